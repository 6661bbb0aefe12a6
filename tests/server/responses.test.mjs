// OpenAI Responses (/v1/responses, stateless) end to end with the official openai client's
// responses.create: string and item input, instructions, max_output_tokens (incomplete), the
// streaming events in order with sequence numbers, store answered false, refusals naming the
// field (previous_response_id, other tool types), and a function-call round trip through qwen3's
// real template (function_call -> function_call_output -> answer).
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import {
  missing, postJson, startServer, synthServer, tinyStoriesDir, tmpDir, tokenizersDir,
} from './helpers.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const plainTemplate = path.join(here, 'data', 'plain_chat.jinja');
const qwen3Tokenizer = path.join(tokenizersDir, 'qwen3');
const MODEL = 'test-model';

async function collect(client, params) {
  const events = [];
  const stream = await client.responses.create({ ...params, stream: true });
  for await (const event of stream) events.push(event);
  return events;
}

describe('responses (tinystories-656k + plain template)', { skip: missing(tinyStoriesDir) ?? false }, () => {
  let server, client;
  before(async () => {
    server = await startServer(tinyStoriesDir, ['--chat-template', plainTemplate]);
    client = server.client();
  });
  after(async () => { await server.stop(); });

  test('string input: a response object with one message item; store is answered false', async () => {
    const r = await client.responses.create({ model: MODEL, input: 'Once upon a time', max_output_tokens: 24, temperature: 0 });
    assert.match(r.id, /^resp_[0-9a-f]{24}$/);
    assert.equal(r.object, 'response');
    assert.equal(r.model, MODEL);
    assert.equal(r.store, false);
    assert.equal(r.previous_response_id, null);
    assert.ok(['completed', 'incomplete'].includes(r.status));
    assert.equal(r.output.length, 1);
    assert.equal(r.output[0].type, 'message');
    assert.equal(r.output[0].role, 'assistant');
    assert.match(r.output[0].id, /^msg_/);
    assert.equal(r.output[0].content[0].type, 'output_text');
    assert.ok(r.output_text.length > 0, 'the SDK joins the output text');
    assert.equal(r.output_text, r.output[0].content[0].text);
    assert.ok(r.usage.input_tokens > 0);
    assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
    // store: true (the API's default) is accepted; nothing is stored, and the response says so.
    const stored = await client.responses.create({ model: MODEL, input: 'Hi', max_output_tokens: 2, store: true });
    assert.equal(stored.store, false);
  });

  test('max_output_tokens: status incomplete; instructions and items reach the prompt', async () => {
    const cut = await client.responses.create({ model: MODEL, input: 'Once upon a time', max_output_tokens: 2, temperature: 0 });
    assert.equal(cut.status, 'incomplete');
    assert.equal(cut.incomplete_details.reason, 'max_output_tokens');
    assert.equal(cut.usage.output_tokens, 2);
    const instructed = await client.responses.create({ model: MODEL, input: 'Once upon a time', max_output_tokens: 2,
                                                       instructions: 'There was a little dog.' });
    assert.equal(instructed.instructions, 'There was a little dog.');
    assert.ok(instructed.usage.input_tokens > cut.usage.input_tokens);
    const items = await client.responses.create({ model: MODEL, max_output_tokens: 2, temperature: 0, input: [
      { role: 'user', content: [{ type: 'input_text', text: 'Once upon a time' }] },
      { type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'there was a cat.', annotations: [] }] },
      { role: 'user', content: 'The end.' }] });
    assert.ok(items.usage.input_tokens > cut.usage.input_tokens);
  });

  test('streaming: the events in order, sequence numbers, the same text as without streaming', async () => {
    const params = { model: MODEL, input: 'Once upon a time', max_output_tokens: 16, temperature: 0 };
    const plain = await client.responses.create(params);
    const events = await collect(client, params);
    const types = events.map((e) => e.type);
    events.forEach((e, i) => assert.equal(e.sequence_number, i));
    assert.deepEqual(types.slice(0, 4), ['response.created', 'response.in_progress', 'response.output_item.added',
                                         'response.content_part.added']);
    assert.ok(types.includes('response.output_text.delta'));
    const end = plain.status === 'completed' ? 'response.completed' : 'response.incomplete';
    assert.deepEqual(types.slice(-4), ['response.output_text.done', 'response.content_part.done',
                                       'response.output_item.done', end]);
    const text = events.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
    assert.equal(text, plain.output_text);
    assert.equal(events.find((e) => e.type === 'response.output_text.done').text, text);
    const final = events.at(-1).response;
    assert.equal(final.usage.output_tokens, plain.usage.output_tokens);
    assert.equal(final.output[0].content[0].text, text);
    assert.equal(events[0].response.status, 'in_progress');
  });

  test('stateful and unsupported fields are 400s naming the field', async () => {
    const bad = [
      [{ previous_response_id: 'resp_123' }, 'previous_response_id'],
      [{ conversation: 'conv_1' }, 'conversation'],
      [{ tools: [{ type: 'web_search' }] }, 'tools[0].type'],
      [{ frobnicate: true }, 'frobnicate'],
      [{ max_output_tokens: 0 }, 'max_output_tokens'],
      [{ temperature: 9 }, 'temperature'],
      [{ input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'https://x/y.png' }] }] }, 'input[0].content[0].type'],
      // TinyStories' vocabulary cannot spell '{': no structured output (the chat path's check, renamed).
      [{ text: { format: { type: 'json_object' } } }, 'text.format'],
    ];
    for (const [extra, param] of bad) {
      await assert.rejects(client.responses.create({ model: MODEL, input: 'Hi', max_output_tokens: 2, ...extra }), (err) => {
        assert.ok(err instanceof OpenAI.BadRequestError, `${param}: ${err}`);
        assert.equal(err.param, param, err.message);
        assert.ok(err.message.includes(param), err.message);
        return true;
      });
    }
    await assert.rejects(client.responses.create({ model: 'other', input: 'Hi' }), (err) => err.status === 404);

    // Every field with every wrong type: a 4xx naming a field, never a 500.
    const base = { model: MODEL, max_output_tokens: 1, instructions: 'i', temperature: 0, top_p: 1, store: false,
      metadata: { k: 'v' }, parallel_tool_calls: true, text: { format: { type: 'text' } }, reasoning: { effort: 'low' },
      input: [{ role: 'user', content: [{ type: 'input_text', text: 'a' }] },
              { type: 'function_call', call_id: 'c', name: 'f', arguments: '{}' },
              { type: 'function_call_output', call_id: 'c', output: 'r' },
              { type: 'reasoning', summary: [{ type: 'summary_text', text: 's' }] },
              { role: 'user', content: 'b' }],
      tools: [{ type: 'function', name: 'f', parameters: { type: 'object' } }], tool_choice: 'auto' };
    const wrong = [1, -1, 'x', '', true, [], [1], ['x'], [{}], {}, { type: 1 }, { type: 'function' }];
    const targets = Object.keys(base).map((k) => [k, (b, v) => { b[k] = v; }]);
    for (let i = 0; i < base.input.length; i++) targets.push([`input[${i}]`, (b, v) => { b.input[i] = v; }]);
    targets.push(['input[0].content[0]', (b, v) => { b.input[0].content[0] = v; }],
                 ['input[1].arguments', (b, v) => { b.input[1].arguments = v; }],
                 ['input[2].output', (b, v) => { b.input[2].output = v; }],
                 ['input[3].summary', (b, v) => { b.input[3].summary = v; }],
                 ['tools[0].parameters', (b, v) => { b.tools[0].parameters = v; }],
                 ['text.format', (b, v) => { b.text.format = v; }]);
    for (const [where, set] of targets) {
      for (const value of wrong) {
        const body = structuredClone(base);
        set(body, value);
        const r = await postJson(server.baseURL, '/v1/responses', body);
        const what = `${where} = ${JSON.stringify(value)}: ${r.text}`;
        assert.ok(r.status === 200 || r.status === 400 || r.status === 404, what);
        if (r.status !== 200) assert.ok(r.json.error.param, what);
      }
    }
    const metrics = await (await fetch(`${server.baseURL}/metrics`)).text();
    assert.match(metrics, /ember_http_requests_total\{route="\/v1\/responses",status="200"\} [1-9]/);
    assert.match(metrics, /ember_http_requests_total\{route="\/v1\/responses",status="400"\} [1-9]/);
  });
});

describe('responses with qwen3\'s template (ember synth qwen3 + qwen3 tokenizer)', { skip: missing(qwen3Tokenizer) ?? false }, () => {
  let server, client, modelDir;
  synthServer('tiny-qwen3', qwen3Tokenizer, ['--max-batch', '4'], async (s, dir) => {
    server = s;
    modelDir = dir;
    client = server.client();
  });

  const tools = [{ type: 'function', name: 'get_weather', description: 'Weather for a city',
                   // One possible input: the forced call is fully determined by its schema.
                   parameters: { type: 'object', properties: { city: { enum: ['Paris'] } }, required: ['city'], additionalProperties: false } }];

  test('function call round trip: function_call -> function_call_output -> answer (also streamed)', async () => {
    const base = { model: MODEL, max_output_tokens: 60, temperature: 0, tools, reasoning: { effort: 'none' } };
    const question = { role: 'user', content: 'Weather in Paris?' };
    const first = await client.responses.create({ ...base, input: [question], tool_choice: { type: 'function', name: 'get_weather' } });
    assert.equal(first.status, 'completed');
    const call = first.output.find((item) => item.type === 'function_call');
    assert.ok(call, JSON.stringify(first.output));
    assert.match(call.id, /^fc_/);
    assert.match(call.call_id, /^call_/);
    assert.equal(call.name, 'get_weather');
    assert.deepEqual(JSON.parse(call.arguments), { city: 'Paris' });
    assert.equal(first.tools[0].name, 'get_weather');

    const events = await collect(client, { ...base, input: [question], tool_choice: { type: 'function', name: 'get_weather' } });
    const types = events.map((e) => e.type);
    const added = events.find((e) => e.type === 'response.output_item.added' && e.item.type === 'function_call');
    assert.equal(added.item.name, 'get_weather');
    const args = events.filter((e) => e.type === 'response.function_call_arguments.delta').map((e) => e.delta).join('');
    assert.deepEqual(JSON.parse(args), { city: 'Paris' });
    assert.equal(events.find((e) => e.type === 'response.function_call_arguments.done').arguments, args);
    assert.ok(types.indexOf('response.function_call_arguments.done') < types.lastIndexOf('response.output_item.done'));
    assert.equal(types.at(-1), 'response.completed');

    // The output items go back as input with the call's result; the model answers.
    const second = await client.responses.create({ ...base, max_output_tokens: 6, tool_choice: 'none', input: [
      question, ...first.output, { type: 'function_call_output', call_id: call.call_id, output: '{"temp_c": 21}' }] });
    assert.ok(!second.output.some((item) => item.type === 'function_call'));
    const unanswered = await client.responses.create({ ...base, max_output_tokens: 1, tool_choice: 'none', input: [question] });
    assert.ok(second.usage.input_tokens > unanswered.usage.input_tokens, 'the call and its output reach the prompt');

    await assert.rejects(client.responses.create({ ...base, input: [question], tool_choice: { type: 'function', name: 'nope' } }),
      (err) => err.status === 400 && err.param === 'tool_choice.name');
  });

  test('text.format json_schema: the output follows the schema (the chat path\'s structured output)', async () => {
    const schema = { type: 'object', properties: { ok: { enum: ['yes'] } }, required: ['ok'], additionalProperties: false };
    // (Random weights favour whitespace, which JSON allows between tokens: a generous budget.)
    const r = await client.responses.create({ model: MODEL, input: 'JSON please', max_output_tokens: 200, temperature: 0,
      reasoning: { effort: 'high' }, text: { format: { type: 'json_schema', name: 'answer', schema, strict: true } } });
    assert.equal(r.status, 'completed', r.output_text);
    assert.deepEqual(JSON.parse(r.output_text), { ok: 'yes' });
    assert.equal(r.text.format.type, 'json_schema');
    await assert.rejects(client.responses.create({ model: MODEL, input: 'x', max_output_tokens: 4,
      text: { format: { type: 'json_schema', name: 'a', schema: { type: 'string' } } } }),
      (err) => err.status === 400 && err.param === 'text.format.schema');
  });

  test('reasoning: a think block comes back as a reasoning item (reasoning_text events when streamed)', async () => {
    // An R1-style template opens the think block in the prompt; the reply starts inside it.
    const file = path.join(tmpDir('ember-think-'), 'think.jinja');
    fs.writeFileSync(file, "{% for m in messages %}{{ m['content'] }}\n{% endfor %}<think>\n");
    const thinking = await startServer(modelDir, ['--chat-template', file, '--reasoning-parser', 'think']);
    try {
      const c = thinking.client();
      const params = { model: MODEL, input: 'Think first.', max_output_tokens: 12, temperature: 0 };
      const r = await c.responses.create(params);
      assert.equal(r.output[0].type, 'reasoning');
      assert.match(r.output[0].id, /^rs_/);
      const thought = r.output[0].content[0].text;
      assert.ok(thought.length > 0);
      const events = await collect(c, params);
      const deltas = events.filter((e) => e.type === 'response.reasoning_text.delta').map((e) => e.delta).join('');
      assert.equal(deltas, thought);
      assert.equal(events.find((e) => e.type === 'response.reasoning_text.done').text, thought);
      // The reasoning item goes back as input (before the assistant turn it belongs to).
      const again = await c.responses.create({ ...params, max_output_tokens: 2,
        input: [{ role: 'user', content: 'Think first.' }, ...r.output, { role: 'user', content: 'More?' }] });
      assert.equal(again.object, 'response');
    } finally {
      await thinking.stop();
    }
  });
});
