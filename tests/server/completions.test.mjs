// /v1/completions against the real TinyStories-656K model, driven by the official openai client:
// greedy non-streaming vs streaming, n, stop strings, logprobs, seeds (alone and under load),
// 32 concurrent identical requests, prompt forms, echo, echo + logprobs (prompt logprobs, also
// vLLM's prompt_logprobs), cancellation mid-stream.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { getJson, missing, postJson, startServer, tinyStoriesDir, waitFor } from './helpers.mjs';

const skip = missing(tinyStoriesDir);
const PROMPT = 'Once upon a time';

describe('completions (tinystories-656k)', { skip: skip ?? false }, () => {
  let server, client;
  before(async () => {
    server = await startServer(tinyStoriesDir);
    client = server.client();
  });
  after(async () => {
    const { code } = await server.stop();
    assert.equal(code, 0, 'SIGTERM must exit 0');
  });

  const greedy = (extra = {}) => client.completions.create({
    model: 'test-model', prompt: PROMPT, max_tokens: 48, temperature: 0, ...extra });

  async function streamText(params) {
    const stream = await client.completions.create({ ...params, stream: true });
    const texts = {};
    const finish = {};
    let usage = null;
    for await (const chunk of stream) {
      assert.equal(chunk.object, 'text_completion');
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        texts[c.index] = (texts[c.index] ?? '') + c.text;
        if (c.finish_reason) finish[c.index] = c.finish_reason;
      }
    }
    return { texts, finish, usage };
  }

  test('non-streaming greedy completion has OpenAI shape and usage', async () => {
    const r = await greedy();
    assert.match(r.id, /^cmpl-/);
    assert.equal(r.object, 'text_completion');
    assert.equal(r.model, 'test-model');
    assert.equal(typeof r.created, 'number');
    assert.equal(r.choices.length, 1);
    assert.equal(r.choices[0].index, 0);
    assert.ok(r.choices[0].text.length > 20, r.choices[0].text);
    assert.ok(['length', 'stop'].includes(r.choices[0].finish_reason));
    assert.equal(r.usage.prompt_tokens, 6);  // BOS + 5 tokens (tokenizer golden)
    assert.ok(r.usage.completion_tokens > 0 && r.usage.completion_tokens <= 48);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
    assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
  });

  test('streamed text equals non-streamed text at temperature 0', async () => {
    const solo = await greedy();
    const s = await streamText({ model: 'test-model', prompt: PROMPT, max_tokens: 48,
                                 temperature: 0, stream_options: { include_usage: true } });
    assert.equal(s.texts[0], solo.choices[0].text);
    assert.equal(s.finish[0], solo.choices[0].finish_reason);
    assert.deepEqual(s.usage.completion_tokens, solo.usage.completion_tokens);
    assert.equal(s.usage.prompt_tokens, 6);
  });

  test('n returns n indexed choices; greedy samples agree', async () => {
    const r = await greedy({ n: 3 });
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
    const solo = await greedy();
    for (const c of r.choices) assert.equal(c.text, solo.choices[0].text);
    const s = await streamText({ model: 'test-model', prompt: PROMPT, max_tokens: 16, n: 2,
                                 temperature: 1.0, seed: 7 });
    assert.deepEqual(Object.keys(s.texts).sort(), ['0', '1']);
  });

  test('stop strings cut the text exactly and never leak (also streaming)', async () => {
    const full = (await greedy()).choices[0].text;
    // A stop string from the middle of the greedy continuation, spanning several tokens.
    const start = Math.floor(full.length / 2);
    const stop = full.slice(start, start + 7);
    const expected = full.slice(0, full.indexOf(stop));
    const r = await greedy({ stop: [stop, 'zzzz-never'] });
    assert.equal(r.choices[0].text, expected);
    assert.equal(r.choices[0].finish_reason, 'stop');
    const s = await streamText({ model: 'test-model', prompt: PROMPT, max_tokens: 48,
                                 temperature: 0, stop });
    assert.equal(s.texts[0], expected);
    assert.equal(s.finish[0], 'stop');
    assert.ok(!s.texts[0].includes(stop));
  });

  test('logprobs: one entry per token, chosen greedy token is the top alternative', async () => {
    const r = await greedy({ max_tokens: 12, logprobs: 3 });
    const lp = r.choices[0].logprobs;
    assert.equal(lp.tokens.length, r.usage.completion_tokens);
    assert.equal(lp.token_logprobs.length, lp.tokens.length);
    assert.equal(lp.tokens.join(''), r.choices[0].text);
    for (let i = 0; i < lp.tokens.length; i++) {
      assert.ok(lp.token_logprobs[i] <= 0);
      const alts = Object.values(lp.top_logprobs[i]);
      assert.ok(alts.length >= 1 && alts.length <= 3);
      assert.ok(Math.abs(Math.max(...alts) - lp.token_logprobs[i]) < 1e-4);
    }
    assert.equal(lp.text_offset[0], 0);
  });

  test('a seed reproduces a sampled completion, alone and under concurrent load', async () => {
    const params = { model: 'test-model', prompt: PROMPT, max_tokens: 32, temperature: 1.0, seed: 1234 };
    const a = await client.completions.create(params);
    const b = await client.completions.create(params);
    assert.equal(a.choices[0].text, b.choices[0].text);
    const c = await client.completions.create({ ...params, seed: 99 });
    assert.notEqual(c.choices[0].text, a.choices[0].text);
    const load = [];
    for (let i = 0; i < 12; i++) {
      load.push(client.completions.create(i % 2 === 0 ? params
        : { ...params, seed: 5000 + i, prompt: `Tom had a ${i} red balls` }));
    }
    const results = await Promise.all(load);
    for (let i = 0; i < results.length; i += 2) assert.equal(results[i].choices[0].text, a.choices[0].text);
  });

  test('32 concurrent identical greedy requests all equal the solo output', async () => {
    const solo = (await greedy()).choices[0].text;
    const results = await Promise.all(Array.from({ length: 32 }, () => greedy()));
    for (const r of results) assert.equal(r.choices[0].text, solo);
  });

  test('ignore_eos and min_tokens (vLLM extensions) generate past the EOS', async () => {
    // Greedy TinyStories ends its story with EOS well inside 400 tokens.
    const free = await greedy({ max_tokens: 400 });
    assert.equal(free.choices[0].finish_reason, 'stop');
    const k = free.usage.completion_tokens;  // includes the EOS token
    const through = await greedy({ max_tokens: k + 10, ignore_eos: true });
    assert.equal(through.choices[0].finish_reason, 'length');
    assert.equal(through.usage.completion_tokens, k + 10);
    assert.ok(through.choices[0].text.startsWith(free.choices[0].text));
    const floor = await greedy({ max_tokens: 400, min_tokens: k + 5 });
    assert.ok(floor.usage.completion_tokens >= k + 5, `${floor.usage.completion_tokens}`);
    const bad = await postJson(server.baseURL, '/v1/completions',
                               { prompt: PROMPT, max_tokens: 4, min_tokens: 5 });
    assert.equal(bad.status, 400);
    assert.equal(bad.json.error.param, 'min_tokens');
  });

  test('prompt as token ids, a batch of prompts, and echo', async () => {
    const byText = await greedy({ max_tokens: 16 });
    const byIds = await greedy({ max_tokens: 16, prompt: [1, 80, 147, 201, 282, 57] });
    assert.equal(byIds.choices[0].text, byText.choices[0].text);
    const batch = await greedy({ max_tokens: 8, prompt: [PROMPT, 'The dog'], n: 2 });
    assert.deepEqual(batch.choices.map((c) => c.index), [0, 1, 2, 3]);
    assert.equal(batch.choices[0].text, batch.choices[1].text);
    assert.equal(batch.usage.prompt_tokens, 6 + (await greedy({ prompt: 'The dog', max_tokens: 1 })).usage.prompt_tokens);
    const echo = await greedy({ max_tokens: 16, echo: true });
    assert.equal(echo.choices[0].text, PROMPT + byText.choices[0].text);
  });

  test('echo + logprobs score the prompt (lm-eval style), streamed as in the body', async () => {
    const params = { model: 'test-model', prompt: PROMPT, max_tokens: 4, temperature: 0, echo: true,
                     logprobs: 2 };
    const r = await client.completions.create(params);
    const c = r.choices[0];
    assert.ok(c.text.startsWith(PROMPT), c.text);
    const lp = c.logprobs;
    assert.equal(lp.tokens.length, 6 + r.usage.completion_tokens);  // BOS + 5 prompt tokens first
    assert.equal(lp.token_logprobs[0], null);
    assert.equal(lp.top_logprobs[0], null);
    for (let i = 1; i < lp.tokens.length; i++) {
      assert.ok(lp.token_logprobs[i] <= 0);
      const alts = Object.values(lp.top_logprobs[i]);
      assert.ok(alts.length >= 1 && alts.length <= 2);
      assert.ok(Math.max(...alts) >= lp.token_logprobs[i]);
    }
    const generated = lp.text_offset.slice(6);
    assert.equal(generated[0], PROMPT.length);  // the completion's tokens start after the echo

    const stream = await client.completions.create({ ...params, stream: true });
    const got = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
    let text = '';
    let first = null;
    for await (const chunk of stream) {
      for (const ch of chunk.choices) {
        if (first === null && ch.text) first = ch;
        text += ch.text;
        if (!ch.logprobs) continue;
        for (const k of Object.keys(got)) got[k].push(...ch.logprobs[k]);
      }
    }
    assert.ok(first.text.startsWith(PROMPT));  // the first chunk: the echo and the prompt's entries
    assert.ok(first.logprobs.tokens.length >= 6);
    assert.equal(text, c.text);
    for (const k of Object.keys(got)) assert.deepEqual(got[k].slice(0, 6), lp[k].slice(0, 6), k);
    assert.deepEqual(got, { tokens: lp.tokens, token_logprobs: lp.token_logprobs,
                            top_logprobs: lp.top_logprobs, text_offset: lp.text_offset });

    // max_tokens 0: the prompt alone, the same prompt entries, no completion tokens.
    const only = await client.completions.create({ ...params, max_tokens: 0 });
    assert.equal(only.choices[0].text, PROMPT);
    assert.equal(only.choices[0].finish_reason, 'length');
    assert.equal(only.usage.completion_tokens, 0);
    assert.deepEqual(only.choices[0].logprobs.token_logprobs, lp.token_logprobs.slice(0, 6));
  });

  test('prompt_logprobs (vLLM extension) on each choice', async () => {
    const r = await postJson(server.baseURL, '/v1/completions',
      { model: 'test-model', prompt: [1, 80, 147, 201, 282, 57], max_tokens: 1, prompt_logprobs: 1 });
    assert.equal(r.status, 200, r.text);
    const list = r.json.choices[0].prompt_logprobs;
    assert.equal(list.length, 6);
    assert.equal(list[0], null);
    for (const [p, id] of [[1, 80], [2, 147], [5, 57]]) {
      const own = list[p][String(id)];
      assert.ok(own.logprob <= 0 && own.rank >= 1 && typeof own.decoded_token === 'string');
    }
  });

  test('cancelling mid-stream frees the sequence; the server stays healthy', async () => {
    const before = (await getJson(server.baseURL, '/stats')).json;
    const controller = new AbortController();
    const stream = await client.completions.create(
      { model: 'test-model', prompt: PROMPT, max_tokens: 490, n: 8, temperature: 1.0, logit_bias: { 2: -100 }, stream: true,
        stream_options: { include_usage: true } },
      { signal: controller.signal });
    let chunks = 0;
    try {
      for await (const chunk of stream) {
        assert.ok(chunk.choices);
        if (++chunks === 3) controller.abort();
      }
    } catch (err) {
      assert.match(String(err?.name), /Abort/);  // some client versions end the loop instead
    }
    assert.ok(chunks < 100, `the stream must end soon after the abort (${chunks} chunks)`);
    const freed = await waitFor(async () => {
      const s = (await getJson(server.baseURL, '/stats')).json;
      return s.engine.running_sequences === 0 &&
             s.engine.requests_cancelled > before.engine.requests_cancelled;
    }, 3000);
    assert.ok(freed, 'the cancelled stream must leave the running batch');
    const health = await getJson(server.baseURL, '/health');
    assert.equal(health.status, 200);
    const after = await greedy({ max_tokens: 8 });
    assert.ok(after.choices[0].text.length > 0);
  });

  test('a non-streaming request whose client disconnects is cancelled', async () => {
    const before = (await getJson(server.baseURL, '/stats')).json;
    const controller = new AbortController();
    const pending = client.completions.create(
      { model: 'test-model', prompt: PROMPT, max_tokens: 490, n: 8, temperature: 1.0, logit_bias: { 2: -100 } },
      { signal: controller.signal });
    // Abort once the engine is running it (8 x 490 tokens take far longer than this poll).
    await waitFor(async () => (await getJson(server.baseURL, '/stats')).json.engine.running_sequences > 0, 5000, 2);
    controller.abort();
    await assert.rejects(pending);
    const freed = await waitFor(async () => {
      const s = (await getJson(server.baseURL, '/stats')).json;
      return s.engine.running_sequences === 0 &&
             s.engine.requests_cancelled > before.engine.requests_cancelled;
    }, 3000);
    assert.ok(freed, 'the abandoned request must be cancelled');
  });

  test('/v1/models, /health, /metrics and /stats', async () => {
    const models = await client.models.list();
    const m = models.data[0];
    assert.equal(m.id, 'test-model');
    assert.equal(m.object, 'model');
    assert.equal(m.context_length, 512);
    assert.equal(m.capabilities.streaming, true);
    assert.equal(m.capabilities.chat_completions, false);  // no chat template
    assert.equal(m.capabilities.embeddings, true);  // a decoder: last-token pooling (serve/README.md)
    assert.match(m.ember_version, /^\d+\.\d+\.\d+$/);
    assert.ok(Number.isInteger(m.uptime_s) && m.uptime_s >= 0, `uptime_s ${m.uptime_s}`);
    assert.equal((await getJson(server.baseURL, '/health')).json.status, 'ok');
    const metrics = await (await fetch(server.baseURL + '/metrics')).text();
    for (const name of ['ember_http_requests_total', 'ember_queue_depth', 'ember_running_sequences',
      'ember_kv_cache_usage_ratio', 'ember_prefix_cache_hit_ratio',
      'ember_time_to_first_token_seconds_bucket', 'ember_inter_token_latency_seconds_count',
      'ember_generation_tokens_total']) {
      assert.ok(metrics.includes(name), name);
    }
    const stats = (await getJson(server.baseURL, '/stats')).json;
    assert.ok(stats.tokens.generated > 0);
    assert.ok(stats.latency_seconds.time_to_first_token.count > 0);
    assert.equal(stats.context_length, 512);
    // The engine's limits in force: the CPU's defaults (the flags' 0s resolved).
    assert.equal(stats.max_batch, 64);
    assert.equal(stats.max_step_tokens, 512);
  });
});
