// The utility routes as llama.cpp and vLLM clients call them (fetch): POST /tokenize under both
// servers' field names (content / prompt, add_special / add_special_tokens, with_pieces,
// return_token_strs, and vLLM's chat form through the chat template), POST /detokenize, GET
// /version; every bad field a 400 naming it, never a 500; the API key guards them all.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import {
  getJson, missing, postJson, startServer, synthServer, tinyStoriesDir, tokenizersDir,
} from './helpers.mjs';

const qwen3Tokenizer = path.join(tokenizersDir, 'qwen3');

describe('utility routes (tinystories-656k)', { skip: missing(tinyStoriesDir) ?? false }, () => {
  let server;
  before(async () => { server = await startServer(tinyStoriesDir); });
  after(async () => { await server.stop(); });

  test('/tokenize: llama.cpp content adds no special tokens, vLLM prompt does', async () => {
    const llama = await postJson(server.baseURL, '/tokenize', { content: 'Once upon a time' });
    assert.equal(llama.status, 200, llama.text);
    assert.equal(llama.json.count, llama.json.tokens.length);
    assert.equal(llama.json.max_model_len, 512);
    const vllm = await postJson(server.baseURL, '/tokenize', { model: 'test-model', prompt: 'Once upon a time' });
    assert.deepEqual(vllm.json.tokens, [1, ...llama.json.tokens]);
    const withSpecial = await postJson(server.baseURL, '/tokenize', { content: 'Once upon a time', add_special: true });
    assert.deepEqual(withSpecial.json.tokens, vllm.json.tokens);
    const without = await postJson(server.baseURL, '/tokenize', { prompt: 'Once upon a time', add_special_tokens: false });
    assert.deepEqual(without.json.tokens, llama.json.tokens);
    const strs = await postJson(server.baseURL, '/tokenize', { prompt: 'Once', return_token_strs: true });
    assert.equal(strs.json.token_strs.length, strs.json.tokens.length);
    assert.equal(strs.json.token_strs[0], '<|start_story|>');
  });

  test('/tokenize: with_pieces and parse_special (llama.cpp)', async () => {
    const pieces = await postJson(server.baseURL, '/tokenize', { content: 'Once upon', with_pieces: true });
    assert.equal(pieces.status, 200, pieces.text);
    assert.equal(pieces.json.tokens.map((t) => t.piece).join(''), ' Once upon');
    assert.ok(pieces.json.tokens.every((t) => Number.isInteger(t.id)));
    const parsed = await postJson(server.baseURL, '/tokenize', { content: '<|start_story|>Once' });
    assert.equal(parsed.json.tokens[0], 1);
    const literal = await postJson(server.baseURL, '/tokenize', { content: '<|start_story|>Once', parse_special: false });
    assert.notEqual(literal.json.tokens[0], 1);
  });

  test('/detokenize round-trips; /version', async () => {
    const tok = await postJson(server.baseURL, '/tokenize', { content: 'The cat sat on the mat.' });
    const de = await postJson(server.baseURL, '/detokenize', { tokens: tok.json.tokens });
    assert.equal(de.status, 200, de.text);
    assert.equal(de.json.content, 'The cat sat on the mat.');
    assert.equal(de.json.prompt, de.json.content);
    const empty = await postJson(server.baseURL, '/detokenize', { tokens: [] });
    assert.equal(empty.json.content, '');
    const v = await getJson(server.baseURL, '/version');
    assert.equal(v.status, 200);
    assert.match(v.json.version, /^\d+\.\d+\.\d+/);
  });

  test('every bad field is a 400 naming it; wrong methods 405', async () => {
    const cases = [
      ['/tokenize', {}, 'messages'],
      ['/tokenize', { content: 5 }, 'content'],
      ['/tokenize', { content: 'a', prompt: 'b' }, 'content'],
      ['/tokenize', { content: 'a', add_special: 'yes' }, 'add_special'],
      ['/tokenize', { content: 'a', add_special: true, add_special_tokens: false }, 'add_special_tokens'],
      ['/tokenize', { content: 'a', with_pieces: 1 }, 'with_pieces'],
      ['/tokenize', { content: 'a', add_generation_prompt: true }, 'add_generation_prompt'],
      ['/tokenize', { content: 'a', nonsense: 1 }, 'nonsense'],
      ['/tokenize', { messages: [{ role: 'user', content: 'hi' }] }, 'messages'],  // no chat template
      ['/detokenize', {}, 'tokens'],
      ['/detokenize', { tokens: 'abc' }, 'tokens'],
      ['/detokenize', { tokens: [1, -1] }, 'tokens'],
      ['/detokenize', { tokens: [1, 2.5] }, 'tokens'],
      ['/detokenize', { tokens: [1, 1e12] }, 'tokens'],
      ['/detokenize', { tokens: [1], skip_special_tokens: 'no' }, 'skip_special_tokens'],
    ];
    for (const [route, body, param] of cases) {
      const r = await postJson(server.baseURL, route, body);
      assert.equal(r.status, 400, `${route} ${JSON.stringify(body)}: ${r.text}`);
      assert.equal(r.json.error.param, param, `${route} ${JSON.stringify(body)}`);
    }
    for (const route of ['/tokenize', '/detokenize']) {
      assert.equal((await postJson(server.baseURL, route, '[1,')).status, 400);
      assert.equal((await postJson(server.baseURL, route, '[]')).status, 400);
      assert.equal((await getJson(server.baseURL, route)).status, 405);
    }
    assert.equal((await postJson(server.baseURL, '/version', {})).status, 405);
    const foreign = await postJson(server.baseURL, '/tokenize', { content: 'a', model: 'other' });
    assert.equal(foreign.status, 404);
  });

  test('the routes are counted per route in /metrics', async () => {
    const text = await (await fetch(server.baseURL + '/metrics')).text();
    assert.match(text, /route="\/tokenize"/);
    assert.match(text, /route="\/version"/);
  });
});

describe('utility routes behind an API key', { skip: missing(tinyStoriesDir) ?? false }, () => {
  let server;
  before(async () => { server = await startServer(tinyStoriesDir, ['--api-key', 'k3y']); });
  after(async () => { await server.stop(); });

  test('401 without the key on every route, 200 with it', async () => {
    const auth = { Authorization: 'Bearer k3y' };
    for (const [route, body] of [['/tokenize', { content: 'a' }], ['/detokenize', { tokens: [5] }]]) {
      assert.equal((await postJson(server.baseURL, route, body)).status, 401, route);
      assert.equal((await postJson(server.baseURL, route, body, auth)).status, 200, route);
    }
    assert.equal((await fetch(server.baseURL + '/version')).status, 401);
    assert.equal((await fetch(server.baseURL + '/version', { headers: auth })).status, 200);
  });
});

describe('/tokenize chat form (ember synth qwen3-shaped model + qwen3 tokenizer)', { skip: missing(qwen3Tokenizer) ?? false }, () => {
  let server;
  synthServer('tiny-qwen3', qwen3Tokenizer, ['--max-batch', '4'], async (s) => {
    server = s;
  });

  test('messages render through the chat template: the count equals chat usage.prompt_tokens', async () => {
    const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hello <|im_end|> there' }];
    const tok = await postJson(server.baseURL, '/tokenize', { model: 'test-model', messages,
                                                              chat_template_kwargs: { enable_thinking: false } });
    assert.equal(tok.status, 200, tok.text);
    const chat = await postJson(server.baseURL, '/v1/chat/completions', {
      messages, max_tokens: 1, temperature: 0, chat_template_kwargs: { enable_thinking: false } });
    assert.equal(chat.status, 200, chat.text);
    assert.equal(tok.json.count, chat.json.usage.prompt_tokens);
    // The client's "<|im_end|>" stayed text: exactly the template's own markers are special.
    const imEnd = (await postJson(server.baseURL, '/tokenize', { content: '<|im_end|>' })).json.tokens;
    assert.equal(imEnd.length, 1);
    assert.equal(tok.json.tokens.filter((id) => id === imEnd[0]).length, 2);  // system + user turns
    const de = await postJson(server.baseURL, '/detokenize', { tokens: tok.json.tokens });
    assert.match(de.json.content, /^<\|im_start\|>system\nBe brief\.<\|im_end\|>/);
    const skipped = await postJson(server.baseURL, '/detokenize', { tokens: tok.json.tokens, skip_special_tokens: true });
    assert.doesNotMatch(skipped.json.content, /<\|im_start\|>/);
    const noPrompt = await postJson(server.baseURL, '/tokenize', { messages, add_generation_prompt: false,
                                                                   chat_template_kwargs: { enable_thinking: false } });
    assert.ok(noPrompt.json.count < tok.json.count);
    const bad = await postJson(server.baseURL, '/tokenize', { messages: [{ role: 'user' }] });
    assert.equal(bad.status, 400);
    assert.match(bad.json.error.param, /^messages/);
    const parse = await postJson(server.baseURL, '/tokenize', { messages, parse_special: true });
    assert.equal(parse.json.error.param, 'parse_special');
    const cont = await postJson(server.baseURL, '/tokenize', { messages, continue_final_message: true });
    assert.equal(cont.json.error.param, 'continue_final_message');
  });
});
