// CTest `schema_corpus_ajv`: the structured-output corpus (tests/structured/schemas.jsonl) checked
// by an independent validator. Runs the schema_corpus_test binary ($EMBER_SCHEMA_CORPUS_TEST:
// seeded random walks of the JSON-schema constraint on real vocabularies) with
// EMBER_CORPUS_OUTPUTS, then validates every finished text against its schema with ajv (JSON
// Schema 2020-12) and ajv-formats. Exits 77 (skipped) when ajv or the binary is missing.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const bin = process.env.EMBER_SCHEMA_CORPUS_TEST;
for (const pkg of ['ajv', 'ajv-formats']) {
  if (!fs.existsSync(path.join(here, 'node_modules', pkg, 'package.json'))) {
    console.log(`SKIP: tests/server/node_modules/${pkg} is missing (run scripts/setup.sh)`);
    process.exit(77);
  }
}
if (!bin || !fs.existsSync(bin)) {
  console.log(`SKIP: set EMBER_SCHEMA_CORPUS_TEST to the schema_corpus_test binary (got '${bin ?? ''}')`);
  process.exit(77);
}
const { default: Ajv2020 } = await import('ajv/dist/2020.js');
const { default: addFormats } = await import('ajv-formats');

const outputs = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'ember-corpus-')), 'outputs.jsonl');
const run = spawnSync(bin, [], { env: { ...process.env, EMBER_CORPUS_OUTPUTS: outputs }, stdio: 'inherit' });
if (run.status !== 0) {
  console.log(`schema_corpus_test failed (status ${run.status})`);
  process.exit(1);
}
const corpus = new Map();
for (const line of fs.readFileSync(path.join(here, '..', 'structured', 'schemas.jsonl'), 'utf8').split('\n')) {
  if (line) { const { name, schema } = JSON.parse(line); corpus.set(name, schema); }
}
// multipleOfPrecision: ajv divides in doubles by default, so 0.07 is not a multiple of 0.01 to it
// (0.07 / 0.01 = 7.000000000000001); the constraint is exact in decimal (0.07 = 7 / 100), and a
// quotient within 1e-9 of an integer is what a decimal multiple looks like in doubles.
const ajv = new Ajv2020({ strict: false, allErrors: true, multipleOfPrecision: 9 });
addFormats(ajv);
const validators = new Map();
let checked = 0, failed = 0;
const lines = fs.existsSync(outputs) ? fs.readFileSync(outputs, 'utf8').split('\n').filter(Boolean) : [];
for (const line of lines) {
  const { name, tokenizer, text } = JSON.parse(line);
  if (!validators.has(name)) validators.set(name, ajv.compile(corpus.get(name)));
  const validate = validators.get(name);
  let value;
  try { value = JSON.parse(text); } catch (e) { value = undefined; }
  ++checked;
  if (value === undefined || !validate(value)) {
    ++failed;
    console.log(`INVALID ${name} (${tokenizer}): ${JSON.stringify(validate.errors)}\n  ${text}`);
  }
}
console.log(`ajv: ${checked - failed} of ${checked} outputs valid (${validators.size} schemas)`);
// Without tokenizers the walks skip and write nothing: that is a skip, not a pass.
if (checked === 0) { console.log('SKIP: no outputs (tokenizers missing?)'); process.exit(77); }
process.exit(failed === 0 ? 0 : 1);
