// llama.cpp's samplers on the OpenAI routes against the real TinyStories-656K model: XTC, DRY,
// typical_p and top_n_sigma are accepted on completions and chat, seeded outputs repeat, DRY
// changes a greedy continuation that repeats itself, and bad values are 400s naming the field.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { missing, postJson, startServer, tinyStoriesDir } from './helpers.mjs';

const skip = missing(tinyStoriesDir);
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
