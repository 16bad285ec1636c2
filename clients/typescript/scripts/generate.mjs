// Generates what the build needs from the proto contract, so it can never be
// stale: it runs on every `npm run build`, and its outputs are git-ignored,
// never committed.
//
//   ../../proto/echomq/**/*.proto  →  proto/echomq/**       (copied, inside the
//                                      repository only; shipped in the npm
//                                      package, so the package builds outside)
//   proto/echomq/**/*.proto        →  src/gen/**             (TypeScript types
//                                      from proto-loader-gen-types)
//                                  →  src/gen/descriptor.ts  (the contract as
//                                      protobufjs JSON, which the client loads
//                                      at run time: no .proto file is read
//                                      then, so ESM, CommonJS and bundlers all
//                                      work without locating files)
//
// The options below must match PROTO_LOADER_OPTIONS in src/grpc.ts: the types
// describe the objects that proto-loader builds at run time.
import { execFileSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, readdirSync, readFileSync, realpathSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = dirname(dirname(fileURLToPath(import.meta.url)));
const protoOut = join(root, 'proto');
const genOut = join(root, 'src', 'gen');

// Inside the repository (this package is its clients/typescript), the
// contract is the repository's proto/, copied afresh. Anywhere else (an
// unpacked tarball) it is the copy the package ships.
const repoProto = join(root, '..', '..', 'proto');
const inRepository =
  existsSync(join(repoProto, 'echomq')) &&
  existsSync(join(root, '..', '..', 'clients', 'typescript')) &&
  realpathSync(join(root, '..', '..', 'clients', 'typescript')) === realpathSync(root);
if (inRepository) {
  rmSync(protoOut, { recursive: true, force: true });
  cpSync(join(repoProto, 'echomq'), join(protoOut, 'echomq'), {
    recursive: true,
    filter: (path) => statSync(path).isDirectory() || path.endsWith('.proto'),
  });
} else if (!existsSync(join(protoOut, 'echomq'))) {
  throw new Error(`no proto contract: neither ${repoProto} (the EchoMQ repository) nor ${protoOut} (the packaged copy)`);
}
rmSync(genOut, { recursive: true, force: true });

const files = [];
const walk = (dir) => {
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) walk(path);
    else if (entry.name.endsWith('.proto')) files.push(relative(protoOut, path));
  }
};
walk(join(protoOut, 'echomq'));
files.sort();

const bin = join(root, 'node_modules', '.bin', 'proto-loader-gen-types');
execFileSync(
  bin,
  [
    '--longs=String',
    '--enums=String',
    '--defaults',
    '--oneofs',
    '--includeComments',
    '--grpcLib=@grpc/grpc-js',
    '--importFileExtension=.js',
    '-I',
    protoOut,
    '-O',
    genOut,
    ...files,
  ],
  { stdio: ['ignore', 'ignore', 'inherit'] },
);

// The contract as protobufjs JSON, loaded exactly as proto-loader's loadSync
// would load the files (the same protobufjs, through proto-loader's own
// loader, camelCase field names), so that fromJSON at run time builds the
// same package definition.
const requireFromLoader = createRequire(createRequire(import.meta.url).resolve('@grpc/proto-loader'));
const { loadProtosWithOptionsSync } = requireFromLoader('./util');
const contract = loadProtosWithOptionsSync(files, { keepCase: false, includeDirs: [protoOut] });
mkdirSync(genOut, { recursive: true });
writeFileSync(
  join(genOut, 'descriptor.ts'),
  '/** The proto contract (proto/echomq) as protobufjs JSON, for proto-loader\'s fromJSON. */\n' +
    `export const DESCRIPTOR: Record<string, unknown> = ${JSON.stringify(contract.toJSON({ keepComments: false }))};\n`,
);

// The generator's output is checked by the generator, not by this package's
// stricter lint flags (it declares helpers it does not always use).
const mark = (dir) => {
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) mark(path);
    else if (entry.name.endsWith('.ts')) writeFileSync(path, '// @ts-nocheck\n// Generated from ../../proto by scripts/generate.mjs. Do not edit.\n' + readFileSync(path, 'utf8'));
  }
};
mark(genOut);
