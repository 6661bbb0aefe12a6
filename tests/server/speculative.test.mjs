// Speculative decoding through `ember serve --spec-method ngram` on the real TinyStories-656K
// model, driven by the official openai client: a copy-heavy prompt gives the same greedy text with
// speculation on and off (the request's `speculative_decoding: false`), usage reports the drafted
// tokens under completion_tokens_details (accepted_prediction_tokens, rejected_prediction_tokens)
// only when speculation ran, a streamed response's usage chunk too, /stats and /metrics report the
// counters, and a server without speculation adds no such field. JSON-schema output with
// speculation (a qwen3-shaped synth model with qwen3's tokenizer) is valid and the same as without.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import {
  getJson, missing, startServer, synthServer, tinyStoriesDir, tokenizersDir,
} from './helpers.mjs';

const skip = missing(tinyStoriesDir);

function copyHeavyPrompt() {
  const golden = JSON.parse(fs.readFileSync(path.join(tinyStoriesDir, 'golden.json'), 'utf8'));
  const story = golden.prompts[0].full_text;
  return `${story}\n${story}\nOnce upon a time`;
}

describe('speculative decoding (tinystories-656k)', { skip: skip ?? false }, () => {
  let server, client;
  const prompt = skip ? '' : copyHeavyPrompt();
  before(async () => {
    server = await startServer(tinyStoriesDir, ['--spec-method', 'ngram', '--num-spec-tokens', '4']);
    client = server.client();
  });
  after(async () => {
    const { code } = await server.stop();
    assert.equal(code, 0, 'SIGTERM must exit 0');
  });

  const complete = (extra = {}) => client.completions.create({
    model: 'test-model', prompt, max_tokens: 96, temperature: 0, ignore_eos: true, ...extra });

  test('same text with and without speculation; usage details only when it ran', async () => {
    const on = await complete();
    const off = await complete({ speculative_decoding: false });
    assert.equal(on.choices[0].text, off.choices[0].text);
    assert.equal(on.usage.completion_tokens, 96);
    const details = on.usage.completion_tokens_details;
    assert.ok(details, JSON.stringify(on.usage));
    assert.equal(typeof details.accepted_prediction_tokens, 'number');
    assert.equal(typeof details.rejected_prediction_tokens, 'number');
    assert.ok(details.accepted_prediction_tokens > 0, JSON.stringify(details));
    assert.equal(off.usage.completion_tokens_details, undefined, JSON.stringify(off.usage));
  });

  test('seeded sampling is the same with and without speculation', async () => {
    const params = { temperature: 0.8, top_p: 0.95, seed: 1234, frequency_penalty: 0.2 };
    const on = await complete(params);
    const off = await complete({ ...params, speculative_decoding: false });
    assert.equal(on.choices[0].text, off.choices[0].text);
  });

  test('a streamed response carries the details in its usage chunk', async () => {
    const stream = await client.completions.create({
      model: 'test-model', prompt, max_tokens: 64, temperature: 0, ignore_eos: true,
      stream: true, stream_options: { include_usage: true } });
    let usage = null;
    for await (const chunk of stream) if (chunk.usage) usage = chunk.usage;
    assert.ok(usage?.completion_tokens_details, JSON.stringify(usage));
    assert.equal(usage.completion_tokens, 64);
  });

  test('a bad speculative_decoding value is refused naming the field', async () => {
    await assert.rejects(complete({ speculative_decoding: 'no' }), (err) => {
      assert.equal(err.status, 400);
      assert.match(err.message, /speculative_decoding/);
      return true;
    });
  });

  test('/stats and /metrics report drafted and accepted tokens', async () => {
    const stats = await getJson(server.baseURL, '/stats');
    const spec = stats.json.speculative;
    assert.ok(spec, JSON.stringify(stats.json).slice(0, 400));
    assert.ok(spec.draft_tokens > 0);
    assert.ok(spec.accepted_tokens > 0);
    assert.ok(spec.acceptance_rate > 0 && spec.acceptance_rate <= 1);
    assert.ok(spec.tokens_per_target_step > 1);
    const metrics = await fetch(`${server.baseURL}/metrics`).then((r) => r.text());
    assert.match(metrics, /ember_spec_draft_tokens_total \d+/);
    assert.match(metrics, /ember_spec_accepted_tokens_total \d+/);
    assert.match(metrics, /ember_tokens_per_target_step /);
  });
});

describe('no speculation (tinystories-656k)', { skip: skip ?? false }, () => {
  let server, client;
  before(async () => {
    server = await startServer(tinyStoriesDir);
    client = server.client();
  });
  after(async () => { await server.stop(); });

  test('usage has no completion_tokens_details', async () => {
    const r = await client.completions.create({
      model: 'test-model', prompt: 'Once upon a time', max_tokens: 16, temperature: 0 });
    assert.equal(r.usage.completion_tokens_details, undefined, JSON.stringify(r.usage));
  });
});

const qwen3Tokenizer = path.join(tokenizersDir, 'qwen3');

describe('speculative decoding + JSON schema (synth qwen3)', { skip: missing(qwen3Tokenizer) ?? false }, () => {
  let server, client;
  synthServer('tiny-qwen3', qwen3Tokenizer, ['--max-batch', '4', '--spec-method', 'ngram'], async (s) => {
    server = s;
    client = server.client();
  });

  test('the output is valid against the schema and equal to the output without speculation', async () => {
    const schema = { type: 'object', additionalProperties: false, required: ['ok', 'count', 'color'],
                     properties: { ok: { type: 'boolean' }, count: { type: 'integer' },
                                   color: { enum: ['red', 'green'] },
                                   list: { type: 'array', items: { type: 'integer' }, maxItems: 3 } } };
    let drafted = 0;
    for (const seed of [7, 8, 9]) {
      // Random weights: nudge '}' and ',' (qwen3 ids 92, 11) so that the object closes in time.
      const params = { model: 'test-model', prompt: 'JSON: {"ok": true, "count": 3, "color": "red"} JSON:',
                       temperature: 1, seed, max_tokens: 300, logit_bias: { 92: 30, 11: 30 },
                       response_format: { type: 'json_schema', json_schema: { name: 'a', schema, strict: true } } };
      const on = await client.completions.create(params);
      const off = await client.completions.create({ ...params, speculative_decoding: false });
      assert.equal(on.choices[0].finish_reason, 'stop', on.choices[0].text);
      assert.equal(on.choices[0].text, off.choices[0].text);
      const value = JSON.parse(on.choices[0].text);
      assert.equal(typeof value.ok, 'boolean');
      assert.ok(Number.isInteger(value.count));
      assert.ok(['red', 'green'].includes(value.color));
      const d = on.usage.completion_tokens_details;
      drafted += d.accepted_prediction_tokens + d.rejected_prediction_tokens;
    }
    assert.ok(drafted > 0, 'nothing was drafted: the test tests nothing');
  });
});
