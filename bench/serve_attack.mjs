#!/usr/bin/env node
// serve_attack: `ember serve` under attack. Phase 1: --streams well-behaved streaming
// clients (raw keep-alive sockets, each looping /v1/completions stream requests) and --slow
// slowloris connections (each trickles header bytes; reconnects when the server cuts it off)
// for --duration seconds, while /health is timed every 100 ms on a fresh connection. Reports
// /health p50/p99/max (target < 100 ms) and the errors among the well-behaved clients (target 0).
// Phase 2 (--soak S): 64 workers mix valid, invalid, streaming and mid-stream-disconnecting
// requests for S seconds while the server's RSS (--pid) is sampled every 2 s (target: flat).
// Usage: node bench/serve_attack.mjs --port 8080 --pid PID [--streams 1000] [--slow 1000]
//        [--duration 30] [--max-tokens 16] [--soak 60] [--model NAME]
// The client needs `ulimit -n` above streams + slow + 100; the server raises its own limit.
import fs from 'node:fs';
import net from 'node:net';
import { Worker } from 'node:worker_threads';

const opts = { port: 8080, pid: 0, streams: 1000, slow: 1000, duration: 30, maxTokens: 16, soak: 60,
               model: '' };
for (let i = 2; i < process.argv.length; i += 2) {
  const key = process.argv[i].replace(/^--/, '').replace(/-(\w)/g, (_, c) => c.toUpperCase());
  if (!(key in opts)) throw new Error(`unknown flag ${process.argv[i]}`);
  opts[key] = key === 'model' ? process.argv[i + 1] : Number(process.argv[i + 1]);
}
const HOST = `127.0.0.1:${opts.port}`;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function rssMiB() {
  try {
    const m = fs.readFileSync(`/proc/${opts.pid}/status`, 'utf8').match(/VmRSS:\s+(\d+) kB/);
    return m ? Number(m[1]) / 1024 : null;
  } catch { return null; }
}

function pct(sorted, p) {
  return sorted.length ? sorted[Math.min(sorted.length - 1, Math.ceil(p * sorted.length) - 1)] : 0;
}

function post(body, extra = '') {
  return `POST /v1/completions HTTP/1.1\r\nHost: ${HOST}\r\nContent-Type: application/json\r\n${extra}` +
         `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
}

function completionBody(stream, seed) {
  const b = { prompt: `Once upon a time ${seed % 97}`, max_tokens: opts.maxTokens, stream,
              logit_bias: { 2: -100 } };
  if (opts.model) b.model = opts.model;
  return JSON.stringify(b);
}

// One keep-alive socket; run(request, isDone) writes a request and resolves with the bytes of
// its response once isDone(text) says it is complete, or rejects on error/close/timeout.
function connection() {
  const sock = net.connect({ host: '127.0.0.1', port: opts.port });
  let buf = '', waiter = null;
  const fail = (e) => { if (waiter) { const w = waiter; waiter = null; w.reject(e); } };
  sock.setEncoding('utf8');
  sock.on('data', (d) => {
    buf += d;
    if (waiter && waiter.isDone(buf)) { const w = waiter; waiter = null; const t = buf; buf = ''; w.resolve(t); }
  });
  sock.on('error', (e) => fail(e));
  sock.on('close', () => fail(new Error('closed')));
  return {
    sock,
    run(request, isDone, timeoutMs = 60000) {
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => fail(new Error('timeout')), timeoutMs);
        waiter = { isDone, resolve: (t) => { clearTimeout(timer); resolve(t); },
                   reject: (e) => { clearTimeout(timer); reject(e); } };
        sock.write(request);
      });
    },
  };
}

const sseDone = (t) => t.includes('data: [DONE]') && t.endsWith('0\r\n\r\n');
function wholeDone(t) {
  const end = t.indexOf('\r\n\r\n');
  if (end < 0) return false;
  const m = t.slice(0, end).match(/content-length: (\d+)/i);
  return m && Buffer.byteLength(t.slice(end + 4)) >= Number(m[1]);
}

// Worker-thread code: times GET /health (fresh connection each) every 100 ms until `end`.
const HEALTH_PROBER = `
const { parentPort, workerData } = require('node:worker_threads');
const net = require('node:net');
function probe() {
  return new Promise((resolve) => {
    const t0 = performance.now();
    const s = net.connect({ host: '127.0.0.1', port: workerData.port });
    let buf = '';
    const done = (ok) => { clearTimeout(timer); s.destroy(); resolve({ ok, ms: performance.now() - t0 }); };
    const timer = setTimeout(() => done(false), 10000);
    s.on('connect', () => s.write('GET /health HTTP/1.1\\r\\nHost: 127.0.0.1:' + workerData.port +
                                  '\\r\\nConnection: close\\r\\n\\r\\n'));
    s.on('data', (d) => { buf += d; if (buf.includes('"ok"')) done(buf.startsWith('HTTP/1.1 200')); });
    s.on('error', () => done(false));
  });
}
(async () => {
  const health = []; let healthFailures = 0;
  while (Date.now() < workerData.end) {
    const h = await probe();
    if (h.ok) health.push(h.ms); else ++healthFailures;
    await new Promise((r) => setTimeout(r, 100));
  }
  parentPort.postMessage({ health, healthFailures });
})();
`;

async function phaseAttack() {
  const end = Date.now() + opts.duration * 1000;
  let slowOpen = 0, slowCut = 0, stop = false;
  const slowSocks = new Set();
  const openSlow = () => {
    if (stop) return;
    const s = net.connect({ host: '127.0.0.1', port: opts.port });
    slowSocks.add(s);
    s.on('connect', () => { ++slowOpen; s.write('GET /health HTTP/1.1\r\n'); });
    s.on('error', () => {});
    s.on('close', () => { slowSocks.delete(s); ++slowCut; setTimeout(openSlow, 200); });
  };
  for (let i = 0; i < opts.slow; ++i) openSlow();
  const trickle = setInterval(() => { for (const s of slowSocks) if (s.writable) s.write('X'); }, 1000);

  const stats = { requests: 0, errors: 0, errorKinds: {} };
  const client = async (idx) => {
    await sleep((idx % 100) * 10);  // connect in a ramp rather than one burst
    let c = connection();
    for (let k = 0; Date.now() < end; ++k) {
      try {
        const r = await c.run(post(completionBody(true, idx * 1000 + k)), sseDone);
        if (!r.startsWith('HTTP/1.1 200')) throw new Error(r.slice(0, 12));
        ++stats.requests;
      } catch (e) {
        ++stats.errors;
        stats.errorKinds[e.message] = (stats.errorKinds[e.message] ?? 0) + 1;
        c.sock.destroy();
        c = connection();
      }
    }
    c.sock.destroy();
  };
  const clients = Array.from({ length: opts.streams }, (_, i) => client(i));
  // /health is timed from its own thread, so the 2,000 sockets of this one do not delay it.
  const prober = new Worker(HEALTH_PROBER, { eval: true, workerData: { port: opts.port, end } });
  const { health, healthFailures } = await new Promise((resolve) => prober.on('message', resolve));
  await Promise.all(clients);
  stop = true;
  clearInterval(trickle);
  for (const s of slowSocks) s.destroy();
  health.sort((a, b) => a - b);
  return { streams: opts.streams, slow: opts.slow, slowConnectionsOpened: slowOpen, slowCutOffs: slowCut,
           streamRequests: stats.requests, streamErrors: stats.errors, errorKinds: stats.errorKinds,
           health: { samples: health.length, failures: healthFailures, p50Ms: +pct(health, 0.5).toFixed(1),
                     p99Ms: +pct(health, 0.99).toFixed(1), maxMs: +(health.at(-1) ?? 0).toFixed(1) } };
}

async function phaseSoak() {
  const end = Date.now() + opts.soak * 1000;
  const counts = { valid: 0, invalid: 0, stream: 0, disconnect: 0, unexpected: 0 };
  const rss = [];
  const sampler = setInterval(() => rss.push(+(rssMiB() ?? 0).toFixed(1)), 2000);
  rss.push(+(rssMiB() ?? 0).toFixed(1));
  const worker = async (idx) => {
    for (let k = 0; Date.now() < end; ++k) {
      const kind = ['valid', 'invalid', 'stream', 'disconnect'][(idx + k) % 4];
      const c = connection();
      try {
        if (kind === 'valid') {
          const r = await c.run(post(completionBody(false, k)), wholeDone);
          if (!r.startsWith('HTTP/1.1 200')) ++counts.unexpected;
        } else if (kind === 'invalid') {
          const r = await c.run(post('{"prompt": "x", "max_tokens": "many"'), wholeDone);
          if (!r.startsWith('HTTP/1.1 400')) ++counts.unexpected;
        } else if (kind === 'stream') {
          const r = await c.run(post(completionBody(true, k)), sseDone);
          if (!r.startsWith('HTTP/1.1 200')) ++counts.unexpected;
        } else {
          await c.run(post(completionBody(true, k)), (t) => t.includes('data: '));
        }
        ++counts[kind];
      } catch {
        ++counts.unexpected;
      } finally {
        c.sock.destroy();
      }
    }
  };
  await Promise.all(Array.from({ length: 64 }, (_, i) => worker(i)));
  clearInterval(sampler);
  rss.push(+(rssMiB() ?? 0).toFixed(1));
  return { seconds: opts.soak, counts, rssMiB: rss };
}

const attack = await phaseAttack();
console.log(JSON.stringify({ attack }, null, 1));
if (opts.soak > 0) {
  await sleep(12000);  // let the slowloris connections time out before the soak's baseline
  console.log(JSON.stringify({ soak: await phaseSoak() }, null, 1));
}
