// The served context (--max-model-len, alias --ctx-size): what /v1/models and /stats report and
// what requests are checked against; at most the model's context and what the KV cache holds
// (more is refused at start-up, naming both numbers); without the flag, the model's context
// capped to the KV cache, so the server never advertises more than one request can use.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { emberBin, getJson, missing, postJson, startServer, tinyStoriesDir } from './helpers.mjs';

describe('served context (tinystories-656k, 512 positions)', { skip: missing(tinyStoriesDir) ?? false }, () => {
  let server;
  before(async () => { server = await startServer(tinyStoriesDir, ['--max-model-len', '128']); });
  after(async () => { await server.stop(); });

  test('--max-model-len 128: reported and enforced', async () => {
    const models = (await getJson(server.baseURL, '/v1/models')).json;
    assert.equal(models.data[0].context_length, 128);
    assert.equal(models.data[0].max_model_len, 128);
    assert.equal((await getJson(server.baseURL, '/stats')).json.context_length, 128);
    const ok = await postJson(server.baseURL, '/v1/completions',
                              { prompt: 'Once upon a time', max_tokens: 100, temperature: 0 });
    assert.equal(ok.status, 200, ok.text);
    const long = await postJson(server.baseURL, '/v1/completions',
                                { prompt: 'Once upon a time', max_tokens: 125, temperature: 0 });
    assert.equal(long.status, 400, long.text);
    assert.equal(long.json.error.param, 'max_tokens');
    assert.match(long.json.error.message, /maximum context length is 128/);
  });
});

describe('served context at start-up', { skip: missing(tinyStoriesDir) ?? false }, () => {
  const serve = (args) => spawnSync(emberBin, ['serve', '--model', tinyStoriesDir, '--port', '0', ...args],
                                    { encoding: 'utf8', timeout: 60000 });

  test('more than the model\'s context is refused', () => {
    const r = serve(['--max-model-len', '1000']);
    assert.notEqual(r.status, 0);
    assert.match(r.stderr, /--max-model-len: must be in \[1, 512\]/);
  });

  test('more than the KV cache holds is refused; --ctx-size is the same flag', () => {
    // 16 KiB of KV holds 16 tokens of tinystories (2 layers x K,V x 4 heads x 16 dims x 4 bytes = 1 KiB a token).
    const r = serve(['--ctx-size', '256', '--kv-cache-bytes', String(16 << 10)]);
    assert.notEqual(r.status, 0);
    assert.match(r.stderr, /--max-model-len 256: the KV cache holds only \d+ tokens/);
  });

  test('without the flag the context is capped to the KV cache', async () => {
    const s = await startServer(tinyStoriesDir, ['--kv-cache-bytes', String(64 << 10)]);
    try {
      const m = (await getJson(s.baseURL, '/v1/models')).json.data[0];
      const stats = (await getJson(s.baseURL, '/stats')).json;
      assert.ok(m.context_length < 512, `context ${m.context_length}`);
      assert.equal(m.context_length, stats.kv_capacity_tokens);
    } finally {
      await s.stop();
    }
  });
});
