/**
 * A model that runs in worker processes on other machines: `remoteModel(link)` is a
 * `ModelWorker` whose `generate` sends the request through the link and streams the tokens a
 * worker (`serveModel`) sends back, with demand carried across: the worker's model steps only as
 * far as this side's consumer has asked (a slow browser pauses it), and unsubscribing cancels it.
 *
 * If the worker dies, the link delivers the request to another one, which regenerates it with
 * the same seed (every remote request carries one) and skips the tokens already delivered here:
 * the consumer sees each token once. See `remote-protocol.ts`.
 */
import { randomBytes } from 'node:crypto';
import type { Msg, Subscription as NatsSubscription } from '@nats-io/nats-core';
import { AbortedError, SluiceError } from '../core/errors.js';
import { ContextLengthExceededError } from '../ai/inference/errors.js';
import { Flow, type Outlet, type Producer } from '../flow/demand.js';
import { Ring } from '../flow/ring.js';
import {
  type Completion,
  type GenerateOptions,
  type GenerateRequest,
  type GenerationDone,
  type ModelWorker,
  type Token,
  complete,
  generateRequest,
} from '../ai/inference/worker.js';
import { type Link, MAXIMUM_MESSAGES_EXCEEDED, apiCode, definite, refused } from './link.js';
import { type ControlMessage, type RemoteRequest, type WorkerMessage, controlSubject, parseMessage, workerMessageSchema } from './remote-protocol.js';
import { traceHeaders } from './wire.js';
import { parseOptions, positiveInt } from '../flow/options.js';
import { lazySchema } from '../core/zod.js';

/** A remote generation ended without its tokens: the worker reported an error, or none answered in time. */
export class RemoteGenerationError extends SluiceError {
  constructor(
    code: 'REMOTE_FAILED' | 'REMOTE_TIMEOUT' | 'REMOTE_PROTOCOL',
    model: string,
    message: string,
    readonly workerCode?: string,
  ) {
    super(code, `model "${model}": ${message}`, {
      hint: code === 'REMOTE_TIMEOUT' ? 'Start a worker for the link (serveModel), or raise idleTimeout.' : undefined,
    });
  }
}

/** Options of `remoteModel`: its name, the request window and the idle timeout. */
export interface RemoteModelOptions {
  /** The model's name (what clients ask for). Default: the link's name. */
  name?: string;
  /** Tokens asked of the worker beyond what the consumer took, at most (default 32). */
  window?: number;
  /** How long without a word from any worker (ms) before the generation fails `REMOTE_TIMEOUT` (default 60 000). */
  idleTimeout?: number;
}

const remoteModelSchema = lazySchema((z) =>
  z.strictObject({
    name: z.string({ error: 'name must be a string' }).min(1, { error: 'name must not be empty' }).optional(),
    window: positiveInt('window').optional(),
    idleTimeout: positiveInt('idleTimeout').optional(),
  }),
);

const encoder = new TextEncoder();

/** A `ModelWorker` whose generations run on the workers of `link`. Bad options throw `InvalidOptionsError` naming the field. */
export function remoteModel(link: Link<RemoteRequest>, options: RemoteModelOptions = {}): ModelWorker<GenerateRequest, Completion> {
  parseOptions(remoteModelSchema(), options, 'remoteModel options');
  const name = options.name ?? link.config.name;
  const window = options.window ?? 32;
  const idleTimeout = options.idleTimeout ?? 60_000;
  const generate = (request: GenerateRequest, generateOptions: GenerateOptions = {}): Flow<Token> => {
    const valid = generateRequest(request);
    // A seed makes a worker that takes over regenerate the same tokens, so it can skip those delivered.
    const seeded = valid.seed === undefined ? { ...valid, seed: randomBytes(4).readUInt32LE() >>> 1 } : valid;
    return new Flow<Token>((outlet) => new RemoteGeneration(link, name, seeded, generateOptions, outlet, window, idleTimeout));
  };
  return {
    name,
    generate,
    infer: (request, inferOptions = {}) => complete((onDone) => generate(request, { ...inferOptions, onDone })),
  };
}

class RemoteGeneration implements Producer {
  private readonly id = randomBytes(12).toString('hex');
  private readonly reply: string;
  private replies: NatsSubscription | undefined;
  /** Tokens received in order and not yet emitted. */
  private readonly buffer = new Ring<Token>(4);
  /** Index of the next token expected (= tokens received in order). */
  private received = 0;
  /** Credit last sent (cumulative). */
  private granted = 0;
  private heard = false;
  private ending: { finishReason: GenerationDone['finishReason']; usage: GenerationDone['usage'] } | undefined;
  private done = false;
  private timer: ReturnType<typeof setInterval> | undefined;
  private lastHeard = Date.now();
  private readonly startedAt = Date.now();
  private firstTokenAt: number | undefined;
  private readonly onAbort = (): void => this.fail(new AbortedError(undefined, `the generation on "${this.name}" was aborted`));

  constructor(
    private readonly link: Link<RemoteRequest>,
    private readonly name: string,
    private readonly request: GenerateRequest,
    private readonly options: GenerateOptions,
    private readonly outlet: Outlet<Token>,
    private readonly window: number,
    private readonly idleTimeout: number,
  ) {
    this.reply = `sluice.reply.${link.config.name}.${this.id}`;
  }

  start(): void {
    if (this.options.signal?.aborted) return this.onAbort();
    this.options.signal?.addEventListener('abort', this.onAbort, { once: true });
    this.replies = this.link.connection.subscribe(this.reply, { callback: (_error, message) => this.hear(message) });
    // Credit is re-sent on a timer (a lost control message only delays), and silence is noticed.
    this.timer = setInterval(() => this.tick(), this.link.config.creditInterval);
    this.timer.unref();
    this.send();
  }

  /** Publishes the request to the link; a full link (every worker busy, the queue at capacity) is tried again. */
  private send(): void {
    const body: RemoteRequest = { id: this.id, reply: this.reply, request: { ...this.request } };
    this.link.js
      .publish(this.link.subject, JSON.stringify(body), {
        msgID: this.id,
        ...(this.options.trace !== undefined && { headers: traceHeaders(this.options.trace) }),
      })
      .then(
        () => {},
        (error: unknown) => {
          if (this.done) return;
          if (apiCode(error) === MAXIMUM_MESSAGES_EXCEEDED || !definite(error)) setTimeout(() => !this.done && this.send(), this.link.config.creditInterval);
          else this.fail(refused(this.link.config.name, 'the request could not be sent', error));
        },
      );
  }

  private hear(raw: Msg): void {
    if (this.done) return;
    const message = parseMessage(workerMessageSchema(), raw.data);
    if (message === undefined)
      return this.fail(new RemoteGenerationError('REMOTE_PROTOCOL', this.name, 'a worker sent a message that is not of the protocol.'));
    this.lastHeard = Date.now();
    this.take(message, raw);
  }

  private take(message: WorkerMessage, raw: Msg): void {
    switch (message.type) {
      case 'hello':
        // A worker took the request (again, after one died): the answer tells it what was received here, to skip.
        this.heard = true;
        raw.respond(encoder.encode(JSON.stringify({ type: 'credit', granted: this.granted, have: this.received } satisfies ControlMessage)));
        return;
      case 'token':
        if (message.index < this.received) return; // regenerated by a worker that took over: delivered already
        if (message.index > this.received) return this.fail(new RemoteGenerationError('REMOTE_PROTOCOL', this.name, `token ${this.received} never came.`));
        this.received++;
        this.firstTokenAt ??= Date.now();
        this.buffer.push(
          message.logprob === undefined ? { text: message.text, index: message.index } : { text: message.text, index: message.index, logprob: message.logprob },
        );
        return this.pull();
      case 'end':
        this.ending = { finishReason: message.finishReason, usage: { inputTokens: message.usage.inputTokens, outputTokens: message.usage.outputTokens } };
        return this.pull();
      case 'error': {
        const context = message.context;
        if (message.code === 'CONTEXT_LENGTH_EXCEEDED' && context !== undefined)
          return this.fail(new ContextLengthExceededError(this.name, context.contextLength, context.promptTokens, context.completionTokens, context.param));
        return this.fail(new RemoteGenerationError('REMOTE_FAILED', this.name, message.message, message.code));
      }
    }
  }

  pull(): void {
    if (this.done) return;
    while (this.buffer.length > 0 && this.outlet.wants()) this.outlet.next(this.buffer.shift()!);
    if (this.buffer.length === 0 && this.ending !== undefined) return this.finish();
    // `wants()` registers a resume when the answer is no.
    if (this.buffer.length === 0 && this.outlet.wants()) {
      const granted = this.received + Math.min(this.window, this.outlet.demand());
      if (granted > this.granted) {
        this.granted = granted;
        if (this.heard) this.control({ type: 'credit', granted, have: this.received });
      }
    }
  }

  private tick(): void {
    if (this.done) return;
    if (Date.now() - this.lastHeard > this.idleTimeout) {
      this.fail(new RemoteGenerationError('REMOTE_TIMEOUT', this.name, `no worker answered for ${this.idleTimeout} ms.`));
      return;
    }
    if (this.heard) this.control({ type: 'credit', granted: this.granted, have: this.received });
  }

  private control(message: ControlMessage): void {
    if (!this.link.connection.isClosed()) this.link.connection.publish(controlSubject(this.reply), encoder.encode(JSON.stringify(message)));
  }

  private finish(): void {
    const ending = this.ending!;
    const trace = this.options.trace;
    const stage = this.options.stage ?? this.name;
    trace?.note(stage, 'finish_reason', ending.finishReason);
    trace?.note(stage, 'input_tokens', ending.usage.inputTokens);
    trace?.note(stage, 'output_tokens', ending.usage.outputTokens);
    if (this.firstTokenAt !== undefined) trace?.note(stage, 'ttft_ms', this.firstTokenAt - this.startedAt);
    this.options.onDone?.({
      ...ending,
      timeToFirstToken: this.firstTokenAt === undefined ? undefined : this.firstTokenAt - this.startedAt,
      tokensPerSecond: undefined,
    });
    this.end();
    this.outlet.complete();
  }

  private fail(error: unknown): void {
    if (this.done) return;
    if (this.heard) this.control({ type: 'cancel' });
    this.end();
    this.outlet.error(error);
  }

  cancel(): void {
    if (this.done) return;
    this.control({ type: 'cancel' });
    this.end();
  }

  private end(): void {
    this.done = true;
    this.options.signal?.removeEventListener('abort', this.onAbort);
    this.replies?.unsubscribe();
    if (this.timer !== undefined) clearInterval(this.timer);
  }
}
