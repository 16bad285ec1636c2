// Generates what the build needs from the repository's proto contract, so it
// can never be stale: it runs on every `npm run build`, and its outputs are
// git-ignored, never committed.
//
//   ../../proto/echomq/**/*.proto  →  proto/echomq/**  (copied: loaded at run
//                                      time by @grpc/proto-loader, and shipped
//                                      in the npm package)
//                                  →  src/gen/**        (TypeScript types from
//                                      proto-loader-gen-types, compiled by tsc)
//
// The type options below must match PROTO_LOADER_OPTIONS in src/grpc.ts: the
// types describe the objects that proto-loader builds at run time.
import { execFileSync } from 'node:child_process';
import { cpSync, existsSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = dirname(dirname(fileURLToPath(import.meta.url)));
const source = join(root, '..', '..', 'proto');
const protoOut = join(root, 'proto');
const genOut = join(root, 'src', 'gen');

if (!existsSync(join(source, 'echomq'))) {
  throw new Error(`no proto contract at ${source}: build from inside the EchoMQ repository`);
}

rmSync(protoOut, { recursive: true, force: true });
rmSync(genOut, { recursive: true, force: true });
cpSync(join(source, 'echomq'), join(protoOut, 'echomq'), {
  recursive: true,
  filter: (path) => statSync(path).isDirectory() || path.endsWith('.proto'),
});

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
