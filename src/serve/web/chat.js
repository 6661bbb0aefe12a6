// The chat page: conversations (store.js) shown as messages, a reply streamed from
// POST /v1/chat/completions (sse.js) and rendered as Markdown (markdown.js) at most once a frame,
// the model picker from GET /v1/models, per-conversation system prompt, sampling settings, a
// stop button that aborts the fetch (the server then cancels the request), and the API key asked
// for when the server answers 401. Text from the model or the user only ever reaches the page as
// text nodes.
import { renderMarkdown } from './markdown.js';
import { readChatStream } from './sse.js';
import { ChatStore, titleOf } from './store.js';

const $ = (id) => document.getElementById(id);
const ui = {
  app: $('app'), sidebar: $('sidebar'), list: $('conversation-list'), newChat: $('new-chat'),
  toggleSidebar: $('toggle-sidebar'), model: $('model'), modelInfo: $('model-info'),
  toggleSettings: $('toggle-settings'), settings: $('settings'), system: $('system-prompt'),
  temperature: $('temperature'), topP: $('top-p'), maxTokens: $('max-tokens'),
  error: $('error'), errorText: $('error-text'), errorClose: $('error-close'),
  messages: $('messages'), composer: $('composer'), prompt: $('prompt'), send: $('send'),
  stop: $('stop'), keyButton: $('api-key-button'), keyDialog: $('key-dialog'),
  keyForm: $('key-form'), keyInput: $('api-key'), keyReason: $('key-reason'),
  keyCancel: $('key-cancel'), version: $('server-version'),
};

const store = new ChatStore(window.localStorage);
let inFlight = null;  // { controller, reply } while a reply streams
const messageViews = new WeakMap();  // message object -> its elements
const pendingRenders = new Set();

// ---- errors and the API ----

class UnauthorizedError extends Error {}

function showError(message) {
  ui.errorText.textContent = message;
  ui.error.hidden = false;
}

function clearError() {
  ui.error.hidden = true;
  ui.errorText.textContent = '';
}

function save() {
  try {
    store.save();
  } catch (err) {
    showError(`Could not save the conversation in this browser's storage: ${err.message}`);
  }
}

// The server's message for a failed response: its OpenAI error body, else the status and text.
async function errorMessage(response) {
  const text = await response.text();
  try {
    const error = JSON.parse(text).error;
    if (error?.message) return `${error.message} (HTTP ${response.status})`;
  } catch { /* not JSON */ }
  return `HTTP ${response.status} ${response.statusText}${text ? `: ${text.slice(0, 300)}` : ''}`;
}

async function api(path, options = {}) {
  const headers = { ...options.headers };
  if (store.apiKey) headers.Authorization = `Bearer ${store.apiKey}`;
  const response = await fetch(path, { ...options, headers });
  if (response.status === 401) {
    const message = await errorMessage(response);
    askForKey(store.apiKey ? `The server refused the saved key: ${message}`
                           : `This server needs an API key: ${message}`);
    throw new UnauthorizedError(message);
  }
  return response;
}

function askForKey(reason) {
  ui.keyReason.textContent = reason || 'Enter the key the server was started with (--api-key).';
  ui.keyInput.value = store.apiKey;
  if (!ui.keyDialog.open) ui.keyDialog.showModal();
  ui.keyInput.focus();
}

// ---- models ----

async function loadModels() {
  let response;
  try {
    response = await api('/v1/models');
  } catch (err) {
    if (!(err instanceof UnauthorizedError)) showError(`Could not list the models: ${err.message}`);
    return;
  }
  if (!response.ok) {
    showError(`Could not list the models: ${await errorMessage(response)}`);
    return;
  }
  const models = (await response.json()).data ?? [];
  ui.model.replaceChildren(...models.map((m) => new Option(m.id, m.id)));
  const wanted = store.settings.model;
  ui.model.value = models.some((m) => m.id === wanted) ? wanted : (models[0]?.id ?? '');
  ui.model.disabled = models.length === 0;
  if (models[0]?.ember_version) ui.version.textContent = `v${models[0].ember_version}`;
  describeModel(models);
  ui.model.onchange = () => {
    store.settings.model = ui.model.value;
    describeModel(models);
    save();
  };
}

function describeModel(models) {
  const model = models.find((m) => m.id === ui.model.value);
  ui.modelInfo.textContent = model?.context_length ? `${model.context_length} tokens context` : '';
}

// ---- conversations ----

function renderConversationList() {
  const current = store.current();
  ui.list.replaceChildren(...store.list().map((conversation) => {
    const item = document.createElement('li');
    const open = document.createElement('button');
    open.type = 'button';
    open.className = 'conversation';
    open.textContent = titleOf(conversation);
    open.title = titleOf(conversation);
    if (conversation === current) open.setAttribute('aria-current', 'true');
    open.onclick = () => switchTo(conversation.id);
    const remove = document.createElement('button');
    remove.type = 'button';
    remove.className = 'plain delete';
    remove.textContent = '✕';
    remove.setAttribute('aria-label', `Delete "${titleOf(conversation)}"`);
    remove.onclick = () => deleteConversation(conversation);
    item.append(open, remove);
    return item;
  }));
}

function switchTo(id) {
  store.select(id);
  renderAll();
  closeSidebarOnNarrow();
  ui.prompt.focus();
}

function deleteConversation(conversation) {
  if (conversation.messages.length > 0 && !window.confirm(`Delete "${titleOf(conversation)}"?`)) return;
  if (inFlight && conversation.messages.includes(inFlight.reply)) inFlight.controller.abort();
  store.remove(conversation.id);
  renderAll();
}

function renderAll() {
  renderConversationList();
  const conversation = store.current();
  ui.system.value = conversation.system ?? '';
  ui.messages.replaceChildren(...conversation.messages.map(messageView));
  if (conversation.messages.length === 0) ui.messages.append(emptyState());
  for (const message of conversation.messages) updateMessage(message);
  scrollToEnd(true);
}

function emptyState() {
  const empty = document.createElement('p');
  empty.className = 'empty muted';
  empty.textContent = 'Send a message to start the conversation.';
  return empty;
}

// ---- messages ----

function messageView(message) {
  let view = messageViews.get(message);
  if (view) return view.article;
  const article = document.createElement('article');
  article.className = `message ${message.role}`;
  const role = document.createElement('div');
  role.className = 'role';
  const reasoning = document.createElement('details');
  reasoning.className = 'reasoning';
  const summary = document.createElement('summary');
  const reasoningText = document.createElement('div');
  reasoningText.className = 'reasoning-text';
  reasoning.append(summary, reasoningText);
  const content = document.createElement('div');
  content.className = message.role === 'user' ? 'content plain-text' : 'content markdown';
  const footer = document.createElement('div');
  footer.className = 'message-footer';
  const status = document.createElement('span');
  status.className = 'status muted';
  const copy = document.createElement('button');
  copy.type = 'button';
  copy.className = 'plain copy-message';
  copy.textContent = 'Copy';
  copy.setAttribute('aria-label', `Copy this ${message.role === 'user' ? 'message' : 'reply'}`);
  copy.onclick = () => copyText(message.content, copy);
  footer.append(status, copy);
  article.append(role, reasoning, content, footer);
  view = { article, role, reasoning, summary, reasoningText, content, status };
  messageViews.set(message, view);
  return article;
}

function updateMessage(message) {
  const view = messageViews.get(message);
  if (!view) return;
  const streaming = message.status === 'streaming';
  view.article.classList.toggle('streaming', streaming);
  view.article.setAttribute('aria-busy', String(streaming));
  view.role.textContent = message.role === 'user' ? 'You' : `Assistant${message.model ? ` · ${message.model}` : ''}`;
  view.reasoning.hidden = !message.reasoning;
  view.summary.textContent = streaming && !message.content ? 'Thinking…' : 'Reasoning';
  view.reasoningText.textContent = message.reasoning ?? '';
  if (message.role === 'user') view.content.textContent = message.content;
  else view.content.replaceChildren(renderMarkdown(message.content));
  view.status.textContent = statusText(message);
}

function statusText(message) {
  if (message.role !== 'assistant') return '';
  const parts = [];
  if (message.status === 'streaming') parts.push('Generating…');
  if (message.status === 'stopped') parts.push('Stopped');
  if (message.status === 'error') parts.push('Cut short by an error');
  if (message.finish === 'length') parts.push('Reached the token limit');
  if (message.usage) parts.push(`${message.usage.completion_tokens} tokens`);
  // The clock starts at the first token, so the rate counts the tokens after it.
  if (message.usage?.completion_tokens > 1 && message.seconds > 0) {
    parts.push(`${((message.usage.completion_tokens - 1) / message.seconds).toFixed(1)} tok/s`);
  }
  return parts.join(' · ');
}

// Re-renders a streaming message at most once per frame.
function scheduleRender(message) {
  if (pendingRenders.size === 0) {
    requestAnimationFrame(() => {
      const stick = nearEnd();
      for (const m of pendingRenders) updateMessage(m);
      pendingRenders.clear();
      scrollToEnd(stick);
    });
  }
  pendingRenders.add(message);
}

function nearEnd() {
  const m = ui.messages;
  return m.scrollHeight - m.scrollTop - m.clientHeight < 80;
}

function scrollToEnd(really) {
  if (really) ui.messages.scrollTop = ui.messages.scrollHeight;
}

async function copyText(text, button) {
  try {
    if (navigator.clipboard && window.isSecureContext) {
      await navigator.clipboard.writeText(text);
    } else {
      const area = document.createElement('textarea');
      area.value = text;
      area.setAttribute('readonly', '');
      area.className = 'visually-hidden';
      document.body.append(area);
      area.select();
      const copied = document.execCommand('copy');
      area.remove();
      if (!copied) throw new Error('the browser refused');
    }
    flash(button, 'Copied');
  } catch (err) {
    showError(`Could not copy: ${err.message}`);
  }
}

function flash(button, text) {
  const before = button.textContent;
  button.textContent = text;
  setTimeout(() => { button.textContent = before; }, 1500);
}

// ---- sending ----

function samplingFields() {
  const fields = {};
  const add = (name, input, parse) => {
    const value = input.value.trim();
    if (value !== '') fields[name] = parse(value);
  };
  add('temperature', ui.temperature, Number);
  add('top_p', ui.topP, Number);
  add('max_tokens', ui.maxTokens, (v) => parseInt(v, 10));
  return fields;
}

function requestBody(conversation) {
  const messages = [];
  if (conversation.system?.trim()) messages.push({ role: 'system', content: conversation.system });
  for (const m of conversation.messages) {
    if (m.status === 'streaming') continue;
    if (m.role === 'user' || m.content) messages.push({ role: m.role, content: m.content });
  }
  const body = { messages, stream: true, stream_options: { include_usage: true }, ...samplingFields() };
  if (ui.model.value) body.model = ui.model.value;
  return body;
}

function setBusy(busy) {
  ui.send.hidden = busy;
  ui.stop.hidden = !busy;
  if (busy) ui.stop.focus();
  else if (document.activeElement === ui.stop || document.activeElement === document.body) ui.prompt.focus();
}

function applyChunk(reply, chunk) {
  if (chunk.usage) reply.usage = chunk.usage;
  for (const choice of chunk.choices ?? []) {
    const delta = choice.delta ?? {};
    if (delta.reasoning_content) reply.reasoning = (reply.reasoning ?? '') + delta.reasoning_content;
    if (delta.content) {
      reply.firstTokenAt ??= performance.now();
      reply.content += delta.content;
    }
    if (choice.finish_reason) reply.finish = choice.finish_reason;
  }
  if (!reply.firstTokenAt && reply.reasoning) reply.firstTokenAt = performance.now();
}

async function send(text) {
  clearError();
  const conversation = store.current();
  conversation.system = ui.system.value;  // also when its change event has not fired yet
  const user = { role: 'user', content: text };
  const reply = { role: 'assistant', content: '', model: ui.model.value, status: 'streaming' };
  const body = requestBody({ ...conversation, messages: [...conversation.messages, user] });
  conversation.messages.push(user, reply);
  store.touch(conversation);
  renderAll();
  const controller = new AbortController();
  inFlight = { controller, reply };
  setBusy(true);
  try {
    const response = await api('/v1/chat/completions', {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify(body), signal: controller.signal,
    });
    if (!response.ok) throw new Error(await errorMessage(response));
    await readChatStream(response, (chunk) => { applyChunk(reply, chunk); scheduleRender(reply); });
    reply.status = 'done';
  } catch (err) {
    finishWithError(conversation, user, reply, err);
  } finally {
    if (reply.firstTokenAt) reply.seconds = (performance.now() - reply.firstTokenAt) / 1000;
    delete reply.firstTokenAt;
    inFlight = null;
    setBusy(false);
    save();
    renderConversationList();
    updateMessage(reply);
  }
}

function finishWithError(conversation, user, reply, err) {
  if (err.name === 'AbortError') {
    reply.status = 'stopped';
    return;
  }
  if (!(err instanceof UnauthorizedError)) showError(err.message);
  if (reply.content || reply.reasoning) {
    reply.status = 'error';
    return;
  }
  // Nothing came back: take the turn out again and give the text back to edit or resend.
  conversation.messages = conversation.messages.filter((m) => m !== user && m !== reply);
  if (!ui.prompt.value) ui.prompt.value = user.content;
  renderAll();
}

// ---- wiring ----

function closeSidebarOnNarrow() {
  ui.app.classList.remove('sidebar-open');
  ui.toggleSidebar.setAttribute('aria-expanded', 'false');
}

function loadSettingsIntoForm() {
  ui.temperature.value = store.settings.temperature;
  ui.topP.value = store.settings.top_p;
  ui.maxTokens.value = store.settings.max_tokens;
  for (const [input, name] of [[ui.temperature, 'temperature'], [ui.topP, 'top_p'], [ui.maxTokens, 'max_tokens']]) {
    input.addEventListener('change', () => { store.settings[name] = input.value.trim(); save(); });
  }
  ui.system.addEventListener('change', () => {
    store.current().system = ui.system.value;
    save();
  });
}

function resizePrompt() {
  ui.prompt.style.height = 'auto';
  ui.prompt.style.height = `${Math.min(ui.prompt.scrollHeight, 240)}px`;
}

function wire() {
  ui.composer.addEventListener('submit', (event) => {
    event.preventDefault();
    const text = ui.prompt.value.trim();
    if (!text || inFlight) return;
    ui.prompt.value = '';
    resizePrompt();
    send(text);
  });
  ui.prompt.addEventListener('keydown', (event) => {
    if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      ui.composer.requestSubmit();
    }
  });
  ui.prompt.addEventListener('input', resizePrompt);
  ui.stop.addEventListener('click', () => inFlight?.controller.abort());
  document.addEventListener('keydown', (event) => {
    if (event.key === 'Escape' && inFlight && !ui.keyDialog.open) inFlight.controller.abort();
  });
  ui.newChat.addEventListener('click', () => {
    const current = store.current();
    if (current.messages.length > 0) store.create();
    renderAll();
    closeSidebarOnNarrow();
    ui.prompt.focus();
  });
  ui.toggleSettings.addEventListener('click', () => {
    ui.settings.hidden = !ui.settings.hidden;
    ui.toggleSettings.setAttribute('aria-expanded', String(!ui.settings.hidden));
  });
  ui.toggleSidebar.addEventListener('click', () => {
    const open = ui.app.classList.toggle('sidebar-open');
    ui.toggleSidebar.setAttribute('aria-expanded', String(open));
  });
  ui.errorClose.addEventListener('click', clearError);
  ui.keyButton.addEventListener('click', () => askForKey(''));
  ui.keyCancel.addEventListener('click', () => ui.keyDialog.close());
  ui.keyForm.addEventListener('submit', (event) => {
    event.preventDefault();
    store.apiKey = ui.keyInput.value.trim();
    ui.keyDialog.close();
    clearError();
    loadModels();
  });
  // Copy buttons of code blocks (made by markdown.js) through one listener.
  ui.messages.addEventListener('click', (event) => {
    const button = event.target.closest('.copy-code');
    if (button) copyText(button.closest('.code-block').querySelector('code').textContent, button);
  });
  window.addEventListener('pagehide', save);
}

// A reply that was streaming when the page went away ended there.
for (const conversation of store.conversations) {
  for (const m of conversation.messages) if (m.status === 'streaming') m.status = 'stopped';
}
loadSettingsIntoForm();
wire();
renderAll();
loadModels();
ui.prompt.focus();
