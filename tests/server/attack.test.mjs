// Adversarial HTTP clients (issue 47) over raw loopback sockets: oversized chunked bodies,
// Expect: 100-continue, slowloris, header deadlines, pipelining, Host/Origin/CORS rules, half-closed
// clients, clients that never read a stream, the connection cap, a port already in use, and the
// access log. Every loop is bounded by a count and a time limit.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import { emberBin, getJson, missing, startServer, tinyStoriesDir, waitFor } from './helpers.mjs';

const skip = missing(tinyStoriesDir);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function rssBytes(pid) {
  const m = fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+) kB/);
  return m ? Number(m[1]) * 1024 : 0;
}

// Splits raw response bytes into responses (Content-Length or chunked bodies; 1xx have none).
function parseResponses(buf) {
  const out = [];
  let pos = 0;
  while (pos < buf.length) {
    const end = buf.indexOf('\r\n\r\n', pos);
    if (end < 0) break;
    const lines = buf.subarray(pos, end).toString('latin1').split('\r\n');
    const status = Number(lines[0].split(' ')[1]);
    const headers = {};
    for (const l of lines.slice(1)) {
      const i = l.indexOf(':');
      headers[l.slice(0, i).trim().toLowerCase()] = l.slice(i + 1).trim();
    }
    pos = end + 4;
    let body = Buffer.alloc(0);
    if (status >= 200 && status !== 204) {
      if (headers['transfer-encoding'] === 'chunked') {
        const parts = [];
        for (;;) {
          const le = buf.indexOf('\r\n', pos);
          if (le < 0) { pos = buf.length; break; }
          const size = parseInt(buf.subarray(pos, le).toString('latin1'), 16);
          pos = le + 2;
          if (size === 0) { pos += 2; break; }
          parts.push(buf.subarray(pos, pos + size));
          pos += size + 2;
        }
        body = Buffer.concat(parts);
      } else {
        const n = Number(headers['content-length'] ?? 0);
        body = buf.subarray(pos, pos + n);
        pos += n;
      }
    }
    out.push({ status, headers, body: body.toString('utf8') });
  }
  return out;
}

// Connects, writes `data` (a string or Buffer), optionally half-closes, and collects what comes
// back until the server closes or `timeoutMs` passes.
function exchange(port, data, { halfClose = false, timeoutMs = 10000 } = {}) {
  return new Promise((resolve) => {
    const chunks = [];
    const sock = net.connect({ host: '127.0.0.1', port });
    let done = false;
    const finish = (why) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      sock.destroy();
      resolve({ why, data: Buffer.concat(chunks) });
    };
    const timer = setTimeout(() => finish('timeout'), timeoutMs);
    sock.on('connect', () => {
      sock.write(data);
      if (halfClose) sock.end();
    });
    sock.on('data', (c) => chunks.push(c));
    sock.on('end', () => finish('closed'));
    sock.on('error', () => finish('error'));
  });
}

function request(method, path, { host, body = '', headers = {} }) {
  const lines = [`${method} ${path} HTTP/1.1`, `Host: ${host}`];
  for (const [k, v] of Object.entries(headers)) lines.push(`${k}: ${v}`);
  if (body || method === 'POST') lines.push(`Content-Length: ${Buffer.byteLength(body)}`);
  return lines.join('\r\n') + '\r\n\r\n' + body;
}

async function timedHealth(baseURL) {
  const t0 = performance.now();
  const ctrl = new AbortController();
  const timer = setTimeout(() => ctrl.abort(), 5000);
  try {
    const res = await fetch(`${baseURL}/health`, { signal: ctrl.signal });
    await res.text();
    return { status: res.status, ms: performance.now() - t0 };
  } catch {
    return { status: 0, ms: performance.now() - t0 };
  } finally {
    clearTimeout(timer);
  }
}

describe('HTTP attacks (tinystories-656k)', { skip: skip ?? false }, () => {
  let server, host;
  before(async () => {
    server = await startServer(tinyStoriesDir, ['--max-body-bytes', '65536', '--http-threads', '32',
                                                '--header-timeout', '2']);
    host = `127.0.0.1:${server.port}`;
  });
  after(async () => { await server.stop(); });

  test('(2) a chunked body over the limit gets 413 early; memory stays flat', async () => {
    // Warm up first (the first requests fault in the engine's buffers), then measure.
    await fetch(`${server.baseURL}/v1/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: 'test-model', prompt: 'Once', max_tokens: 4 }) }).then((r) => r.text());
    const rssBefore = rssBytes(server.proc.pid);
    const sock = net.connect({ host: '127.0.0.1', port: server.port });
    await new Promise((r) => sock.on('connect', r));
    const received = [];
    let closed = false;
    sock.on('data', (c) => received.push(c));
    sock.on('close', () => { closed = true; });
    sock.on('error', () => { closed = true; });
    sock.write(`POST /v1/completions HTTP/1.1\r\nHost: ${host}\r\nContent-Type: application/json\r\n` +
               'Transfer-Encoding: chunked\r\n\r\n');
    const piece = Buffer.alloc(64 * 1024, 'a');
    const chunk = Buffer.concat([Buffer.from(piece.length.toString(16) + '\r\n'), piece, Buffer.from('\r\n')]);
    let sent = 0;
    const deadline = Date.now() + 20000;
    // Up to 32 MiB, stopping as soon as the server answers (or hangs up).
    // Each write yields to the event loop, so the server's answer (or its hang-up) is seen as soon
    // as it arrives: a loop that only awaited 'drain' kept queueing megabytes into the socket
    // while the 413 sat unread (seen under load in CI).
    for (let i = 0; i < 512 && !closed && received.length === 0 && Date.now() < deadline; ++i) {
      if (!sock.write(chunk)) await new Promise((r) => { sock.once('drain', r); setTimeout(r, 200); });
      else await new Promise((r) => setImmediate(r));
      sent += piece.length;
    }
    await waitFor(() => received.length > 0 || closed, 5000);
    sock.destroy();
    const responses = parseResponses(Buffer.concat(received));
    assert.ok(responses.length >= 1, `no response after ${sent} bytes (closed: ${closed})`);
    assert.equal(responses[0].status, 413, responses[0].body);
    assert.equal(JSON.parse(responses[0].body).error.code, 'request_too_large');
    assert.ok(sent < 8 * 1024 * 1024, `the 413 should come near the 64 KiB limit, came after ${sent} bytes`);
    const grew = rssBytes(server.proc.pid) - rssBefore;
    assert.ok(grew < 24 * 1024 * 1024, `RSS grew by ${grew} bytes`);
  });

  test('(2) Expect: 100-continue with an oversized Content-Length gets 413 at once', async () => {
    const t0 = Date.now();
    const r = await exchange(server.port, `POST /v1/completions HTTP/1.1\r\nHost: ${host}\r\n` +
      'Content-Type: application/json\r\nContent-Length: 1073741824\r\nExpect: 100-continue\r\n\r\n',
    { timeoutMs: 5000 });
    const responses = parseResponses(r.data);
    assert.ok(responses.length >= 1, `no response (${r.why})`);
    assert.equal(responses[0].status, 413, 'the first answer must be 413, not 100 Continue');
    assert.ok(Date.now() - t0 < 2000);
    // A small body with Expect gets 100 Continue, then its answer.
    const body = JSON.stringify({ model: 'test-model', prompt: 'Once', max_tokens: 2 });
    const ok = await exchange(server.port, request('POST', '/v1/completions', {
      host, body, headers: { 'Content-Type': 'application/json', Expect: '100-continue', Connection: 'close' } }));
    const parsed = parseResponses(ok.data);
    assert.deepEqual(parsed.map((p) => p.status), [100, 200]);
  });

  test('(3) slowloris: 200 trickling connections do not starve /health', async () => {
    const socks = [];
    for (let i = 0; i < 200; ++i) {
      const s = net.connect({ host: '127.0.0.1', port: server.port });
      s.on('error', () => {});
      s.on('connect', () => s.write('GET /health HTTP/1.1\r\n'));
      socks.push(s);
    }
    const trickle = setInterval(() => { for (const s of socks) if (!s.destroyed) s.write('X'); }, 300);
    try {
      await sleep(500);
      for (let i = 0; i < 10; ++i) {
        const h = await timedHealth(server.baseURL);
        assert.equal(h.status, 200);
        assert.ok(h.ms < 1000, `/health took ${h.ms} ms`);
        await sleep(50);
      }
    } finally {
      clearInterval(trickle);
      for (const s of socks) s.destroy();
    }
  });

  test('(3) the header deadline closes a trickler (408)', async () => {
    const sock = net.connect({ host: '127.0.0.1', port: server.port });
    const received = [];
    let closedAt = 0;
    sock.on('data', (c) => received.push(c));
    sock.on('close', () => { closedAt = Date.now(); });
    sock.on('error', () => {});
    await new Promise((r) => sock.on('connect', r));
    const t0 = Date.now();
    const text = `GET /health HTTP/1.1\r\nHost: ${host}\r\nX-Slow: ` + 'y'.repeat(100);
    for (let i = 0; i < text.length && !closedAt && Date.now() - t0 < 8000; ++i) {
      sock.write(text[i]);
      await sleep(100);
    }
    await waitFor(() => closedAt > 0, 3000);
    sock.destroy();
    assert.ok(closedAt > 0, 'the connection must be closed by the header deadline');
    assert.ok(closedAt - t0 < 5000, `closed after ${closedAt - t0} ms (--header-timeout 2)`);
    const responses = parseResponses(Buffer.concat(received));
    assert.equal(responses[0]?.status, 408);
  });

  test('(4) pipelined requests are all answered, in order', async () => {
    const body = JSON.stringify({ model: 'test-model', prompt: 'Once upon a time', max_tokens: 3 });
    const data = request('GET', '/health', { host }) +
                 request('POST', '/v1/completions', { host, body, headers: { 'Content-Type': 'application/json' } }) +
                 request('GET', '/v1/models', { host }) +
                 request('GET', '/nope', { host, headers: { Connection: 'close' } });
    const r = await exchange(server.port, data);
    const responses = parseResponses(r.data);
    assert.deepEqual(responses.map((x) => x.status), [200, 200, 200, 404]);
    assert.equal(JSON.parse(responses[0].body).status, 'ok');
    assert.equal(JSON.parse(responses[1].body).object, 'text_completion');
    assert.equal(JSON.parse(responses[2].body).object, 'list');
  });

  test('(8) a foreign Host or Origin is refused; OPTIONS is answered; no CORS by default', async () => {
    const bad = parseResponses((await exchange(server.port, request('GET', '/v1/models', {
      host: 'evil.example:80', headers: { Connection: 'close' } }))).data)[0];
    assert.equal(bad.status, 403);
    assert.equal(JSON.parse(bad.body).error.code, 'host_not_allowed');
    assert.match(JSON.parse(bad.body).error.message, /--allowed-hosts/);
    // A cross-site "simple" POST (text/plain) from a web page.
    const body = JSON.stringify({ model: 'test-model', prompt: 'Once', max_tokens: 2 });
    const xsite = parseResponses((await exchange(server.port, request('POST', '/v1/completions', {
      host, body, headers: { 'Content-Type': 'text/plain', Origin: 'http://evil.example', Connection: 'close' } }))).data)[0];
    assert.equal(xsite.status, 403);
    assert.equal(JSON.parse(xsite.body).error.code, 'origin_not_allowed');
    const localhost = parseResponses((await exchange(server.port, request('GET', '/health', {
      host: `localhost:${server.port}`, headers: { Connection: 'close' } }))).data)[0];
    assert.equal(localhost.status, 200);
    const options = parseResponses((await exchange(server.port, request('OPTIONS', '/v1/chat/completions', {
      host, headers: { Connection: 'close' } }))).data)[0];
    assert.equal(options.status, 204);
    assert.equal(options.headers.allow, 'POST, OPTIONS');
    assert.equal(options.headers['access-control-allow-origin'], undefined);
    const preflight = parseResponses((await exchange(server.port, request('OPTIONS', '/v1/chat/completions', {
      host, headers: { Origin: 'http://evil.example', 'Access-Control-Request-Method': 'POST', Connection: 'close' } }))).data)[0];
    assert.equal(preflight.status, 403);
    assert.equal(preflight.headers['access-control-allow-origin'], undefined);
  });

  test('(11) a half-closed client gets its responses', async () => {
    const body = JSON.stringify({ model: 'test-model', prompt: 'Once upon a time', max_tokens: 5 });
    const r = await exchange(server.port,
      request('GET', '/health', { host }) +
      request('POST', '/v1/completions', { host, body, headers: { 'Content-Type': 'application/json' } }),
      { halfClose: true });
    const responses = parseResponses(r.data).filter((x) => x.status >= 200);
    assert.deepEqual(responses.map((x) => x.status), [200, 200]);
    assert.equal(JSON.parse(responses[1].body).usage.completion_tokens, 5);
  });

  test('(13) one access-log line per request, without prompts', async () => {
    const secret = 'PROMPT-SECRET-42';
    const body = JSON.stringify({ model: 'test-model', prompt: secret, max_tokens: 2 });
    await exchange(server.port, request('POST', '/v1/completions?key=QUERY-SECRET', {
      host, body, headers: { 'Content-Type': 'application/json', Connection: 'close' } }));
    const logged = await waitFor(() => /http POST \/v1\/completions 200 [\d.]+ ms tokens=\d+\+2/.test(server.log()), 3000);
    assert.ok(logged, server.log().slice(-2000));
    assert.ok(!server.log().includes(secret) && !server.log().includes('QUERY-SECRET'));
  });
});

describe('HTTP attacks: server flags (tinystories-656k)', { skip: skip ?? false }, () => {
  test('(8) --allowed-hosts and --cors-origin', async () => {
    const server = await startServer(tinyStoriesDir, ['--allowed-hosts', 'api.example,other.example',
                                                      '--cors-origin', 'http://app.example']);
    try {
      const ok = parseResponses((await exchange(server.port, request('GET', '/health', {
        host: 'api.example:8080', headers: { Connection: 'close' } }))).data)[0];
      assert.equal(ok.status, 200);
      const host = `127.0.0.1:${server.port}`;
      const preflight = parseResponses((await exchange(server.port, request('OPTIONS', '/v1/completions', {
        host, headers: { Origin: 'http://app.example', 'Access-Control-Request-Method': 'POST',
                         'Access-Control-Request-Headers': 'authorization, content-type', Connection: 'close' } }))).data)[0];
      assert.equal(preflight.status, 204);
      assert.equal(preflight.headers['access-control-allow-origin'], 'http://app.example');
      assert.match(preflight.headers['access-control-allow-methods'], /POST/);
      assert.equal(preflight.headers['access-control-allow-headers'], 'authorization, content-type');
      const get = parseResponses((await exchange(server.port, request('GET', '/health', {
        host, headers: { Origin: 'http://app.example', Connection: 'close' } }))).data)[0];
      assert.equal(get.status, 200);
      assert.equal(get.headers['access-control-allow-origin'], 'http://app.example');
      const other = parseResponses((await exchange(server.port, request('GET', '/health', {
        host, headers: { Origin: 'http://evil.example', Connection: 'close' } }))).data)[0];
      assert.equal(other.status, 403);
    } finally {
      await server.stop();
    }
  });

  test('(10) a streaming client that never reads is cut off and its sequences freed', async () => {
    const server = await startServer(tinyStoriesDir, ['--stream-buffer-bytes', '4096', '--stall-timeout', '1']);
    try {
      const host = `127.0.0.1:${server.port}`;
      const body = JSON.stringify({ model: 'test-model', prompt: 'Once upon a time', max_tokens: 490, n: 16,
                                    temperature: 1.0, logprobs: 5, logit_bias: { 2: -100 }, stream: true });
      const sock = net.connect({ host: '127.0.0.1', port: server.port });
      sock.on('error', () => {});
      await new Promise((r) => sock.on('connect', r));
      sock.pause();  // never reads: the kernel buffers fill, then the server's writes stall
      sock.write(request('POST', '/v1/completions', { host, body, headers: { 'Content-Type': 'application/json' } }));
      const cut = await waitFor(async () => {
        const s = (await getJson(server.baseURL, '/stats')).json;
        return s.http.stalled_clients >= 1 && s.engine.running_sequences === 0;
      }, 30000, 200);
      sock.destroy();
      assert.ok(cut, 'the stalled stream must be cancelled');
      const metrics = await (await fetch(server.baseURL + '/metrics')).text();
      assert.match(metrics, /ember_http_stalled_clients_total 1/);
      assert.equal((await getJson(server.baseURL, '/health')).status, 200);
    } finally {
      await server.stop();
    }
  });

  test('--max-connections: connections over the cap get 503 at once', async () => {
    const server = await startServer(tinyStoriesDir, ['--max-connections', '20']);
    const socks = [];
    try {
      for (let i = 0; i < 20; ++i) {
        const s = net.connect({ host: '127.0.0.1', port: server.port });
        s.on('error', () => {});
        socks.push(s);
      }
      await sleep(300);
      const r = await exchange(server.port, request('GET', '/health', { host: `127.0.0.1:${server.port}` }),
                               { timeoutMs: 3000 });
      const responses = parseResponses(r.data);
      assert.equal(responses[0]?.status, 503);
      assert.equal(JSON.parse(responses[0].body).error.code, 'too_many_connections');
      for (const s of socks) s.destroy();
      const back = await waitFor(async () => (await timedHealth(server.baseURL)).status === 200, 3000);
      assert.ok(back, 'connections are accepted again once others closed');
    } finally {
      for (const s of socks) s.destroy();
      await server.stop();
    }
  });

  test('(12) a second server on the same port exits non-zero with a clear message', async () => {
    const first = await startServer(tinyStoriesDir);
    try {
      const t0 = Date.now();
      const second = spawn(emberBin, ['serve', '--model', tinyStoriesDir, '--host', '127.0.0.1',
                                      '--port', String(first.port)], { stdio: ['ignore', 'pipe', 'pipe'] });
      let out = '';
      second.stdout.on('data', (c) => { out += c; });
      second.stderr.on('data', (c) => { out += c; });
      const code = await new Promise((resolve) => {
        const timer = setTimeout(() => { second.kill('SIGKILL'); resolve('still running'); }, 20000);
        second.on('exit', (c) => { clearTimeout(timer); resolve(c); });
      });
      assert.notEqual(code, 0, out);
      assert.notEqual(code, 'still running', out);
      assert.match(out, /already in use/);
      assert.ok(!/listening on/.test(out), out);
      assert.ok(Date.now() - t0 < 10000);
      assert.equal((await getJson(first.baseURL, '/health')).status, 200);
    } finally {
      await first.stop();
    }
  });
});
