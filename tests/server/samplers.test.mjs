// llama.cpp's samplers on the OpenAI routes against the real TinyStories-656K model: XTC, DRY,
// typical_p and top_n_sigma are accepted on completions and chat, seeded outputs repeat, DRY
// changes a greedy continuation that repeats itself, and bad values are 400s naming the field.
// On a synth model with qwen3's vocabulary (which can spell JSON): DRY's breaker strings resolved
// by the real tokenizer, and a JSON schema whose anyOf branches start alike.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import {
  missing, postJson, startServer, synthServer, tinyStoriesDir, tokenizersDir,
} from './helpers.mjs';

const skip = missing(tinyStoriesDir);
const qwen3Tokenizer = path.join(tokenizersDir, 'qwen3');
const PROMPT = 'Once upon a time';

describe('llama.cpp samplers (tinystories-656k)', { skip: skip ?? false }, () => {
  let server, client;
  before(async () => {
    server = await startServer(tinyStoriesDir);
    client = server.client();
  });
  after(async () => {
    const { code } = await server.stop();
    assert.equal(code, 0, 'SIGTERM must exit 0');
  });

  const all = {
    temperature: 1, seed: 17, top_n_sigma: 2, typical_p: 0.95, xtc_probability: 0.5,
    xtc_threshold: 0.1, dry_multiplier: 0.8, dry_base: 1.75, dry_allowed_length: 2,
    dry_penalty_last_n: 64, dry_sequence_breakers: ['\n', '.'],
  };

  test('every sampler at once: accepted, seeded, repeatable', async () => {
    const a = await client.completions.create({ model: 'test-model', prompt: PROMPT, max_tokens: 40, ...all });
    const b = await client.completions.create({ model: 'test-model', prompt: PROMPT, max_tokens: 40, ...all });
    assert.ok(a.choices[0].text.length > 0);
    assert.equal(a.choices[0].text, b.choices[0].text);
    const other = await client.completions.create({ model: 'test-model', prompt: PROMPT, max_tokens: 40,
                                                    ...all, seed: 18 });
    assert.notEqual(other.choices[0].text, a.choices[0].text);
    // The chat route reads the same fields (this model has no chat template: the parse passes,
    // then the route refuses for the template, not for a field; a bad field is named first).
    const messages = [{ role: 'user', content: 'Tell a story' }];
    const chat = await postJson(server.baseURL, '/v1/chat/completions',
                                { model: 'test-model', messages, max_tokens: 20, ...all });
    assert.equal(chat.json.error.code, 'no_chat_template', JSON.stringify(chat.json));
    const bad = await postJson(server.baseURL, '/v1/chat/completions',
                               { model: 'test-model', messages, ...all, dry_base: 11 });
    assert.equal(bad.status, 400);
    assert.equal(bad.json.error.param, 'dry_base');
  });

  test('DRY changes a greedy continuation that repeats itself', async () => {
    const base = { model: 'test-model', prompt: PROMPT, max_tokens: 96, temperature: 0 };
    const plain = await client.completions.create(base);
    const dry = await client.completions.create({ ...base, dry_multiplier: 4, dry_allowed_length: 1,
                                                  dry_sequence_breakers: [] });
    assert.notEqual(dry.choices[0].text, plain.choices[0].text);
    // Repeated word trigrams: DRY leaves no more of them than plain greedy decoding.
    const repeats = (text) => {
      const words = text.split(/\s+/).filter(Boolean);
      const seen = new Set();
      let count = 0;
      for (let i = 0; i + 3 <= words.length; ++i) {
        const key = words.slice(i, i + 3).join(' ');
        if (seen.has(key)) ++count;
        seen.add(key);
      }
      return count;
    };
    assert.ok(repeats(dry.choices[0].text) <= repeats(plain.choices[0].text),
              `${dry.choices[0].text}\n---\n${plain.choices[0].text}`);
  });

  test('bad values are 400s naming the field', async () => {
    const cases = [
      [{ xtc_threshold: 0.7 }, 'xtc_threshold'],
      [{ xtc_probability: 'often' }, 'xtc_probability'],
      [{ temperature: 0, xtc_probability: 0.5 }, 'xtc_probability'],
      [{ temperature: 0, typical_p: 0.5 }, 'typical_p'],
      [{ typical_p: 0 }, 'typical_p'],
      [{ top_n_sigma: -2 }, 'top_n_sigma'],
      [{ dry_multiplier: -1 }, 'dry_multiplier'],
      [{ dry_base: 0.5 }, 'dry_base'],
      [{ dry_allowed_length: 0 }, 'dry_allowed_length'],
      [{ dry_penalty_last_n: -7 }, 'dry_penalty_last_n'],
      [{ dry_sequence_breakers: [1] }, 'dry_sequence_breakers[0]'],
      [{ dry_sequence_breakers: new Array(33).fill('x') }, 'dry_sequence_breakers'],
    ];
    for (const [fields, param] of cases) {
      const r = await postJson(server.baseURL, '/v1/completions',
                               { model: 'test-model', prompt: PROMPT, max_tokens: 4, ...fields });
      assert.equal(r.status, 400, JSON.stringify(fields));
      assert.equal(r.json.error.param, param, JSON.stringify(r.json));
      assert.ok(r.json.error.message.includes(param.replace(/\[0\]$/, '')), r.json.error.message);
    }
  });
});

describe('samplers and look-alike unions (ember synth qwen3-shaped model + qwen3 tokenizer)',
         { skip: missing(qwen3Tokenizer) ?? false }, () => {
  let server, client;
  synthServer('tiny-qwen3', qwen3Tokenizer, ['--max-batch', '4'], async (s) => {
    server = s;
    client = server.client();
  });

  test('DRY with the default breakers (resolved by the tokenizer) is seeded and repeatable', async () => {
    const params = { model: 'test-model', prompt: 'a: b: a: b: a:', max_tokens: 24, temperature: 1, seed: 5,
                     dry_multiplier: 2, xtc_probability: 0.5, typical_p: 0.9 };
    const a = await client.completions.create(params);
    const b = await client.completions.create(params);
    assert.equal(a.choices[0].text, b.choices[0].text);
    assert.equal(a.usage.completion_tokens, 24);
  });

  test('a JSON schema whose anyOf branches start alike is served, and outputs match a branch', async () => {
    const circle = { type: 'object', properties: { kind: { const: 'circle' }, r: { type: 'integer', minimum: 0, maximum: 99 } },
                     required: ['kind', 'r'], additionalProperties: false };
    const rect = { type: 'object', properties: { kind: { const: 'rect' }, w: { type: 'integer', minimum: 0, maximum: 9 },
                                                 h: { type: 'integer', minimum: 0, maximum: 9 } },
                   required: ['kind', 'w', 'h'], additionalProperties: false };
    const schema = { type: 'object', properties: { v: { anyOf: [circle, rect] } }, required: ['v'],
                     additionalProperties: false };
    let finished = 0;
    const kinds = new Set();
    for (let seed = 1; seed <= 8; ++seed) {
      const r = await client.completions.create({ model: 'test-model', prompt: 'JSON:', temperature: 1, seed,
                                                  max_tokens: 120, json_schema: schema });
      if (r.choices[0].finish_reason !== 'stop') continue;
      ++finished;
      const v = JSON.parse(r.choices[0].text).v;
      kinds.add(v.kind);
      if (v.kind === 'circle') {
        assert.deepEqual(Object.keys(v), ['kind', 'r'], r.choices[0].text);
        assert.ok(Number.isInteger(v.r) && v.r >= 0 && v.r <= 99, r.choices[0].text);
      } else {
        assert.equal(v.kind, 'rect', r.choices[0].text);
        assert.deepEqual(Object.keys(v), ['kind', 'w', 'h'], r.choices[0].text);
        assert.ok([v.w, v.h].every((x) => Number.isInteger(x) && x >= 0 && x <= 9), r.choices[0].text);
      }
    }
    assert.ok(finished >= 4, `only ${finished} of 8 finished`);
  });
});
