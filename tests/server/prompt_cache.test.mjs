// The prompt cache's tiers through `ember serve` (tinystories-656k, official openai client):
// disk: a long prompt's KV survives a restart (usage.prompt_tokens_details.cached_tokens, same
// greedy text), also after kill -9; cache_salt isolates; POST /v1/cache/clear drops it; /stats
// and /metrics report the tier; a second server on the same directory is refused. RAM: a prompt
// evicted from a small KV pool comes back from RAM with the same text; /stats, /metrics, clear.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { spawnSync } from 'node:child_process';
import { emberBin, getJson, missing, postJson, startServer, tinyStoriesDir, tmpDir, waitFor } from './helpers.mjs';

const skip = missing(tinyStoriesDir);
const PROMPT = 'Once upon a time there was a little girl named Lily who loved to play in the park. '
  .repeat(5);

describe('prompt cache disk tier (tinystories-656k)', { skip: skip ?? false }, () => {
  let dir;
  const args = () => ['--prompt-cache-dir', dir, '--prompt-cache-disk-bytes', '100000000'];
  const ask = (client, extra = {}) => client.completions.create({
    model: 'test-model', prompt: PROMPT, max_tokens: 12, temperature: 0, ...extra });
  before(() => { dir = tmpDir('ember-prompt-cache-'); });
  after(() => { fs.rmSync(dir, { recursive: true, force: true }); });

  let cold;
  test('a restart serves the prompt from disk with the same text', async () => {
    let server = await startServer(tinyStoriesDir, args());
    cold = await ask(server.client());
    assert.equal(cold.usage.prompt_tokens_details.cached_tokens, 0);
    assert.equal((await server.stop()).code, 0);

    server = await startServer(tinyStoriesDir, args());
    try {
      const warm = await ask(server.client());
      const whole = Math.floor((cold.usage.prompt_tokens - 1) / 16) * 16;
      assert.equal(warm.usage.prompt_tokens_details.cached_tokens, whole);
      assert.equal(warm.choices[0].text, cold.choices[0].text);
      const stats = (await getJson(server.baseURL, '/stats')).json.prompt_cache;
      assert.equal(stats.tiers.disk.promotions, whole / 16);
      assert.equal(stats.tiers.disk.corrupt_dropped, 0);
      assert.ok(stats.tiers.disk.bytes > 0 && stats.tiers.disk.bytes <= 100000000);
      assert.ok(['load', 'load_unmeasured'].includes(stats.reuse.last_choice), stats.reuse.last_choice);
      const metrics = (await fetch(server.baseURL + '/metrics').then((r) => r.text()));
      assert.match(metrics, new RegExp(`ember_prompt_cache_promotions_total\\{tier="disk"\\} ${whole / 16}\\n`));
    } finally {
      await server.stop();
    }
  });

  test('kill -9 leaves a directory the next server uses', async () => {
    let server = await startServer(tinyStoriesDir, args());
    let other, written;
    try {
      other = await ask(server.client(), { prompt: PROMPT + ' The end.', cache_salt: 'k9' });
      // Let the writer finish (kill -9 mid-write is the fault-injection tests' business: a torn
      // record is a temp file, removed at start-up), then kill without any shutdown.
      written = await waitFor(async () => {
        const d = (await getJson(server.baseURL, '/stats')).json.prompt_cache.tiers.disk;
        return d.queued_bytes === 0 && d.writes > 0;
      });
    } finally {
      server.proc.kill('SIGKILL');
      await server.exited;
    }
    assert.ok(written);
    server = await startServer(tinyStoriesDir, args());
    try {
      const again = await ask(server.client(), { prompt: PROMPT + ' The end.', cache_salt: 'k9' });
      assert.equal(again.choices[0].text, other.choices[0].text);
      const whole = Math.floor((other.usage.prompt_tokens - 1) / 16) * 16;
      assert.equal(again.usage.prompt_tokens_details.cached_tokens, whole);
      const stats = (await getJson(server.baseURL, '/stats')).json.prompt_cache;
      assert.equal(stats.tiers.disk.write_errors, 0);
    } finally {
      await server.stop();
    }
  });

  test('cache_salt isolates, and /v1/cache/clear drops one salt or all', async () => {
    const server = await startServer(tinyStoriesDir, args());
    try {
      const client = server.client();
      await ask(client, { cache_salt: 'tenant-a' });
      const b = await ask(client, { cache_salt: 'tenant-b' });
      assert.equal(b.usage.prompt_tokens_details.cached_tokens, 0);
      assert.equal(b.choices[0].text, cold.choices[0].text);
      assert.ok((await ask(client, { cache_salt: 'tenant-a' })).usage.prompt_tokens_details.cached_tokens > 0);

      const bad = await postJson(server.baseURL, '/v1/cache/clear', { cache_salt: 5 });
      assert.equal(bad.status, 400);
      assert.equal(bad.json.error.param, 'cache_salt');
      const one = await postJson(server.baseURL, '/v1/cache/clear', { cache_salt: 'tenant-a' });
      assert.equal(one.status, 200);
      assert.equal(one.json.scope, 'cache_salt');
      assert.ok(one.json.disk_blocks_removed > 0);
      assert.equal((await ask(client, { cache_salt: 'tenant-a' })).usage.prompt_tokens_details.cached_tokens, 0);
      assert.ok((await ask(client, { cache_salt: 'tenant-b' })).usage.prompt_tokens_details.cached_tokens > 0);
      const all = await postJson(server.baseURL, '/v1/cache/clear', {});
      assert.equal(all.json.scope, 'all');
      assert.equal((await ask(client)).usage.prompt_tokens_details.cached_tokens, 0);
    } finally {
      await server.stop();
    }
  });

  test('a second server on the same directory is refused, naming it', async () => {
    const server = await startServer(tinyStoriesDir, args());
    try {
      const r = spawnSync(emberBin, ['serve', '--model', tinyStoriesDir, '--port', '0', ...args()],
                          { encoding: 'utf8', timeout: 60000 });
      assert.notEqual(r.status, 0);
      assert.match(r.stderr, /in use by another Ember engine/);
    } finally {
      await server.stop();
    }
  });

});

describe('prompt cache RAM tier (tinystories-656k)', { skip: skip ?? false }, () => {
  // A pool of 24 blocks of 16 tokens (1 KiB of KV a token on this model): a few prompts evict it.
  const args = ['--kv-cache-bytes', String(24 * 16 * 1024), '--prompt-cache-ram-bytes', '10000000'];
  const ask = (client, prompt, extra = {}) => client.completions.create({
    model: 'test-model', prompt, max_tokens: 12, temperature: 0, ...extra });
  const OTHERS = ['The cat sat on the warm mat and purred all day long. ',
    'Tom and his dog went to the big blue sea to swim with a fish. ',
    'A tiny bird sang a happy song in the old tree by the house. ',
    'The sun was hot, so Mia ate a cold red apple under the tree. '];

  test('a prompt evicted from the pool is served from RAM with the same text', async () => {
    const server = await startServer(tinyStoriesDir, args);
    try {
      const client = server.client();
      const first = await ask(client, PROMPT);
      for (const other of OTHERS) await ask(client, other.repeat(10));
      let stats = (await getJson(server.baseURL, '/stats')).json.prompt_cache;
      assert.ok(stats.tiers.ram.demotions > 0, JSON.stringify(stats.tiers.ram));
      assert.equal(stats.tiers.disk, undefined);
      const again = await ask(client, PROMPT);
      const whole = Math.floor((first.usage.prompt_tokens - 1) / 16) * 16;
      assert.equal(again.usage.prompt_tokens_details.cached_tokens, whole);
      assert.equal(again.choices[0].text, first.choices[0].text);
      stats = (await getJson(server.baseURL, '/stats')).json.prompt_cache;
      assert.ok(stats.tiers.ram.promotions > 0 && stats.tiers.ram.hits === stats.tiers.ram.promotions,
                JSON.stringify(stats.tiers.ram));
      assert.ok(stats.tiers.ram.bytes > 0 && stats.tiers.ram.bytes <= 10000000);
      assert.equal(stats.tiers.ram.capacity_bytes, 10000000);
      const metrics = await fetch(server.baseURL + '/metrics').then((r) => r.text());
      assert.match(metrics, new RegExp(`ember_prompt_cache_promotions_total\\{tier="ram"\\} ${stats.tiers.ram.promotions}\\n`));
      assert.doesNotMatch(metrics, /tier="disk"/);

      const cleared = await postJson(server.baseURL, '/v1/cache/clear', {});
      assert.equal(cleared.status, 200);
      assert.ok(cleared.json.ram_blocks_removed > 0, JSON.stringify(cleared.json));
      assert.equal(cleared.json.disk_blocks_removed, 0);
      assert.equal((await getJson(server.baseURL, '/stats')).json.prompt_cache.tiers.ram.bytes, 0);
    } finally {
      await server.stop();
    }
  });

  test('a RAM cap smaller than one KV block is refused, naming the flag', () => {
    const r = spawnSync(emberBin, ['serve', '--model', tinyStoriesDir, '--port', '0',
                                   '--prompt-cache-ram-bytes', '1000'],
                        { encoding: 'utf8', timeout: 60000 });
    assert.notEqual(r.status, 0);
    assert.match(r.stderr, /--prompt-cache-ram-bytes: 1000 holds no KV block/);
  });
});
