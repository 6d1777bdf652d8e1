/**
 * A client for OpenAI-compatible chat-completions servers (OpenAI, vLLM, llama.cpp,
 * Ollama, TGI...), streaming with server-sent events, as a `ModelWorker`.
 *
 * The response body is read through its own reader, one chunk when a token is wanted
 * and none is parsed yet, so what sits in memory is bounded by one network chunk plus
 * the transport's own window: a slow consumer makes TCP flow control reach the server.
 */
import type * as z from 'zod';
import { lazySchema } from '../../core/zod.js';
import type { Flow } from '../../flow/demand.js';
import { parseOptions } from '../../flow/options.js';
import { HttpStatusError, MalformedEventError, RateLimitedError } from './errors.js';
import { inStreamError } from './stream-errors.js';
import {
  complete,
  decode,
  generateRequest,
  type Completion,
  type DecodeStep,
  type Decoding,
  type EndReason,
  type GenerateOptions,
  type GenerateRequest,
  type InferOptions,
  type ModelWorker,
  type Token,
  type Usage,
} from './worker.js';

/** Options of `OpenAIWorker`: the upstream's base URL, model, key and headers. */
export interface OpenAIWorkerOptions {
  /** Up to and including the version, e.g. `https://api.openai.com/v1` or `http://127.0.0.1:8000/v1`. */
  readonly baseUrl: string;
  readonly model: string;
  /** Sent as `Authorization: Bearer <apiKey>`. */
  readonly apiKey?: string;
  /** Extra request headers. */
  readonly headers?: Readonly<Record<string, string>>;
  /** Names the worker in traces and errors. Default `openai:<model>`. */
  readonly name?: string;
  /** The `fetch` to use. Default: the global one. */
  readonly fetch?: typeof fetch;
}

const optionsSchema = lazySchema((z) =>
  z
    .object({
      baseUrl: z.url({ error: 'baseUrl must be an absolute URL' }),
      model: z.string().min(1, { error: 'model must not be empty' }),
      apiKey: z.string().optional(),
      headers: z.record(z.string(), z.string()).optional(),
      name: z.string().min(1).optional(),
      fetch: z.custom<typeof fetch>((v) => typeof v === 'function', { error: 'fetch must be a function' }).optional(),
    })
    .strict(),
);

/**
 * A `ModelWorker` over HTTP. `generate` streams (`stream: true`); `infer` asks for the
 * whole answer at once. HTTP errors become `HttpStatusError` (429: `RateLimitedError`
 * with `retryAfter` in ms), a broken stream `MalformedEventError`, an error inside the
 * stream `ProviderError` (an `HttpStatusError` with the status it stands for), after every
 * token the stream carried before it. Aborting the signal or unsubscribing closes the connection.
 *
 * `top_k` and `repetition_penalty` are sent only when set: OpenAI ignores or rejects
 * them, vLLM and llama.cpp honour them. Stop sequences are sent to the server and also
 * applied here, so a server that ignores them still stops.
 *
 * ## Example
 * ```ts
 * const worker = new OpenAIWorker({ baseUrl: 'http://127.0.0.1:8000/v1', model: 'llama-3-8b' });
 * worker.generate(generateRequest({ messages: [{ role: 'user', content: 'Hi' }], max_tokens: 32 }))
 *   .subscribe((token) => process.stdout.write(token.text));
 * ```
 */
export class OpenAIWorker implements ModelWorker<GenerateRequest, Completion> {
  readonly name: string;
  private readonly options: z.output<ReturnType<typeof optionsSchema>>;

  constructor(options: OpenAIWorkerOptions) {
    this.options = parseOptions(optionsSchema(), options, 'OpenAIWorker options');
    this.name = this.options.name ?? `openai:${this.options.model}`;
  }

  /** Streams the completion of `request` from the upstream server; unsubscribing aborts the HTTP request. */
  generate(request: GenerateRequest, options: GenerateOptions = {}): Flow<Token> {
    const valid = generateRequest(request);
    return decode(valid, options, { name: this.name, maxTokens: undefined }, () => new SseDecoding(this, valid));
  }

  /** The whole completion in one response (`stream: false`). */
  async infer(request: GenerateRequest, options: InferOptions = {}): Promise<Completion> {
    const valid = generateRequest(request);
    const response = await this.post(valid, false, options.signal);
    const text = await readLimited(response, MAX_COMPLETION_BYTES);
    let json: unknown;
    try {
      json = JSON.parse(text);
    } catch {
      throw new MalformedEventError('the response is not JSON', text);
    }
    const parsed = completionSchema().safeParse(json);
    if (!parsed.success) throw new MalformedEventError(`unexpected completion shape (${parsed.error.issues[0]?.message ?? 'invalid'})`, text);
    const choice = parsed.data.choices[0];
    return {
      text: choice?.message.content ?? '',
      finishReason: finishReason(choice?.finish_reason),
      usage: { inputTokens: parsed.data.usage?.prompt_tokens ?? 0, outputTokens: parsed.data.usage?.completion_tokens ?? 0 },
    };
  }

  /** Streams the completion and gathers it: what `infer` gives, built from `generate`. */
  completeStreaming(request: GenerateRequest, options: InferOptions = {}): Promise<Completion> {
    return complete((onDone) => this.generate(request, { ...options, onDone }));
  }

  /**
   * `POST /embeddings` with a client's body as it is (`model` set to this worker's): the
   * server's JSON answer, or the typed HTTP error. Answers over 64 MiB fail.
   */
  async embeddings(body: Readonly<Record<string, unknown>>, signal?: AbortSignal): Promise<unknown> {
    const response = await this.send('embeddings', { ...body, model: this.options.model }, 'application/json', signal);
    const text = await readLimited(response, MAX_EMBEDDINGS_BYTES);
    try {
      return JSON.parse(text) as unknown;
    } catch {
      throw new MalformedEventError('the embeddings answer is not JSON', text.slice(0, 200));
    }
  }

  /** @internal POSTs the request; answers with the response once its status is OK, or throws the typed HTTP error. */
  async post(request: GenerateRequest, stream: boolean, signal: AbortSignal | undefined): Promise<Response> {
    // A client's body is forwarded as it is (its own messages, tools, vendor fields); the worker sets model and stream.
    const body: Record<string, unknown> = {
      ...request.passthrough,
      model: this.options.model,
      stream,
    };
    if (request.passthrough === undefined) body.messages = request.messages ?? [{ role: 'user', content: request.prompt }];
    else delete body.stream_options;
    if (stream) body.stream_options = { ...streamOptionsOf(request.passthrough), include_usage: true };
    for (const key of ['temperature', 'top_p', 'top_k', 'max_tokens', 'stop', 'repetition_penalty', 'seed', 'presence_penalty', 'frequency_penalty'] as const) {
      if (request[key] !== undefined && !(key in body)) body[key] = request[key];
    }
    // max_completion_tokens and max_tokens mean the same; a body with one keeps it alone.
    if ('max_completion_tokens' in body && request.passthrough !== undefined && !('max_tokens' in request.passthrough)) delete body.max_tokens;
    return this.send(isTextCompletion(request) ? 'completions' : 'chat/completions', body, stream ? 'text/event-stream' : 'application/json', signal);
  }

  private async send(path: string, body: Readonly<Record<string, unknown>>, accept: string, signal: AbortSignal | undefined): Promise<Response> {
    const doFetch = this.options.fetch ?? fetch;
    const response = await doFetch(`${this.options.baseUrl.replace(/\/+$/, '')}/${path}`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        accept,
        ...(this.options.apiKey === undefined ? {} : { authorization: `Bearer ${this.options.apiKey}` }),
        ...this.options.headers,
      },
      body: JSON.stringify(body),
      ...(signal === undefined ? {} : { signal }),
    });
    if (response.ok) return response;
    // Only the start of an error body is kept: a server may send anything there.
    const text = (await readLimited(response, 1000, true).catch(() => '')).slice(0, 1000);
    if (response.status === 429) throw new RateLimitedError(text, retryAfter(response.headers));
    throw new HttpStatusError(response.status, text);
  }
}

/** One streamed generation: the response body read per demand and parsed into deltas. */
class SseDecoding implements Decoding {
  inputTokens = 0;
  private reader: ReadableStreamDefaultReader<Uint8Array> | undefined;
  private readonly parser = new SseParser();
  /** Deltas parsed from the last chunk read and not yet stepped: at most one chunk's worth. */
  private pending: DecodeStep[] = [];
  private next = 0;
  private finish: EndReason | undefined;
  private usage: Partial<Usage> | undefined;
  private sawDone = false;
  /** The stream's failure, thrown once the deltas read before it were stepped: a read may carry tokens and then an error. */
  private failure: { error: unknown } | undefined;
  private closed = false;
  /** Parses one event into `pending`; bound once, a read may carry many. */
  private readonly onEvent = (data: string, type: string): void => this.accept(data, type);

  constructor(
    private readonly worker: OpenAIWorker,
    private readonly request: GenerateRequest,
  ) {}

  async step(signal: AbortSignal): Promise<DecodeStep> {
    for (;;) {
      if (this.next < this.pending.length) return this.pending[this.next++]!;
      this.pending = [];
      this.next = 0;
      if (this.failure !== undefined) throw this.failure.error;
      if (this.sawDone) return this.end();
      if (this.reader === undefined) {
        const response = await this.worker.post(this.request, true, signal);
        const type = response.headers.get('content-type') ?? '';
        if (!type.includes('text/event-stream')) {
          await response.body?.cancel().catch(() => {});
          throw new MalformedEventError(`expected content-type text/event-stream, got "${type}"`);
        }
        if (response.body === null) throw new MalformedEventError('the response has no body');
        this.reader = response.body.getReader();
        if (this.closed) this.release();
      }
      const { done, value } = await this.reader.read();
      try {
        if (done) this.parser.endEvents(this.onEvent);
        else this.parser.pushEvents(value, this.onEvent);
      } catch (err) {
        this.fail(err);
      }
      if (done && !this.sawDone && this.failure === undefined) {
        // Some servers end the body after the last chunk without `[DONE]`; a stream with no finish reason was cut off.
        if (this.finish === undefined) this.fail(new MalformedEventError('the stream ended before [DONE]'));
        else this.sawDone = true;
      }
    }
  }

  private end(): DecodeStep {
    return this.usage === undefined ? { end: this.finish ?? 'stop' } : { end: this.finish ?? 'stop', usage: this.usage };
  }

  private fail(error: unknown): void {
    this.failure ??= { error };
  }

  private accept(data: string, type: string): void {
    if (this.sawDone || this.failure !== undefined) return;
    if (data === '[DONE]' && type !== 'error') {
      this.sawDone = true;
      return;
    }
    let json: unknown;
    try {
      json = JSON.parse(data);
    } catch {
      json = undefined;
      if (type !== 'error') return this.fail(new MalformedEventError('a data payload is not JSON', data));
    }
    const error = inStreamError(json, type, data);
    if (error !== undefined) return this.fail(error);
    const chunk = chunkSchema().safeParse(json);
    if (!chunk.success) return this.fail(new MalformedEventError(`unexpected chunk shape (${chunk.error.issues[0]?.message ?? 'invalid'})`, data));
    if (chunk.data.usage) {
      this.usage = { inputTokens: chunk.data.usage.prompt_tokens, outputTokens: chunk.data.usage.completion_tokens };
      this.inputTokens = chunk.data.usage.prompt_tokens;
    }
    for (const choice of chunk.data.choices) {
      if (choice.index !== undefined && choice.index !== 0) continue;
      // A text completion's choice has its text; a chat's, a delta.
      const { content, role: _role, ...rest } = choice.delta ?? {};
      const text = typeof content === 'string' ? content : typeof choice.text === 'string' ? choice.text : '';
      // Tool calls, refusals and other vendor deltas ride along with (or instead of) the text.
      const delta = Object.keys(rest).some((key) => rest[key] !== undefined && rest[key] !== null) ? rest : undefined;
      if (text.length > 0 || delta !== undefined) this.pending.push(delta === undefined ? { text } : { text, delta });
      if (choice.finish_reason) this.finish = finishReason(choice.finish_reason);
    }
  }

  close(): void {
    this.closed = true;
    this.release();
  }

  private release(): void {
    const reader = this.reader;
    this.reader = undefined;
    // Cancelling the body closes the connection, so the server stops generating too.
    reader?.cancel().catch(() => {});
  }
}

/**
 * Server-sent events, incrementally: bytes in (split anywhere, even inside a UTF-8
 * character or between CR and LF), the `data` of each complete event out. `push`/`end`
 * give the data alone; `pushEvents`/`endEvents` hand each event to a callback with its
 * `event` type (`message` when none was given) as soon as it completes, so events completed
 * before a failure (an event over the size bound) are handed over before the throw. `id`,
 * `retry` and comments are ignored.
 *
 * ## Example
 * ```ts
 * const parser = new SseParser();
 * parser.push(new TextEncoder().encode('data: {"a"'));  // []
 * parser.push(new TextEncoder().encode(':1}\n\n'));     // ['{"a":1}']
 * parser.pushEvents(new TextEncoder().encode('event: error\ndata: down\n\n'), (data, type) => console.log(type, data)); // error down
 * ```
 */
export class SseParser {
  private readonly decoder = new TextDecoder('utf-8', { fatal: false });
  private line = '';
  private data: string[] = [];
  private type = '';
  /** Characters of the event being read (its data lines and the line not yet ended). */
  private size = 0;

  /** `maxEventChars`: an event longer than this fails with `MalformedEventError`, so a server that never ends a line cannot fill memory. */
  constructor(private readonly maxEventChars = 1 << 20) {}
  private afterCarriageReturn = false;
  private started = false;

  /** The data of the events completed by `chunk`. */
  push(chunk: Uint8Array): string[] {
    const events: string[] = [];
    this.pushEvents(chunk, (data) => events.push(data));
    return events;
  }

  /**
   * The body ended. A last event missing its blank line is still delivered: the spec
   * drops it, but servers that end with a bare `data: [DONE]` are common.
   */
  end(): string[] {
    const events: string[] = [];
    this.endEvents((data) => events.push(data));
    return events;
  }

  /** Hands each event completed by `chunk` to `onEvent`, with its type. */
  pushEvents(chunk: Uint8Array, onEvent: (data: string, type: string) => void): void {
    this.feed(this.decoder.decode(chunk, { stream: true }), onEvent);
  }

  /** `end`, each event handed to `onEvent` with its type. */
  endEvents(onEvent: (data: string, type: string) => void): void {
    this.feed(this.decoder.decode(), onEvent);
    if (this.line !== '') this.dispatchLine(this.line, onEvent);
    this.dispatchLine('', onEvent);
    this.line = '';
  }

  private feed(text: string, onEvent: (data: string, type: string) => void): void {
    if (!this.started && text.length > 0) {
      this.started = true;
      if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
    }
    let start = 0;
    // The LF of a CRLF split across two chunks ends no second line.
    if (this.afterCarriageReturn && text.charCodeAt(0) === 10) start = 1;
    this.afterCarriageReturn = false;
    for (let i = start; i < text.length; i++) {
      const c = text.charCodeAt(i);
      if (c !== 10 && c !== 13) continue;
      this.dispatchLine(this.line + text.slice(start, i), onEvent);
      this.line = '';
      if (c === 13) {
        if (i + 1 === text.length) this.afterCarriageReturn = true;
        else if (text.charCodeAt(i + 1) === 10) i++;
      }
      start = i + 1;
    }
    this.line += text.slice(start);
    if (this.size + this.line.length > this.maxEventChars) throw new MalformedEventError(`an event is longer than ${this.maxEventChars} characters`);
  }

  private dispatchLine(line: string, onEvent: (data: string, type: string) => void): void {
    if (line === '') {
      const { type, data } = this;
      this.type = '';
      this.data = [];
      this.size = 0;
      if (data.length > 0) onEvent(data.join('\n'), type === '' ? 'message' : type);
      return;
    }
    if (line.startsWith(':')) return;
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    if (field !== 'data' && field !== 'event') return;
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'event') {
      this.type = value;
      return;
    }
    this.data.push(value);
    this.size += value.length + 1;
  }
}

const chunkSchema = lazySchema((z) =>
  z.looseObject({
    choices: z.array(
      z.looseObject({
        index: z.number().optional(),
        delta: z.looseObject({ content: z.string().nullish() }).nullish(),
        text: z.string().nullish(),
        finish_reason: z.string().nullish(),
      }),
    ),
    usage: z.looseObject({ prompt_tokens: z.number(), completion_tokens: z.number() }).nullish(),
  }),
);

const completionSchema = lazySchema((z) =>
  z.looseObject({
    choices: z.array(z.looseObject({ message: z.looseObject({ content: z.string().nullish() }), finish_reason: z.string().nullish() })),
    usage: z.looseObject({ prompt_tokens: z.number(), completion_tokens: z.number() }).nullish(),
  }),
);

function finishReason(reason: string | null | undefined): EndReason {
  if (reason === 'length' || reason === 'tool_calls' || reason === 'content_filter') return reason;
  // The legacy name of a tool call.
  return reason === 'function_call' ? 'tool_calls' : 'stop';
}

function streamOptionsOf(body: Readonly<Record<string, unknown>> | undefined): Record<string, unknown> {
  const options = body?.stream_options;
  return typeof options === 'object' && options !== null ? { ...(options as Record<string, unknown>) } : {};
}

/** The largest whole (non-streamed) completion read, bytes; a larger one is a `MalformedEventError`. */
const MAX_COMPLETION_BYTES = 16 * 1024 * 1024;

/** The largest embeddings answer read, bytes: about 1,000 vectors of 3,072 floats as JSON, 4,000 in base64. */
const MAX_EMBEDDINGS_BYTES = 64 * 1024 * 1024;

/** A response body as text, read up to `limit` bytes: beyond, the rest is cancelled and the read fails, or with `truncate` returns what it has. */
async function readLimited(response: Response, limit: number, truncate = false): Promise<string> {
  if (response.body === null) return '';
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let text = '';
  let bytes = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return text + decoder.decode();
    bytes += value.byteLength;
    if (bytes > limit) {
      await reader.cancel().catch(() => {});
      if (truncate) return text + decoder.decode(value);
      throw new MalformedEventError(`the response body is larger than ${limit} bytes`);
    }
    text += decoder.decode(value, { stream: true });
  }
}

/** `retry-after-ms` (OpenAI), else `retry-after` in seconds or as an HTTP date; in ms. */
function retryAfter(headers: Headers): number | undefined {
  const ms = Number.parseFloat(headers.get('retry-after-ms') ?? '');
  if (Number.isFinite(ms) && ms >= 0) return ms;
  const value = headers.get('retry-after');
  if (value === null) return undefined;
  const seconds = Number(value.trim());
  if (value.trim() !== '' && Number.isFinite(seconds) && seconds >= 0) return seconds * 1000;
  const date = Date.parse(value);
  return Number.isNaN(date) ? undefined : Math.max(0, date - Date.now());
}

/** A client's legacy text-completion body forwarded as it is (a prompt, no messages): it goes to `/completions`. */
function isTextCompletion(request: GenerateRequest): boolean {
  const body = request.passthrough;
  return body !== undefined && 'prompt' in body && !('messages' in body);
}
