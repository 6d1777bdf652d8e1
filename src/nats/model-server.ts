/**
 * The worker side of remote generation: `serveModel(link, model)` takes requests from the link
 * (shared by every worker process of it), runs each on `model` and streams its tokens back to the
 * requester, stepping the model only as far as the requester's credit allows. A request is
 * acknowledged once its end (or error) was sent; a worker that dies leaves its requests to the
 * link, which delivers them to another worker after `ackWait`. See `remote-protocol.ts`.
 */
import { InvalidOptionsError, SluiceError } from '../core/errors.js';
import { ContextLengthExceededError } from '../ai/inference/errors.js';
import { subscribeWithDemand, type DemandSubscription } from '../flow/demand.js';
import { untraced } from '../flow/sinks.js';
import type { StageContext } from '../flow/work.js';
import { stage } from '../../operators/stage.js';
import { type GenerateRequest, type GenerationDone, type ModelWorker, generateRequest } from '../ai/inference/worker.js';
import type { Link } from './link.js';
import { type ControlMessage, type RemoteRequest, type WorkerMessage, controlMessageSchema, controlSubject, parseMessage } from './remote-protocol.js';
import { LinkReceiverStats, fromLink, linkMessageOf } from './source.js';
import { functionSchema, parseOptions, positiveInt } from '../flow/options.js';
import { lazySchema } from '../core/zod.js';

/** Options of `serveModel`: how many requests run at once, the idle timeout and a report per request. */
export interface ServeModelOptions {
  /** Requests this process generates at once (default 1). */
  concurrency?: number;
  /** How long without a word from the requester (ms) before its generation is dropped (default 30 000); requesters re-send credit every `creditInterval`. */
  idleTimeout?: number;
  /** Counters of the requests taken from the link. */
  stats?: LinkReceiverStats;
  /** Called when a request ends: how, and the tokens sent. */
  onRequest?: (event: {
    readonly id: string;
    readonly outcome: 'end' | 'error' | 'cancelled' | 'gone';
    readonly sent: number;
    readonly attempt: number;
  }) => void;
}

/** A running model server: its stats and how to stop it. */
export interface ModelServer {
  readonly stats: LinkReceiverStats;
  /** Stops taking requests; those in flight are handed back to the link at once (another worker resumes them). */
  stop(): void;
  /** Settles when the server stopped: resolves after `stop()`, rejects if the link failed. */
  readonly done: Promise<void>;
}

const serveModelSchema = lazySchema((z) =>
  z.strictObject({
    concurrency: positiveInt('concurrency').optional(),
    idleTimeout: positiveInt('idleTimeout').optional(),
    stats: z.instanceof(LinkReceiverStats, { error: 'stats must be a LinkReceiverStats' }).optional(),
    onRequest: functionSchema<ServeModelOptions['onRequest']>().optional(),
  }),
);

const encoder = new TextEncoder();

/** Serves `model` to the requesters of `link` (`remoteModel`), `concurrency` requests at a time. Bad options throw `InvalidOptionsError` naming the field. */
export function serveModel(link: Link<RemoteRequest>, model: ModelWorker, options: ServeModelOptions = {}): ModelServer {
  parseOptions(serveModelSchema(), options, 'serveModel options');
  const stats = options.stats ?? new LinkReceiverStats();
  const idleTimeout = options.idleTimeout ?? 30_000;
  let stopped: () => void = () => {};
  let failed: (error: unknown) => void = () => {};
  const done = new Promise<void>((resolve, reject) => {
    stopped = resolve;
    failed = reject;
  });
  const subscription = fromLink(link, { stats })
    .pipe(
      stage((remote: RemoteRequest, context: StageContext) => serveOne(link, model, remote, context, idleTimeout, options.onRequest), {
        name: `serve-${model.name}`,
        concurrency: options.concurrency ?? 1,
        capacity: 1,
      }),
      untraced(),
    )
    .subscribe({ error: (error: unknown) => failed(error), complete: () => stopped() });
  return {
    stats,
    done,
    stop: () => {
      subscription.unsubscribe();
      stopped();
    },
  };
}

/** One request: greets the requester (who answers with its credit), then streams the tokens. */
async function serveOne(
  link: Link<RemoteRequest>,
  model: ModelWorker,
  remote: RemoteRequest,
  context: StageContext,
  idleTimeout: number,
  onRequest: ServeModelOptions['onRequest'],
): Promise<void> {
  const attempt = linkMessageOf(context)?.deliveries ?? 1;
  const report = (outcome: 'end' | 'error' | 'cancelled' | 'gone', sent: number) => onRequest?.({ id: remote.id, outcome, sent, attempt });
  const credit = await greet(link, remote.reply, attempt, context.signal);
  if (credit === undefined) return report('gone', 0);
  let request: GenerateRequest;
  try {
    request = generateRequest(remote.request as unknown as GenerateRequest);
  } catch (error) {
    send(link, remote.reply, {
      type: 'error',
      code: error instanceof InvalidOptionsError ? error.code : 'INVALID_REQUEST',
      message: String((error as Error).message),
    });
    return report('error', 0);
  }
  const outcome = await new Promise<{ outcome: 'end' | 'error' | 'cancelled' | 'gone'; sent: number }>((resolve) =>
    new Streaming(link, model, remote.reply, request, credit, context.signal, idleTimeout, resolve).start(),
  );
  report(outcome.outcome, outcome.sent);
}

/** Asks the requester for its credit (a request: no responders means it is gone). Undefined: gone, or aborted. */
async function greet(link: Link<RemoteRequest>, reply: string, attempt: number, signal: AbortSignal): Promise<{ granted: number; have: number } | undefined> {
  const hello = encoder.encode(JSON.stringify({ type: 'hello', attempt } satisfies WorkerMessage));
  for (let tries = 0; tries < 5 && !signal.aborted; tries++) {
    try {
      const answer = await link.connection.request(reply, hello, { timeout: Math.max(1_000, 4 * link.config.creditInterval) });
      const credit = parseMessage(controlMessageSchema(), answer.data);
      return credit?.type === 'credit' ? credit : undefined;
    } catch (error) {
      if ((error as { name?: string }).name === 'NoRespondersError' || /no responders/i.test(String(error))) return undefined;
      // a timeout: the requester may be reconnecting; ask again
    }
  }
  return undefined;
}

function send(link: Link<RemoteRequest>, reply: string, message: WorkerMessage): void {
  if (!link.connection.isClosed()) link.connection.publish(reply, encoder.encode(JSON.stringify(message)));
}

type Outcome = { outcome: 'end' | 'error' | 'cancelled' | 'gone'; sent: number };

/** The tokens of one request, stepped as the requester's credit allows. */
class Streaming {
  private readonly controller = new AbortController();
  private subscription: DemandSubscription | undefined;
  private control: ReturnType<Link<RemoteRequest>['connection']['subscribe']> | undefined;
  private timer: ReturnType<typeof setInterval> | undefined;
  private granted: number;
  /** Tokens the requester has: regenerated ones below it are not sent again. */
  private readonly have: number;
  /** Tokens the model produced (sent or skipped). */
  private produced = 0;
  private sent = 0;
  private lastHeard = Date.now();
  private finished = false;
  private generation: GenerationDone | undefined;
  private readonly onAbort = (): void => this.finish('cancelled');

  constructor(
    private readonly link: Link<RemoteRequest>,
    private readonly model: ModelWorker,
    private readonly reply: string,
    private readonly request: GenerateRequest,
    credit: { granted: number; have: number },
    private readonly signal: AbortSignal,
    private readonly idleTimeout: number,
    private readonly resolve: (outcome: Outcome) => void,
  ) {
    this.granted = credit.granted;
    this.have = credit.have;
  }

  start(): void {
    if (this.signal.aborted) return this.finish('cancelled');
    this.signal.addEventListener('abort', this.onAbort, { once: true });
    this.control = this.link.connection.subscribe(controlSubject(this.reply), {
      callback: (_error, message) => this.hear(parseMessage(controlMessageSchema(), message.data)),
    });
    this.timer = setInterval(() => {
      if (Date.now() - this.lastHeard > this.idleTimeout) this.finish('gone');
    }, this.link.config.creditInterval);
    this.timer.unref();
    const tokens = this.model.generate(this.request, { signal: this.controller.signal, onDone: (done) => (this.generation = done) });
    this.subscription = subscribeWithDemand(tokens, {
      next: (token) => {
        this.produced++;
        if (token.index >= this.have) {
          this.sent++;
          send(
            this.link,
            this.reply,
            token.logprob === undefined
              ? { type: 'token', index: token.index, text: token.text }
              : { type: 'token', index: token.index, text: token.text, logprob: token.logprob },
          );
        }
        this.pump();
      },
      error: (error: unknown) => {
        send(this.link, this.reply, {
          type: 'error',
          code: error instanceof SluiceError ? error.code : 'GENERATION_FAILED',
          message: String((error as Error)?.message ?? error),
          ...(error instanceof ContextLengthExceededError && { context: contextOf(error) }),
        });
        this.finish('error');
      },
      complete: () => {
        const done = this.generation;
        const usage = { inputTokens: done?.usage.inputTokens ?? 0, outputTokens: done?.usage.outputTokens ?? this.produced };
        send(this.link, this.reply, { type: 'end', finishReason: done?.finishReason ?? 'stop', usage });
        this.finish('end');
      },
    });
    this.pump();
  }

  private hear(message: ControlMessage | undefined): void {
    if (message === undefined || this.finished) return; // not of the protocol: ignored, the requester re-sends
    this.lastHeard = Date.now();
    if (message.type === 'cancel') return this.finish('cancelled');
    if (message.granted > this.granted) {
      this.granted = message.granted;
      this.pump();
    }
  }

  /** Asks the model for the tokens the credit allows (those below `have` are regenerated to be skipped, within it). */
  private pump(): void {
    const subscription = this.subscription;
    if (subscription === undefined || this.finished) return;
    const wanted = this.granted - this.produced - subscription.outstanding;
    if (wanted > 0) subscription.request(wanted);
  }

  private finish(outcome: Outcome['outcome']): void {
    if (this.finished) return;
    this.finished = true;
    this.signal.removeEventListener('abort', this.onAbort);
    this.control?.unsubscribe();
    if (this.timer !== undefined) clearInterval(this.timer);
    if (outcome === 'cancelled' || outcome === 'gone') this.controller.abort();
    this.subscription?.cancel();
    this.resolve({ outcome, sent: this.sent });
  }
}

/** A context error's figures, as the protocol carries them. */
function contextOf(error: ContextLengthExceededError): NonNullable<Extract<WorkerMessage, { type: 'error' }>['context']> {
  return {
    contextLength: error.contextLength,
    promptTokens: error.promptTokens,
    ...(error.completionTokens !== undefined && { completionTokens: error.completionTokens }),
    param: error.param,
  };
}
