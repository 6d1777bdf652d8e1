/** The stage's options: one zod schema, the option types, and the fixed-shape config a run reads. */
import type * as z from 'zod';
import { lazySchema, type Holds, type SchemaMatches } from '../../src/core/zod.js';
import type { SchedulerLike } from 'rxjs';
import type { Observable } from 'rxjs';
import type { Flow } from '../../src/flow/demand.js';
import { KillSwitch } from '../../src/flow/kill-switch.js';
import { POLICIES, functionSchema, positiveInt, schedulerSchema, type Policy } from '../../src/flow/options.js';
import { StageStats } from '../../src/flow/stats.js';
import type { Traced } from '../../src/core/trace.js';
import type { ShedEvent, FailureEvent } from '../../src/flow/work.js';

/** The operator a stage is: any source of `I` (plain or traced) in, a Flow of traced outputs out. */
export type StageOperator<I, O> = (source: Observable<I | Traced<I>>) => Flow<Traced<O>>;

/** @internal The one check of a stage's options; `StageOptions` is its input, written out. */
export const stageOptionsSchema = lazySchema((z) =>
  z
    .object({
      /** Names the stage in errors, traces and metrics. Default: the work function's name, else `stage-N`. */
      name: z.string().min(1, { error: 'name must not be empty' }).optional(),
      /** Elements the stage may buffer before work starts. Default 16. */
      capacity: positiveInt('capacity').default(16),
      /** Work running at once (including results waiting for downstream demand). Default 1. */
      concurrency: positiveInt('concurrency').default(1),
      /** What happens when the buffer is full. Default `pause`. */
      policy: z.enum(POLICIES, { error: `policy must be one of ${POLICIES.map((p) => `"${p}"`).join(', ')}` }).default('pause'),
      /** `conflate` policy: merges an arriving element into the newest buffered one. */
      conflate: functionSchema<(pending: unknown, incoming: unknown) => unknown>().optional(),
      /** Emit results in arrival order (default) or as they complete. */
      ordered: z.boolean().default(true),
      /** Per-element deadline in ms: the signal aborts and the element fails with `StageTimeoutError`. */
      timeout: z.number().positive({ error: 'timeout must be > 0 ms' }).optional(),
      /** A failing element ends the stream (`fail`, default) or is reported to `onFailure` and skipped (`skip`). */
      errorPolicy: z.enum(['fail', 'skip']).default('fail'),
      /** After upstream completes, how long buffered and in-flight work may take before it is failed (ms). */
      drainTimeout: z.number().positive({ error: 'drainTimeout must be > 0 ms' }).optional(),
      /** Stops the stage from outside: a shutdown drains it, an abort fails it. */
      killSwitch: z.instanceof(KillSwitch, { error: 'killSwitch must be a KillSwitch' }).optional(),
      /** Timers (timeout, drain deadline) and the clock. Inject `TestScheduler` for virtual time. */
      scheduler: schedulerSchema().optional(),
      /** Fraction of elements whose per-stage timing is recorded, when this stage starts their trace. Default 0. */
      sampleRate: z.number().min(0).max(1).default(0),
      /** How long a link waits for an element a deferring plain operator may have dropped (ms). Default 1000. */
      transitTimeout: z.number().positive().default(1000),
      /** Called for every element shed, with the reason. */
      onShed: functionSchema<(event: ShedEvent<unknown>) => void>().optional(),
      /** Called for every element that failed under `errorPolicy: 'skip'`. */
      onFailure: functionSchema<(event: FailureEvent<unknown>) => void>().optional(),
      /** Counters shared by every subscription of this stage. */
      stats: z.instanceof(StageStats, { error: 'stats must be a StageStats' }).optional(),
    })
    .strict()
    .refine((o) => o.policy !== 'conflate' || o.conflate !== undefined, {
      error: 'policy "conflate" needs a conflate(pending, incoming) reducer',
      path: ['conflate'],
    }),
);

/** @internal */
export type ParsedOptions = z.output<ReturnType<typeof stageOptionsSchema>>;

/**
 * A stage's options. Invalid options throw `InvalidOptionsError` naming each bad field.
 * `I` is the stage's input: it types the callbacks.
 */
export interface StageOptions<I> {
  /** Names the stage in errors, traces and metrics. Default: the work function's name, else `stage-N`. */
  name?: string;
  /** Elements the stage may buffer before work starts. Default 16. */
  capacity?: number;
  /** Work running at once (including results waiting for downstream demand). Default 1. */
  concurrency?: number;
  /** What happens when the buffer is full. Default `pause`. */
  policy?: Policy;
  /** `conflate` policy: merges an arriving element into the newest buffered one. */
  conflate?: (pending: I, incoming: I) => I;
  /** Emit results in arrival order (default) or as they complete. */
  ordered?: boolean;
  /** Per-element deadline in ms: the signal aborts and the element fails with `StageTimeoutError`. */
  timeout?: number;
  /** A failing element ends the stream (`fail`, default) or is reported to `onFailure` and skipped (`skip`). */
  errorPolicy?: 'fail' | 'skip';
  /** After upstream completes, how long buffered and in-flight work may take before it is failed (ms). */
  drainTimeout?: number;
  /** Stops the stage from outside: a shutdown drains it, an abort fails it. */
  killSwitch?: KillSwitch;
  /** Timers (timeout, drain deadline) and the clock. Inject `TestScheduler` for virtual time. */
  scheduler?: SchedulerLike;
  /** Fraction of elements whose per-stage timing is recorded, when this stage starts their trace. Default 0. */
  sampleRate?: number;
  /** How long a link waits for an element a deferring plain operator may have dropped (ms). Default 1000. */
  transitTimeout?: number;
  /** Called for every element shed, with the reason. */
  onShed?: (event: ShedEvent<I>) => void;
  /** Called for every element that failed under `errorPolicy: 'skip'`. */
  onFailure?: (event: FailureEvent<I>) => void;
  /** Counters shared by every subscription of this stage. */
  stats?: StageStats;
}

/** @internal Fails to compile when `StageOptions` and the schema's input part ways. */
export type StageOptionsInStep = Holds<SchemaMatches<StageOptions<unknown>, z.input<ReturnType<typeof stageOptionsSchema>>>>;

/**
 * @internal
 * Options normalised into one fixed shape. zod's outputs differ in shape with the
 * options given, and reading them on the hot path made V8 deoptimise at every
 * `config.x` (figures: docs/internals/stage-hot-path.md).
 */
export class StageConfig {
  readonly name: string;
  readonly capacity: ParsedOptions['capacity'];
  readonly concurrency: ParsedOptions['concurrency'];
  readonly policy: ParsedOptions['policy'];
  /** `pause`: demand is bounded by room. Every other policy takes what comes. */
  readonly pausing: boolean;
  /** Elements a pausing stage holds at most: buffered plus in flight. */
  readonly limit: number;
  readonly conflate: ParsedOptions['conflate'];
  readonly ordered: ParsedOptions['ordered'];
  readonly timeout: ParsedOptions['timeout'];
  readonly errorPolicy: ParsedOptions['errorPolicy'];
  readonly drainTimeout: ParsedOptions['drainTimeout'];
  readonly killSwitch: ParsedOptions['killSwitch'];
  readonly scheduler: ParsedOptions['scheduler'];
  readonly sampleRate: ParsedOptions['sampleRate'];
  readonly transitTimeout: ParsedOptions['transitTimeout'];
  readonly onShed: ParsedOptions['onShed'];
  readonly onFailure: ParsedOptions['onFailure'];
  /** Whether the work can see its context; when it cannot, a plain result is produced without one (no allocation per element). */
  readonly passContext: boolean;
  /** The work is an `async` function: it is called from a call site of its own (see `StageRun.callAsync`). */
  readonly asyncWork: boolean;

  constructor(
    options: ParsedOptions,
    name: string,
    passContext: boolean,
    asyncWork: boolean,
    /** False: every element takes the general path (see `fast-paths.ts`). */
    readonly fastPaths = true,
  ) {
    this.name = name;
    this.passContext = passContext;
    this.asyncWork = asyncWork;
    this.capacity = options.capacity;
    this.concurrency = options.concurrency;
    this.policy = options.policy;
    this.pausing = options.policy === 'pause';
    this.limit = options.capacity + options.concurrency;
    this.conflate = options.conflate;
    this.ordered = options.ordered;
    this.timeout = options.timeout;
    this.errorPolicy = options.errorPolicy;
    this.drainTimeout = options.drainTimeout;
    this.killSwitch = options.killSwitch;
    this.scheduler = options.scheduler;
    this.sampleRate = options.sampleRate;
    this.transitTimeout = options.transitTimeout;
    this.onShed = options.onShed;
    this.onFailure = options.onFailure;
  }
}
