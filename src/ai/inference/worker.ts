/**
 * The model-worker interface: what every model backend (an in-process ONNX session, an
 * HTTP server speaking the OpenAI protocol, a worker-thread pool) offers a pipeline.
 *
 * `generate` returns a `Flow<Token>`: the backend is stepped only while the consumer
 * wants another token, so a slow consumer pauses decoding instead of filling a buffer.
 * `infer` answers in one piece. Both take an `AbortSignal`; a `StageContext` can be
 * passed as the options as it is, so `stage((request, context) => worker.generate(request, context))`
 * wires the stage's cancellation and trace straight through.
 */
import { lazySchema } from '../../core/zod.js';
import { performance } from 'node:perf_hooks';
import { Flow, type Outlet, type Producer } from '../../flow/demand.js';
import { activeIntrospector, type InspectedRun, type RunCounters, type RunDescription } from '../../flow/introspection.js';
import { StageStats } from '../../flow/stats.js';
import { parseOptions } from '../../flow/options.js';
import { AbortedError } from '../../core/errors.js';
import type { ChatMessage } from '../../cache/key.js';
import type { NamedWorker, StreamWork } from '../../resilience/relay.js';
import type { TraceContext } from '../../core/trace.js';
import type { PriorityClass } from '../../core/vocabulary.js';
import { EmptyPromptError } from './errors.js';
import { StopMatcher } from './sampling.js';
import { samplingRules } from './sampling-rules.js';

export type { ChatMessage } from '../../cache/key.js';

/** How a model generates. Names follow the OpenAI / Hugging Face parameters, so requests pass through unchanged. */
export interface GenerationParams {
  /** Softmax temperature, ≥ 0; 0 is greedy decoding. */
  readonly temperature?: number;
  /** Nucleus sampling: the smallest set of tokens whose probability reaches `top_p`, in (0, 1]. */
  readonly top_p?: number;
  /** Only the `top_k` most likely tokens (integer ≥ 0; 0 turns it off). */
  readonly top_k?: number;
  /** Tokens generated at most (integer ≥ 1). */
  readonly max_tokens?: number;
  /** Generation stops before the first of these strings; it is never emitted. */
  readonly stop?: readonly string[];
  /** > 0; above 1 makes tokens already in the text less likely (CTRL-style). */
  readonly repetition_penalty?: number;
  /** Makes sampling reproducible. */
  readonly seed?: number;
  /** In [-2, 2]: subtracted from the logit of every token already generated (OpenAI's). */
  readonly presence_penalty?: number;
  /** In [-2, 2]: subtracted from a token's logit once per time it was generated (OpenAI's). */
  readonly frequency_penalty?: number;
  /**
   * The client's OpenAI chat body, for a worker that forwards it to an OpenAI-compatible
   * backend (`OpenAIWorker`): sent as it is — tools, `tool_choice`, `response_format`,
   * vendor fields, messages with their tool calls — with `model` and `stream` set by the
   * worker. A text-completions body (a `prompt`, no `messages`) goes to the backend's
   * `/completions`. Other workers ignore it.
   */
  readonly passthrough?: Readonly<Record<string, unknown>>;
}

/** A prompt to continue, or a chat, with the parameters to generate with. */
export type GenerateRequest = (
  | { readonly prompt: string; readonly messages?: undefined }
  | { readonly messages: readonly ChatMessage[]; readonly prompt?: undefined }
) &
  GenerationParams;

/** One piece of generated text. `index` counts the tokens emitted by this generation, from 0. */
export interface Token {
  readonly text: string;
  readonly index: number;
  /** Natural log of the model's probability for this token, when the backend knows it. */
  readonly logprob?: number;
  /**
   * What else an OpenAI-compatible backend's chunk carried beside text (`tool_calls`,
   * `refusal`...), as its `delta` had it; `text` may then be empty.
   */
  readonly delta?: Readonly<Record<string, unknown>>;
}

/**
 * Why a generation ended: a stop sequence or the model's end (`stop`), `max_tokens`
 * (`length`), cancellation (`abort`), or, from an OpenAI-compatible backend, a call of
 * the request's tools (`tool_calls`) or its content filter (`content_filter`).
 */
export type FinishReason = 'stop' | 'length' | 'abort' | 'tool_calls' | 'content_filter';

/** How a backend may end a generation: every `FinishReason` but `abort`, which only the consumer causes. */
export type EndReason = Exclude<FinishReason, 'abort'>;

/** Token counts of one generation: the prompt's (`inputTokens`) and the generated ones (`outputTokens`). */
export interface Usage {
  readonly inputTokens: number;
  readonly outputTokens: number;
}

/** What a generation reports when it ends (also noted in the trace). */
export interface GenerationDone {
  readonly finishReason: FinishReason;
  readonly usage: Usage;
  /** From the start of the generation to its first token, ms; undefined when no token came. */
  readonly timeToFirstToken: number | undefined;
  /** Output tokens after the first, per second since the first; undefined with fewer than two. */
  readonly tokensPerSecond: number | undefined;
}

/** A whole answer, as `infer` gives it. */
export interface Completion {
  readonly text: string;
  readonly finishReason: FinishReason;
  readonly usage: Usage;
}

/** What `generate` takes beside the request. A `StageContext` fits as it is. */
export interface GenerateOptions {
  /** Aborting stops the generation between steps (and closes a connection); the Flow then errors with `AbortedError`. */
  readonly signal?: AbortSignal;
  /** Where `ttft_ms`, `tokens_per_s`, `finish_reason`, `input_tokens` and `output_tokens` are noted. */
  readonly trace?: TraceContext;
  /** The stage the notes are filed under. Default: the worker's name. */
  readonly stage?: string;
  /** Called once when the generation ends, however it ends (after the last token, before the terminal signal). */
  readonly onDone?: (done: GenerationDone) => void;
  /**
   * Whose request this is (the tenant of its token). A worker that may answer a request with
   * another's tokens (the gateway's response cache, its single-flight) shares them only within
   * a tenant; wrappers pass it on.
   */
  readonly tenant?: string;
  /** Its class at a shared pipeline's door (`Intake`): `low` is shed first. Default `default`. */
  readonly priority?: PriorityClass;
}

/** Options of `ModelWorker.infer`: its abort signal. */
export interface InferOptions {
  readonly signal?: AbortSignal;
}

/**
 * A model backend. `generate` streams tokens with backpressure; `infer` answers once
 * (for a language model: the whole completion; for other models: their output).
 *
 * ## Example
 * ```ts
 * const worker: ModelWorker = await DecoderLmWorker.load('models/decoder.onnx');
 * const answers = fromIterable(prompts).pipe(
 *   stage((prompt: string, context) => worker.generate(generateRequest({ prompt, max_tokens: 64 }), context), { name: 'infer' }),
 * );
 * ```
 */
export interface ModelWorker<Input = GenerateRequest, Output = Completion> {
  readonly name: string;
  /**
   * True for a worker that forwards the client's OpenAI chat body to its backend
   * (`request.passthrough`): the HTTP API then accepts fields it does not know itself
   * (tools, `response_format`, vendor fields) instead of refusing them.
   */
  readonly passthrough?: boolean;
  /**
   * Tokens the model attends to, prompt and answer together, when it has such a limit. A request
   * that cannot fit fails with `ContextLengthExceededError` before any token is decoded.
   */
  readonly contextLength?: number;
  /**
   * For a worker that is a pipeline of stages counting each request themselves (`sluice-rag`:
   * guard, embed, retrieve, assemble, generate): their names. A server counts the requests of a
   * worker without them — a plain model — in a `generate` stage of its own, and never counts a
   * pipeline's: a request its guard blocked counts once, as the guard's.
   */
  readonly stages?: readonly string[];
  /** Streams the tokens generated for `request`; unsubscribing cancels the generation. */
  generate(request: GenerateRequest, options?: GenerateOptions): Flow<Token>;
  /** Runs the model once on `input` (embeddings, scores...). */
  infer(input: Input, options?: InferOptions): Promise<Output>;
}

const validated = new WeakSet<object>();

const requestSchema = lazySchema((z) => {
  const rules = samplingRules();
  return z
    .object({
      prompt: z.string({ error: 'prompt must be a string' }).optional(),
      messages: z
        .array(z.object({ role: z.string().min(1, { error: 'role must not be empty' }), content: z.string({ error: 'content must be a string' }) }).loose(), {
          error: 'messages must be an array of { role, content }',
        })
        .optional(),
      temperature: rules.temperature.optional(),
      top_p: rules.top_p.optional(),
      top_k: rules.top_k.optional(),
      max_tokens: rules.max_tokens.optional(),
      stop: z.array(z.string().min(1, { error: 'a stop sequence must not be empty' }), { error: 'stop must be an array of strings' }).optional(),
      repetition_penalty: rules.repetition_penalty.optional(),
      seed: rules.seed.optional(),
      presence_penalty: rules.presence_penalty.optional(),
      frequency_penalty: rules.frequency_penalty.optional(),
      passthrough: z.record(z.string(), z.unknown(), { error: 'passthrough must be an object (an OpenAI chat or completions body)' }).optional(),
    })
    .strict()
    .refine((r) => (r.prompt === undefined) !== (r.messages === undefined), { error: 'give exactly one of prompt or messages', path: ['prompt'] });
});

/**
 * Builds a validated, frozen `GenerateRequest`. Invalid parameters throw
 * `InvalidOptionsError` naming each bad field (`top_p`, `max_tokens`...); an empty
 * prompt or chat throws `EmptyPromptError`. Workers validate requests they did not
 * get from here too, so a bad one fails before any model runs.
 *
 * ## Example
 * ```ts
 * const request = generateRequest({ prompt: 'Once upon a time', temperature: 0.7, top_p: 0.9, max_tokens: 64, stop: ['\n\n'], seed: 1 });
 * generateRequest({ prompt: 'x', top_p: 0 }); // InvalidOptionsError: top_p: top_p must be in (0, 1]
 * ```
 */
export function generateRequest(input: GenerateRequest): GenerateRequest {
  if (validated.has(input)) return input;
  const parsed = parseOptions(requestSchema(), input, 'generation request');
  if (parsed.prompt !== undefined ? parsed.prompt.length === 0 : parsed.messages!.every((m) => m.content.length === 0)) {
    throw new EmptyPromptError(
      parsed.prompt !== undefined ? 'the prompt is empty' : parsed.messages!.length === 0 ? 'there are no messages' : 'every message is empty',
    );
  }
  // `Object.assign({}, …)`, not a spread: each frozen spread result would get a hidden class of its own (docs/internals/ai-figures.md).
  const request = Object.freeze(
    Object.assign(
      {},
      parsed,
      parsed.messages && { messages: Object.freeze(parsed.messages.map((m) => Object.freeze(Object.assign({}, m)))) },
      parsed.stop && { stop: Object.freeze([...parsed.stop]) },
      parsed.passthrough && { passthrough: Object.freeze(Object.assign({}, parsed.passthrough)) },
    ),
  ) as GenerateRequest;
  validated.add(request);
  return request;
}

/**
 * The text a completion model continues: the prompt, or the chat's contents, one per
 * line (models without a chat template have nothing better to go on).
 *
 * ## Example
 * ```ts
 * promptText({ messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hi' }] }); // 'Be brief.\nHi'
 * ```
 */
export function promptText(request: GenerateRequest): string {
  return request.prompt ?? request.messages!.map((m) => m.content).join('\n');
}

/** What a request asks: the prompt, or the last user message (else the last message) of a chat. */
export function questionOf(request: GenerateRequest): string {
  if (request.prompt !== undefined) return request.prompt;
  const messages = request.messages;
  const user = [...messages].reverse().find((m) => m.role === 'user' && m.content.length > 0) ?? [...messages].reverse().find((m) => m.content.length > 0);
  if (user === undefined) throw new EmptyPromptError('there is no message to answer');
  return user.content;
}

/**
 * A worker's generation as a `NamedWorker` of `StreamWork`, the shape `retrying`,
 * `fallback` and `route` take: the element's context (signal, trace) is passed through.
 *
 * ## Example
 * ```ts
 * const answer = stage(fallback([generation(local), generation(remote)]), { name: 'infer' });
 * ```
 */
export function generation(worker: ModelWorker<never, unknown>): NamedWorker<GenerateRequest, Token> & { readonly work: StreamWork<GenerateRequest, Token> } {
  return { name: worker.name, work: (request, context) => worker.generate(request, context) };
}

/**
 * Gathers a token Flow into one `Completion` (how language-model workers implement `infer`).
 *
 * ## Example
 * ```ts
 * const { text, finishReason } = await complete((onDone) => worker.generate(request, { signal, onDone }));
 * ```
 */
export function complete(start: (onDone: (done: GenerationDone) => void) => Flow<Token>): Promise<Completion> {
  return new Promise<Completion>((resolve, reject) => {
    let text = '';
    let done: GenerationDone | undefined;
    start((d) => (done = d)).subscribe({
      next: (token) => (text += token.text),
      error: reject,
      complete: () => resolve({ text, finishReason: done?.finishReason ?? 'stop', usage: done?.usage ?? { inputTokens: 0, outputTokens: 0 } }),
    });
  });
}

/** What one step of a backend gives: a piece of text (usually one token), or the end. */
export type DecodeStep =
  | {
      readonly text: string;
      readonly logprob?: number;
      /** Model tokens this piece stands for; default 1. */
      readonly tokens?: number;
      /** Beside the text (see `Token.delta`). */
      readonly delta?: Readonly<Record<string, unknown>>;
    }
  | { readonly end: EndReason; readonly usage?: Partial<Usage> };

/** One generation as a backend runs it, stepped by `decode`. */
export interface Decoding {
  /** Prompt tokens, for usage (read when the generation ends). */
  readonly inputTokens: number;
  /** The next step. Called only when the consumer wants a token, never while a step is running. */
  step(signal: AbortSignal): Promise<DecodeStep>;
  /** Releases what the generation holds (a connection, cache tensors); called once, however it ends. */
  close(): void;
}

/** What `decode` needs to know about the worker: its name and its token limit. */
export interface DecodeConfig {
  /** The worker's name: the default stage for trace notes. */
  readonly name: string;
  /** Model tokens after which the generation ends with `length`; undefined when the backend enforces it. */
  readonly maxTokens: number | undefined;
}

/**
 * Turns a backend's step function into a `Flow<Token>` with demand: a step runs only
 * when the consumer wants a token and no step is running. Stop sequences are applied
 * here (text that may begin one is held back until it is known not to), as are
 * `max_tokens`, abort, and the trace notes.
 *
 * ## Example
 * ```ts
 * generate(request, options) { return decode(generateRequest(request), options, { name: this.name, maxTokens: 256 }, () => this.open(request)); }
 * ```
 */
export function decode(request: GenerateRequest, options: GenerateOptions, config: DecodeConfig, open: () => Decoding): Flow<Token> {
  return new Flow<Token>((outlet) => new DecodeProducer(outlet, request, options, config, open));
}

/** A model's generations as an inspector counts them: one node per model name. */
class ModelCounts {
  readonly stats = new StageStats();
  started = 0;
  /** Tokens sent, all generations: what the inspector's rate reads while one streams. */
  emitted = 0;
  completed = 0;
  aborted = 0;
  failed = 0;
  running = 0;
}
const modelCounts = new Map<string, ModelCounts>();

function countsOf(name: string): ModelCounts {
  let counts = modelCounts.get(name);
  if (counts === undefined) modelCounts.set(name, (counts = new ModelCounts()));
  return counts;
}

class DecodeProducer implements Producer, InspectedRun {
  private decoding: Decoding | undefined;
  private readonly controller = new AbortController();
  private readonly stops: StopMatcher | undefined;
  private stepping = false;
  private ended = false;
  /** Set when the backend is done; what is left is emitting `tail` and completing. */
  private finishReason: EndReason | undefined;
  private tail = '';
  private emitted = 0;
  private outputTokens = 0;
  private reportedUsage: Partial<Usage> | undefined;
  private startedAt = 0;
  private firstTokenAt: number | undefined;
  private unlink: (() => void) | undefined;
  private failed = false;
  /** Counted as started (so its end is counted once, and only then). */
  private counted = false;
  /** Its model's counts, shared by every generation of that model. */
  private readonly counts: ModelCounts;

  constructor(
    private readonly outlet: Outlet<Token>,
    request: GenerateRequest,
    private readonly options: GenerateOptions,
    private readonly config: DecodeConfig,
    private readonly open: () => Decoding,
  ) {
    this.stops = request.stop && request.stop.length > 0 ? new StopMatcher(request.stop) : undefined;
    this.counts = countsOf(config.name);
  }

  // ---- inspection: a node per model, its elements generations ----

  get stats(): StageStats {
    return countsOf(this.config.name).stats;
  }

  describe(): RunDescription {
    return { name: this.config.name, kind: 'model', capacity: 0, concurrency: 1, policy: 'pause' };
  }

  /** Generations started, ended with a finish reason, cancelled (shed `cancelled`), failed, running. */
  counters(): RunCounters {
    const counts = countsOf(this.config.name);
    return {
      received: counts.started,
      delivered: counts.completed,
      emitted: counts.emitted,
      shed: { cancelled: counts.aborted },
      failed: counts.failed,
      buffered: 0,
      inFlight: counts.running,
    };
  }

  demandNow(): number {
    return this.outlet.demand();
  }

  ownLink(): undefined {
    return undefined;
  }

  start(): void {
    this.startedAt = performance.now();
    const counts = countsOf(this.config.name);
    counts.started++;
    counts.running++;
    this.counted = true;
    const signal = this.options.signal;
    if (signal === undefined) return;
    if (signal.aborted) return this.abort(signal.reason);
    const onAbort = () => this.abort(signal.reason);
    signal.addEventListener('abort', onAbort, { once: true });
    this.unlink = () => signal.removeEventListener('abort', onAbort);
  }

  pull(): void {
    if (this.ended || this.stepping) return;
    if (this.finishReason !== undefined) return this.drain();
    if (!this.outlet.wants()) return;
    let decoding: Decoding;
    try {
      decoding = this.decoding ??= this.open();
    } catch (err) {
      return this.fail(err);
    }
    this.stepping = true;
    let step: Promise<DecodeStep>;
    try {
      step = decoding.step(this.controller.signal);
    } catch (err) {
      this.stepping = false;
      return this.fail(err);
    }
    step.then(
      (result) => this.onStep(result),
      (err: unknown) => {
        this.stepping = false;
        this.fail(err);
      },
    );
  }

  private onStep(step: DecodeStep): void {
    this.stepping = false;
    if (this.ended) return;
    // A step that finished after an abort is dropped: abort means no more output.
    if (this.controller.signal.aborted) return;
    if ('end' in step) {
      this.reportedUsage = step.usage;
      return this.finish(step.end);
    }
    this.outputTokens += step.tokens ?? 1;
    let text = step.text;
    let stopped = false;
    if (this.stops !== undefined) ({ text, stopped } = this.stops.push(text));
    if (text.length > 0 || step.delta !== undefined) {
      this.emit(text, step.logprob, step.delta);
      if (this.ended) return; // the consumer left during the emit
    }
    if (stopped) return this.finish('stop');
    if (this.config.maxTokens !== undefined && this.outputTokens >= this.config.maxTokens) return this.finish('length');
    this.pull();
  }

  private emit(text: string, logprob: number | undefined, delta?: Readonly<Record<string, unknown>>): void {
    if (this.firstTokenAt === undefined) this.firstTokenAt = performance.now();
    const token: Token =
      logprob === undefined && delta === undefined
        ? { text, index: this.emitted }
        : { text, index: this.emitted, ...(logprob !== undefined && { logprob }), ...(delta !== undefined && { delta }) };
    this.emitted++;
    this.counts.emitted++;
    this.outlet.next(token);
  }

  private finish(reason: EndReason): void {
    this.finishReason = reason;
    // Text held back for a stop sequence that never completed is real output (after a match nothing is held);
    // held text can also end in a stop sequence that a longer candidate beginning earlier kept undecided.
    this.tail = this.stops?.flush() ?? '';
    if (this.stops?.matched) this.finishReason = 'stop';
    this.drain();
  }

  private drain(): void {
    if (this.tail.length > 0) {
      if (!this.outlet.wants()) return;
      const tail = this.tail;
      this.tail = '';
      this.emit(tail, undefined);
      if (this.ended) return;
    }
    this.end(this.finishReason!);
    this.outlet.complete();
  }

  private abort(reason: unknown): void {
    if (this.ended) return;
    this.controller.abort(reason);
    this.end('abort');
    const why = reason instanceof Error ? reason.message : reason === undefined ? 'the signal was aborted' : String(reason);
    this.outlet.error(new AbortedError(this.options.stage ?? this.config.name, why));
  }

  private fail(err: unknown): void {
    if (this.ended) return;
    // The backend may have failed because of the abort: report the abort, not its echo.
    if (this.options.signal?.aborted) return this.abort(this.options.signal.reason);
    this.failed = true;
    this.end('abort');
    // Listed among the inspector's recent failures with its code, as a stage's failed element is.
    activeIntrospector()?.elementFailed?.(this, this.options.trace?.seq ?? 0, err);
    this.outlet.error(err);
  }

  cancel(): void {
    if (this.ended) return;
    this.controller.abort(new AbortedError(this.options.stage ?? this.config.name, 'the consumer unsubscribed'));
    this.end('abort');
  }

  /** Releases the backend and reports, exactly once. */
  private end(reason: FinishReason): void {
    if (this.ended) return;
    this.ended = true;
    if (this.counted) {
      const counts = countsOf(this.config.name);
      counts.running--;
      if (this.failed) counts.failed++;
      else if (reason === 'abort') counts.aborted++;
      else counts.completed++;
    }
    this.unlink?.();
    if (reason === 'abort' && !this.controller.signal.aborted) this.controller.abort();
    const decoding = this.decoding;
    this.decoding = undefined;
    const inputTokens = decoding?.inputTokens ?? 0;
    try {
      decoding?.close();
    } catch {
      // releasing is best effort; the generation's outcome stands
    }
    this.report(reason, inputTokens);
  }

  private report(finishReason: FinishReason, inputTokens: number): void {
    const now = performance.now();
    const usage: Usage = {
      inputTokens: this.reportedUsage?.inputTokens ?? inputTokens,
      outputTokens: this.reportedUsage?.outputTokens ?? this.outputTokens,
    };
    const first = this.firstTokenAt;
    const timeToFirstToken = first === undefined ? undefined : first - this.startedAt;
    const tokensPerSecond = first === undefined || usage.outputTokens < 2 || now <= first ? undefined : ((usage.outputTokens - 1) * 1000) / (now - first);
    const trace = this.options.trace;
    if (trace !== undefined) {
      const stage = this.options.stage ?? this.config.name;
      trace.note(stage, 'finish_reason', finishReason);
      trace.note(stage, 'input_tokens', usage.inputTokens);
      trace.note(stage, 'output_tokens', usage.outputTokens);
      if (timeToFirstToken !== undefined) trace.note(stage, 'ttft_ms', round(timeToFirstToken));
      if (tokensPerSecond !== undefined) trace.note(stage, 'tokens_per_s', round(tokensPerSecond));
    }
    this.options.onDone?.({ finishReason, usage, timeToFirstToken, tokensPerSecond });
  }
}

function round(value: number): number {
  return Math.round(value * 1000) / 1000;
}
