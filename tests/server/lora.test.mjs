// LoRA adapters through `ember serve` (issue 44): the llama3 fixture model (with tinystories'
// tokenizer beside it: the fixture has none; prompts are token ids) and the llama3-a / llama3-b
// PEFT adapters. `model: "BASE:NAME"`, an adapter's own name and the `adapter` field pick an
// adapter ("none" the base); greedy output equals the transformers golden of the merged adapter;
// /v1/models lists the adapters with parent/root (/stats: the pool's counters); POST/DELETE /v1/adapters need the API key;
// unknown adapters are a 404 naming them.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fixturesDir, getJson, missing, postJson, startServer, tmpDir } from './helpers.mjs';

const llama3 = path.join(fixturesDir, 'models', 'llama3');
const tinyStories = path.join(fixturesDir, 'models', 'tinystories-656k');
const adapterDir = (name) => path.join(fixturesDir, 'adapters', name);
const skip = missing(llama3, tinyStories, adapterDir('llama3-a'), adapterDir('llama3-b'));
const KEY = 'sk-lora-test';
const auth = { Authorization: `Bearer ${KEY}` };

// The llama3 fixture's files (links) with a tokenizer beside them.
function modelWithTokenizer() {
  const dir = path.join(tmpDir('ember-lora-'), 'llama3');
  fs.mkdirSync(dir);
  for (const f of fs.readdirSync(llama3)) fs.symlinkSync(path.join(llama3, f), path.join(dir, f));
  for (const f of ['tokenizer.json', 'tokenizer_config.json'])
    fs.copyFileSync(path.join(tinyStories, f), path.join(dir, f));
  return dir;
}

describe('LoRA adapters (llama3 fixture)', { skip: skip ?? false }, () => {
  let server, dir;
  const golden = (name) => JSON.parse(fs.readFileSync(path.join(adapterDir(name), 'golden.json')));
  const complete = (body) => postJson(server.baseURL, '/v1/completions',
    { prompt: golden('llama3-a').sequences.short, max_tokens: 24, temperature: 0, ignore_eos: true,
      ...body }, auth);
  const textOf = async (tokens) =>
    (await postJson(server.baseURL, '/detokenize', { tokens }, auth)).json.prompt;

  before(async () => {
    dir = modelWithTokenizer();
    server = await startServer(dir, ['--lora', `a=${adapterDir('llama3-a')}`,
                                     '--lora', `b=${adapterDir('llama3-b')}`, '--max-loras', '2',
                                     '--api-key', KEY]);
  });
  after(async () => {
    await server?.stop();
    fs.rmSync(path.dirname(dir), { recursive: true, force: true });
  });

  test('each way of naming an adapter gives the golden greedy text; none is the base', async () => {
    const want = {
      a: await textOf(golden('llama3-a').greedy.short),
      b: await textOf(golden('llama3-b').greedy.short),
    };
    for (const name of ['a', 'b']) {
      for (const body of [{ model: `test-model:${name}` }, { model: name }, { adapter: name },
                          { model: 'test-model', adapter: name }]) {
        const r = await complete(body);
        assert.equal(r.status, 200, JSON.stringify(r.json));
        assert.equal(r.json.choices[0].text, want[name], JSON.stringify(body));
      }
    }
    const base = await complete({ model: 'test-model' });
    assert.equal(base.status, 200);
    assert.notEqual(base.json.choices[0].text, want.a);
    assert.equal((await complete({ adapter: 'none' })).json.choices[0].text, base.json.choices[0].text);
    assert.equal((await complete({ model: 'test-model:none' })).json.choices[0].text,
                 base.json.choices[0].text);
  });

  test('concurrent requests for a, b and the base each get their own output', async () => {
    const solo = {};
    for (const adapter of ['a', 'b', 'none']) solo[adapter] = (await complete({ adapter })).json.choices[0].text;
    const order = ['a', 'none', 'b', 'a', 'b', 'none'];
    const results = await Promise.all(order.map((adapter) => complete({ adapter })));
    results.forEach((r, i) => assert.equal(r.json.choices[0].text, solo[order[i]], order[i]));
  });

  test('unknown adapters are a 404 naming them; a model/adapter clash is a 400', async () => {
    let r = await complete({ adapter: 'nope' });
    assert.equal(r.status, 404);
    assert.equal(r.json.error.code, 'adapter_not_found');
    assert.match(r.json.error.message, /'nope'/);
    r = await complete({ model: 'test-model:nope' });
    assert.equal(r.status, 404);
    assert.match(r.json.error.message, /'nope'/);
    r = await complete({ model: 'a', adapter: 'b' });
    assert.equal(r.status, 400);
    assert.equal(r.json.error.param, 'adapter');
  });

  test('/v1/models lists each adapter with its base', async () => {
    const r = await fetch(`${server.baseURL}/v1/models`, { headers: auth }).then((x) => x.json());
    const ids = r.data.map((m) => m.id);
    assert.deepEqual(ids, ['test-model', 'a', 'b']);
    const a = r.data[1];
    assert.equal(a.parent, 'test-model');
    assert.equal(a.root, adapterDir('llama3-a'));
    assert.equal(a.lora.rank, 4);
    const one = await fetch(`${server.baseURL}/v1/models/b`, { headers: auth }).then((x) => x.json());
    assert.equal(one.parent, 'test-model');
    const stats = (await getJson(server.baseURL, '/stats')).json.lora;
    assert.deepEqual(stats.adapters, ['a', 'b']);
    assert.equal(stats.max_loras, 2);
    assert.ok(stats.loads >= 2, JSON.stringify(stats));
    assert.equal(stats.waiting, 0);
  });

  test('admin load and unload need the API key', async () => {
    const body = { name: 'c', path: adapterDir('llama3-b') };
    let r = await postJson(server.baseURL, '/v1/adapters', body);
    assert.equal(r.status, 401);
    r = await postJson(server.baseURL, '/v1/adapters', body, auth);
    assert.equal(r.status, 200, JSON.stringify(r.json));
    assert.equal(r.json.id, 'c');
    assert.equal((await complete({ adapter: 'c' })).json.choices[0].text,
                 (await complete({ adapter: 'b' })).json.choices[0].text);
    r = await postJson(server.baseURL, '/v1/adapters', body, auth);
    assert.equal(r.status, 400);  // already loaded
    r = await postJson(server.baseURL, '/v1/adapters',
                       { name: 'q', path: adapterDir('qwen3-a') }, auth);
    assert.equal(r.status, 400);  // another model's shapes: named
    assert.match(r.json.error.message, /tensor "base_model\.model\.model\.layers\.0\./);
    let del = await fetch(`${server.baseURL}/v1/adapters/c`, { method: 'DELETE' });
    assert.equal(del.status, 401);
    del = await fetch(`${server.baseURL}/v1/adapters/c`, { method: 'DELETE', headers: auth });
    assert.equal(del.status, 200);
    assert.equal((await complete({ adapter: 'c' })).status, 404);
    del = await fetch(`${server.baseURL}/v1/adapters/c`, { method: 'DELETE', headers: auth });
    assert.equal(del.status, 404);
  });

  test('the prefix cache does not share blocks across adapters', async () => {
    const prompt = Array.from({ length: 40 }, (_, i) => 3 + ((i * 37) % 500));
    const cached = async (body) => (await complete({ prompt, max_tokens: 2, ...body }))
      .json.usage.prompt_tokens_details.cached_tokens;
    assert.equal(await cached({ adapter: 'a' }), 0);
    assert.equal(await cached({ adapter: 'b' }), 0);
    assert.equal(await cached({ adapter: 'none' }), 0);
    assert.equal(await cached({ adapter: 'a' }), 32);
  });
});
