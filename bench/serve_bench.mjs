#!/usr/bin/env node
// serve_bench: a load generator for `ember serve` (or any OpenAI-compatible server).
// N concurrent clients each loop: one streaming /v1/completions request with a prompt of about
// --prompt-words words and --max-tokens output tokens (EOS suppressed so lengths are exact),
// until --duration seconds have passed. Reports requests/s, output tokens/s, time to first token
// and inter-token latency p50/p90/p99, errors, and (with --pid) the server's RSS before/after.
// Usage: node bench/serve_bench.mjs --url http://127.0.0.1:8080 [--clients 256] [--duration 60]
//        [--prompt-words 32] [--max-tokens 64] [--model NAME] [--pid SERVER_PID] [--json]
import fs from 'node:fs';

function parseArgs(argv) {
  const opts = { url: 'http://127.0.0.1:8080', clients: 64, duration: 30, promptWords: 32,
                 maxTokens: 64, model: '', pid: 0, json: false, eosId: 2 };
  for (let i = 2; i < argv.length; i++) {
    const key = argv[i];
    const val = () => { if (i + 1 >= argv.length) throw new Error(`${key} needs a value`); return argv[++i]; };
    switch (key) {
      case '--url': opts.url = val(); break;
      case '--clients': opts.clients = Number(val()); break;
      case '--duration': opts.duration = Number(val()); break;
      case '--prompt-words': opts.promptWords = Number(val()); break;
      case '--max-tokens': opts.maxTokens = Number(val()); break;
      case '--model': opts.model = val(); break;
      case '--pid': opts.pid = Number(val()); break;
      case '--eos-id': opts.eosId = Number(val()); break;
      case '--json': opts.json = true; break;
      case '-h': case '--help':
        console.log(fs.readFileSync(new URL(import.meta.url)).toString().split('\n').slice(1, 8).join('\n'));
        process.exit(0);
      default: throw new Error(`unknown flag ${key}`);
    }
  }
  return opts;
}

function rssMiB(pid) {
  if (!pid) return null;
  try {
    const m = fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+) kB/);
    return m ? Number(m[1]) / 1024 : null;
  } catch { return null; }
}

function percentile(sorted, p) {
  if (sorted.length === 0) return 0;
  const idx = Math.min(sorted.length - 1, Math.max(0, Math.ceil(p * sorted.length) - 1));
  return sorted[idx];
}

const WORDS = ['the', 'little', 'cat', 'saw', 'a', 'big', 'red', 'ball', 'in', 'park', 'and',
               'she', 'was', 'happy', 'to', 'play', 'with', 'her', 'friend', 'Tom'];
function makePrompt(n, seed) {
  const out = ['Once', 'upon', 'a', 'time'];
  for (let i = 0; i < n - 4; i++) out.push(WORDS[(seed * 7 + i * 13) % WORDS.length]);
  return out.join(' ');
}

// One streaming request; resolves with its timings or throws.
async function oneRequest(opts, clientIdx, reqIdx, stats) {
  const body = { prompt: makePrompt(opts.promptWords, clientIdx * 1000 + reqIdx),
                 max_tokens: opts.maxTokens, temperature: 1.0, stream: true,
                 stream_options: { include_usage: true }, logit_bias: { [opts.eosId]: -100 } };
  if (opts.model) body.model = opts.model;
  const start = performance.now();
  const res = await fetch(`${opts.url}/v1/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  if (res.status !== 200) throw new Error(`HTTP ${res.status}: ${(await res.text()).slice(0, 200)}`);
  const decoder = new TextDecoder();
  let buffer = '', first = 0, last = 0, tokens = 0, done = false;
  for await (const piece of res.body) {
    buffer += decoder.decode(piece, { stream: true });
    let sep;
    while ((sep = buffer.indexOf('\n\n')) >= 0) {
      const event = buffer.slice(0, sep);
      buffer = buffer.slice(sep + 2);
      if (!event.startsWith('data: ')) continue;
      const data = event.slice(6);
      if (data === '[DONE]') { done = true; continue; }
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(`stream error: ${chunk.error.message}`);
      if (chunk.usage) tokens = chunk.usage.completion_tokens;
      if (chunk.choices?.length && chunk.choices[0].text) {
        const now = performance.now();
        if (!first) first = now; else stats.itl.push(now - last);
        last = now;
      }
    }
  }
  if (!done) throw new Error('stream ended without [DONE]');
  stats.ttft.push(first - start);
  stats.outputTokens += tokens;
  stats.requests += 1;
}

async function main() {
  const opts = parseArgs(process.argv);
  const stats = { ttft: [], itl: [], outputTokens: 0, requests: 0, errors: 0, errorSamples: [] };
  const rssBefore = rssMiB(opts.pid);
  const deadline = performance.now() + opts.duration * 1000;
  const t0 = performance.now();
  let rssPeak = rssBefore ?? 0;
  const sampler = setInterval(() => { rssPeak = Math.max(rssPeak, rssMiB(opts.pid) ?? 0); }, 500);
  await Promise.all(Array.from({ length: opts.clients }, async (_, c) => {
    for (let r = 0; performance.now() < deadline; r++) {
      try {
        await oneRequest(opts, c, r, stats);
      } catch (err) {
        stats.errors += 1;
        if (stats.errorSamples.length < 5) stats.errorSamples.push(`${err.message ?? err}${err.cause ? ` (${err.cause.code ?? err.cause.message ?? err.cause})` : ''}`);
      }
    }
  }));
  clearInterval(sampler);
  const elapsed = (performance.now() - t0) / 1000;
  let server = null;  // the server's own TTFT/ITL histograms (engine timestamps), when it has /stats
  try {
    const st = await (await fetch(`${opts.url}/stats`)).json();
    server = st.latency_seconds ?? null;
  } catch { /* not an ember server */ }
  const ttft = stats.ttft.sort((a, b) => a - b);
  const itl = stats.itl.sort((a, b) => a - b);
  const report = {
    url: opts.url, clients: opts.clients, duration_s: Number(elapsed.toFixed(1)),
    prompt_words: opts.promptWords, max_tokens: opts.maxTokens,
    requests: stats.requests, errors: stats.errors,
    requests_per_s: Number((stats.requests / elapsed).toFixed(2)),
    output_tokens_per_s: Number((stats.outputTokens / elapsed).toFixed(1)),
    ttft_ms: { p50: percentile(ttft, 0.5), p90: percentile(ttft, 0.9), p99: percentile(ttft, 0.99) },
    itl_ms: { p50: percentile(itl, 0.5), p90: percentile(itl, 0.9), p99: percentile(itl, 0.99) },
    server_rss_mib: opts.pid ? { before: rssBefore, peak: rssPeak, after: rssMiB(opts.pid) } : null,
    server_latency_ms: server && {
      ttft: Object.fromEntries(['p50', 'p90', 'p99'].map((p) => [p, Number((server.time_to_first_token[p] * 1000).toFixed(1))])),
      itl: Object.fromEntries(['p50', 'p90', 'p99'].map((p) => [p, Number((server.inter_token[p] * 1000).toFixed(1))])),
    },
    error_samples: stats.errorSamples,
  };
  for (const k of ['ttft_ms', 'itl_ms']) for (const p of ['p50', 'p90', 'p99']) report[k][p] = Number(report[k][p].toFixed(1));
  if (opts.json) {
    console.log(JSON.stringify(report));
  } else {
    console.log(`clients ${report.clients}, ${report.duration_s} s, prompt ~${opts.promptWords} words, ${opts.maxTokens} output tokens`);
    console.log(`requests ${report.requests} (${report.requests_per_s}/s), errors ${report.errors}, output ${report.output_tokens_per_s} tok/s`);
    console.log(`TTFT ms p50 ${report.ttft_ms.p50} p90 ${report.ttft_ms.p90} p99 ${report.ttft_ms.p99}`);
    console.log(`ITL  ms p50 ${report.itl_ms.p50} p90 ${report.itl_ms.p90} p99 ${report.itl_ms.p99}`);
    if (report.server_latency_ms) {
      const { ttft, itl } = report.server_latency_ms;
      console.log(`server-side (engine stamps, whole server lifetime, histogram-interpolated): TTFT ms p50 ${ttft.p50} p90 ${ttft.p90} p99 ${ttft.p99}; ITL ms p50 ${itl.p50} p90 ${itl.p90} p99 ${itl.p99}`);
    }
    if (report.server_rss_mib) console.log(`server RSS MiB: before ${report.server_rss_mib.before?.toFixed(1)}, peak ${report.server_rss_mib.peak.toFixed(1)}, after ${report.server_rss_mib.after?.toFixed(1)}`);
    for (const e of report.error_samples) console.log(`error: ${e}`);
  }
  process.exit(stats.errors > 0 ? 1 : 0);
}

main().catch((err) => { console.error(err); process.exit(2); });
