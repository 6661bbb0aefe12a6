// Server-sent events over fetch: the body of a streaming POST /v1/chat/completions, read with a
// ReadableStream reader and cut into events. EventSource cannot POST or send a bearer key,
// hence this. No DOM; also runs under node (tests).

// Splits SSE text into events as chunks arrive. push() returns the complete events' data
// fields (several `data:` lines of one event joined with "\n"); a partial event waits.
export class SseParser {
  constructor() {
    this.buffer = '';
  }

  push(text) {
    this.buffer += text.replace(/\r\n?/g, '\n');
    const events = [];
    let end;
    while ((end = this.buffer.indexOf('\n\n')) >= 0) {
      const block = this.buffer.slice(0, end);
      this.buffer = this.buffer.slice(end + 2);
      const data = [];
      for (const line of block.split('\n')) {
        if (line.startsWith('data:')) data.push(line.slice(line[5] === ' ' ? 6 : 5));
      }
      if (data.length > 0) events.push(data.join('\n'));
    }
    return events;
  }
}

// Reads an OpenAI-style event stream from a fetch Response and calls onChunk(object) for each
// JSON event until `data: [DONE]`. An event carrying {"error": ...} is thrown as an Error with
// the server's message. Resolves when the stream ends; rejects (AbortError) when aborted.
export async function readChatStream(response, onChunk) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  const parser = new SseParser();
  for (;;) {
    const { value, done } = await reader.read();
    const text = done ? decoder.decode() : decoder.decode(value, { stream: true });
    for (const data of parser.push(text)) {
      if (data === '[DONE]') return;
      let event;
      try {
        event = JSON.parse(data);
      } catch {
        throw new Error(`the server sent an event that is not JSON: ${data.slice(0, 200)}`);
      }
      if (event.error) throw new Error(event.error.message || JSON.stringify(event.error));
      onChunk(event);
    }
    if (done) return;
  }
}
