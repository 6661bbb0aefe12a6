// The web chat page (GET /) in headless Chromium, driven by puppeteer-core: the routes' headers
// over HTTP, the API-key prompt, a streamed conversation whose text equals the API's, Markdown
// and copy buttons, HTML in messages staying text, errors shown, the model picker, conversations
// surviving a reload, and the stop button cancelling a long generation on the server (/stats).
// Screenshots go to EMBER_TEST_OUTPUT or build/release/test-output/webchat (beside EMBER_BIN).
// Skipped, with the reason, without Debian's chromium (EMBER_CHROMIUM overrides the path) or the
// puppeteer-core package (scripts/setup.sh installs both).
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  emberBin, getJson, missing, startServer, synthServer, tinyStoriesDir, tokenizersDir, waitFor,
} from './helpers.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const plainTemplate = path.join(here, 'data', 'plain_chat.jinja');
const thinkTemplate = path.join(here, 'data', 'think_chat.jinja');
const qwen3Tokenizer = path.join(tokenizersDir, 'qwen3');
const API_KEY = 'web-page-key';

const chromium = [process.env.EMBER_CHROMIUM, '/usr/bin/chromium', '/usr/bin/chromium-browser']
  .find((p) => p && fs.existsSync(p));
let puppeteer = null;
try {
  puppeteer = (await import('puppeteer-core')).default;
} catch { /* reported as the skip reason */ }

function skipReason() {
  if (!puppeteer) return 'puppeteer-core is not installed (scripts/setup.sh, or npm ci in tests/server)';
  if (!chromium) return 'chromium not found (apt-get install chromium, or set EMBER_CHROMIUM)';
  return missing(tinyStoriesDir, plainTemplate);
}

const outputDir = process.env.EMBER_TEST_OUTPUT ||
  path.join(path.dirname(emberBin), 'test-output', 'webchat');

async function launchBrowser() {
  return puppeteer.launch({
    executablePath: chromium,
    headless: true,
    // The sandbox needs user namespaces, which CI containers (and root) often lack.
    args: ['--no-sandbox', '--disable-dev-shm-usage', '--disable-gpu'],
  });
}

// A fresh profile (empty localStorage) on `baseURL`, with console errors and page errors kept.
async function openPage(browser, baseURL) {
  const context = await browser.createBrowserContext();
  await context.overridePermissions(baseURL, ['clipboard-read', 'clipboard-write',
                                              'clipboard-sanitized-write']);
  const page = await context.newPage();
  await page.setViewport({ width: 1200, height: 800 });
  const problems = [];
  page.on('pageerror', (err) => problems.push(`page error: ${err.message}`));
  page.on('console', (msg) => {
    // The browser logs every 4xx the page handles (401, 400, 404); anything else is a problem
    // (a CSP or Trusted Types violation, an exception).
    if (msg.type() === 'error' && !/Failed to load resource/.test(msg.text())) problems.push(msg.text());
  });
  await page.goto(`${baseURL}/`, { waitUntil: 'load' });
  return { context, page, problems };
}

async function screenshot(page, name) {
  fs.mkdirSync(outputDir, { recursive: true });
  await page.screenshot({ path: path.join(outputDir, `${name}.png`) });
}

// The conversation as the page shows it.
function shownMessages(page) {
  return page.$$eval('#messages article.message', (articles) => articles.map((a) => ({
    role: a.classList.contains('user') ? 'user' : 'assistant',
    text: a.querySelector('.content').textContent,
    reasoning: a.querySelector('.reasoning-text').textContent,
    reasoningShown: !a.querySelector('.reasoning').hidden,
    reasoningOpen: a.querySelector('.reasoning').open,
    status: a.querySelector('.status').textContent,
  })));
}

// The conversations as the page stored them.
function storedConversations(page) {
  return page.evaluate(() => JSON.parse(localStorage.getItem('ember.chat.conversations.v1')));
}

async function setField(page, selector, value) {
  await page.$eval(selector, (el, v) => {
    el.value = v;
    el.dispatchEvent(new Event('change', { bubbles: true }));
  }, value);
}

async function openSettings(page) {
  if (await page.$eval('#settings', (el) => el.hidden)) await page.click('#toggle-settings');
}

async function sendMessage(page, text) {
  await page.focus('#prompt');
  await page.$eval('#prompt', (el, v) => { el.value = v; }, text);
  await page.keyboard.press('Enter');
}

function waitForReplyDone(page, timeout = 30000) {
  return page.waitForFunction(() => {
    const last = [...document.querySelectorAll('#messages article.message.assistant')].pop();
    return last && last.getAttribute('aria-busy') === 'false' && !document.querySelector('#send').hidden;
  }, { timeout });
}

describe('web chat page (tinystories-656k, --api-key)', { skip: skipReason() ?? false }, () => {
  let server, browser, page, context, problems;
  before(async () => {
    server = await startServer(tinyStoriesDir, ['--chat-template', plainTemplate, '--api-key', API_KEY]);
    browser = await launchBrowser();
  });
  after(async () => {
    if (browser) await browser.close();
    if (server) await server.stop();
  });

  test('the page and its files are served without the key, with their headers; HEAD and 304 work', async () => {
    const files = { '/': 'text/html', '/chat.js': 'text/javascript', '/markdown.js': 'text/javascript',
                    '/sse.js': 'text/javascript', '/store.js': 'text/javascript',
                    '/chat.css': 'text/css', '/favicon.svg': 'image/svg+xml' };
    for (const [route, type] of Object.entries(files)) {
      const res = await fetch(server.baseURL + route);
      const body = await res.text();
      assert.equal(res.status, 200, route);
      assert.ok(res.headers.get('content-type').startsWith(type), `${route}: ${res.headers.get('content-type')}`);
      assert.equal(res.headers.get('cache-control'), 'no-cache', route);
      assert.match(res.headers.get('etag'), /^"[0-9a-f]{16}"$/, route);
      assert.match(res.headers.get('content-security-policy'), /default-src 'none'; script-src 'self'/, route);
      assert.equal(res.headers.get('x-content-type-options'), 'nosniff', route);
      assert.ok(body.length > 0, route);
      const head = await fetch(server.baseURL + route, { method: 'HEAD' });
      assert.equal(head.status, 200, `HEAD ${route}`);
      assert.equal(head.headers.get('content-length'), String(Buffer.byteLength(body)), `HEAD ${route}`);
      assert.equal(await head.text(), '', `HEAD ${route}`);
      const again = await fetch(server.baseURL + route, { headers: { 'If-None-Match': res.headers.get('etag') } });
      assert.equal(again.status, 304, `revalidating ${route}`);
      assert.equal(again.headers.get('etag'), res.headers.get('etag'));
    }
    assert.equal((await fetch(`${server.baseURL}/index.html`)).status, 404);
    assert.equal((await fetch(`${server.baseURL}/`, { method: 'POST' })).status, 405);
    // The API itself still needs the key.
    assert.equal((await fetch(`${server.baseURL}/v1/models`)).status, 401);
  });

  test('the page asks for the API key on 401, then lists the served model', async () => {
    ({ context, page, problems } = await openPage(browser, server.baseURL));
    await page.waitForSelector('#key-dialog[open]', { timeout: 10000 });
    assert.match(await page.$eval('#key-reason', (el) => el.textContent), /API key/);
    await screenshot(page, '01-api-key');
    await page.type('#api-key', API_KEY);
    await page.click('#key-form button[type=submit]');
    await page.waitForFunction(() => document.querySelector('#model').options.length > 0, { timeout: 10000 });
    const options = await page.$$eval('#model option', (os) => os.map((o) => o.value));
    assert.deepEqual(options, ['test-model']);
    assert.equal(await page.$eval('#model', (el) => el.value), 'test-model');
    assert.equal(await page.evaluate(() => localStorage.getItem('ember.chat.apiKey')), API_KEY);
    assert.equal(await page.$eval('#error', (el) => el.hidden), true);
  });

  test('a message streams a reply equal to the API\'s at temperature 0', async () => {
    await openSettings(page);
    await setField(page, '#temperature', '0');
    await setField(page, '#max-tokens', '40');
    await sendMessage(page, 'Once upon a time');
    await waitForReplyDone(page);
    const shown = await shownMessages(page);
    assert.equal(shown.length, 2);
    assert.equal(shown[0].text, 'Once upon a time');
    assert.match(shown[1].status, /\d+ tokens/);
    const stored = (await storedConversations(page)).conversations[0].messages;
    const reference = await fetch(`${server.baseURL}/v1/chat/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${API_KEY}` },
      body: JSON.stringify({ model: 'test-model', messages: [{ role: 'user', content: 'Once upon a time' }],
                             temperature: 0, max_tokens: 40 }),
    }).then((r) => r.json());
    assert.ok(reference.choices[0].message.content.length > 0);
    assert.equal(stored[1].content, reference.choices[0].message.content);
    assert.equal(stored[1].usage.completion_tokens, reference.usage.completion_tokens);
    assert.equal(await page.$eval('#conversation-list [aria-current=true]', (el) => el.textContent),
                 'Once upon a time');
    await screenshot(page, '02-conversation');
  });

  test('HTML in a message is shown as text, never run', async () => {
    const hostile = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script> **not bold**';
    await sendMessage(page, hostile);
    await waitForReplyDone(page);
    const shown = await shownMessages(page);
    assert.equal(shown[2].text, hostile);
    assert.equal(await page.$$eval('#messages img, #messages script', (els) => els.length), 0);
    assert.equal(await page.evaluate(() => window.__xss), undefined);
  });

  test('a reply\'s Markdown is rendered: headings, code blocks with copy buttons, tables, safe links', async () => {
    const markdown = [
      '# Plan', '', 'Some **bold**, *italic* and `inline code`; see [the docs](https://example.com/docs) ' +
      'or [this](javascript:window.__xss=3).', '', '```js', 'const ok = 1 < 2 && "<b>";', '```', '',
      '| name | n |', '|---|--:|', '| a | 1 |', '', '- one', '- two', '', '<script>window.__xss=4</script>',
    ].join('\n');
    // Written from another document of this origin: the page saves its own state on pagehide.
    await page.goto(`${server.baseURL}/favicon.svg`);
    await page.evaluate((text) => {
      const saved = JSON.parse(localStorage.getItem('ember.chat.conversations.v1'));
      const now = Date.now();
      saved.conversations.push({ id: 'markdown', system: '', created: now, updated: now, messages: [
        { role: 'user', content: 'Show me Markdown' },
        { role: 'assistant', content: text, model: 'test-model', status: 'done' }] });
      saved.currentId = 'markdown';
      localStorage.setItem('ember.chat.conversations.v1', JSON.stringify(saved));
    }, markdown);
    await page.goto(`${server.baseURL}/`, { waitUntil: 'load' });
    await page.waitForSelector('#messages .code-block');
    const reply = '#messages article.assistant .content';
    assert.equal(await page.$eval(`${reply} h1`, (el) => el.textContent), 'Plan');
    assert.equal(await page.$eval(`${reply} strong`, (el) => el.textContent), 'bold');
    assert.equal(await page.$eval(`${reply} em`, (el) => el.textContent), 'italic');
    assert.equal(await page.$eval(`${reply} p code`, (el) => el.textContent), 'inline code');
    assert.equal(await page.$eval(`${reply} .code-block code.language-js`, (el) => el.textContent),
                 'const ok = 1 < 2 && "<b>";');
    assert.deepEqual(await page.$$eval(`${reply} th`, (els) => els.map((e) => e.textContent)), ['name', 'n']);
    assert.deepEqual(await page.$$eval(`${reply} li`, (els) => els.map((e) => e.textContent)), ['one', 'two']);
    const links = await page.$$eval(`${reply} a`, (els) => els.map((a) => [a.textContent, a.getAttribute('href')]));
    assert.deepEqual(links, [['the docs', 'https://example.com/docs']]);
    assert.equal(await page.$$eval('#messages script, #messages b', (els) => els.length), 0);
    assert.match(await page.$eval(reply, (el) => el.textContent), /<script>window.__xss=4<\/script>/);

    await page.click(`${reply} .code-block .copy-code`);
    await page.waitForFunction(() => document.querySelector('.copy-code').textContent === 'Copied');
    assert.equal(await page.evaluate(() => navigator.clipboard.readText()), 'const ok = 1 < 2 && "<b>";');
    await page.click('#messages article.assistant .copy-message');
    await page.waitForFunction(() => document.querySelector('article.assistant .copy-message').textContent === 'Copied');
    assert.equal(await page.evaluate(() => navigator.clipboard.readText()), markdown);
    await screenshot(page, '03-markdown');
    await page.emulateMediaFeatures([{ name: 'prefers-color-scheme', value: 'dark' }]);
    await screenshot(page, '03-markdown-dark');
    await page.emulateMediaFeatures([{ name: 'prefers-color-scheme', value: 'light' }]);
  });

  test('a reload keeps the conversations; new and delete work', async () => {
    const before = await storedConversations(page);
    await page.click('#conversation-list li:nth-child(2) .conversation');  // the streamed one
    const shownBefore = await shownMessages(page);
    assert.equal(shownBefore[0].text, 'Once upon a time');
    await page.reload({ waitUntil: 'load' });
    await page.waitForSelector('#messages article.message');
    assert.deepEqual((await shownMessages(page)).map((m) => m.text), shownBefore.map((m) => m.text));
    assert.equal(await page.$$eval('#conversation-list li', (els) => els.length), 2);

    await page.click('#new-chat');
    assert.equal(await page.$$eval('#messages article', (els) => els.length), 0);
    page.once('dialog', (dialog) => dialog.accept());
    await page.click('#conversation-list li:nth-child(2) .delete');  // the Markdown one, now second
    await page.waitForFunction(() => document.querySelectorAll('#conversation-list li').length === 2);
    const after = await storedConversations(page);
    assert.deepEqual(after.conversations.map((c) => c.id).sort(),
                     [...before.conversations.filter((c) => c.id !== 'markdown').map((c) => c.id),
                      after.currentId].sort());
  });

  test('a request the server refuses shows its message and gives the text back', async () => {
    await openSettings(page);
    await setField(page, '#max-tokens', '100000');
    const numShown = (await shownMessages(page)).length;
    await sendMessage(page, 'Too long, please');
    await page.waitForSelector('#error:not([hidden])');
    const message = await page.$eval('#error-text', (el) => el.textContent);
    assert.match(message, /maximum context length is 512 tokens/);
    assert.match(message, /HTTP 400/);
    assert.equal(await page.$eval('#prompt', (el) => el.value), 'Too long, please');
    assert.equal((await shownMessages(page)).length, numShown, 'the refused turn is not kept');
    await screenshot(page, '04-error');
    await page.click('#error-close');
    await setField(page, '#max-tokens', '16');
  });

  test('the picked model is the one requested (a second model offered by the list)', async () => {
    // One model is served; the list is answered here with a second id to pick.
    await page.setRequestInterception(true);
    const bodies = [];
    const onRequest = (request) => {
      if (request.url().endsWith('/v1/models')) {
        request.respond({ status: 200, contentType: 'application/json', body: JSON.stringify({
          object: 'list', data: [{ id: 'test-model', object: 'model' }, { id: 'other-model', object: 'model' }] }) });
        return;
      }
      if (request.url().endsWith('/v1/chat/completions')) bodies.push(JSON.parse(request.postData()));
      request.continue();
    };
    page.on('request', onRequest);
    await page.reload({ waitUntil: 'load' });
    await page.waitForFunction(() => document.querySelector('#model').options.length === 2);
    await page.select('#model', 'other-model');
    await page.$eval('#prompt', (el) => { el.value = ''; });
    await sendMessage(page, 'Hello there');
    await page.waitForSelector('#error:not([hidden])');
    assert.match(await page.$eval('#error-text', (el) => el.textContent),
                 /The model 'other-model' does not exist.*\(HTTP 404\)/);
    assert.equal(bodies.at(-1).model, 'other-model');
    assert.equal(bodies.at(-1).max_tokens, 16);
    assert.equal(bodies.at(-1).stream, true);
    await page.select('#model', 'test-model');
    await page.click('#error-close');
    await page.$eval('#prompt', (el) => { el.value = ''; });
    await sendMessage(page, 'Hello there');
    await waitForReplyDone(page);
    assert.equal(bodies.at(-1).model, 'test-model');
    assert.equal(await page.$eval('#error', (el) => el.hidden), true);
    // The choice is remembered.
    assert.equal(await page.evaluate(() => JSON.parse(localStorage.getItem('ember.chat.settings.v1')).model),
                 'test-model');
    page.off('request', onRequest);
    await page.setRequestInterception(false);
  });

  test('no CSP violation or script error happened', async () => {
    assert.deepEqual(problems, []);
    await context.close();
  });
});

// A model slow enough to stop mid-stream (qwen3's 151k-token vocabulary on a toy body) and a
// template that opens a <think> block, so the reply streams as reasoning.
describe('web chat page: reasoning, streaming and stop (tiny-qwen3)', { skip: skipReason() ?? missing(qwen3Tokenizer) ?? false }, () => {
  let server, browser;
  synthServer('tiny-qwen3', qwen3Tokenizer, ['--chat-template', thinkTemplate, '--reasoning-parser', 'think'],
              async (s) => {
    server = s;
    browser = await launchBrowser();
  });
  after(async () => {
    if (browser) await browser.close();
  });

  test('reasoning streams in collapsed; Stop ends the request on the server', async () => {
    const { page, problems } = await openPage(browser, server.baseURL);
    await page.waitForFunction(() => document.querySelector('#model').options.length === 1);
    const statsBefore = (await getJson(server.baseURL, '/stats')).json;
    await openSettings(page);
    await setField(page, '#system-prompt', 'You think before you answer.');
    await setField(page, '#max-tokens', '4000');  // ~10 s of tokens here: Stop comes long before
    await sendMessage(page, 'Why is the sky blue?');
    const lengthOfReasoning = () => page.$eval('#messages article.assistant .reasoning-text', (el) => el.textContent.length);
    await page.waitForFunction(() => document.querySelector('#messages article.assistant .reasoning-text')?.textContent.length > 0);
    const first = await lengthOfReasoning();
    await page.waitForFunction((n) => document.querySelector('#messages article.assistant .reasoning-text').textContent.length > n + 40,
                               {}, first);
    let shown = await shownMessages(page);
    assert.equal(shown[1].status, 'Generating…', 'still streaming while the text grows');
    assert.ok(shown[1].reasoningShown);
    assert.equal(shown[1].reasoningOpen, false, 'reasoning is collapsed');
    assert.equal(await page.$eval('#messages article.assistant summary', (el) => el.textContent), 'Thinking…');
    assert.equal(await page.$eval('#send', (el) => el.hidden), true);
    await screenshot(page, '05-streaming');

    await page.click('#stop');
    await page.waitForFunction(() => !document.querySelector('#send').hidden);
    shown = await shownMessages(page);
    assert.match(shown[1].status, /^Stopped/);
    assert.equal(await page.$eval('#messages article.assistant summary', (el) => el.textContent), 'Reasoning');
    const ended = await waitFor(async () => {
      const s = (await getJson(server.baseURL, '/stats')).json;
      return s.http.open_streams === 0 && s.engine.running_sequences === 0 &&
             s.engine.requests_cancelled > statsBefore.engine.requests_cancelled;
    }, 5000);
    assert.ok(ended, 'the stopped request must be cancelled on the server');
    const stats = (await getJson(server.baseURL, '/stats')).json;
    assert.ok(stats.tokens.generated < 4000, `generation stopped early (${stats.tokens.generated} tokens)`);

    // The reasoning opens on a click; the stopped reply and the system prompt are kept.
    await page.click('#messages article.assistant summary');
    assert.equal((await shownMessages(page))[1].reasoningOpen, true);
    await screenshot(page, '06-stopped-reasoning-open');
    const stored = (await storedConversations(page)).conversations[0];
    assert.equal(stored.system, 'You think before you answer.');
    assert.equal(stored.messages[1].status, 'stopped');
    assert.ok(stored.messages[1].reasoning.length > first);
    assert.deepEqual(problems, []);
  });
});
