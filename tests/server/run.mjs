// CTest entry point for the server suite: runs every *.test.mjs here with node's test runner,
// or exits 77 (CTest: skipped) with a clear message when the openai or @anthropic-ai/sdk npm
// package is missing.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
for (const pkg of ['openai', '@anthropic-ai/sdk']) {
  if (!fs.existsSync(path.join(here, 'node_modules', pkg, 'package.json'))) {
    console.log(`SKIP: tests/server/node_modules/${pkg} is missing (run scripts/setup.sh, or npm ci in tests/server)`);
    process.exit(77);
  }
}
const files = fs.readdirSync(here).filter((f) => f.endsWith('.test.mjs')).sort();
const r = spawnSync(process.execPath, ['--test', '--test-concurrency=1', ...files],
                    { cwd: here, stdio: 'inherit' });
process.exit(r.status ?? 1);
