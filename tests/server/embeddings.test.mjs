// POST /v1/embeddings end to end through the official openai npm client's embeddings.create:
// the client's default (base64, decoded by the client) equals encoding_format float; batched
// inputs, token-id inputs and dimensions; the pooled vector of a fixture model equals
// transformers' final hidden state of the golden sequence (last token, L2-normalized: Ember's
// rule for a decoder without a sentence-transformers config), also batched with other inputs and
// while a completion streams; every bad field a 400 naming it; the API key.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fixturesDir, getJson, missing, postJson, startServer, tinyStoriesDir, tmpDir } from './helpers.mjs';

const qwen3Dir = path.join(fixturesDir, 'models', 'qwen3');

const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));

// A float32 tensor of a safetensors file, as an array of rows.
function readTensor(file, name) {
  const buf = fs.readFileSync(file);
  const headerLen = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + headerLen).toString('utf8'));
  const t = header[name];
  assert.equal(t.dtype, 'F32');
  const [rows, cols] = t.shape;
  const start = 8 + headerLen + t.data_offsets[0];
  const out = [];
  for (let r = 0; r < rows; r++) {
    const row = [];
    for (let c = 0; c < cols; c++) row.push(buf.readFloatLE(start + 4 * (r * cols + c)));
    out.push(row);
  }
  return out;
}

describe('embeddings (tinystories-656k)', { skip: missing(tinyStoriesDir) ?? false }, () => {
  let server, client;
  before(async () => {
    server = await startServer(tinyStoriesDir, ['--max-model-len', '128']);
    client = server.client();
  });
  after(async () => { await server.stop(); });

  test('/v1/models reports embeddings', async () => {
    const m = (await getJson(server.baseURL, '/v1/models')).json.data[0];
    assert.equal(m.capabilities.embeddings, true);
  });

  test('a string: a unit vector of the hidden size; base64 (the client default) equals float', async () => {
    const viaBase64 = await client.embeddings.create({ model: 'test-model', input: 'Once upon a time' });
    assert.equal(viaBase64.object, 'list');
    assert.equal(viaBase64.model, 'test-model');
    assert.equal(viaBase64.data.length, 1);
    const v = viaBase64.data[0].embedding;
    assert.equal(v.length, 128);
    assert.ok(Math.abs(norm(v) - 1) < 1e-5);
    const viaFloat = await client.embeddings.create({ model: 'test-model', input: 'Once upon a time',
                                                      encoding_format: 'float' });
    assert.deepEqual(viaFloat.data[0].embedding, v);
    const raw = await client.embeddings.create({ model: 'test-model', input: 'Once upon a time',
                                                 encoding_format: 'base64' });
    assert.equal(typeof raw.data[0].embedding, 'string');
    const bytes = Buffer.from(raw.data[0].embedding, 'base64');
    assert.equal(bytes.length, 4 * 128);
    for (let i = 0; i < 128; i++) assert.equal(bytes.readFloatLE(4 * i), v[i]);
    assert.ok(viaFloat.usage.prompt_tokens > 0);
    assert.equal(viaFloat.usage.total_tokens, viaFloat.usage.prompt_tokens);
  });

  test('several inputs batched; text and its token ids agree; dimensions truncate and renormalize', async () => {
    const texts = ['Once upon a time', 'The cat sat on the mat.', 'Lily', 'Once upon a time'];
    const r = await client.embeddings.create({ model: 'test-model', input: texts, encoding_format: 'float' });
    assert.deepEqual(r.data.map((d) => d.index), [0, 1, 2, 3]);
    assert.deepEqual(r.data[0].embedding, r.data[3].embedding);
    assert.notDeepEqual(r.data[0].embedding, r.data[1].embedding);
    const tok = await postJson(server.baseURL, '/tokenize', { prompt: texts[1] });
    assert.equal(tok.status, 200, tok.text);
    const byIds = await client.embeddings.create({ model: 'test-model', input: [tok.json.tokens],
                                                   encoding_format: 'float' });
    assert.deepEqual(byIds.data[0].embedding, r.data[1].embedding);
    const single = await client.embeddings.create({ model: 'test-model', input: tok.json.tokens,
                                                    encoding_format: 'float' });
    assert.deepEqual(single.data[0].embedding, r.data[1].embedding);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens);
    const cut = await client.embeddings.create({ model: 'test-model', input: texts[1], dimensions: 16,
                                                 encoding_format: 'float' });
    const head = r.data[1].embedding.slice(0, 16);
    const n = norm(head);
    assert.equal(cut.data[0].embedding.length, 16);
    cut.data[0].embedding.forEach((x, i) => assert.ok(Math.abs(x - head[i] / n) < 1e-6));
  });

  test('while a completion streams, embeddings come back the same', async () => {
    const alone = await client.embeddings.create({ model: 'test-model', input: 'Lily', encoding_format: 'float' });
    const stream = await client.completions.create({ model: 'test-model', prompt: 'Once upon a time',
                                                     max_tokens: 60, temperature: 0, stream: true });
    const during = client.embeddings.create({ model: 'test-model', input: ['Lily', 'Tom'],
                                              encoding_format: 'float' });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
    assert.ok(text.length > 0);
    assert.deepEqual((await during).data[0].embedding, alone.data[0].embedding);
  });

  test('every bad field is a 400 naming it', async () => {
    const cases = [
      [{}, 'input'],
      [{ input: '' }, 'input'],
      [{ input: [] }, 'input'],
      [{ input: 7 }, 'input'],
      [{ input: ['a', 3] }, 'input'],
      [{ input: [1, 99999] }, 'input'],
      [{ input: [[1, 2], []] }, 'input'],
      [{ input: 'a', encoding_format: 'hex' }, 'encoding_format'],
      [{ input: 'a', dimensions: 0 }, 'dimensions'],
      [{ input: 'a', dimensions: 129 }, 'dimensions'],
      [{ input: 'a', dimensions: '8' }, 'dimensions'],
      [{ input: 'a', user: 5 }, 'user'],
      [{ input: 'a', max_tokens: 3 }, 'max_tokens'],
    ];
    for (const [body, param] of cases) {
      const r = await postJson(server.baseURL, '/v1/embeddings', body);
      assert.equal(r.status, 400, `${JSON.stringify(body)}: ${r.text}`);
      assert.equal(r.json.error.param, param, JSON.stringify(body));
    }
    const foreign = await postJson(server.baseURL, '/v1/embeddings', { input: 'a', model: 'other' });
    assert.equal(foreign.status, 404);
    assert.equal(foreign.json.error.code, 'model_not_found');
    const long = await postJson(server.baseURL, '/v1/embeddings', { input: ['a', 'word '.repeat(300)] });
    assert.equal(long.status, 400, long.text);
    assert.match(long.json.error.message, /input\[1\] has \d+ tokens; this model's maximum context length is 128/);
    const notJson = await postJson(server.baseURL, '/v1/embeddings', '{"input": ');
    assert.equal(notJson.status, 400);
    const get = await getJson(server.baseURL, '/v1/embeddings');
    assert.equal(get.status, 405);
    const ok = await postJson(server.baseURL, '/v1/embeddings', { input: 'a', user: 'u1' });
    assert.equal(ok.status, 200, ok.text);
  });
});

describe('embeddings against transformers\' hidden states (qwen3 fixture)', { skip: missing(qwen3Dir, tinyStoriesDir) ?? false }, () => {
  let server, client;
  const golden = JSON.parse(fs.readFileSync(path.join(qwen3Dir, 'golden.json'), 'utf8'));
  before(async () => {
    // The fixture has no tokenizer: borrow TinyStories' (token-id inputs never use it).
    const dir = tmpDir('ember-emb-qwen3-');
    for (const f of fs.readdirSync(qwen3Dir)) fs.symlinkSync(path.join(qwen3Dir, f), path.join(dir, f));
    fs.symlinkSync(path.join(tinyStoriesDir, 'tokenizer.json'), path.join(dir, 'tokenizer.json'));
    server = await startServer(dir);
    client = server.client();
  });
  after(async () => { await server.stop(); });

  test('last-token pooling, L2-normalized, within 2e-5 of the golden; batched', async () => {
    const names = Object.keys(golden.sequences);
    const r = await client.embeddings.create({ model: 'test-model', input: names.map((n) => golden.sequences[n]),
                                               encoding_format: 'float' });
    names.forEach((name, i) => {
      const rows = readTensor(path.join(qwen3Dir, 'golden_hidden.safetensors'), `hidden.${name}`);
      const last = rows[rows.length - 1];
      const n = norm(last);
      const got = r.data[i].embedding;
      assert.equal(got.length, last.length);
      got.forEach((x, j) => assert.ok(Math.abs(x - last[j] / n) <= 2e-5, `${name}[${j}]: ${x} vs ${last[j] / n}`));
    });
    assert.equal(r.usage.prompt_tokens, names.reduce((s, n) => s + golden.sequences[n].length, 0));
  });
});

describe('embeddings behind an API key', { skip: missing(tinyStoriesDir) ?? false }, () => {
  let server;
  before(async () => { server = await startServer(tinyStoriesDir, ['--api-key', 'k3y']); });
  after(async () => { await server.stop(); });

  test('401 without the key, 200 with it', async () => {
    const denied = await postJson(server.baseURL, '/v1/embeddings', { input: 'a' });
    assert.equal(denied.status, 401);
    const r = await server.client({ apiKey: 'k3y' }).embeddings.create({ model: 'test-model', input: 'a' });
    assert.equal(r.data.length, 1);
  });
});
