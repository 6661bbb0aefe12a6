// A small Markdown renderer for model replies: fenced and indented-free code blocks, headings,
// paragraphs, lists (nested by indentation), block quotes, tables, rules; inline code, bold,
// italics, strike-through, links (http, https and mailto only) and bare URLs.
// Safe by construction: parseMarkdown() makes a tree of plain objects whose text is never HTML,
// and toDom() builds elements with createElement/createTextNode only (no innerHTML anywhere; the
// page's CSP enforces that). Nesting is bounded (kMaxDepth), so hostile input cannot recurse
// deeply. An unclosed code fence runs to the end, as it does while a reply streams in.
// No DOM needed to parse; runs under node for the tests.

const kMaxDepth = 12;

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)[^`]*$/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$/;
const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
const QUOTE = /^ {0,3}> ?(.*)$/;
const LIST_ITEM = /^( *)([-*+]|\d{1,9}[.)])(?: +(.*))?$/;
const TABLE_SEPARATOR = /^\s*\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)*\|?\s*$/;
const SAFE_URL = /^(?:https?:\/\/|mailto:)[^\s]+$/i;
const BARE_URL = /https?:\/\/[^\s<>"'`]*[^\s<>"'`.,;:!?)\]]/g;

function isBlank(line) {
  return line.trim() === '';
}

function startsBlock(line) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) ||
         LIST_ITEM.test(line);
}

// ---- blocks ----

// Returns the block nodes of `lines` (an array of strings).
function parseBlocks(lines, depth) {
  const blocks = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (isBlank(line)) { i++; continue; }
    let m;
    if ((m = FENCE.exec(line))) {
      i = parseFence(lines, i, m, blocks);
    } else if ((m = HEADING.exec(line))) {
      blocks.push({ tag: `h${m[1].length}`, children: parseInline(m[2], depth) });
      i++;
    } else if (RULE.test(line)) {
      blocks.push({ tag: 'hr', children: [] });
      i++;
    } else if (QUOTE.test(line) && depth < kMaxDepth) {
      const inner = [];
      while (i < lines.length && (m = QUOTE.exec(lines[i]))) { inner.push(m[1]); i++; }
      blocks.push({ tag: 'blockquote', children: parseBlocks(inner, depth + 1) });
    } else if (LIST_ITEM.test(line) && depth < kMaxDepth) {
      i = parseList(lines, i, depth, blocks);
    } else if (i + 1 < lines.length && line.includes('|') && TABLE_SEPARATOR.test(lines[i + 1]) &&
               lines[i + 1].includes('-')) {
      i = parseTable(lines, i, depth, blocks);
    } else {
      const text = [line.trim()];
      i++;
      while (i < lines.length && !isBlank(lines[i]) && !startsBlock(lines[i])) text.push(lines[i++].trim());
      blocks.push({ tag: 'p', children: joinLines(text, depth) });
    }
  }
  return blocks;
}

function parseFence(lines, i, match, blocks) {
  const fence = match[1];
  const closing = new RegExp(`^ {0,3}${fence[0] === '`' ? '`' : '~'}{${fence.length},}\\s*$`);
  const body = [];
  i++;
  while (i < lines.length && !closing.test(lines[i])) body.push(lines[i++]);
  blocks.push({ tag: 'code-block', lang: match[2], text: body.join('\n') });
  return i + 1;
}

// A list: items at the first item's indentation; deeper-indented lines belong to the item above
// (parsed as its own blocks, so nested lists work). A blank line ends the list unless indented
// content or another item follows.
function parseList(lines, i, depth, blocks) {
  const first = LIST_ITEM.exec(lines[i]);
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const list = { tag: ordered ? 'ol' : 'ul', children: [] };
  if (ordered && parseInt(first[2], 10) !== 1) list.start = parseInt(first[2], 10);
  while (i < lines.length) {
    const m = LIST_ITEM.exec(lines[i]);
    if (!m || m[1].length !== indent || /\d/.test(m[2]) !== ordered) break;
    const contentIndent = indent + m[2].length + 1;
    const itemLines = [m[3] ?? ''];
    i++;
    while (i < lines.length) {
      const line = lines[i];
      const leading = line.length - line.trimStart().length;
      if (isBlank(line)) {
        const next = lines.slice(i + 1).find((l) => !isBlank(l));
        const nextIndent = next === undefined ? 0 : next.length - next.trimStart().length;
        if (next === undefined || nextIndent <= indent) break;
        itemLines.push('');
      } else if (leading > indent) {
        itemLines.push(line.slice(Math.min(leading, contentIndent)));
      } else if (!startsBlock(line) && !isBlank(itemLines[itemLines.length - 1])) {
        itemLines.push(line.trim());  // a lazy continuation of the item's paragraph
      } else {
        break;
      }
      i++;
    }
    list.children.push({ tag: 'li', children: unwrapTight(parseBlocks(itemLines, depth + 1)) });
    // Blank lines between items keep the list going; before anything else they end it.
    let next = i;
    while (next < lines.length && isBlank(lines[next])) next++;
    if (next === i) continue;
    const following = next < lines.length && LIST_ITEM.exec(lines[next]);
    if (!following || following[1].length !== indent) break;
    i = next;
  }
  blocks.push(list);
  return i;
}

// An item that is one paragraph (plus perhaps a nested list) shows its text without <p>.
function unwrapTight(blocks) {
  if (blocks.length > 0 && blocks[0].tag === 'p') return [...blocks[0].children, ...blocks.slice(1)];
  return blocks;
}

function splitRow(line) {
  let s = line.trim();
  if (s.startsWith('|')) s = s.slice(1);
  if (s.endsWith('|') && !s.endsWith('\\|')) s = s.slice(0, -1);
  const cells = [];
  let cell = '';
  for (let k = 0; k < s.length; k++) {
    if (s[k] === '\\' && s[k + 1] === '|') { cell += '|'; k++; continue; }
    if (s[k] === '|') { cells.push(cell.trim()); cell = ''; continue; }
    cell += s[k];
  }
  cells.push(cell.trim());
  return cells;
}

function parseTable(lines, i, depth, blocks) {
  const header = splitRow(lines[i]);
  const aligns = splitRow(lines[i + 1]).map((c) => {
    if (c.startsWith(':') && c.endsWith(':')) return 'center';
    if (c.endsWith(':')) return 'right';
    return c.startsWith(':') ? 'left' : '';
  });
  const cell = (tag, text, k) => {
    const node = { tag, children: parseInline(text ?? '', depth) };
    if (aligns[k]) node.align = aligns[k];
    return node;
  };
  const head = { tag: 'thead', children: [{ tag: 'tr', children: header.map((t, k) => cell('th', t, k)) }] };
  const body = { tag: 'tbody', children: [] };
  i += 2;
  while (i < lines.length && !isBlank(lines[i]) && lines[i].includes('|')) {
    const cells = splitRow(lines[i++]);
    body.children.push({ tag: 'tr', children: header.map((_, k) => cell('td', cells[k], k)) });
  }
  blocks.push({ tag: 'table', children: [head, body] });
  return i;
}

// The lines of a paragraph, with a line break between them (chat replies mean their newlines).
function joinLines(lines, depth) {
  const out = [];
  lines.forEach((line, k) => {
    if (k > 0) out.push({ tag: 'br', children: [] });
    out.push(...parseInline(line, depth));
  });
  return out;
}

// ---- inlines ----

const EMPHASIS = [
  { delim: '**', tag: 'strong' },
  { delim: '__', tag: 'strong' },
  { delim: '~~', tag: 'del' },
  { delim: '*', tag: 'em' },
  { delim: '_', tag: 'em' },
];

function isWordChar(c) {
  return c !== undefined && /[\p{L}\p{N}]/u.test(c);
}

// Returns the inline nodes (strings and elements) of one line of text.
function parseInline(text, depth) {
  const out = [];
  let plain = '';
  const flush = () => {
    if (plain) out.push(...linkifyUrls(plain));
    plain = '';
  };
  let i = 0;
  while (i < text.length) {
    const c = text[i];
    if (c === '\\' && i + 1 < text.length && /[!-/:-@[-`{-~]/.test(text[i + 1])) {
      plain += text[i + 1];
      i += 2;
      continue;
    }
    if (c === '`') {
      const run = /^`+/.exec(text.slice(i))[0];
      const close = text.indexOf(run, i + run.length);
      if (close >= 0) {
        flush();
        out.push({ tag: 'code', children: [text.slice(i + run.length, close).trim() || ' '] });
        i = close + run.length;
        continue;
      }
      plain += run;
      i += run.length;
      continue;
    }
    if (c === '[' && depth < kMaxDepth) {
      const link = parseLink(text, i, depth);
      if (link) {
        flush();
        out.push(link.node);
        i = link.end;
        continue;
      }
    }
    const emphasis = depth < kMaxDepth && parseEmphasis(text, i, depth);
    if (emphasis) {
      flush();
      out.push(emphasis.node);
      i = emphasis.end;
      continue;
    }
    plain += c;
    i++;
  }
  flush();
  return out;
}

function parseEmphasis(text, i, depth) {
  for (const { delim, tag } of EMPHASIS) {
    if (!text.startsWith(delim, i)) continue;
    const after = text[i + delim.length];
    if (after === undefined || after === ' ' || text.startsWith(delim[0], i + delim.length)) continue;
    // Underscores inside words (snake_case) are text.
    if (delim[0] === '_' && isWordChar(text[i - 1])) continue;
    let close = text.indexOf(delim, i + delim.length + 1);
    while (close >= 0) {
      const before = text[close - 1];
      const next = text[close + delim.length];
      const intraword = delim[0] === '_' && isWordChar(next);
      if (before !== ' ' && !intraword && !(delim.length === 1 && next === delim)) break;
      close = text.indexOf(delim, close + 1);
    }
    if (close < 0) continue;
    // "**a *b***": a longer closing run ends the outer span at its last two characters.
    while (delim.length === 2 && text[close + 2] === delim[0]) close++;
    const inner = text.slice(i + delim.length, close);
    return { node: { tag, children: parseInline(inner, depth + 1) }, end: close + delim.length };
  }
  return null;
}

// [label](url): a link when the url is http(s) or mailto; otherwise the caller keeps the text.
function parseLink(text, i, depth) {
  let level = 0;
  let close = -1;
  for (let k = i; k < text.length; k++) {
    if (text[k] === '[') level++;
    else if (text[k] === ']' && --level === 0) { close = k; break; }
  }
  if (close < 0 || text[close + 1] !== '(') return null;
  let end = -1;
  for (let k = close + 2, open = 1; k < text.length; k++) {  // URLs may hold balanced parentheses
    if (text[k] === '(') open++;
    else if (text[k] === ')' && --open === 0) { end = k; break; }
  }
  if (end < 0) return null;
  // (url) or (url "title"); the title is not shown.
  const [url, ...title] = text.slice(close + 2, end).trim().split(/\s+/);
  if (!SAFE_URL.test(url) || (title.length > 0 && !/^".*"$/.test(title.join(' ')))) return null;
  const children = parseInline(text.slice(i + 1, close), depth + 1);
  return { node: { tag: 'a', href: url, children }, end: end + 1 };
}

function linkifyUrls(text) {
  const out = [];
  let last = 0;
  for (const m of text.matchAll(BARE_URL)) {
    if (m.index > last) out.push(text.slice(last, m.index));
    out.push({ tag: 'a', href: m[0], children: [m[0]] });
    last = m.index + m[0].length;
  }
  if (last < text.length) out.push(text.slice(last));
  return out;
}

// ---- output ----

// The tree of `text`: an array of nodes, each a string (text) or {tag, children, ...attributes}
// (`code-block` nodes carry `lang` and `text` instead of children).
export function parseMarkdown(text) {
  return parseBlocks(String(text).replace(/\r\n?/g, '\n').split('\n'), 0);
}

function appendNodes(parent, nodes, doc) {
  for (const node of nodes) {
    if (typeof node === 'string') { parent.appendChild(doc.createTextNode(node)); continue; }
    if (node.tag === 'code-block') { parent.appendChild(codeBlock(node, doc)); continue; }
    const el = doc.createElement(node.tag);
    if (node.tag === 'a') {
      el.href = node.href;
      el.target = '_blank';
      el.rel = 'noopener noreferrer';
    }
    if (node.start !== undefined) el.start = node.start;
    if (node.align) el.className = `align-${node.align}`;
    appendNodes(el, node.children, doc);
    parent.appendChild(node.tag === 'table' ? wrapTable(el, doc) : el);
  }
}

function wrapTable(table, doc) {
  const wrap = doc.createElement('div');
  wrap.className = 'table-wrap';
  wrap.appendChild(table);
  return wrap;
}

// A code block with its language and a copy button (chat.js handles the button's clicks).
function codeBlock(node, doc) {
  const wrap = doc.createElement('div');
  wrap.className = 'code-block';
  const head = doc.createElement('div');
  head.className = 'code-head';
  const lang = doc.createElement('span');
  lang.textContent = node.lang || 'text';
  const copy = doc.createElement('button');
  copy.type = 'button';
  copy.className = 'copy-code';
  copy.textContent = 'Copy';
  copy.setAttribute('aria-label', `Copy ${node.lang || 'text'} code`);
  head.append(lang, copy);
  const pre = doc.createElement('pre');
  const code = doc.createElement('code');
  if (node.lang) code.className = `language-${node.lang.replace(/[^\w+-]/g, '')}`;
  code.textContent = node.text;
  pre.appendChild(code);
  wrap.append(head, pre);
  return wrap;
}

// `text` rendered into a DocumentFragment of `doc`.
export function renderMarkdown(text, doc = document) {
  const fragment = doc.createDocumentFragment();
  appendNodes(fragment, parseMarkdown(text), doc);
  return fragment;
}

const HTML_ESCAPES = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
const escapeHtml = (s) => String(s).replace(/[&<>"']/g, (c) => HTML_ESCAPES[c]);

// The tree as escaped HTML text: what toDom builds, written out (the tests compare it; the page
// itself never parses HTML).
export function toHtml(nodes) {
  return nodes.map((node) => {
    if (typeof node === 'string') return escapeHtml(node);
    if (node.tag === 'code-block') {
      return `<pre><code${node.lang ? ` class="language-${escapeHtml(node.lang)}"` : ''}>` +
             `${escapeHtml(node.text)}</code></pre>`;
    }
    let attrs = '';
    if (node.href !== undefined) attrs += ` href="${escapeHtml(node.href)}"`;
    if (node.start !== undefined) attrs += ` start="${node.start}"`;
    if (node.align) attrs += ` class="align-${node.align}"`;
    if (node.tag === 'br' || node.tag === 'hr') return `<${node.tag}>`;
    return `<${node.tag}${attrs}>${toHtml(node.children)}</${node.tag}>`;
  }).join('');
}
