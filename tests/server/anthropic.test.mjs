// Anthropic Messages (/v1/messages, /v1/messages/count_tokens) end to end with the official
// @anthropic-ai/sdk client: plain and streamed replies (the whole event sequence), system prompts,
// stop_sequences, max_tokens, count_tokens, Anthropic-shaped errors naming the field (the SDK's
// error classes), x-api-key auth, per-route metrics, cancellation, thinking blocks, and a
// multi-turn tool-use loop through qwen3's real template (tool_use -> tool_result -> answer).
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import Anthropic from '@anthropic-ai/sdk';
import {
  getJson, missing, postJson, startServer, synthServer, tinyStoriesDir, tmpDir, tokenizersDir, waitFor,
} from './helpers.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const plainTemplate = path.join(here, 'data', 'plain_chat.jinja');
const qwen3Tokenizer = path.join(tokenizersDir, 'qwen3');
const MODEL = 'test-model';

// The whole prompt of a reply's usage: input_tokens counts the tokens not read from the prompt
// cache, cache_read_input_tokens the ones that were (cache_creation_input_tokens is always 0).
const promptOf = (usage) => usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens;

function anthropic(server, opts = {}) {
  return new Anthropic({ baseURL: server.baseURL, apiKey: 'unused', maxRetries: 0, timeout: 120000, ...opts });
}

// Streams a request; returns the raw events, the text/thinking per block and the final message.
async function collect(client, params) {
  const events = [];
  const stream = await client.messages.create({ ...params, stream: true });
  for await (const event of stream) events.push(event);
  return events;
}

function assertEventOrder(events) {
  const names = events.map((e) => e.type);
  assert.equal(names[0], 'message_start');
  assert.equal(names.at(-1), 'message_stop');
  assert.equal(names.at(-2), 'message_delta');
  let open = null, next = 0;
  for (const e of events.slice(1, -2)) {
    if (e.type === 'content_block_start') {
      assert.equal(open, null, 'one block open at a time');
      assert.equal(e.index, next);
      open = e.index;
    } else if (e.type === 'content_block_delta') {
      assert.equal(e.index, open);
    } else if (e.type === 'content_block_stop') {
      assert.equal(e.index, open);
      open = null;
      next += 1;
    }
  }
  assert.equal(open, null, 'every block is closed before message_delta');
}

function textOf(message) {
  return message.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
}

describe('anthropic messages (tinystories-656k + plain template)', { skip: missing(tinyStoriesDir) ?? false }, () => {
  let server, client;
  before(async () => {
    server = await startServer(tinyStoriesDir, ['--chat-template', plainTemplate, '--max-body-bytes', '65536']);
    client = anthropic(server);
  });
  after(async () => { await server.stop(); });

  const messages = [{ role: 'user', content: 'Once upon a time' }];

  test('a plain reply has the message shape; streaming sends the same text in order', async () => {
    const m = await client.messages.create({ model: MODEL, max_tokens: 24, temperature: 0, messages });
    assert.match(m.id, /^msg_[0-9a-f]{24}$/);
    assert.equal(m.type, 'message');
    assert.equal(m.role, 'assistant');
    assert.equal(m.model, MODEL);
    assert.ok(['end_turn', 'max_tokens'].includes(m.stop_reason), m.stop_reason);
    assert.equal(m.stop_sequence, null);
    assert.ok(textOf(m).length > 0);
    assert.ok(promptOf(m.usage) > 0);
    assert.equal(m.usage.cache_creation_input_tokens, 0);
    assert.ok(m.usage.output_tokens > 0 && m.usage.output_tokens <= 24);

    const events = await collect(client, { model: MODEL, max_tokens: 24, temperature: 0, messages });
    assertEventOrder(events);
    // On the wire (the SDK hides pings): SSE `event:` names equal the data's type; a ping follows message_start.
    const raw = await postJson(server.baseURL, '/v1/messages', { model: MODEL, max_tokens: 4, temperature: 0, messages, stream: true });
    const names = [...raw.text.matchAll(/^event: (\S+)\ndata: (.*)$/gm)].map((m) => {
      assert.equal(JSON.parse(m[2]).type, m[1]);
      return m[1];
    });
    assert.deepEqual(names.slice(0, 3), ['message_start', 'ping', 'content_block_start']);
    assert.deepEqual(names.slice(-2), ['message_delta', 'message_stop']);
    assert.equal(promptOf(events[0].message.usage), promptOf(m.usage));
    const text = events.filter((e) => e.type === 'content_block_delta').map((e) => e.delta.text).join('');
    assert.equal(text, textOf(m));
    const delta = events.at(-2);
    assert.equal(delta.delta.stop_reason, m.stop_reason);
    assert.equal(delta.usage.output_tokens, m.usage.output_tokens);
    assert.equal(promptOf(delta.usage), promptOf(m.usage));

    // The SDK's stream helper accumulates the same message.
    const final = await client.messages.stream({ model: MODEL, max_tokens: 24, temperature: 0, messages }).finalMessage();
    assert.equal(textOf(final), textOf(m));
    assert.equal(final.stop_reason, m.stop_reason);
  });

  test('max_tokens ends with stop_reason max_tokens; the system prompt reaches the prompt', async () => {
    const short = await client.messages.create({ model: MODEL, max_tokens: 2, temperature: 0, messages });
    assert.equal(short.stop_reason, 'max_tokens');
    assert.equal(short.usage.output_tokens, 2);
    const withSystem = await client.messages.create({ model: MODEL, max_tokens: 2, temperature: 0, messages,
      system: [{ type: 'text', text: 'There was a little dog.' }] });
    assert.ok(promptOf(withSystem.usage) > promptOf(short.usage));
    const asString = await client.messages.create({ model: MODEL, max_tokens: 2, temperature: 0, messages,
      system: 'There was a little dog.' });
    assert.equal(promptOf(asString.usage), promptOf(withSystem.usage));
  });

  test('stop_sequences: the reply stops before the sequence and names it (also streamed)', async () => {
    const full = await client.messages.create({ model: MODEL, max_tokens: 32, temperature: 0, messages });
    const text = textOf(full);
    const words = text.trim().split(/\s+/);
    assert.ok(words.length >= 3, text);
    const stop = words[2];
    const cut = await client.messages.create({ model: MODEL, max_tokens: 32, temperature: 0, messages,
                                               stop_sequences: ['@@never@@', stop] });
    assert.equal(cut.stop_reason, 'stop_sequence');
    assert.equal(cut.stop_sequence, stop);
    assert.equal(textOf(cut), text.slice(0, text.indexOf(stop)));
    const events = await collect(client, { model: MODEL, max_tokens: 32, temperature: 0, messages, stop_sequences: [stop] });
    const delta = events.at(-2);
    assert.equal(delta.delta.stop_reason, 'stop_sequence');
    assert.equal(delta.delta.stop_sequence, stop);
  });

  test('a repeated long prompt is read from the prompt cache: cache_read_input_tokens', async () => {
    const long = [{ role: 'user', content: 'Once upon a time there was a little girl named Lily. '.repeat(12) }];
    const first = await client.messages.create({ model: MODEL, max_tokens: 2, temperature: 0, messages: long });
    const again = await client.messages.create({ model: MODEL, max_tokens: 2, temperature: 0, messages: long });
    assert.equal(promptOf(again.usage), promptOf(first.usage));
    assert.ok(again.usage.cache_read_input_tokens > 0, JSON.stringify(again.usage));
    assert.ok(again.usage.input_tokens < promptOf(again.usage), JSON.stringify(again.usage));
    const events = await collect(client, { model: MODEL, max_tokens: 2, temperature: 0, messages: long });
    const delta = events.at(-2);
    assert.ok(delta.usage.cache_read_input_tokens > 0, JSON.stringify(delta.usage));
    assert.equal(promptOf(delta.usage), promptOf(first.usage));
  });

  test('count_tokens counts the prompt a message would have', async () => {
    const params = { model: MODEL, messages, system: 'There was a little dog.' };
    const counted = await client.messages.countTokens(params);
    const m = await client.messages.create({ ...params, max_tokens: 1 });
    assert.equal(counted.input_tokens, promptOf(m.usage));
    await assert.rejects(client.messages.countTokens({ ...params, max_tokens: 5 }),
      (err) => err instanceof Anthropic.BadRequestError && err.error.error.message.startsWith('max_tokens'));
  });

  test('bad fields are 400 invalid_request_error naming the field', async () => {
    const bad = [
      [{ messages }, 'max_tokens'],
      [{ messages, max_tokens: 0 }, 'max_tokens'],
      [{ messages, max_tokens: 'ten' }, 'max_tokens'],
      [{ messages, max_tokens: 4, frobnicate: 1 }, 'frobnicate'],
      [{ messages, max_tokens: 4, temperature: 9 }, 'temperature'],
      [{ messages, max_tokens: 4, stop_sequences: [''] }, 'stop_sequences'],
      [{ messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AA==' } }] }], max_tokens: 4 },
       'messages[0].content[0].type'],
      [{ messages: [{ role: 'system', content: 'x' }], max_tokens: 4 }, 'messages[0].role'],
      [{ messages, max_tokens: 4, tools: [{ type: 'bash_20250124', name: 'bash' }] }, 'tools[0].type'],
      [{ messages, max_tokens: 4, tool_choice: { type: 'tool', name: 'nope' }, tools: [{ name: 'f', input_schema: { type: 'object' } }] },
       'tool_choice.name'],
    ];
    for (const [body, field] of bad) {
      await assert.rejects(client.messages.create({ model: MODEL, ...body }), (err) => {
        assert.ok(err instanceof Anthropic.BadRequestError, `${field}: ${err}`);
        assert.equal(err.status, 400);
        assert.equal(err.error.type, 'error');
        assert.equal(err.error.error.type, 'invalid_request_error');
        assert.ok(err.error.error.message.startsWith(field), `${field}: ${err.error.error.message}`);
        return true;
      });
    }
    await assert.rejects(client.messages.create({ model: 'claude-other', messages, max_tokens: 4 }),
      (err) => err instanceof Anthropic.NotFoundError && err.error.error.type === 'not_found_error');
    const malformed = await postJson(server.baseURL, '/v1/messages', '{"messages": [');
    assert.equal(malformed.status, 400);
    assert.equal(malformed.json.error.type, 'invalid_request_error');
    const big = await postJson(server.baseURL, '/v1/messages',
      { model: MODEL, max_tokens: 4, messages: [{ role: 'user', content: 'x'.repeat(70000) }] });
    assert.equal(big.status, 413);
    assert.equal(big.json.type, 'error');
    assert.equal(big.json.error.type, 'request_too_large');
    const get = await getJson(server.baseURL, '/v1/messages');
    assert.equal(get.status, 405);
    assert.equal(get.json.type, 'error');
    // The OpenAI routes keep OpenAI's shape.
    const openai = await postJson(server.baseURL, '/v1/chat/completions', { messages, frobnicate: 1 });
    assert.equal(openai.json.error.param, 'frobnicate');
  });

  test('every field with every wrong type is a 4xx naming a field, never a 500', async () => {
    const base = { model: MODEL, max_tokens: 1, system: 's', stop_sequences: ['x'], temperature: 0, metadata: { user_id: 'u' },
      messages: [{ role: 'user', content: [{ type: 'text', text: 'a' }] },
                 { role: 'assistant', content: [{ type: 'tool_use', id: 't', name: 'f', input: {} }] },
                 { role: 'user', content: [{ type: 'tool_result', tool_use_id: 't', content: 'r' }] }],
      tools: [{ name: 'f', input_schema: { type: 'object' } }], tool_choice: { type: 'auto' } };
    const wrong = [1, -1, 'x', '', true, [], [1], ['x'], [{}], {}, { type: 1 }, { type: 'text' }];
    // (path into the body, setter) for top-level fields and a few nested ones.
    const targets = Object.keys(base).map((k) => [k, (b, v) => { b[k] = v; }]);
    targets.push(['messages[0].content[0]', (b, v) => { b.messages[0].content[0] = v; }],
                 ['messages[1].content[0].input', (b, v) => { b.messages[1].content[0].input = v; }],
                 ['messages[2].content[0].content', (b, v) => { b.messages[2].content[0].content = v; }],
                 ['tools[0].input_schema', (b, v) => { b.tools[0].input_schema = v; }],
                 ['tool_choice.type', (b, v) => { b.tool_choice.type = v; }]);
    for (const [where, set] of targets) {
      for (const value of wrong) {
        const body = structuredClone(base);
        set(body, value);
        const r = await postJson(server.baseURL, '/v1/messages', body);
        const what = `${where} = ${JSON.stringify(value)}: ${r.text}`;
        assert.ok(r.status === 200 || r.status === 400 || r.status === 404, what);
        if (r.status !== 200) {
          assert.equal(r.json.type, 'error', what);
          if (r.status === 400) assert.match(r.json.error.message, /^[a-z_]+[a-z_\[\].0-9]*[: ]/, what);
        }
      }
    }
  });

  test('metrics count the route; the server still answers after every error', async () => {
    const metrics = await (await fetch(`${server.baseURL}/metrics`)).text();
    assert.match(metrics, /ember_http_requests_total\{route="\/v1\/messages",status="200"\} [1-9]/);
    assert.match(metrics, /ember_http_requests_total\{route="\/v1\/messages",status="400"\} [1-9]/);
    assert.match(metrics, /ember_http_requests_total\{route="\/v1\/messages\/count_tokens",status="200"\} [1-9]/);
    const m = await client.messages.create({ model: MODEL, max_tokens: 4, messages });
    assert.equal(m.type, 'message');
  });
});

describe('anthropic messages auth (x-api-key)', { skip: missing(tinyStoriesDir) ?? false }, () => {
  let server;
  before(async () => { server = await startServer(tinyStoriesDir, ['--chat-template', plainTemplate, '--api-key', 'sekrit']); });
  after(async () => { await server.stop(); });

  test('x-api-key and Bearer keys are accepted; a wrong key is an authentication_error', async () => {
    const params = { model: MODEL, max_tokens: 2, messages: [{ role: 'user', content: 'Hi' }] };
    const viaKey = await anthropic(server, { apiKey: 'sekrit' }).messages.create(params);
    assert.equal(viaKey.type, 'message');
    const viaBearer = await anthropic(server, { apiKey: null, authToken: 'sekrit' }).messages.create(params);
    assert.equal(viaBearer.type, 'message');
    await assert.rejects(anthropic(server, { apiKey: 'wrong' }).messages.create(params), (err) =>
      err instanceof Anthropic.AuthenticationError && err.error.error.type === 'authentication_error');
    await assert.rejects(anthropic(server, { apiKey: 'wrong' }).messages.countTokens({ messages: params.messages, model: MODEL }),
      (err) => err instanceof Anthropic.AuthenticationError);
  });
});

describe('anthropic messages with qwen3\'s template (ember synth qwen3 + qwen3 tokenizer)', { skip: missing(qwen3Tokenizer) ?? false }, () => {
  let server, client, modelDir;
  synthServer('tiny-qwen3', qwen3Tokenizer, ['--max-batch', '4'], async (s, dir) => {
    server = s;
    modelDir = dir;
    client = anthropic(server);
  });

  const tools = [
    { name: 'get_weather', description: 'Weather for a city',
      // One possible input: the forced call is fully determined by its schema.
      input_schema: { type: 'object', properties: { city: { enum: ['Paris'] } }, required: ['city'], additionalProperties: false } },
    { name: 'get_time', input_schema: { type: 'object', properties: {}, additionalProperties: false } },
  ];

  test('tool-use loop: tool_use -> tool_result -> final answer (also streamed)', async () => {
    const question = { role: 'user', content: 'Weather in Paris?' };
    const base = { model: MODEL, max_tokens: 60, temperature: 0, tools, thinking: { type: 'disabled' } };
    const first = await client.messages.create({ ...base, messages: [question],
                                                 tool_choice: { type: 'tool', name: 'get_weather' } });
    assert.equal(first.stop_reason, 'tool_use');
    const use = first.content.find((b) => b.type === 'tool_use');
    assert.ok(use, JSON.stringify(first.content));
    assert.match(use.id, /^toolu_[0-9a-f]{24}$/);
    assert.equal(use.name, 'get_weather');
    assert.deepEqual(use.input, { city: 'Paris' });

    // Streamed, the call is one tool_use block whose input arrives as input_json_delta.
    const events = await collect(client, { ...base, messages: [question], tool_choice: { type: 'tool', name: 'get_weather' } });
    assertEventOrder(events);
    const start = events.find((e) => e.type === 'content_block_start' && e.content_block.type === 'tool_use');
    assert.equal(start.content_block.name, 'get_weather');
    const json = events.filter((e) => e.type === 'content_block_delta' && e.delta.type === 'input_json_delta')
      .map((e) => e.delta.partial_json).join('');
    assert.deepEqual(JSON.parse(json), { city: 'Paris' });
    assert.equal(events.at(-2).delta.stop_reason, 'tool_use');
    const streamed = await client.messages.stream({ ...base, messages: [question],
                                                    tool_choice: { type: 'tool', name: 'get_weather' } }).finalMessage();
    assert.deepEqual(streamed.content.find((b) => b.type === 'tool_use').input, { city: 'Paris' });

    // The result goes back; the model answers (tool_choice none: text only).
    const turns = [question, { role: 'assistant', content: first.content },
                   { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '{"temp_c": 21}' }] }];
    const counted = await client.messages.countTokens({ model: MODEL, messages: turns, tools });
    const answer = await client.messages.create({ ...base, max_tokens: 8, messages: turns, tool_choice: { type: 'none' } });
    assert.equal(answer.stop_reason, 'max_tokens');
    assert.ok(!answer.content.some((b) => b.type === 'tool_use'));
    const unanswered = await client.messages.create({ ...base, max_tokens: 1, messages: [question], tool_choice: { type: 'none' } });
    assert.ok(promptOf(answer.usage) > promptOf(unanswered.usage), 'the call and its result reach the prompt');
    const counted1 = await client.messages.countTokens({ model: MODEL, messages: [question], tools });
    assert.ok(counted.input_tokens > counted1.input_tokens);

    // tool_choice any: some tool is called.
    const any = await client.messages.create({ ...base, messages: [question], tool_choice: { type: 'any' } });
    assert.equal(any.stop_reason, 'tool_use');
    assert.ok(['get_weather', 'get_time'].includes(any.content.find((b) => b.type === 'tool_use').name));
  });

  test('a streaming client that goes away is cancelled', async () => {
    const before = (await getJson(server.baseURL, '/stats')).json;
    const controller = new AbortController();
    const stream = await client.messages.create({ model: MODEL, max_tokens: 4000, temperature: 1,
      messages: [{ role: 'user', content: 'Talk.' }], stream: true }, { signal: controller.signal });
    let deltas = 0;
    for await (const event of stream) {
      if (event.type !== 'content_block_delta') continue;
      deltas += 1;
      controller.abort();  // the SDK's iterator then ends quietly
      break;
    }
    assert.equal(deltas, 1);
    const freed = await waitFor(async () => {
      const s = (await getJson(server.baseURL, '/stats')).json;
      return s.engine.running_sequences === 0 && s.engine.requests_cancelled > before.engine.requests_cancelled;
    }, 5000);
    assert.ok(freed, 'the abandoned stream must be cancelled');
  });

  test('thinking: a think block comes back as a thinking block (thinking_delta when streamed)', async () => {
    // An R1-style template opens the think block in the prompt; the reply starts inside it.
    const file = path.join(tmpDir('ember-think-'), 'think.jinja');
    fs.writeFileSync(file, "{% for m in messages %}{{ m['content'] }}\n{% endfor %}<think>\n");
    const thinking = await startServer(modelDir, ['--chat-template', file, '--reasoning-parser', 'think']);
    try {
      const c = anthropic(thinking);
      const params = { model: MODEL, max_tokens: 12, temperature: 0, messages: [{ role: 'user', content: 'Think first.' }] };
      const m = await c.messages.create(params);
      assert.equal(m.content[0].type, 'thinking');
      assert.ok(m.content[0].thinking.length > 0);
      const events = await collect(c, params);
      assertEventOrder(events);
      assert.equal(events.find((e) => e.type === 'content_block_start').content_block.type, 'thinking');
      const thought = events.filter((e) => e.type === 'content_block_delta' && e.delta.type === 'thinking_delta')
        .map((e) => e.delta.thinking).join('');
      assert.equal(thought, m.content[0].thinking);
      // A thinking block sent back is accepted (and reaches templates that render reasoning).
      const again = await c.messages.create({ ...params, max_tokens: 2, messages: [params.messages[0],
        { role: 'assistant', content: m.content.map((b) => b.type === 'thinking' ? { ...b, signature: '' } : b) },
        { role: 'user', content: 'More?' }] });
      assert.equal(again.type, 'message');
    } finally {
      await thinking.stop();
    }
  });
});
