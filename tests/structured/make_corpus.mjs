// Writes schemas.jsonl beside this file: the structured-output schema corpus (one
// {"name", "schema"} per line), generated deterministically (a seeded PRNG): every supported
// keyword alone, real-world shapes, and random nestings of them. Run it again after editing:
//   node tests/structured/make_corpus.mjs
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
let seed = 20261205;
function rand() {  // mulberry32
  seed = (seed + 0x6D2B79F5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (list) => list[Math.floor(rand() * list.length)];
const int = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));

const PATTERNS = [
  '^[a-z]+$', '^[A-Z]{2,3}-\\d{3}$', '^\\d{3}-\\d{3}-\\d{4}$', '^[a-zA-Z0-9_]{3,16}$',
  '^#[0-9a-fA-F]{6}$', '^(red|green|blue)$', '^\\+?[1-9]\\d{1,14}$', '^[^@\\s]+@[^@\\s]+$',
  '\\d', '^v\\d+\\.\\d+\\.\\d+$', '^(?:[01]\\d|2[0-3]):[0-5]\\d$', '^\\S+$', '^[\\w.-]+$',
  '^[A-Z][a-z]*( [A-Z][a-z]*)*$', '^[^"\\\\]*$', '^[\\s\\S]{0,10}$', '^.{1,20}$', '^[à-ÿ]+$',
  '^\\$\\d+(\\.\\d{2})?$', '^[0-9a-f]{8}$', '^(\\d+,)*\\d+$', '^a*b?c+$', '^[a-z]+(?:-[a-z]+)*$',
  '^\\/[a-z/]*$', '^\\u00e9t\\u00e9$', '^"[a-z]*"$', '^[\\t\\n ]*x$', 'x', '^(?<w>\\w+)$',
  '^(?:ab|cd){1,3}$', '^[^a-z]{2,}$', '^\\d{4}-\\d{2}-\\d{2}$', '^[A-Z]{3}$', '^\\w+@\\w+\\.com$',
];
const FORMATS = ['date-time', 'date', 'time', 'uuid', 'email', 'ipv4', 'ipv6', 'uri'];

function stringSchema() {
  switch (int(0, 8)) {
    case 0: return { type: 'string' };
    case 1: return { type: 'string', maxLength: int(1, 12) };
    case 2: { const lo = int(0, 5); return { type: 'string', minLength: lo, maxLength: lo + int(0, 10) }; }
    case 3: case 4: return { type: 'string', pattern: pick(PATTERNS) };
    case 5: return { type: 'string', format: pick(FORMATS) };
    case 6: return { type: 'string', pattern: pick(['^[a-z]+$', '^\\w+$', '^[0-9]+$']), minLength: int(1, 3), maxLength: int(4, 9) };
    case 7: return { enum: ['alpha', 'beta', 'gamma "quoted"', 'é', 'line\nbreak'].slice(0, int(1, 5)) };
    default: return { const: pick(['fixed', 'ok', '']) };
  }
}
function numberSchema() {
  switch (int(0, 8)) {
    case 0: return { type: 'integer' };
    case 1: return { type: 'number' };
    case 2: { const lo = int(-50, 50); return { type: 'integer', minimum: lo, maximum: lo + int(0, 300) }; }
    case 3: return { type: 'integer', exclusiveMinimum: int(-10, 10), exclusiveMaximum: int(20, 2000) };
    case 4: return { type: 'integer', minimum: int(0, 100) };
    case 5: return { type: 'number', minimum: int(-5, 0), maximum: int(1, 100) };
    case 6: return { type: 'number', minimum: 0.5, exclusiveMaximum: 10 };
    case 7: return { type: 'integer', multipleOf: int(2, 12), minimum: int(-20, 0) };
    default: return { enum: [1, 2, 3, 10, -1, 0.5].slice(0, int(1, 6)) };
  }
}
function leaf() {
  switch (int(0, 9)) {
    case 0: case 1: case 2: return stringSchema();
    case 3: case 4: return numberSchema();
    case 5: return { type: 'boolean' };
    case 6: return { type: 'null' };
    case 7: return { type: [pick(['string', 'integer', 'number', 'boolean']), 'null'] };
    case 8: return { anyOf: [stringSchema().type ? { type: 'string', maxLength: 8 } : { type: 'string' }, { type: 'integer', minimum: 0 }] };
    default: return {};
  }
}
function arraySchema(depth) {
  const s = { type: 'array', items: depth > 0 && rand() < 0.3 ? objectSchema(depth - 1) : leaf() };
  if (rand() < 0.5) s.minItems = int(0, 2);
  if (rand() < 0.6) s.maxItems = (s.minItems ?? 0) + int(0, 4);
  if (rand() < 0.2) {
    delete s.items;
    s.prefixItems = [leaf(), leaf()];
    if (rand() < 0.5) s.items = false; else s.items = leaf();
  }
  return s;
}
function objectSchema(depth) {
  const n = int(1, 6);
  const properties = {};
  const required = [];
  for (let i = 0; i < n; ++i) {
    const name = pick(['id', 'name', 'title', 'value', 'tags', 'count', 'when', 'email', 'note',
                       'kind', 'url', 'score', 'items', 'meta', 'ok', 'ratio', 'code', 'uid']) + (i > 0 && rand() < 0.3 ? i : '');
    if (properties[name]) continue;
    const r = rand();
    properties[name] = depth > 0 && r < 0.15 ? objectSchema(depth - 1)
                     : depth > 0 && r < 0.3 ? arraySchema(depth - 1)
                     : leaf();
    if (rand() < 0.6) required.push(name);
  }
  const s = { type: 'object', properties };
  if (required.length) s.required = required;
  if (rand() < 0.5) s.additionalProperties = false;
  return s;
}

const corpus = [];
const add = (name, schema) => corpus.push({ name, schema });
const wrap = (sub) => ({ type: 'object', properties: { v: sub }, required: ['v'], additionalProperties: false });

// Every keyword alone, as the value of a required property.
add('type-string', wrap({ type: 'string' }));
add('type-number', wrap({ type: 'number' }));
add('type-integer', wrap({ type: 'integer' }));
add('type-boolean', wrap({ type: 'boolean' }));
add('type-null', wrap({ type: 'null' }));
add('type-list', wrap({ type: ['string', 'number', 'null'] }));
add('untyped', wrap({}));
add('enum-mixed', wrap({ enum: ['a', 1, 2.5, true, null, 'é'] }));
add('const-string', wrap({ const: 'exact "value"' }));
add('const-object', wrap({ const: { a: [1, 2] } }));
add('min-max-length', wrap({ type: 'string', minLength: 3, maxLength: 5 }));
add('max-length-0', wrap({ type: 'string', maxLength: 0 }));
for (const [i, p] of PATTERNS.entries()) add(`pattern-${i}`, wrap({ type: 'string', pattern: p }));
for (const f of FORMATS) add(`format-${f}`, wrap({ type: 'string', format: f }));
for (const f of FORMATS) add(`format-${f}-nullable`, wrap({ type: ['string', 'null'], format: f }));
add('pattern-with-lengths', wrap({ type: 'string', pattern: '^[a-z]+$', minLength: 2, maxLength: 4 }));
add('format-with-pattern', wrap({ type: 'string', format: 'date', pattern: '^2024-' }));
add('int-range', wrap({ type: 'integer', minimum: -17, maximum: 4096 }));
add('int-exclusive', wrap({ type: 'integer', exclusiveMinimum: 0, exclusiveMaximum: 10 }));
add('int-min-only', wrap({ type: 'integer', minimum: 1000 }));
add('int-max-only', wrap({ type: 'integer', maximum: -5 }));
add('int-fractional-bounds', wrap({ type: 'integer', minimum: 0.5, maximum: 9.5 }));
add('int-huge', wrap({ type: 'integer', minimum: -1e17, maximum: 1e17 }));
add('number-range', wrap({ type: 'number', minimum: -1, maximum: 1 }));
add('number-exclusive', wrap({ type: 'number', exclusiveMinimum: 0, exclusiveMaximum: 100 }));
add('number-fractional-bounds', wrap({ type: 'number', minimum: 0.25, maximum: 3.75 }));
add('int-multiple', wrap({ type: 'integer', multipleOf: 7 }));
add('int-multiple-range', wrap({ type: 'integer', multipleOf: 25, minimum: -100, exclusiveMaximum: 1000 }));
add('number-multiple', wrap({ type: 'number', multipleOf: 3, maximum: 99 }));
add('array-items', wrap({ type: 'array', items: { type: 'integer' } }));
add('array-min-max', wrap({ type: 'array', items: { type: 'string', maxLength: 3 }, minItems: 2, maxItems: 4 }));
add('array-prefix', wrap({ type: 'array', prefixItems: [{ type: 'string' }, { type: 'integer' }], items: false }));
add('array-prefix-rest', wrap({ type: 'array', prefixItems: [{ const: 'head' }], items: { type: 'number' }, minItems: 1 }));
add('map', wrap({ type: 'object', additionalProperties: { type: 'integer', minimum: 0 } }));
add('closed-empty', wrap({ type: 'object', additionalProperties: false }));
add('anyOf-disjoint', wrap({ anyOf: [{ type: 'string', format: 'email' }, { type: 'integer' }, { type: 'null' }] }));
add('oneOf-disjoint', wrap({ oneOf: [{ type: 'array', items: { type: 'string' } }, { type: 'boolean' }] }));
add('nullable', wrap({ type: 'string', nullable: true, maxLength: 4 }));
add('allOf-objects', wrap({ allOf: [{ type: 'object', properties: { a: { type: 'integer' } }, required: ['a'] },
                                    { properties: { b: { type: 'string' } }, required: ['b'] }] }));
add('allOf-bounds', wrap({ allOf: [{ type: 'integer', minimum: 0 }, { maximum: 50 }, { exclusiveMaximum: 40 }] }));
add('ref-sibling', { $defs: { P: { type: 'object', properties: { x: { type: 'number' } } } }, type: 'object',
                     properties: { p: { $ref: '#/$defs/P', required: ['x'] } }, required: ['p'] });
add('ref-tree', { $ref: '#/$defs/Node', $defs: { Node: { type: 'object', properties: { value: { type: 'integer' },
    children: { type: 'array', items: { $ref: '#/$defs/Node' }, maxItems: 2 } }, required: ['value'], additionalProperties: false } } });
add('ref-list', { $defs: { Item: { type: 'object', properties: { v: { type: 'string', maxLength: 5 },
    next: { anyOf: [{ $ref: '#/$defs/Item' }, { type: 'null' }] } }, required: ['v', 'next'] } },
    type: 'object', properties: { head: { $ref: '#/$defs/Item' } }, required: ['head'] });
add('definitions-legacy', { definitions: { D: { type: 'string', format: 'date' } }, type: 'object',
    properties: { d: { $ref: '#/definitions/D' } }, required: ['d'] });

// Real-world shapes.
add('person', { type: 'object', properties: { name: { type: 'string', minLength: 1, maxLength: 40 },
  age: { type: 'integer', minimum: 0, maximum: 150 }, email: { type: 'string', format: 'email' },
  phones: { type: 'array', items: { type: 'string', pattern: '^\\+?[0-9 -]{7,15}$' }, maxItems: 3 } },
  required: ['name', 'age'], additionalProperties: false });
add('address', { type: 'object', properties: { street: { type: 'string' }, city: { type: 'string' },
  zip: { type: 'string', pattern: '^\\d{5}(-\\d{4})?$' }, country: { enum: ['US', 'CA', 'MX'] } },
  required: ['street', 'city', 'country'] });
add('order', { $defs: { Line: { type: 'object', properties: { sku: { type: 'string', pattern: '^[A-Z]{3}-\\d{4}$' },
  qty: { type: 'integer', minimum: 1, maximum: 99 }, price: { type: 'number', minimum: 0 } }, required: ['sku', 'qty', 'price'] } },
  type: 'object', properties: { id: { type: 'string', format: 'uuid' }, placed: { type: 'string', format: 'date-time' },
  lines: { type: 'array', items: { $ref: '#/$defs/Line' }, minItems: 1, maxItems: 3 },
  status: { enum: ['new', 'paid', 'shipped'] } }, required: ['id', 'lines', 'status'] });
add('event', { type: 'object', properties: { title: { type: 'string', maxLength: 30 }, date: { type: 'string', format: 'date' },
  start: { type: 'string', format: 'time' }, location: { anyOf: [{ type: 'string' }, { type: 'null' }] },
  attendees: { type: 'array', items: { type: 'string', format: 'email' }, maxItems: 2 } }, required: ['title', 'date'] });
add('weather-tool', { type: 'object', properties: { location: { type: 'string', description: 'City' },
  unit: { type: 'string', enum: ['celsius', 'fahrenheit'] }, days: { type: 'integer', minimum: 1, maximum: 14 } },
  required: ['location', 'unit'], additionalProperties: false });
add('classification', { type: 'object', properties: { label: { enum: ['positive', 'negative', 'neutral'] },
  confidence: { type: 'number', minimum: 0, maximum: 1 }, reasons: { type: 'array', items: { type: 'string', maxLength: 20 }, maxItems: 3 } },
  required: ['label', 'confidence'] });
add('server-config', { type: 'object', properties: { host: { type: 'string', format: 'ipv4' }, v6: { type: 'string', format: 'ipv6' },
  port: { type: 'integer', minimum: 1, maximum: 65535 }, tls: { type: 'boolean' }, endpoint: { type: 'string', format: 'uri' },
  tags: { type: 'object', additionalProperties: { type: 'string', maxLength: 8 } } }, required: ['host', 'port'] });
add('pydantic-model', { title: 'Invoice', type: 'object', $defs: { Item: { title: 'Item', type: 'object',
  properties: { name: { title: 'Name', type: 'string' }, amount: { title: 'Amount', type: 'number', exclusiveMinimum: 0 } },
  required: ['name', 'amount'] } }, properties: { number: { title: 'Number', type: 'string', pattern: '^INV-\\d{4}$' },
  items: { title: 'Items', type: 'array', items: { $ref: '#/$defs/Item' }, maxItems: 2 },
  note: { anyOf: [{ type: 'string' }, { type: 'null' }], default: null, title: 'Note' },
  paid: { title: 'Paid', type: 'boolean', default: false } }, required: ['number', 'items'] });
add('pydantic-v1-allof', { title: 'Wrapper', type: 'object', definitions: { Inner: { type: 'object',
  properties: { k: { type: 'integer' } }, required: ['k'] } },
  properties: { inner: { title: 'Inner', description: 'x', allOf: [{ $ref: '#/definitions/Inner' }] } }, required: ['inner'] });
add('extraction', { type: 'object', properties: { entities: { type: 'array', maxItems: 4, items: { type: 'object',
  properties: { text: { type: 'string', maxLength: 15 }, type: { enum: ['PERSON', 'ORG', 'LOC'] }, start: { type: 'integer', minimum: 0 } },
  required: ['text', 'type'] } } }, required: ['entities'] });
add('api-result', { type: 'object', properties: { ok: { type: 'boolean' }, data: { anyOf: [{ type: 'object',
  properties: { id: { type: 'integer' } } }, { type: 'null' }] }, error: { type: ['string', 'null'], maxLength: 30 } }, required: ['ok'] });
add('color-palette', { type: 'object', properties: { colors: { type: 'array', minItems: 2, maxItems: 4,
  items: { type: 'string', pattern: '^#[0-9a-f]{6}$' } } }, required: ['colors'] });
add('semver', { type: 'object', properties: { version: { type: 'string', pattern: '^\\d+\\.\\d+\\.\\d+(-[a-z]+)?$' } }, required: ['version'] });
add('coordinates', { type: 'object', properties: { lat: { type: 'number', minimum: -90, maximum: 90 },
  lon: { type: 'number', minimum: -180, maximum: 180 } }, required: ['lat', 'lon'], additionalProperties: false });
add('matrix', { type: 'object', properties: { rows: { type: 'array', maxItems: 3, items: { type: 'array',
  items: { type: 'integer', minimum: -9, maximum: 9 }, minItems: 2, maxItems: 2 } } }, required: ['rows'] });

// Random nestings.
while (corpus.length < 360) add(`random-${corpus.length}`, objectSchema(2));
// Union branches that start alike (followed together by the machine until the bytes tell them
// apart); oneOf's branches here exclude each other, as ajv checks exactly one. Appended after
// the random schemas, so the earlier entries and their walks' seeds stay as they were.
add('anyOf-lookalike-objects', wrap({ anyOf: [
  { type: 'object', properties: { kind: { const: 'circle' }, r: { type: 'number' } }, required: ['kind', 'r'], additionalProperties: false },
  { type: 'object', properties: { kind: { const: 'rect' }, w: { type: 'integer' }, h: { type: 'integer' } }, required: ['kind', 'w', 'h'], additionalProperties: false },
  { type: 'object', properties: { kind: { const: 'circle' }, d: { type: 'integer', minimum: 1 } }, required: ['kind', 'd'], additionalProperties: false }] }));
add('oneOf-discriminated', wrap({ oneOf: [
  { type: 'object', properties: { type: { const: 'a' }, x: { type: 'integer' } }, required: ['type', 'x'], additionalProperties: false },
  { type: 'object', properties: { type: { const: 'b' }, y: { type: 'string', maxLength: 5 } }, required: ['type', 'y'], additionalProperties: false }] }));
add('anyOf-overlap-scalars', wrap({ anyOf: [{ type: 'integer', maximum: 9 }, { type: 'number', minimum: 100 },
                                            { type: 'string', maxLength: 3 }, { enum: ['long-name', 'x'] }] }));
add('type-list-integer-number', wrap({ type: ['integer', 'number'], minimum: -5, maximum: 5 }));
add('anyOf-lookalike-arrays', wrap({ anyOf: [{ type: 'array', items: { type: 'integer' }, maxItems: 2 },
                                             { type: 'array', items: { type: 'string', maxLength: 4 }, minItems: 1 }] }));
// uniqueItems over an inline enum (each value at most once; "1" / "12" / "123" share prefixes).
add('array-unique-enum', wrap({ type: 'array', items: { enum: ['red', 'green', 'blue', 1, 2, true, null] },
                                uniqueItems: true, minItems: 2 }));
add('array-unique-prefixes', wrap({ type: 'array', items: { enum: [1, 12, 123, 'a', 'ab'] }, uniqueItems: true }));

// oneOf with branches proven exclusive (ajv checks exactly one matches), not, and if/then/else.
add('oneOf-types-literals', wrap({ oneOf: [{ type: 'string', pattern: '^[a-z]{0,3}$' }, { enum: ['long-name', 7, null] },
                                           { type: 'integer', minimum: 10, multipleOf: 5 }, { type: 'integer', maximum: -1 }] }));
add('oneOf-open-objects', wrap({ oneOf: [
  { type: 'object', properties: { a: { type: 'integer' }, c: { type: 'string' } }, required: ['a'] },
  { type: 'object', properties: { b: { type: 'boolean' }, c: { type: 'string' } }, required: ['b'] }] }));
add('oneOf-root-discriminated', { oneOf: [
  { type: 'object', properties: { kind: { const: 'user' }, name: { type: 'string', maxLength: 8 } }, required: ['kind', 'name'] },
  { type: 'object', properties: { kind: { enum: ['bot', 'system'] }, id: { type: 'integer' } }, required: ['kind'] }] });
add('not-string-literals', wrap({ type: 'string', maxLength: 4, not: { enum: ['', 'a', 'ab', 'null'] } }));
add('not-types-and-enum', { type: 'object', properties: {
  t: { not: { type: ['object', 'array', 'string'] } },
  e: { enum: ['x', 'y', 'z', 1], not: { enum: ['y', 1] } },
  b: { type: 'boolean', not: { const: false } } }, required: ['t', 'e', 'b'] });
add('not-required', { type: 'object', properties: { a: { type: 'integer' }, b: { type: 'integer' }, c: { type: 'string' } },
                      not: { required: ['a', 'b'] }, required: ['c'] });
add('if-then-else-root', { type: 'object', properties: { kind: { enum: ['card', 'bank', 'cash'] },
  number: { type: 'string', pattern: '^[0-9]{4}$' }, iban: { type: 'string', maxLength: 6 } }, required: ['kind'],
  if: { properties: { kind: { const: 'card' } } }, then: { required: ['number'] }, else: { not: { required: ['number'] } } });
add('if-then-required', wrap({ type: 'object', properties: { country: { type: 'string', enum: ['US', 'CA', 'FR'] },
  zip: { type: 'string', pattern: '^[0-9]{5}$' } }, required: ['country'],
  if: { properties: { country: { const: 'US' } }, required: ['country'] }, then: { required: ['zip'] } }));
// Object keywords on listed properties.
add('object-min-max-properties', wrap({ type: 'object', properties: { a: { type: 'integer' }, b: { type: 'string', maxLength: 3 }, c: { type: 'boolean' } },
                                        minProperties: 1, maxProperties: 3 }));
add('object-property-names', wrap({ type: 'object', properties: { id: { type: 'integer' }, Name: { type: 'string' }, tag_1: { type: 'string' } },
                                    propertyNames: { pattern: '^[a-z_0-9]+$', maxLength: 5 }, patternProperties: { '_\\d$': { maxLength: 2 } } }));
add('object-dependent-required', { type: 'object', properties: { card: { type: 'string', pattern: '^[0-9]{4}$' }, billing: { type: 'string' },
  cvv: { type: 'string', pattern: '^[0-9]{3}$' }, name: { type: 'string' } }, required: ['name'],
  dependentRequired: { card: ['billing', 'cvv'], cvv: ['card'] } });

fs.writeFileSync(path.join(here, 'schemas.jsonl'), corpus.map((c) => JSON.stringify(c)).join('\n') + '\n');
console.log(`wrote ${corpus.length} schemas`);
