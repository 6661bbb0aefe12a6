// Shared helpers for the `ember serve` end-to-end tests: locating the binary and fixtures,
// starting a server on a free loopback port, and small HTTP utilities.
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import assert from 'node:assert/strict';
import { after, before } from 'node:test';
import OpenAI from 'openai';

const here = path.dirname(fileURLToPath(import.meta.url));
export const repoRoot = path.resolve(here, '..', '..');

export const emberBin =
  process.env.EMBER_BIN || path.join(repoRoot, 'build', 'release', 'ember');
export const fixturesDir =
  process.env.EMBER_FIXTURES || path.resolve(repoRoot, '..', 'shared', 'fixtures');
export const tokenizersDir =
  process.env.EMBER_TOKENIZERS || path.join(repoRoot, '.cache', 'tokenizers');
export const tinyStoriesDir = path.join(fixturesDir, 'models', 'tinystories-656k');

// Why a suite cannot run here, or null when it can.
export function missing(...paths) {
  if (!fs.existsSync(emberBin)) return `ember binary not found: ${emberBin} (set EMBER_BIN)`;
  for (const p of paths) {
    if (!fs.existsSync(p)) return `fixture not found: ${p} (set EMBER_FIXTURES / EMBER_TOKENIZERS or run scripts/setup.sh)`;
  }
  return null;
}

// Starts `ember serve` on a free loopback port; resolves once it prints its address.
export async function startServer(modelDir, extraArgs = []) {
  return spawnServer(['--model', modelDir, '--served-model-name', 'test-model', ...extraArgs]);
}

// Starts `ember serve --models-dir DIR` (a model library) the same way.
export async function startLibraryServer(modelsDir, extraArgs = []) {
  return spawnServer(['--models-dir', modelsDir, ...extraArgs]);
}

async function spawnServer(serveArgs) {
  const args = ['serve', '--host', '127.0.0.1', '--port', '0', ...serveArgs];
  // stop() should not wait for a drain unless a test asks for one.
  if (!serveArgs.includes('--shutdown-grace')) args.push('--shutdown-grace', '0');
  const proc = spawn(emberBin, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not start:\n${log}`)), 60000);
    const onData = (chunk) => {
      log += chunk.toString();
      const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    };
    proc.stdout.on('data', onData);
    proc.stderr.on('data', onData);
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`server exited (${code}):\n${log}`)); });
  });
  proc.stdout.on('data', (c) => { log += c.toString(); });
  proc.stderr.on('data', (c) => { log += c.toString(); });
  const baseURL = `http://127.0.0.1:${port}`;
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  return {
    proc, port, baseURL, exited,
    log: () => log,
    client: (opts = {}) => new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: opts.apiKey ?? 'unused',
                                        maxRetries: 0, timeout: 120000 }),
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGTERM');
      return exited;
    },
  };
}

export async function postJson(baseURL, route, body, headers = {}) {
  const res = await fetch(baseURL + route, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...headers },
    body: typeof body === 'string' || body instanceof Uint8Array ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: res.status, json, text };
}

export async function getJson(baseURL, route) {
  const res = await fetch(baseURL + route);
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: res.status, json, text };
}

export async function waitFor(predicate, timeoutMs = 5000, stepMs = 20) {
  const start = Date.now();
  while (Date.now() - start < timeoutMs) {
    if (await predicate()) return true;
    await new Promise((r) => setTimeout(r, stepMs));
  }
  return false;
}

export function tmpDir(prefix) {
  return fs.mkdtempSync(path.join(os.tmpdir(), prefix));
}

// `ember synth --like PRESET` into a temp folder; null (with the reason) when unsupported.
export function synthModel(preset, tokenizer, dtype = 'f32') {
  const out = path.join(tmpDir('ember-synth-'), preset);
  const r = spawnSync(emberBin, ['synth', '--like', preset, '--out', out, '--tokenizer', tokenizer,
                                 '--dtype', dtype], { encoding: 'utf8' });
  if (r.status !== 0) return { dir: null, reason: (r.stderr || r.stdout).trim() };
  return { dir: out, reason: null };
}

// A server on an `ember synth PRESET` model with TOKENIZER's vocabulary (a 64 MiB KV cache plus
// `extraArgs`) for the enclosing describe(): started before its tests, stopped and its model
// removed after them. `ready(server, modelDir)` receives the running server and the model folder.
export function synthServer(preset, tokenizer, extraArgs, ready) {
  let server = null;
  let modelDir = null;
  before(async () => {
    const made = synthModel(preset, tokenizer, 'f32');
    assert.ok(made.dir, `ember synth failed: ${made.reason}`);
    modelDir = made.dir;
    server = await startServer(modelDir, ['--kv-cache-bytes', String(64 << 20), ...extraArgs]);
    await ready(server, modelDir);
  });
  after(async () => {
    if (server) await server.stop();
    if (modelDir) fs.rmSync(path.dirname(modelDir), { recursive: true, force: true });
  });
}
