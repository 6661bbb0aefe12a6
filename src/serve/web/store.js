// The page's state in the browser's localStorage: conversations (each with its system prompt,
// model and messages), sampling settings and the API key. Nothing leaves the browser except in
// requests to this server. A value that does not parse (another version, a hand edit) is
// replaced by defaults rather than breaking the page. `storage` is localStorage in the page and
// a stand-in under node (tests).

const CONVERSATIONS_KEY = 'ember.chat.conversations.v1';
const SETTINGS_KEY = 'ember.chat.settings.v1';
const API_KEY_KEY = 'ember.chat.apiKey';

export const DEFAULT_SETTINGS = { model: '', temperature: '', top_p: '', max_tokens: '' };

function readJson(storage, key, fallback) {
  try {
    const value = JSON.parse(storage.getItem(key));
    return value && typeof value === 'object' ? value : fallback;
  } catch {
    return fallback;
  }
}

function newId() {
  return `${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;
}

// A conversation's title: the start of its first user message.
export function titleOf(conversation) {
  const first = conversation.messages.find((m) => m.role === 'user');
  if (!first) return 'New chat';
  const text = first.content.replace(/\s+/g, ' ').trim();
  return text.length > 48 ? `${text.slice(0, 47).trimEnd()}…` : text || 'New chat';
}

export class ChatStore {
  constructor(storage) {
    this.storage = storage;
    const saved = readJson(storage, CONVERSATIONS_KEY, {});
    this.conversations = Array.isArray(saved.conversations)
      ? saved.conversations.filter((c) => c && typeof c.id === 'string' && Array.isArray(c.messages))
      : [];
    this.currentId = saved.currentId;
    if (!this.current()) this.currentId = this.conversations[0]?.id ?? this.create().id;
    this.settings = { ...DEFAULT_SETTINGS, ...readJson(storage, SETTINGS_KEY, {}) };
  }

  current() {
    return this.conversations.find((c) => c.id === this.currentId);
  }

  // Conversations, the most recently updated first.
  list() {
    return [...this.conversations].sort((a, b) => b.updated - a.updated);
  }

  create() {
    const now = Date.now();
    const conversation = { id: newId(), system: '', messages: [], created: now, updated: now };
    this.conversations.push(conversation);
    this.currentId = conversation.id;
    this.save();
    return conversation;
  }

  select(id) {
    if (this.conversations.some((c) => c.id === id)) this.currentId = id;
    this.save();
  }

  remove(id) {
    this.conversations = this.conversations.filter((c) => c.id !== id);
    if (this.currentId === id) this.currentId = this.list()[0]?.id ?? this.create().id;
    this.save();
  }

  touch(conversation) {
    conversation.updated = Date.now();
  }

  // Writes everything; throws (QuotaExceededError) when the browser's storage is full.
  save() {
    this.storage.setItem(CONVERSATIONS_KEY,
                         JSON.stringify({ conversations: this.conversations, currentId: this.currentId }));
    this.storage.setItem(SETTINGS_KEY, JSON.stringify(this.settings));
  }

  get apiKey() {
    return this.storage.getItem(API_KEY_KEY) || '';
  }

  set apiKey(value) {
    if (value) this.storage.setItem(API_KEY_KEY, value);
    else this.storage.removeItem(API_KEY_KEY);
  }
}
