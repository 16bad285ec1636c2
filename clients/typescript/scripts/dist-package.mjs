// Marks dist/cjs as CommonJS, so Node and TypeScript read its .js and .d.ts
// files as such inside a package whose package.json says "type": "module".
import { writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = dirname(dirname(fileURLToPath(import.meta.url)));
writeFileSync(join(root, 'dist', 'cjs', 'package.json'), '{\n  "type": "commonjs"\n}\n');
