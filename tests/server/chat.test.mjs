// /v1/chat/completions: the chat route end to end with a real model. TinyStories has no chat
// template, so the server is started with --chat-template: a plain template (greedy text checks)
// and qwen3's real template (roles, tools, chat_template_kwargs). A qwen3-shaped `ember synth`
// model carrying qwen3's tokenizer runs when synth has a tiny qwen3 preset.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  missing, startServer, synthServer, tinyStoriesDir, tmpDir, tokenizersDir,
} from './helpers.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const plainTemplate = path.join(here, 'data', 'plain_chat.jinja');
const qwen3Tokenizer = path.join(tokenizersDir, 'qwen3');

async function collectChat(client, params) {
  const stream = await client.chat.completions.create({ ...params, stream: true });
  const texts = {}, finish = {}, roles = {}, toolCalls = {}, reasoning = {};
  let usage = null, first = true;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    assert.match(chunk.id, /^chatcmpl-/);
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (first) assert.equal(c.delta.role, 'assistant', 'the first chunk carries the role');
      if (c.delta.role) roles[c.index] = c.delta.role;
      if (c.delta.content) texts[c.index] = (texts[c.index] ?? '') + c.delta.content;
      if (c.delta.reasoning_content) reasoning[c.index] = (reasoning[c.index] ?? '') + c.delta.reasoning_content;
      for (const call of c.delta.tool_calls ?? []) {
        // Merge deltas by call index, as OpenAI clients do.
        const calls = (toolCalls[c.index] ??= []);
        const into = (calls[call.index] ??= { id: '', type: '', function: { name: '', arguments: '' } });
        into.id += call.id ?? '';
        into.type += call.type ?? '';
        into.function.name += call.function?.name ?? '';
        into.function.arguments += call.function?.arguments ?? '';
      }
      if (c.finish_reason) finish[c.index] = c.finish_reason;
    }
    first = false;
  }
  return { texts, finish, usage, roles, toolCalls, reasoning };
}

describe('chat (tinystories-656k + --chat-template)', { skip: missing(tinyStoriesDir) ?? false }, () => {
  let server, client;
  before(async () => {
    server = await startServer(tinyStoriesDir, ['--chat-template', plainTemplate]);
    client = server.client();
  });
  after(async () => { await server.stop(); });

  const messages = [{ role: 'user', content: 'Once upon a time' }];

  test('non-streaming chat completion has OpenAI shape', async () => {
    const r = await client.chat.completions.create({ model: 'test-model', messages, max_tokens: 32, temperature: 0 });
    assert.match(r.id, /^chatcmpl-/);
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.ok(r.choices[0].message.content.length > 0);
    assert.equal(r.choices[0].logprobs, null);
    assert.ok(r.usage.prompt_tokens > 0);
    assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
  });

  test('JSON mode is refused for a vocabulary that cannot spell "{"', async () => {
    await assert.rejects(client.chat.completions.create({ model: 'test-model', messages,
      max_tokens: 8, response_format: { type: 'json_object' } }),
      (err) => err.status === 400 && err.param === 'response_format');
  });

  test('streamed chat equals non-streamed at temperature 0, with role chunk and usage', async () => {
    const params = { model: 'test-model', messages, max_tokens: 40, temperature: 0 };
    const solo = await client.chat.completions.create(params);
    const s = await collectChat(client, { ...params, stream_options: { include_usage: true } });
    assert.equal(s.texts[0], solo.choices[0].message.content);
    assert.equal(s.finish[0], solo.choices[0].finish_reason);
    assert.equal(s.roles[0], 'assistant');
    assert.equal(s.usage.completion_tokens, solo.usage.completion_tokens);
  });

  test('text content parts, n, stop and logprobs/top_logprobs', async () => {
    const parts = [{ role: 'user', content: [{ type: 'text', text: 'Once upon' }, { type: 'text', text: 'a time' }] }];
    const r = await client.chat.completions.create({ model: 'test-model', messages: parts, max_tokens: 8, n: 2, temperature: 0 });
    assert.equal(r.choices.length, 2);
    const full = (await client.chat.completions.create({ model: 'test-model', messages, max_tokens: 40, temperature: 0 })).choices[0].message.content;
    const stop = full.slice(10, 16);
    const cut = await client.chat.completions.create({ model: 'test-model', messages, max_tokens: 40, temperature: 0, stop });
    assert.equal(cut.choices[0].message.content, full.slice(0, full.indexOf(stop)));
    assert.equal(cut.choices[0].finish_reason, 'stop');
    const lp = await client.chat.completions.create({ model: 'test-model', messages, max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: 2 });
    const content = lp.choices[0].logprobs.content;
    assert.equal(content.length, lp.usage.completion_tokens);
    assert.equal(content.map((c) => c.token).join(''), lp.choices[0].message.content);
    for (const c of content) {
      assert.equal(c.top_logprobs.length, 2);
      assert.ok(Math.abs(c.top_logprobs[0].logprob - c.logprob) < 1e-4);
      assert.deepEqual(c.bytes, [...Buffer.from(c.token, 'utf8')]);
    }
  });

  test('unsupported chat features are 400s naming the field', async () => {
    const bad = [
      // TinyStories' vocabulary cannot spell '{': no structured output.
      [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object' } } } }, 'response_format'],
      // The plain template has no tool-call syntax, so a call cannot be forced.
      [{ tool_choice: 'required', tools: [{ type: 'function', function: { name: 'f' } }] }, 'tool_choice'],
      [{ messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] }, 'messages[0].content[0].type'],
      [{ top_logprobs: 2 }, 'top_logprobs'],
    ];
    for (const [extra, param] of bad) {
      await assert.rejects(client.chat.completions.create({ model: 'test-model', messages, max_tokens: 4, ...extra }),
        (err) => err.status === 400 && err.param === param);
    }
  });
});

describe('chat with qwen3\'s real template (on tinystories weights)', { skip: missing(tinyStoriesDir, qwen3Tokenizer) ?? false }, () => {
  let server, client;
  before(async () => {
    const config = JSON.parse(fs.readFileSync(path.join(qwen3Tokenizer, 'tokenizer_config.json'), 'utf8'));
    const file = path.join(tmpDir('ember-tmpl-'), 'qwen3.jinja');
    fs.writeFileSync(file, config.chat_template);
    server = await startServer(tinyStoriesDir, ['--chat-template', file]);
    client = server.client();
  });
  after(async () => { await server.stop(); });

  test('system/user/assistant turns, tools and chat_template_kwargs render and generate', async () => {
    const r = await client.chat.completions.create({
      model: 'test-model', max_tokens: 8, temperature: 0,
      messages: [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Hi' },
                 { role: 'assistant', content: 'Hello.' }, { role: 'user', content: 'Story?' }],
      tools: [{ type: 'function', function: { name: 'get_weather', description: 'weather',
                parameters: { type: 'object', properties: { city: { type: 'string' } } } } }],
      chat_template_kwargs: { enable_thinking: false },
    });
    assert.equal(r.choices.length, 1);
    const without = await client.chat.completions.create({
      model: 'test-model', max_tokens: 8, temperature: 0, messages: [{ role: 'user', content: 'Story?' }] });
    assert.ok(r.usage.prompt_tokens > without.usage.prompt_tokens, 'tools and turns reach the prompt');
  });
});

describe('chat (ember synth qwen3-shaped model + qwen3 tokenizer)', { skip: missing(qwen3Tokenizer) ?? false }, () => {
  let server, client, modelDir;
  // qwen3's vocabulary, config layout, tokenizer and template on a toy body (synth preset).
  synthServer('tiny-qwen3', qwen3Tokenizer, ['--max-batch', '4'], async (s, dir) => {
    server = s;
    modelDir = dir;
    client = server.client();
  });

  test('greedy stream equals non-stream through qwen3\'s template and tokenizer', async () => {
    const params = { model: 'test-model', messages: [{ role: 'user', content: 'Hello there' }],
                     max_tokens: 12, temperature: 0, chat_template_kwargs: { enable_thinking: false } };
    const solo = await client.chat.completions.create(params);
    assert.equal(solo.usage.completion_tokens, 12);
    assert.ok(solo.usage.prompt_tokens > 5);
    const s = await collectChat(client, params);
    assert.equal(s.texts[0] ?? '', solo.choices[0].message.content);
    const models = await client.models.list();
    assert.equal(models.data[0].capabilities.chat_completions, true);
    assert.equal(models.data[0].context_length, 40960);
    assert.deepEqual(models.data[0].capabilities.response_formats, ['text', 'json_object', 'json_schema']);
  });

  test('JSON mode: the output is one JSON object (also streamed)', async () => {
    const base = { model: 'test-model', messages: [{ role: 'user', content: 'JSON please' }],
                   temperature: 1, seed: 5, chat_template_kwargs: { enable_thinking: false },
                   response_format: { type: 'json_object' } };
    // Random weights: nudge '}' (qwen3 id 92) so the object closes within the budget.
    const closed = await client.chat.completions.create({ ...base, max_tokens: 200,
                                                          logit_bias: { 92: 12 } });
    assert.equal(closed.choices[0].finish_reason, 'stop');
    const value = JSON.parse(closed.choices[0].message.content);
    assert.equal(typeof value, 'object');
    assert.ok(value !== null && !Array.isArray(value));
    const s = await collectChat(client, { ...base, max_tokens: 200, logit_bias: { 92: 12 } });
    assert.equal(s.texts[0], closed.choices[0].message.content);
    assert.equal(s.finish[0], 'stop');
    // Unnudged, the random model writes a long string: cut by max_tokens, still an object's start.
    const open = await client.chat.completions.create({ ...base, max_tokens: 24 });
    assert.ok(open.choices[0].message.content.startsWith('{'), open.choices[0].message.content);
  });

  test('JSON schema: the output is valid against the schema (also streamed); unsupported keywords are 400s', async () => {
    const schema = { type: 'object', additionalProperties: false, required: ['ok', 'count', 'color', 'note'],
                     properties: { ok: { type: 'boolean' }, count: { type: 'integer' },
                                   color: { enum: ['red', 'green'] }, note: { type: ['null', 'number'] },
                                   list: { type: 'array', items: { type: 'integer' }, maxItems: 2 } } };
    // Random weights: nudge '}' and ',' (qwen3 ids 92, 11) so that the object closes in time.
    const params = { model: 'test-model', messages: [{ role: 'user', content: 'JSON please' }],
                     temperature: 1, seed: 7, max_tokens: 400, logit_bias: { 92: 30, 11: 30 },
                     chat_template_kwargs: { enable_thinking: false },
                     response_format: { type: 'json_schema', json_schema: { name: 'answer', schema, strict: true } } };
    const r = await client.chat.completions.create(params);
    assert.equal(r.choices[0].finish_reason, 'stop', r.choices[0].message.content);
    const value = JSON.parse(r.choices[0].message.content);
    assert.deepEqual(Object.keys(value).slice(0, 3), ['ok', 'count', 'color'], 'the schema\'s order');
    assert.equal(typeof value.ok, 'boolean');
    assert.ok(Number.isInteger(value.count));
    assert.ok(['red', 'green'].includes(value.color));
    assert.ok(value.note === null || typeof value.note === 'number');
    assert.ok(value.list === undefined || (value.list.length <= 2 && value.list.every(Number.isInteger)));
    const s = await collectChat(client, params);
    assert.equal(s.texts[0], r.choices[0].message.content);
    const completion = await client.completions.create({ model: 'test-model', prompt: 'JSON:', temperature: 1,
      seed: 7, max_tokens: 400, logit_bias: { 92: 30, 11: 30 }, response_format: params.response_format });
    assert.equal(completion.choices[0].finish_reason, 'stop');
    assert.equal(typeof JSON.parse(completion.choices[0].text).ok, 'boolean');
    for (const [bad, param] of [[{ type: 'object', properties: { a: { type: 'string', pattern: '(?=x)' } } }, 'response_format.json_schema.schema'],
                                [{ type: 'string' }, 'response_format.json_schema.schema']]) {
      await assert.rejects(client.chat.completions.create({ ...params, max_tokens: 8,
        response_format: { type: 'json_schema', json_schema: { name: 'x', schema: bad } } }),
        (err) => err.status === 400 && err.param === param && err.message.includes(param));
    }
  });

  test('jump-forward: forced tokens in usage and /stats; the same text with --no-jump-forward', async () => {
    const schema = { type: 'object', additionalProperties: false, required: ['ok', 'count', 'color', 'happy'],
                     properties: { ok: { type: 'boolean' }, count: { type: 'integer' },
                                   color: { enum: ['red', 'green'] }, happy: { type: 'boolean' } } };
    const params = { model: 'test-model', messages: [{ role: 'user', content: 'JSON please' }],
                     temperature: 1, seed: 3, max_tokens: 400, logit_bias: { 92: 30, 11: 30 },
                     chat_template_kwargs: { enable_thinking: false },
                     response_format: { type: 'json_schema', json_schema: { name: 'answer', schema, strict: true } } };
    const off = await startServer(modelDir, ['--kv-cache-bytes', String(64 << 20), '--no-jump-forward']);
    try {
      const r = await client.chat.completions.create(params);
      const plain = await off.client().chat.completions.create(params);
      assert.equal(r.choices[0].finish_reason, 'stop', r.choices[0].message.content);
      assert.equal(r.choices[0].message.content, plain.choices[0].message.content);
      assert.equal(r.usage.completion_tokens, plain.usage.completion_tokens);
      const forced = r.usage.completion_tokens_details?.forced_tokens;
      assert.ok(forced > 0 && forced < r.usage.completion_tokens, JSON.stringify(r.usage));
      assert.equal(plain.usage.completion_tokens_details, undefined, JSON.stringify(plain.usage));
      const s = await collectChat(client, params);
      assert.equal(s.texts[0], r.choices[0].message.content);
      const completion = await client.completions.create({ model: 'test-model', prompt: 'JSON:', temperature: 1,
        seed: 7, max_tokens: 400, logit_bias: { 92: 30, 11: 30 }, response_format: params.response_format });
      assert.ok(completion.usage.completion_tokens_details.forced_tokens > 0, JSON.stringify(completion.usage));
      const stats = await (await fetch(`${server.baseURL}/stats`)).json();
      assert.ok(stats.engine.forced_tokens >= forced, JSON.stringify(stats.engine));
      // Logprobs: every token is sampled (each reports its own row's logprob).
      const lp = await client.chat.completions.create({ ...params, logprobs: true });
      assert.equal(lp.usage.completion_tokens_details, undefined, JSON.stringify(lp.usage));
    } finally {
      await off.stop();
    }
  });

  test('guided_choice, guided_regex, structured_outputs, json_schema: the output follows them; conflicts are 400s', async () => {
    const base = { model: 'test-model', messages: [{ role: 'user', content: 'Pick one' }], temperature: 1,
                   seed: 11, max_tokens: 40, chat_template_kwargs: { enable_thinking: false } };
    const choices = ['red', 'green', 'blue "sky"'];
    for (let seed = 1; seed <= 3; ++seed) {
      const r = await client.chat.completions.create({ ...base, seed, guided_choice: choices });
      assert.ok(choices.includes(r.choices[0].message.content), r.choices[0].message.content);
      assert.equal(r.choices[0].finish_reason, 'stop');
    }
    const re = await client.completions.create({ model: 'test-model', prompt: 'Code:', temperature: 1, seed: 4,
                                                 max_tokens: 40, guided_regex: '[A-Z]{3}-\\d{2,4}!' });
    assert.match(re.choices[0].text, /^[A-Z]{3}-\d{2,4}!$/);
    assert.equal(re.choices[0].finish_reason, 'stop');
    const so = await client.chat.completions.create({ ...base, structured_outputs: { choice: ['yes', 'no'] } });
    assert.ok(['yes', 'no'].includes(so.choices[0].message.content));
    // Keywords enforced through automata: pattern (on the decoded string), format, integer bounds.
    const schema = { type: 'object', required: ['code', 'day', 'n'], additionalProperties: false,
                     properties: { code: { type: 'string', pattern: '^[a-z]{2}"\\d$' },
                                   day: { type: 'string', format: 'date' },
                                   n: { type: 'integer', minimum: -3, maximum: 12 } } };
    const js = await client.completions.create({ model: 'test-model', prompt: 'JSON:', temperature: 1, seed: 2,
                                                 max_tokens: 200, logit_bias: { 92: 30 }, json_schema: schema });
    assert.equal(js.choices[0].finish_reason, 'stop', js.choices[0].text);
    const value = JSON.parse(js.choices[0].text);
    assert.match(value.code, /^[a-z]{2}"\d$/);
    assert.match(value.day, /^\d{4}-\d{2}-\d{2}$/);
    assert.ok(Number.isInteger(value.n) && value.n >= -3 && value.n <= 12, js.choices[0].text);
    for (const [extra, param] of [[{ response_format: { type: 'json_object' }, guided_regex: 'a' }, 'guided_regex'],
                                  [{ guided_grammar: 'root ::= "a"', guided_regex: 'a' }, 'guided_grammar'],
                                  [{ guided_regex: '(a)\\1' }, 'guided_regex']]) {
      await assert.rejects(client.chat.completions.create({ ...base, ...extra }),
        (err) => err.status === 400 && err.param === param && err.message.includes(param));
    }
  });

  test('grammar, guided_grammar, structured_outputs.grammar (GBNF): the output is a sentence; bad grammars are 400s', async () => {
    const base = { model: 'test-model', messages: [{ role: 'user', content: 'Answer' }], temperature: 1,
                   max_tokens: 60, chat_template_kwargs: { enable_thinking: false } };
    const answer = 'root ::= "Answer: " ("yes" | "no") " (" [0-9]{1,3} ")"';
    const answerRe = /^Answer: (yes|no) \(\d{1,3}\)$/;
    for (let seed = 1; seed <= 3; ++seed) {
      const r = await client.completions.create({ model: 'test-model', prompt: 'Q:', temperature: 1, seed,
                                                 max_tokens: 40, grammar: answer });
      assert.match(r.choices[0].text, answerRe);
      assert.equal(r.choices[0].finish_reason, 'stop');
    }
    const chat = await client.chat.completions.create({ ...base, seed: 5, guided_grammar: answer });
    assert.match(chat.choices[0].message.content, answerRe);
    // A recursive grammar with a nullable tail: ends through EOS or at max_tokens, always a prefix
    // of a sentence; the list itself is complete once a ']' closes the outer list.
    const list = 'root ::= "[" items? "]"\nitems ::= item ("," item)*\nitem ::= [0-9]{1,2} | "[" items? "]"';
    const so = await client.chat.completions.create({ ...base, seed: 2, max_tokens: 80,
                                                      structured_outputs: { grammar: list } });
    const text = so.choices[0].message.content;
    assert.match(text, /^\[[0-9,\[\]]*$/);
    if (so.choices[0].finish_reason === 'stop') assert.doesNotThrow(() => JSON.parse(text), text);
    for (const [extra, param, words] of [
      [{ grammar: 'root ::= value' }, 'grammar', "undefined rule 'value'"],
      [{ guided_grammar: 'root ::= expr\nexpr ::= expr "+" "1" | "1"' }, 'guided_grammar', "rule 'expr' is left-recursive"],
      [{ structured_outputs: { grammar: 'root ::= ("a"' } }, 'structured_outputs.grammar', 'unbalanced parentheses'],
      [{ grammar: 'start ::= "a"' }, 'grammar', "no rule named 'root'"],
      [{ grammar: 5 }, 'grammar', 'expected a string'],
      [{ guided_regex: 'a', grammar: 'root ::= "a"' }, 'grammar', 'cannot be combined with guided_regex'],
      [{ response_format: { type: 'json_object' }, guided_grammar: 'root ::= "a"' }, 'guided_grammar', 'cannot be combined'],
    ]) {
      await assert.rejects(client.chat.completions.create({ ...base, ...extra }),
        (err) => err.status === 400 && err.param === param && err.message.includes(words), JSON.stringify(extra));
      await assert.rejects(client.completions.create({ model: 'test-model', prompt: 'Q:', max_tokens: 4, ...extra }),
        (err) => err.status === 400 && err.param === param, JSON.stringify(extra));
    }
  });

  test('tool calls: forced calls come back as tool_calls (also streamed) and go round the template', async () => {
    const tools = [
      { type: 'function', function: { name: 'get_weather', description: 'Weather for a city',
        parameters: { type: 'object', properties: { city: { type: 'string' } } } } },
      { type: 'function', function: { name: 'get_time', parameters: { type: 'object' } } }];
    // Random weights: nudge '}' (qwen3 id 92) so that the arguments object closes at once.
    const base = { model: 'test-model', messages: [{ role: 'user', content: 'Weather in Paris?' }],
                   tools, temperature: 1, seed: 3, max_tokens: 80, logit_bias: { 92: 100 },
                   chat_template_kwargs: { enable_thinking: false } };
    const models = await client.models.list();
    assert.equal(models.data[0].capabilities.tools, true);
    assert.equal(models.data[0].capabilities.tool_call_format, 'hermes');

    const required = await client.chat.completions.create({ ...base, tool_choice: 'required' });
    const choice = required.choices[0];
    assert.equal(choice.finish_reason, 'tool_calls');
    assert.equal(choice.message.content, null);
    assert.equal(choice.message.tool_calls.length, 1);
    const call = choice.message.tool_calls[0];
    assert.match(call.id, /^call_/);
    assert.equal(call.type, 'function');
    assert.ok(['get_weather', 'get_time'].includes(call.function.name), call.function.name);
    assert.deepEqual(JSON.parse(call.function.arguments), {});

    const streamed = await collectChat(client, { ...base, tool_choice: 'required' });
    assert.equal(streamed.finish[0], 'tool_calls');
    assert.equal(streamed.texts[0], undefined, 'no content around the call');
    assert.equal(streamed.toolCalls[0].length, 1);
    assert.equal(streamed.toolCalls[0][0].function.name, call.function.name);
    assert.equal(streamed.toolCalls[0][0].function.arguments, call.function.arguments);

    for (const name of ['get_weather', 'get_time']) {
      const named = await client.chat.completions.create({ ...base, parallel_tool_calls: false,
        tool_choice: { type: 'function', function: { name } } });
      assert.equal(named.choices[0].message.tool_calls[0].function.name, name);
      assert.equal(named.choices[0].finish_reason, 'tool_calls');
    }

    // A forced call's arguments follow the function's parameters schema.
    const book = { type: 'function', function: { name: 'book', parameters: { type: 'object',
      properties: { city: { type: 'string' }, nights: { type: 'integer' } }, required: ['city'] } } };
    const booked = await client.chat.completions.create({ ...base, tools: [...tools, book],
      logit_bias: { 92: 100, 1: 100 }, tool_choice: { type: 'function', function: { name: 'book' } } });
    assert.equal(booked.choices[0].finish_reason, 'tool_calls');
    const args = JSON.parse(booked.choices[0].message.tool_calls[0].function.arguments);
    assert.equal(typeof args.city, 'string');
    assert.ok(Object.keys(args).every((k) => k === 'city' || k === 'nights'), JSON.stringify(args));
    await assert.rejects(client.chat.completions.create({ ...base, tool_choice: 'required',
      tools: [{ type: 'function', function: { name: 'f', strict: true,
        parameters: { type: 'object', properties: { a: { type: 'string', pattern: '(?=x)' } } } } }] }),
      (err) => err.status === 400 && err.param === 'tools[0].function.parameters');

    // The client sends the call and its result back; the template renders both.
    const followUp = await client.chat.completions.create({ ...base, max_tokens: 4, logit_bias: {},
      messages: [...base.messages,
                 choice.message,  // as it came: content null, refusal null, tool_calls
                 { role: 'tool', tool_call_id: call.id, content: '{"temp": 21}' }] });
    assert.ok(followUp.usage.prompt_tokens > required.usage.prompt_tokens);

    await assert.rejects(client.chat.completions.create({ ...base, tool_choice: 'required',
      response_format: { type: 'json_object' } }), (err) => err.status === 400 && err.param === 'response_format');
    await assert.rejects(client.chat.completions.create({ ...base,
      tool_choice: { type: 'function', function: { name: 'nope' } } }),
      (err) => err.status === 400 && err.param === 'tool_choice.function.name');
  });

  test('reasoning: a leading think block becomes reasoning_content (also streamed)', async () => {
    // An R1-style template opens the think block in the prompt; the reply starts inside it.
    const file = path.join(tmpDir('ember-think-'), 'think.jinja');
    fs.writeFileSync(file, "{% for m in messages %}{{ m['content'] }}\n{% endfor %}<think>\n");
    const thinking = await startServer(modelDir, ['--chat-template', file, '--reasoning-parser', 'think']);
    try {
      const c = thinking.client();
      const models = await c.models.list();
      assert.equal(models.data[0].capabilities.reasoning_content, true);
      // Random weights: nudge '</think>' (qwen3 id 151668) so that the block closes early on.
      const params = { model: 'test-model', messages: [{ role: 'user', content: 'Think first.' }],
                       max_tokens: 24, temperature: 1, seed: 4, logit_bias: { 151668: 3 }, logprobs: true };
      const r = await c.chat.completions.create(params);
      // The raw text, from the chosen tokens' bytes.
      const raw = Buffer.from(r.choices[0].logprobs.content.flatMap((t) => t.bytes)).toString('utf8');
      const close = raw.indexOf('</think>');
      assert.ok(close > 0, `the nudge closes the block after some reasoning: ${JSON.stringify(raw)}`);
      const message = r.choices[0].message;
      assert.equal(message.reasoning_content ?? '', raw.slice(0, close));
      assert.equal(message.content, raw.slice(close + '</think>'.length).replace(/^\s+/, ''));
      const s = await collectChat(c, params);
      assert.equal(s.reasoning[0] ?? '', message.reasoning_content ?? '');
      assert.equal(s.texts[0] ?? '', message.content);
    } finally {
      await thinking.stop();
    }
    // The qwen3 server parses think blocks by default (its template writes them).
    const models = await client.models.list();
    assert.equal(models.data[0].capabilities.reasoning_content, true);
  });
});
