/**
 * The bridge from one request's token Flow to its socket: the Flow subscribed with
 * explicit demand, granted only while the socket can take more, and every way the
 * request can end (done, error, client cancel, connection loss, drain deadline) reaching
 * the model through its `AbortSignal`. Kept apart from the connection, which multiplexes many.
 */
import { subscribeWithDemand, type DemandSubscription } from '../../flow/demand.js';
import { SluiceError } from '../../core/errors.js';
import type { GenerateRequest, GenerationDone, Token } from '../../ai/inference/worker.js';
import type { RequestTrace } from '../telemetry.js';
import type { DoneFrame, RequestErrorCode, TokenFrame } from '../protocol.js';
import type { Counters } from './events.js';
import type { TokenSocketLimits, TokenWorker } from './options.js';
import { failureWords } from './errors.js';
import { TokenCap } from '../token-limit.js';
import { GenerationContext } from './generation.js';

/** What a stream needs of the connection that carries it. */
export interface StreamHost {
  readonly limits: Pick<TokenSocketLimits, 'conflateLimit' | 'maxTokens'>;
  readonly counters: Counters;
  /** The tenant of the connection's token (`anonymous-<n>` on an open server). */
  readonly tenant: string;
  /** True while a token frame may be sent now. */
  writable(): boolean;
  send(frame: TokenFrame | DoneFrame): void;
  refuse(id: string, code: RequestErrorCode | (string & {}), message: string, retryAfter?: number): void;
  /** The stream ended, however it ended: its id and its tenant's slot are free again. */
  release(stream: Stream): void;
}

/**
 * One request: its token Flow subscribed with explicit demand, and what is owed to the
 * client. `pause` asks for one token at a time while the socket is writable; `conflate`
 * keeps asking while its pending text is under `conflateLimit` and sends the pending
 * text as one frame when the socket is writable again.
 *
 * The stream is its Flow's observer itself (`next`, `error`, `complete`): closures per request
 * lived as long as the request.
 */
export class Stream {
  private subscription: DemandSubscription | undefined;
  private generation: GenerationContext | undefined;
  private seq = 0;
  private pending = '';
  private pendingTokens = 0;
  private outputTokens = 0;
  /** The worker's report, taken from the generation context when the stream ends (`TokenCap` may rewrite it). */
  private report: GenerationDone | undefined;
  private limit: TokenCap | undefined;
  private finished = false;

  constructor(
    private readonly host: StreamHost,
    readonly id: string,
    private readonly policy: 'pause' | 'conflate',
    private readonly telemetry: RequestTrace,
  ) {}

  start(worker: TokenWorker, request: GenerateRequest): void {
    try {
      const generation = (this.generation = new GenerationContext(this.telemetry.trace, worker.name, this.host.tenant));
      const flow = worker.generate(request, generation);
      this.limit = new TokenCap(request.max_tokens ?? this.host.limits.maxTokens);
      this.subscription = subscribeWithDemand<Token>(flow, this);
    } catch (err) {
      return this.error(err);
    }
    this.resume();
  }

  /** Asks for the next token if the policy has room; flushes conflated text when the socket can take it. */
  resume(): void {
    const subscription = this.subscription;
    if (this.finished || subscription === undefined) return;
    if (this.pending.length > 0 && this.host.writable()) this.flush();
    if (subscription.outstanding > 0 || this.finished) return;
    const room = this.policy === 'pause' ? this.host.writable() : this.pending.length < this.host.limits.conflateLimit;
    if (room) subscription.request(1);
  }

  /** A token from the Flow. */
  next(token: Token): void {
    if (this.finished) return;
    // The token after `max_tokens`: unsubscribing cancels the generation, which then reads as finished for `length`.
    if (this.limit!.over()) {
      this.subscription?.cancel();
      return this.complete();
    }
    this.outputTokens++;
    this.telemetry.token(token.text);
    // The protocol carries text: a piece with none (an upstream's tool-call delta) sends no frame.
    if (token.text === '') return this.resume();
    if (this.policy === 'conflate') {
      this.pending += token.text;
      this.pendingTokens++;
    } else {
      this.sendToken(token.text, 1);
    }
    this.resume();
  }

  private flush(): void {
    const text = this.pending;
    const tokens = this.pendingTokens;
    this.pending = '';
    this.pendingTokens = 0;
    this.sendToken(text, tokens);
  }

  private sendToken(text: string, tokens: number): void {
    this.host.send({ type: 'token', id: this.id, seq: this.seq++, text, tokens });
  }

  /** The Flow completed. */
  complete(): void {
    if (this.finished) return;
    // The conflated tail is bounded by `conflateLimit`, so it goes out without waiting for drain.
    if (this.pending.length > 0) this.flush();
    this.report = this.limit?.done(this.generation?.done);
    this.end();
    this.host.counters.completed++;
    this.sendDone(this.report?.finishReason ?? 'stop');
    this.observe(undefined);
  }

  /** The Flow failed (or `generate` threw). */
  error(err: unknown): void {
    if (this.finished) return;
    this.end();
    this.host.counters.failed++;
    const words = failureWords(err, 'GENERATION_FAILED');
    this.host.refuse(this.id, words.code, words.message, words.retryAfter);
    this.observe(err);
  }

  /** The drain deadline passed: the model stops and the client is told why, so nothing ends silently. */
  interrupt(): void {
    if (this.finished) return;
    this.end();
    this.host.counters.interrupted++;
    this.subscription?.cancel();
    const error = new SluiceError('SHUTDOWN', 'Request interrupted: the server shut down.');
    this.generation?.abort(error);
    this.host.refuse(this.id, 'SHUTDOWN', 'the server shut down before this request finished; retry on another instance');
    this.observe(error);
  }

  /** The client's `cancel`: the model stops, and `done` (finish_reason `abort`) confirms it. */
  cancelByClient(): void {
    if (this.finished) return;
    this.abort('the client cancelled the request');
    this.sendDone('abort');
  }

  /** Unsubscribes the pipeline and aborts the model's work; nothing more is sent for this request. */
  abort(reason: string): void {
    if (this.finished) return;
    this.end();
    this.host.counters.cancelled++;
    // Unsubscribe first: the worker then reports `abort` through onDone rather than erroring the Flow.
    this.subscription?.cancel();
    const error = new SluiceError('ABORTED', `Request aborted: ${reason}.`);
    this.generation?.abort(error);
    this.observe(error);
  }

  private observe(error: unknown): void {
    this.report ??= this.generation?.done;
    this.telemetry.end({ responseId: this.id, done: this.report, error });
  }

  private end(): void {
    this.finished = true;
    this.pending = '';
    this.host.release(this);
  }

  private sendDone(finishReason: DoneFrame['finish_reason']): void {
    const usage = this.report?.usage ?? { inputTokens: 0, outputTokens: this.outputTokens };
    this.host.send({
      type: 'done',
      id: this.id,
      finish_reason: finishReason,
      usage: { input_tokens: usage.inputTokens, output_tokens: usage.outputTokens },
      traceparent: this.telemetry.traceparent,
    });
  }
}
