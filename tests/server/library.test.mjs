// `ember serve --models-dir DIR`: a model library listed by /v1/models, loaded on demand within a
// memory budget (least recently used idle model evicted), rescanned with ?refresh=1.
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { emberBin, fixturesDir, getJson, missing, postJson, startLibraryServer, tinyStoriesDir } from './helpers.mjs';

const tinyGguf = path.join(fixturesDir, 'gguf', 'ts-f32.gguf');
const skip = missing(tinyStoriesDir, tinyGguf) ?? false;

// A folder whose files are links to the tinystories fixture's (the Hugging Face cache's layout).
function linkModel(dir, { tokenizer = true } = {}) {
  fs.mkdirSync(dir, { recursive: true });
  for (const f of fs.readdirSync(tinyStoriesDir)) {
    if (!tokenizer && f.startsWith('tokenizer')) continue;
    fs.symlinkSync(path.join(tinyStoriesDir, f), path.join(dir, f));
  }
}

describe('model library', { skip }, () => {
  let root, server;
  before(async () => {
    root = fs.mkdtempSync(path.join(os.tmpdir(), 'ember-library-'));
    linkModel(path.join(root, 'alpha'));
    linkModel(path.join(root, 'team', 'beta'));
    linkModel(path.join(root, 'broken'), { tokenizer: false });
    fs.mkdirSync(path.join(root, 'files'));
    fs.symlinkSync(tinyGguf, path.join(root, 'files', 'tiny.gguf'));  // a GGUF file is a model too
    // Each model holds ~3 MB of weights + a 2 MB KV cap: the budget holds one at a time.
    server = await startLibraryServer(root, ['--kv-cache-bytes', '2000000', '--models-memory', '8000000']);
  });
  after(async () => {
    await server?.stop();
    fs.rmSync(root, { recursive: true, force: true });
  });

  const complete = (model) => postJson(server.baseURL, '/v1/completions',
    { model, prompt: 'Once upon a time', max_tokens: 6, temperature: 0 });

  test('lists every folder with what its files say, none loaded yet', async () => {
    const { status, json } = await getJson(server.baseURL, '/v1/models');
    assert.equal(status, 200);
    assert.deepEqual(json.data.map((m) => m.id), ['alpha', 'broken', 'files/tiny', 'team/beta']);
    const tiny = json.data[2];
    assert.equal(tiny.library.format, 'gguf');
    assert.equal(tiny.library.architecture, 'llama');
    assert.equal(tiny.library.state, 'available');
    const alpha = json.data[0];
    assert.equal(alpha.library.state, 'available');
    assert.equal(alpha.library.architecture, 'LlamaForCausalLM');
    assert.equal(alpha.library.dtype, 'float32');
    assert.equal(alpha.context_length, 512);
    assert.ok(alpha.library.disk_bytes > 1000000);
    assert.equal(alpha.capabilities.completions, true);
    assert.equal(alpha.capabilities.chat_completions, false);  // no chat template
    const broken = json.data[1];
    assert.equal(broken.library.state, 'unavailable');
    assert.match(broken.library.error, /tokenizer\.json/);
    assert.equal(broken.capabilities.completions, false);
  });

  test('a request loads its model; the same tokens from either folder', async () => {
    const a = await complete('alpha');
    assert.equal(a.status, 200, a.text);
    assert.equal(a.json.model, 'alpha');
    const b = await complete('team/beta');
    assert.equal(b.status, 200, b.text);
    assert.equal(b.json.choices[0].text, a.json.choices[0].text);
    const details = await getJson(server.baseURL, '/v1/models/team/beta');
    assert.equal(details.json.library.state, 'loaded');
    assert.equal(details.json.capabilities.completions, true);
    assert.equal(details.json.max_model_len, 512);  // the loaded model's full entry
  });

  test('the budget holds one model: the idle one is evicted', async () => {
    assert.equal((await complete('alpha')).status, 200);
    const stats = (await getJson(server.baseURL, '/stats')).json;
    assert.ok(stats.library.evictions >= 1, JSON.stringify(stats.library));
    assert.deepEqual(stats.models.map((m) => m.model), ['alpha']);
    assert.ok(stats.library.resident_bytes <= stats.library.memory_budget_bytes);
    const list = (await getJson(server.baseURL, '/v1/models')).json.data;
    assert.equal(list.find((m) => m.id === 'team/beta').library.state, 'available');
  });

  test('model errors name the field', async () => {
    const none = await postJson(server.baseURL, '/v1/completions', { prompt: 'x', max_tokens: 1 });
    assert.equal(none.status, 400);
    assert.equal(none.json.error.param, 'model');
    assert.equal(none.json.error.code, 'model_required');
    const unknown = await complete('nope');
    assert.equal(unknown.status, 404);
    assert.equal(unknown.json.error.code, 'model_not_found');
    const broken = await complete('broken');
    assert.equal(broken.status, 400);
    assert.equal(broken.json.error.code, 'model_unavailable');
    assert.equal((await getJson(server.baseURL, '/v1/models/nope')).status, 404);
  });

  test('a GGUF file loads like a folder', async () => {
    const r = await complete('files/tiny');
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.model, 'files/tiny');
    assert.ok(r.json.choices[0].text.length > 0);
  });

  test('?refresh=1 rescans the folder', async () => {
    linkModel(path.join(root, 'gamma'));
    let ids = (await getJson(server.baseURL, '/v1/models')).json.data.map((m) => m.id);
    assert.ok(!ids.includes('gamma'));
    ids = (await getJson(server.baseURL, '/v1/models?refresh=1')).json.data.map((m) => m.id);
    assert.ok(ids.includes('gamma'));
    assert.equal((await complete('gamma')).status, 200);
  });
});

describe('library flags', { skip }, () => {
  test('--model and --models-dir exclude each other; library-wide flags are refused', () => {
    for (const [args, message] of [
      [['--model', tinyStoriesDir, '--models-dir', tinyStoriesDir], /exclude each other/],
      [['--models-dir', tinyStoriesDir, '--served-model-name', 'x'], /--served-model-name/],
      [['--model', tinyStoriesDir, '--models-memory', '100'], /--models-memory: needs --models-dir/],
      [['--models-dir', '/nonexistent-ember-dir'], /not a readable folder/],
    ]) {
      const r = spawnSync(emberBin, ['serve', '--port', '0', ...args], { encoding: 'utf8' });
      assert.equal(r.status, 1, r.stderr);
      assert.match(r.stderr, message);
    }
  });
});
