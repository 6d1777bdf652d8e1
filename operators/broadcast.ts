import { lazySchema } from '../src/core/zod.js';
import type { Observable, Subscriber } from 'rxjs';
import { functionSchema } from '../src/flow/options.js';
import { LaneRun, fanOut, type FanOutOperator, type LaneConfig, type LaneFactory, type Pending } from './lanes.js';
import { capacitySchema, fanOutSchema, laneConfig, parseFanOutOptions, type LaneOptions } from './fan-out-options.js';
import type { StageStats } from '../src/flow/stats.js';
import type { Traced } from '../src/core/trace.js';

interface BroadcastCommon<T> extends LaneOptions<T> {
  /**
   * How many elements a branch may fall behind the fastest branch. Beyond it, the
   * branch's oldest buffered element is shed (reason `lagging`) instead of holding
   * the others back. Must be below `capacity`. Default: no limit (paced by the slowest).
   */
  maxLag?: number;
  /** Elements each branch may buffer. Default 16, or `maxLag + 1` when that is larger. */
  capacity?: number;
}

/** Branches given one by one: the output's type is the union of theirs (annotate `R` when they differ). */
export interface BroadcastBranchesOptions<T, R> extends BroadcastCommon<T> {
  branches: readonly LaneFactory<T, R>[];
  branch?: never;
}

/** `branches` copies of one pipeline, told apart by their index. */
export interface BroadcastCountOptions<T, R> extends BroadcastCommon<T> {
  branches: number;
  branch: LaneFactory<T, R>;
}

/** Options of `broadcast`: either one function per branch, or a branch count with one factory. */
export type BroadcastOptions<T, R> = BroadcastBranchesOptions<T, R> | BroadcastCountOptions<T, R>;

const branchesSchema = lazySchema((z) =>
  z.custom<readonly LaneFactory<unknown, unknown>[] | number>(
    (v) => (Array.isArray(v) && v.length > 0 && v.every((f) => typeof f === 'function')) || (typeof v === 'number' && Number.isInteger(v) && v >= 1),
    { error: 'branches must be a non-empty array of functions, or a count ≥ 1 together with `branch`' },
  ),
);

const broadcastFields = fanOutSchema((z) => ({
  branches: branchesSchema(),
  branch: functionSchema<LaneFactory<unknown, unknown>>().optional(),
  maxLag: z.number({ error: 'maxLag must be a number' }).int({ error: 'maxLag must be an integer' }).min(0, { error: 'maxLag must be ≥ 0' }).optional(),
  capacity: capacitySchema().optional(),
}));

const broadcastOptionsSchema = lazySchema(() =>
  broadcastFields().check((ctx) => {
    const o = ctx.value;
    if (typeof o.branches === 'number' && o.branch === undefined) {
      ctx.issues.push({ code: 'custom', input: o.branch, path: ['branch'], message: 'branch is required when branches is a count' });
    }
    if (Array.isArray(o.branches) && o.branch !== undefined) {
      ctx.issues.push({ code: 'custom', input: o.branch, path: ['branch'], message: 'branch is only used when branches is a count' });
    }
    if (o.maxLag !== undefined && o.capacity !== undefined && o.maxLag >= o.capacity) {
      ctx.issues.push({
        code: 'custom',
        input: o.maxLag,
        path: ['maxLag'],
        message: `maxLag must be < capacity (${o.capacity}): a branch's lag is held in its buffer`,
      });
    }
  }),
);

interface BroadcastConfig<T, R> extends LaneConfig<T, R> {
  readonly maxLag: number | undefined;
}

/**
 * Copies every element to every branch and merges the branches' outputs, each paced
 * by the consumer's demand.
 *
 * ```
 * source:   --a-----b-----c--|
 * broadcast({ branches: [toUpper, toLength] })
 * branch 0: --A-----B-----C--|
 * branch 1: --1-----1-----1--|
 * output:   --(A1)--(B1)--(C1)|
 * ```
 *
 * Without `maxLag`, upstream is asked for an element only when every branch has
 * room for it: the slowest branch sets the pace, and each branch buffers at most
 * `capacity` elements. With `maxLag`, a branch may fall at most `maxLag` elements
 * behind the fastest branch (counted by what each still has to take); when the
 * fastest takes an element that would stretch the gap further, the lagging branch's
 * oldest buffered element is shed for it (reason `lagging`, counted in
 * `stats.shed.lagging` and reported to `onShed` with the branch's index). A slow
 * audit or logging branch then sees a thinned stream instead of slowing the answer.
 *
 * Every branch receives the same `Traced<T>` envelope (value by reference, one trace).
 * Stats count one copy per branch: `received = delivered + shed + failed` over copies.
 * A branch whose output completes early gets nothing more (its copies are shed,
 * `cancelled`). The output completes when every branch's output has completed,
 * errors as soon as upstream or any branch errors (tearing down every branch), and
 * unsubscribing it tears down upstream and every branch.
 *
 * ## Example
 * ```ts
 * // Answer the user; keep a best-effort copy for the evaluator, which may lag by 100.
 * completions.pipe(
 *   broadcast<Completion, Answer | Score>({
 *     branches: [(flow) => flow.pipe(stage(render)), (flow) => flow.pipe(stage(evaluate), ignoreElements())],
 *     maxLag: 100,
 *   }),
 * );
 * ```
 *
 * Invalid options throw `InvalidOptionsError` naming each bad field.
 *
 * @see balance to send each element to one lane; partition for key affinity.
 */
export function broadcast<T, R>(options: BroadcastOptions<T, R>): FanOutOperator<T, R> {
  const parsed = parseFanOutOptions('broadcast', broadcastOptionsSchema(), options);
  const branches = parsed.branches;
  const factories = (typeof branches === 'number' ? Array.from({ length: branches }, () => parsed.branch!) : [...branches]) as LaneFactory<T, R>[];
  const capacity = parsed.capacity ?? Math.max(16, (parsed.maxLag ?? 0) + 1);
  const config: BroadcastConfig<T, R> = { ...laneConfig('broadcast', parsed, capacity, factories), maxLag: parsed.maxLag };
  return fanOut(config, parsed.stats, (source, config, stats, subscriber) => new BroadcastRun(source, config, stats, subscriber));
}

class BroadcastRun<T, R> extends LaneRun<T, R> {
  protected readonly kind = 'broadcast';
  constructor(
    source: Observable<T | Traced<T>>,
    protected override readonly config: BroadcastConfig<T, R>,
    stats: StageStats,
    subscriber: Subscriber<R>,
  ) {
    super(source, config, stats, subscriber);
    this.copies = this.lanes.length;
  }

  /** Room in the fullest open branch: every branch must take each element. */
  room(): number {
    if (this.terminated || this.upstreamDone) return 0;
    let fullest = 0;
    for (const lane of this.lanes) if (!lane.closed) fullest = Math.max(fullest, lane.ring.length);
    return Math.max(0, this.config.capacity - fullest);
  }

  protected route(pending: Pending<T>, asked: boolean): void {
    if (!asked && this.room() === 0) {
      this.unpausable();
      return;
    }
    // Past the bound only when upstream was asked (a bounded overshoot); the ring grows for it.
    for (const lane of this.lanes) this.enqueue(lane, pending);
  }

  /** Restores the lag bound after branches took elements: no branch holds more than `maxLag` beyond the fastest. */
  protected override settle(): boolean {
    const maxLag = this.config.maxLag;
    if (maxLag === undefined) return false;
    let fastest = Infinity;
    for (const lane of this.lanes) if (!lane.closed) fastest = Math.min(fastest, lane.ring.length);
    let shed = false;
    for (const lane of this.lanes) {
      while (!lane.closed && lane.ring.length - fastest > maxLag) {
        this.shedOldest(lane, 'lagging');
        shed = true;
      }
    }
    return shed;
  }
}
