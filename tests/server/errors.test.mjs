// Error handling and abuse: every bad request gets OpenAI's error body with the right status
// (400 malformed JSON / invalid UTF-8 / wrong types / ranges / unknown fields / context overflow,
// 401, 404, 405, 413, 429, 503) and the server keeps serving everyone else correctly afterwards.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { getJson, missing, postJson, startServer, tinyStoriesDir, waitFor } from './helpers.mjs';

const skip = missing(tinyStoriesDir);
const PROMPT = 'Once upon a time';

function assertError(r, status, param) {
  assert.equal(r.status, status, r.text);
  assert.ok(r.json && r.json.error, `OpenAI error body expected, got: ${r.text}`);
  const e = r.json.error;
  for (const k of ['message', 'type', 'param', 'code']) assert.ok(k in e, `error.${k} missing`);
  assert.equal(typeof e.message, 'string');
  if (param !== undefined) {
    assert.equal(e.param, param, e.message);
    assert.ok(e.message.includes(param), e.message);
  }
  return e;
}

describe('errors (tinystories-656k)', { skip: skip ?? false }, () => {
  let server;
  before(async () => { server = await startServer(tinyStoriesDir, ['--max-body-bytes', '65536']); });
  after(async () => { await server.stop(); });

  const completions = (body) => postJson(server.baseURL, '/v1/completions', body);

  test('400: malformed JSON and invalid UTF-8', async () => {
    assertError(await completions('{"prompt": "x", '), 400);
    const bad = Buffer.concat([Buffer.from('{"prompt": "'), Buffer.from([0xff, 0xfe]), Buffer.from('"}')]);
    const e = assertError(await completions(new Uint8Array(bad)), 400);
    assert.match(e.message, /UTF-8|utf-8/);
  });

  test('400: wrong types, out-of-range values, unknown fields name the field', async () => {
    assertError(await completions({ prompt: PROMPT, max_tokens: 'ten' }), 400, 'max_tokens');
    assertError(await completions({ prompt: PROMPT, temperature: 9 }), 400, 'temperature');
    assertError(await completions({ prompt: PROMPT, top_p: 0 }), 400, 'top_p');
    assertError(await completions({ prompt: PROMPT, n: 0 }), 400, 'n');
    assertError(await completions({ prompt: PROMPT, logit_bias: { 99999: 1 } }), 400, 'logit_bias');
    assertError(await completions({ prompt: PROMPT, stop: [''] }), 400, 'stop');
    assertError(await completions({ prompt: PROMPT, best_of: 2 }), 400, 'best_of');
    assertError(await completions({ prompt: PROMPT, frobnicate: true }), 400, 'frobnicate');
    assertError(await completions({ prompt: [1, 5000] }), 400, 'prompt');
    assertError(await completions({ max_tokens: 5 }), 400, 'prompt');
    // max_tokens 0 only echoes a prompt; prompt_logprobs (vLLM) is an integer in [0, 20], not streamed.
    assertError(await completions({ prompt: PROMPT, max_tokens: 0 }), 400, 'max_tokens');
    assertError(await completions({ prompt: PROMPT, prompt_logprobs: -1 }), 400, 'prompt_logprobs');
    assertError(await completions({ prompt: PROMPT, prompt_logprobs: 21 }), 400, 'prompt_logprobs');
    assertError(await completions({ prompt: PROMPT, prompt_logprobs: 'all' }), 400, 'prompt_logprobs');
    assertError(await completions({ prompt: PROMPT, prompt_logprobs: 1, stream: true }), 400,
                'prompt_logprobs');
    // NaN cannot be written in JSON; 1e999 overflows the parser: both are rejected.
    assertError(await completions('{"prompt": "x", "temperature": NaN}'), 400);
    assertError(await completions('{"prompt": "x", "temperature": 1e999}'), 400);
  });

  test('400: prompt + max_tokens beyond the context, with the numbers', async () => {
    const e = assertError(await completions({ prompt: PROMPT, max_tokens: 600 }), 400, 'max_tokens');
    assert.match(e.message, /512/);
    assert.match(e.message, /606/);
    const long = 'Once upon a time '.repeat(200);
    const e2 = assertError(await completions({ prompt: long, max_tokens: 4 }), 400);
    assert.match(e2.message, /512/);
  });

  test('400: chat on a model without a chat template says so', async () => {
    const e = assertError(await postJson(server.baseURL, '/v1/chat/completions',
      { model: 'test-model', messages: [{ role: 'user', content: 'hi' }] }), 400);
    assert.match(e.message, /chat template/);
  });

  test('404 unknown route and unknown model; 405 wrong method', async () => {
    assertError(await getJson(server.baseURL, '/v1/nothing-here'), 404);
    assertError(await completions({ model: 'other-model', prompt: PROMPT }), 404, 'model');
    assertError(await getJson(server.baseURL, '/v1/completions'), 405);
    assertError(await postJson(server.baseURL, '/v1/models', {}), 405);
  });

  test('413: body over --max-body-bytes', async () => {
    const e = assertError(await completions({ prompt: 'x'.repeat(70000) }), 413);
    assert.match(e.message, /65536/);
  });

  test('the openai client surfaces these as APIError with status and param', async () => {
    const client = server.client();
    await assert.rejects(client.completions.create({ model: 'test-model', prompt: PROMPT, temperature: -1 }),
      (err) => err instanceof OpenAI.BadRequestError && err.status === 400 && err.param === 'temperature');
  });

  test('after all of that the server still answers correctly', async () => {
    const client = server.client();
    const a = await client.completions.create({ model: 'test-model', prompt: PROMPT, max_tokens: 16, temperature: 0 });
    const b = await client.completions.create({ model: 'test-model', prompt: PROMPT, max_tokens: 16, temperature: 0 });
    assert.equal(a.choices[0].text, b.choices[0].text);
    assert.ok(a.choices[0].text.length > 0);
  });
});

describe('401 with --api-key', { skip: skip ?? false }, () => {
  let server;
  before(async () => { server = await startServer(tinyStoriesDir, ['--api-key', 'sekrit']); });
  after(async () => { await server.stop(); });

  test('every /v1 route needs the bearer key; /health does not', async () => {
    assertError(await postJson(server.baseURL, '/v1/completions', { prompt: PROMPT }), 401);
    assertError(await postJson(server.baseURL, '/v1/completions', { prompt: PROMPT },
      { Authorization: 'Bearer sekrit-not' }), 401);
    assertError(await getJson(server.baseURL, '/v1/models'), 401);
    assert.equal((await getJson(server.baseURL, '/health')).status, 200);
    await assert.rejects(server.client({ apiKey: 'wrong' }).models.list(),
      (err) => err instanceof OpenAI.AuthenticationError);
    const ok = await server.client({ apiKey: 'sekrit' }).completions.create(
      { model: 'test-model', prompt: PROMPT, max_tokens: 4 });
    assert.equal(ok.choices.length, 1);
  });
});

describe('429 when the queue is full', { skip: skip ?? false }, () => {
  let server;
  before(async () => {
    server = await startServer(tinyStoriesDir, ['--max-batch', '1', '--max-queue', '1']);
  });
  after(async () => { await server.stop(); });

  test('excess requests get 429, admitted ones complete, later ones succeed', async () => {
    const body = { model: 'test-model', prompt: PROMPT, max_tokens: 490, temperature: 1.0, logit_bias: { 2: -100 } };
    const results = await Promise.all(Array.from({ length: 8 }, () =>
      postJson(server.baseURL, '/v1/completions', body)));
    const statuses = results.map((r) => r.status);
    assert.ok(statuses.includes(200), statuses.join(','));
    assert.ok(statuses.includes(429), statuses.join(','));
    for (const r of results) {
      if (r.status === 429) assertError(r, 429);
      else assert.equal(r.status, 200);
    }
    const later = await postJson(server.baseURL, '/v1/completions', { ...body, max_tokens: 4 });
    assert.equal(later.status, 200);
  });
});

describe('503 and a clean exit on SIGTERM', { skip: skip ?? false }, () => {
  test('in-flight work finishes within the grace period, the process exits 0', async () => {
    const server = await startServer(tinyStoriesDir, ['--shutdown-grace', '300']);
    const body = { model: 'test-model', prompt: PROMPT, max_tokens: 490, n: 4, temperature: 1.0,
                   seed: 3, logit_bias: { 2: -100 } };
    const pending = postJson(server.baseURL, '/v1/completions', body);
    await waitFor(async () => (await getJson(server.baseURL, '/stats')).json.engine.running_sequences > 0, 5000, 2);
    server.proc.kill('SIGTERM');
    const r = await pending;
    assert.equal(r.status, 200, JSON.stringify(r.json));
    assert.equal(r.json.choices.length, 4);
    for (const c of r.json.choices) assert.equal(c.finish_reason, 'length');
    assert.equal(r.json.usage.completion_tokens, 4 * 490);
    const { code } = await server.exited;
    assert.equal(code, 0);
  });

  test('with --shutdown-grace 0 in-flight work is cancelled with 503, the process exits 0', async () => {
    const server = await startServer(tinyStoriesDir, ['--shutdown-grace', '0']);
    const pending = postJson(server.baseURL, '/v1/completions',
      { model: 'test-model', prompt: PROMPT, max_tokens: 490, n: 8, temperature: 1.0, logit_bias: { 2: -100 } });
    await waitFor(async () => (await getJson(server.baseURL, '/stats')).json.engine.running_sequences > 0, 5000, 2);
    server.proc.kill('SIGTERM');
    const r = await pending;
    assertError(r, 503);
    const { code } = await server.exited;
    assert.equal(code, 0);
  });
});
