import { lazySchema } from '../core/zod.js';
import { asyncScheduler, type SchedulerLike, type Subscription } from 'rxjs';
import { Flow, type Outlet, type Producer } from '../flow/demand.js';
import { functionSchema, parseOptions, schedulerSchema } from '../flow/options.js';
import { AbortedError } from '../core/errors.js';
import { AttemptContext, Relay, named, toObservable, type NamedWorker, type StreamWork, type Worker } from './relay.js';
import type { TraceContext } from '../core/trace.js';
import { workerSchema } from './fallback.js';
import { stableHash } from '../../operators/partition.js';
import { fmix32 } from '../core/random.js';
import type { StageContext, Work } from '../flow/work.js';

/** One variant of a `route`: a named worker and its weight. */
export interface RouteVariant<I, O> {
  readonly name: string;
  /** Relative share of traffic (weights need not sum to 1). */
  readonly weight: number;
  readonly worker: Work<I, O>;
}

/** How one run of a worker went, for comparing a shadow with the primary. */
export interface RunReport<O> {
  readonly worker: string;
  readonly outputs: readonly O[];
  /** ms from start to completion or failure. */
  readonly latency: number;
  /** Set when the run failed. */
  readonly error?: unknown;
}

/** What a shadow run produced beside the primary, for comparison. */
export interface ShadowReport<I, O> {
  readonly value: I;
  readonly trace: TraceContext;
  readonly primary: RunReport<O>;
  readonly shadow: RunReport<O>;
}

/** Options of `route`: the variants, how a request picks one, and the shadow traffic. */
export interface RouteOptions<I, O> {
  /** The weighted split. */
  variants: readonly RouteVariant<I, O>[];
  /** Also runs this worker on every input; its outputs are recorded, never returned. */
  shadow?: Worker<I, O>;
  /** Sends `percent` % of inputs to `worker` before the weighted split (noted as `name`, default `canary`). */
  canary?: { worker: Work<I, O>; percent: number; name?: string };
  /** Routes by a hash of this key: the same key always takes the same variant (sticky sessions, reproducible experiments). */
  key?: (value: I) => string;
  /** Numbers in [0, 1) for inputs routed without a key. Default `Math.random`; `seededRandom(seed)` for reproducible splits. */
  random?: () => number;
  /** Called once both the primary and the shadow finished, with both runs' outputs and latencies. */
  onShadow?: (report: ShadowReport<I, O>) => void;
  /** The clock for latencies, and timers of the demand link. Default `asyncScheduler`. */
  scheduler?: SchedulerLike;
}

const routeSchema = lazySchema((z) =>
  z
    .object({
      variants: z
        .array(
          z
            .object({
              name: z.string().min(1, { error: 'name must not be empty' }),
              weight: z.number({ error: 'weight must be a number' }).min(0, { error: 'weight must be ≥ 0' }),
              worker: functionSchema<Work<unknown, unknown>>(),
            })
            .strict(),
        )
        .min(1, { error: 'give at least one variant' })
        .refine((variants) => variants.some((v) => v.weight > 0), { error: 'at least one weight must be > 0' }),
      shadow: workerSchema().optional(),
      canary: z
        .object({
          worker: functionSchema<Work<unknown, unknown>>(),
          percent: z
            .number({ error: 'percent must be a number' })
            .min(0, { error: 'percent must be in [0, 100]' })
            .max(100, { error: 'percent must be in [0, 100]' }),
          name: z.string().min(1, { error: 'name must not be empty' }).optional(),
        })
        .strict()
        .optional(),
      key: functionSchema<(value: unknown) => string>().optional(),
      random: functionSchema<() => number>().default(() => Math.random),
      onShadow: functionSchema<(report: ShadowReport<unknown, unknown>) => void>().optional(),
      scheduler: schedulerSchema().optional(),
    })
    .strict(),
);

/** 2^32: maps a 32-bit hash onto [0, 1). */
const HASH_RANGE = 4294967296;

/** A key's point in [0, 1): uniform over short and similar keys too, so every split keeps its shares. */
function keyPoint(key: string): number {
  return fmix32(stableHash(key)) / HASH_RANGE;
}

/**
 * Routes each input to one model worker: a weighted split across `variants`
 * (deterministic by a hash of `key` when given, else by `random`), a `canary` share
 * taken first, and an optional `shadow` that runs on every input beside the chosen
 * worker. Every decision is noted in the element's trace: `"<stage>.route"` = the
 * variant (or canary) name.
 *
 * ```
 * input:    -a-b-c-d-|
 * route({ variants: [{ name: 'v1', weight: 3, worker: w1 }, { name: 'v2', weight: 1, worker: w2 }], key })
 * output:   -A-B-C-D-|       notes: route = v1, v1, v2, v1 (about 3 : 1 over many keys)
 *
 * primary:  -a-b|
 * shadow:   ---------x|      (slower: never delays the primary)
 * output:   -a-b|            notes: route.latency = 3, later shadow.latency = 10
 * ```
 *
 * The shadow's outputs are never returned and its failures never fail the element;
 * its latency (`"<stage>.shadow.latency"`), outcome (`"<stage>.shadow.outcome"`:
 * `completed` | `failed`) and output count are noted in the trace when it ends, which
 * may be after the element left the stage. `onShadow` gets both runs' outputs and
 * latencies for comparison. The shadow is cancelled with the element (its signal
 * fires when the caller's does, or when the primary's consumer unsubscribes early),
 * not when the primary completes.
 *
 * With a `key`, each input's place in the split is a hash of the key with full avalanche
 * (FNV-1a finished by MurmurHash3's `fmix32`), so keys as short and alike as `u0`…`u199` still
 * split by the weights; the canary share uses a hash of its own (of `"canary:" + key`), so
 * the canary and the split are independent and each is stable per key.
 *
 * ## Example
 * ```ts
 * const generate = route({
 *   variants: [{ name: 'llama-8b', weight: 9, worker: small }, { name: 'llama-70b', weight: 1, worker: large }],
 *   canary: { worker: candidate, percent: 2 },
 *   shadow: { name: 'distilled', work: distilled },
 *   key: (req) => req.sessionId,
 *   onShadow: ({ primary, shadow }) => compare(primary.outputs, shadow.outputs),
 * });
 * prompts.pipe(stage(generate, { name: 'infer' }));
 * ```
 *
 * Invalid options throw `InvalidOptionsError` naming each bad field.
 */
export function route<I, O>(options: RouteOptions<I, O>): StreamWork<I, O> {
  const parsed = parseOptions(routeSchema(), options, 'route options');
  const variants = options.variants;
  const total = variants.reduce((sum, v) => sum + v.weight, 0);
  const canary =
    options.canary === undefined ? undefined : { name: options.canary.name ?? 'canary', work: options.canary.worker, percent: options.canary.percent };
  const shadow =
    options.shadow === undefined ? undefined : typeof options.shadow === 'function' ? { name: 'shadow', work: options.shadow } : named(options.shadow, 0);
  const key = options.key;
  const random = parsed.random;
  const scheduler = parsed.scheduler ?? asyncScheduler;

  const choose = (value: I): NamedWorker<I, O> => {
    const id = key?.(value);
    if (canary !== undefined && canary.percent > 0) {
      const draw = id === undefined ? random() : keyPoint(`canary:${id}`);
      if (draw * 100 < canary.percent) return canary;
    }
    let point = (id === undefined ? random() : keyPoint(id)) * total;
    for (const variant of variants) {
      if (point < variant.weight) return { name: variant.name, work: variant.worker };
      point -= variant.weight;
    }
    // Only reached through floating-point rounding at the top of the range.
    const last = variants.findLast((v) => v.weight > 0)!;
    return { name: last.name, work: last.worker };
  };

  return (value, context) => new Flow<O>((outlet) => new RouteRun(value, context, choose, shadow, options.onShadow, scheduler, outlet));
}

/** Outputs, latency and outcome of one run, collected while it goes. */
class Run<O> {
  /** Kept only when `onShadow` wants them. */
  readonly outputs: O[] = [];
  count = 0;
  latency = -1;
  error: { value: unknown } | undefined;
  constructor(readonly worker: string) {}
  report(): RunReport<O> {
    return { worker: this.worker, outputs: this.outputs, latency: this.latency, ...(this.error ? { error: this.error.value } : {}) };
  }
}

class RouteRun<I, O> implements Producer {
  private relay: Relay<O> | undefined;
  private attempt: AttemptContext | undefined;
  private shadowAttempt: AttemptContext | undefined;
  private shadowSubscription: Subscription | undefined;
  private primaryRun: Run<O> | undefined;
  private shadowRun: Run<O> | undefined;
  private ended = false;

  constructor(
    private readonly value: I,
    private readonly context: StageContext,
    private readonly choose: (value: I) => NamedWorker<I, O>,
    private readonly shadow: NamedWorker<I, O> | undefined,
    private readonly onShadow: ((report: ShadowReport<I, O>) => void) | undefined,
    private readonly scheduler: SchedulerLike,
    private readonly outlet: Outlet<O>,
  ) {}

  start(): void {
    let chosen: NamedWorker<I, O>;
    try {
      chosen = this.choose(this.value);
    } catch (err) {
      this.ended = true;
      this.outlet.error(err);
      return;
    }
    this.context.note('route', chosen.name);
    const startedAt = this.scheduler.now();
    const primary = new Run<O>(chosen.name);
    const collect = this.shadow !== undefined && this.onShadow !== undefined;
    if (this.shadow !== undefined) {
      this.primaryRun = primary;
      // Started first so that a synchronous primary cannot end the element before the shadow began.
      this.startShadow(this.shadow);
    }
    const attempt = (this.attempt = new AttemptContext(this.context));
    const finish = (error?: { value: unknown }): void => {
      this.ended = true;
      attempt.release();
      primary.latency = this.scheduler.now() - startedAt;
      primary.error = error;
      this.context.note('route.latency', primary.latency);
      this.compare();
    };
    this.relay = new Relay<O>(() => this.outlet.wants(), this.scheduler, {
      output: (output) => {
        primary.count++;
        if (collect) primary.outputs.push(output);
        this.outlet.next(output);
      },
      error: (err) => {
        finish({ value: err });
        this.outlet.error(err);
      },
      complete: () => {
        finish();
        this.outlet.complete();
      },
    });
    this.relay.start(() => chosen.work(this.value, attempt));
  }

  pull(): void {
    this.relay?.resume();
  }

  /** The consumer left before the primary ended: nobody wants either answer. After the primary ended, the shadow runs on. */
  cancel(): void {
    if (this.ended) return;
    this.ended = true;
    const reason = new AbortedError(this.context.stage, 'the consumer cancelled');
    this.relay?.close();
    this.attempt?.abort(reason);
    this.shadowSubscription?.unsubscribe();
    this.shadowAttempt?.abort(reason);
  }

  private startShadow(shadow: NamedWorker<I, O>): void {
    const run = (this.shadowRun = new Run<O>(shadow.name));
    const attempt = (this.shadowAttempt = new AttemptContext(this.context));
    const startedAt = this.scheduler.now();
    const collect = this.onShadow !== undefined;
    this.context.note('shadow', shadow.name);
    const finish = (error?: { value: unknown }): void => {
      attempt.release();
      run.latency = this.scheduler.now() - startedAt;
      run.error = error;
      this.context.note('shadow.latency', run.latency);
      this.context.note('shadow.outcome', error ? 'failed' : 'completed');
      this.context.note('shadow.outputs', run.count);
      this.compare();
    };
    try {
      // Not demand-linked: the shadow's outputs are only counted, never held for a consumer.
      this.shadowSubscription = toObservable(shadow.work(this.value, attempt)).subscribe({
        next: (output) => {
          run.count++;
          if (collect) run.outputs.push(output);
        },
        error: (err: unknown) => finish({ value: err }),
        complete: () => finish(),
      });
    } catch (err) {
      finish({ value: err });
    }
  }

  /** Both runs ended: hand them to `onShadow`. */
  private compare(): void {
    const primary = this.primaryRun;
    const shadow = this.shadowRun;
    if (this.onShadow === undefined || primary === undefined || shadow === undefined) return;
    if (primary.latency < 0 || shadow.latency < 0) return;
    this.onShadow({ value: this.value, trace: this.context.trace, primary: primary.report(), shadow: shadow.report() });
  }
}
