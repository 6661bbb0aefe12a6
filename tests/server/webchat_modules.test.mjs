// The web chat page's browser-free modules (src/serve/web/): the Markdown renderer (structure
// and safety: text stays text, only http(s)/mailto links, bounded nesting), the SSE reader of
// streamed chat chunks, and the localStorage conversation store. No browser needed.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { repoRoot } from './helpers.mjs';

// The page's files are plain ES modules without a package.json of their own; load them as such.
async function loadModule(name) {
  const source = fs.readFileSync(path.join(repoRoot, 'src', 'serve', 'web', name), 'utf8');
  return import(`data:text/javascript;base64,${Buffer.from(source).toString('base64')}`);
}

const { parseMarkdown, toHtml } = await loadModule('markdown.js');
const { SseParser, readChatStream } = await loadModule('sse.js');
const { ChatStore, titleOf } = await loadModule('store.js');

const html = (text) => toHtml(parseMarkdown(text));

describe('markdown.js', () => {
  test('blocks: headings, paragraphs with line breaks, rules, quotes, fenced code', () => {
    assert.equal(html('# One\n## Two ##\nplain\nnext line\n\n---\n> a\n> b'),
                 '<h1>One</h1><h2>Two</h2><p>plain<br>next line</p><hr><blockquote><p>a<br>b</p></blockquote>');
    assert.equal(html('```py\nif a < b:\n    print("x")\n```\nafter'),
                 '<pre><code class="language-py">if a &lt; b:\n    print(&quot;x&quot;)</code></pre><p>after</p>');
    assert.equal(html('~~~~\n```\nstill code\n~~~~'), '<pre><code>```\nstill code</code></pre>');
    // A fence still open (a reply streaming in) runs to the end.
    assert.equal(html('text\n```js\nlet x'), '<p>text</p><pre><code class="language-js">let x</code></pre>');
  });

  test('lists: ordered with a start, nested by indentation, loose, lazy lines', () => {
    assert.equal(html('- a\n- b\n  - b1\n  - b2\n- c'),
                 '<ul><li>a</li><li>b<ul><li>b1</li><li>b2</li></ul></li><li>c</li></ul>');
    assert.equal(html('3. x\n\n4. y\ncontinued\n\nafter'),
                 '<ol start="3"><li>x</li><li>y<br>continued</li></ol><p>after</p>');
    assert.equal(html('- a\n1. b'), '<ul><li>a</li></ul><ol><li>b</li></ol>');
  });

  test('tables with alignment and escaped pipes', () => {
    assert.equal(html('| a | b | c |\n|:--|:-:|--:|\n| 1 | x \\| y | **3** |\n| short |'),
                 '<table><thead><tr><th class="align-left">a</th><th class="align-center">b</th>' +
                 '<th class="align-right">c</th></tr></thead><tbody><tr><td class="align-left">1</td>' +
                 '<td class="align-center">x | y</td><td class="align-right"><strong>3</strong></td></tr>' +
                 '<tr><td class="align-left">short</td><td class="align-center"></td>' +
                 '<td class="align-right"></td></tr></tbody></table>');
  });

  test('inlines: code, emphasis, strike-through, escapes, snake_case, links and bare URLs', () => {
    assert.equal(html('`a*b*` and ``x ` y`` and **bold *it*** and ~~gone~~'),
                 '<p><code>a*b*</code> and <code>x ` y</code> and <strong>bold <em>it</em></strong> and <del>gone</del></p>');
    assert.equal(html('snake_case_name, 2 * 3 * 4, \\*not\\*, _it_'),
                 '<p>snake_case_name, 2 * 3 * 4, *not*, <em>it</em></p>');
    assert.equal(html('[docs](https://x.org/a_(b) "title") <https://y.org/p>. mail [me](mailto:a@b.c)'),
                 '<p><a href="https://x.org/a_(b)">docs</a> &lt;<a href="https://y.org/p">https://y.org/p</a>&gt;. ' +
                 'mail <a href="mailto:a@b.c">me</a></p>');
  });

  test('HTML and unsafe links stay text', () => {
    assert.equal(html('<script>alert(1)</script> <img src=x onerror=alert(1)>'),
                 '<p>&lt;script&gt;alert(1)&lt;/script&gt; &lt;img src=x onerror=alert(1)&gt;</p>');
    for (const url of ['javascript:alert(1)', 'JavaScript:alert(1)', 'data:text/html,<b>', 'vbscript:x',
                       '//evil.example/x']) {
      const tree = parseMarkdown(`[click](${url})`);
      assert.ok(!JSON.stringify(tree).includes('"href"'), `${url} must not become a link`);
    }
    // Only the URL becomes an attribute, and it cannot close its quotes.
    assert.equal(html('[x](https://a.b/x onclick="y")'),
                 '<p>[x](<a href="https://a.b/x">https://a.b/x</a> onclick=&quot;y&quot;)</p>');
    assert.equal(html('[x](https://a.b/"onmouseover="alert(1))'),
                 '<p><a href="https://a.b/&quot;onmouseover=&quot;alert(1)">x</a></p>');
  });

  test('hostile nesting is bounded and fast', () => {
    const started = Date.now();
    const deepQuote = parseMarkdown('>'.repeat(5000) + ' x');
    let depth = 0;
    for (let node = deepQuote[0]; node?.tag === 'blockquote'; node = node.children[0]) depth++;
    assert.ok(depth <= 12, `quote depth ${depth}`);
    parseMarkdown('- '.repeat(3000) + 'x');
    parseMarkdown('**'.repeat(20000));
    parseMarkdown('['.repeat(20000) + ']('.repeat(100));
    parseMarkdown('*a '.repeat(5000));
    assert.ok(Date.now() - started < 5000, `took ${Date.now() - started} ms`);
  });
});

describe('sse.js', () => {
  test('events split across chunks, CRLF, multi-line data, comments ignored', () => {
    const parser = new SseParser();
    assert.deepEqual(parser.push('data: {"a"'), []);
    assert.deepEqual(parser.push(':1}\n\n: keep-alive\n\ndata: x\r\ndata: y\r\n\r\ndata:'), ['{"a":1}', 'x\ny']);
    assert.deepEqual(parser.push('[DONE]\n\n'), ['[DONE]']);
  });

  function streamOf(...chunks) {
    const encoder = new TextEncoder();
    return new Response(new ReadableStream({
      start(controller) {
        for (const chunk of chunks) controller.enqueue(encoder.encode(chunk));
        controller.close();
      },
    }));
  }

  test('readChatStream delivers JSON chunks until [DONE], a split UTF-8 character intact', async () => {
    const euro = new TextEncoder().encode('data: {"t":"€"}\n\n');
    const response = new Response(new ReadableStream({
      start(controller) {
        controller.enqueue(euro.slice(0, 13));  // inside the three bytes of "€"
        controller.enqueue(euro.slice(13));
        controller.enqueue(new TextEncoder().encode('data: {"t":"b"}\n\ndata: [DONE]\n\ndata: {"t":"after"}\n\n'));
        controller.close();
      },
    }));
    const seen = [];
    await readChatStream(response, (chunk) => seen.push(chunk.t));
    assert.deepEqual(seen, ['€', 'b']);
  });

  test('an error event is thrown with the server\'s message; non-JSON is an error', async () => {
    await assert.rejects(readChatStream(streamOf('data: {"t":1}\n\ndata: {"error":{"message":"the server is shutting down"}}\n\n'), () => {}),
                         /the server is shutting down/);
    await assert.rejects(readChatStream(streamOf('data: <html>\n\n'), () => {}), /not JSON/);
  });
});

describe('store.js', () => {
  class MemoryStorage {
    constructor(items = {}) { this.items = new Map(Object.entries(items)); }
    getItem(key) { return this.items.has(key) ? this.items.get(key) : null; }
    setItem(key, value) { this.items.set(key, String(value)); }
    removeItem(key) { this.items.delete(key); }
  }

  test('conversations: a first one, create, select, titles, remove, persisted', () => {
    const storage = new MemoryStorage();
    const store = new ChatStore(storage);
    assert.equal(store.conversations.length, 1);
    const first = store.current();
    first.messages.push({ role: 'user', content: '  What is\n the  capital of France, and what is its population? ' });
    assert.equal(titleOf(first), 'What is the capital of France, and what is its…');
    const second = store.create();
    assert.equal(titleOf(second), 'New chat');
    assert.equal(store.current(), second);
    store.select(first.id);
    store.settings.temperature = '0.5';
    store.save();
    const reloaded = new ChatStore(storage);
    assert.equal(reloaded.current().id, first.id);
    assert.equal(reloaded.conversations.length, 2);
    assert.equal(reloaded.settings.temperature, '0.5');
    reloaded.remove(first.id);
    assert.equal(reloaded.current().id, second.id);
    reloaded.remove(second.id);  // the last one: a fresh one takes its place
    assert.equal(reloaded.conversations.length, 1);
    assert.notEqual(reloaded.current().id, second.id);
  });

  test('unreadable saved state gives defaults; the API key is kept apart', () => {
    const storage = new MemoryStorage({ 'ember.chat.conversations.v1': '{broken',
                                        'ember.chat.settings.v1': '"a string"' });
    const store = new ChatStore(storage);
    assert.equal(store.conversations.length, 1);
    assert.deepEqual(store.settings, { model: '', temperature: '', top_p: '', max_tokens: '' });
    store.apiKey = 'k1';
    assert.equal(new ChatStore(storage).apiKey, 'k1');
    store.apiKey = '';
    assert.equal(storage.getItem('ember.chat.apiKey'), null);
  });

  test('a full storage is reported, not swallowed', () => {
    const storage = new MemoryStorage();
    const store = new ChatStore(storage);
    storage.setItem = () => { throw new Error('QuotaExceededError'); };
    assert.throws(() => store.save(), /QuotaExceededError/);
  });
});
