import type * as z from 'zod';
import type { Observable, Subscriber } from 'rxjs';
import type { Holds, SchemaMatches } from '../src/core/zod.js';
import { functionSchema, positiveInt } from '../src/flow/options.js';
import { LaneRun, fanOut, type FanOutOperator, type Lane, type LaneConfig, type LaneFactory, type Pending } from './lanes.js';
import { capacitySchema, fanOutSchema, laneConfig, parseFanOutOptions, type LaneOptions } from './fan-out-options.js';
import type { StageStats } from '../src/flow/stats.js';
import type { Traced } from '../src/core/trace.js';

export interface BalanceOptions<T, R> extends LaneOptions<T> {
  /** Number of worker lanes. */
  workers: number;
  /** Builds worker `index`'s pipeline from its Flow (subscribe the Flow once). */
  worker: LaneFactory<T, R>;
  /**
   * Elements each worker lane may hold beyond what its pipeline has asked for.
   * Default 1: the worker's own stage buffers, and anything routed ahead of demand
   * is committed to that worker however slow it turns out to be.
   */
  capacity?: number;
}

const balanceOptionsSchema = fanOutSchema(() => ({
  workers: positiveInt('workers'),
  worker: functionSchema<LaneFactory<unknown, unknown>>(),
  capacity: capacitySchema().default(1),
}));

/** @internal Fails to compile when `BalanceOptions` and the schema's input part ways. */
export type BalanceOptionsInStep = Holds<SchemaMatches<BalanceOptions<unknown, unknown>, z.input<ReturnType<typeof balanceOptionsSchema>>>>;

/**
 * Spreads a stream over `workers` interchangeable worker lanes: each element goes to
 * a worker that can take it now, so a slow worker receives fewer elements instead of
 * holding the others back. The workers' outputs are merged, each paced by the
 * consumer's demand.
 *
 * ```
 * source:   --a--b--c--d--e--f--|
 * balance({ workers: 2, worker })      worker 1 is three times slower
 * worker 0: --a-----c--d-----f--|
 * worker 1: -----b--------e-----|
 * output:   merged results, in completion order
 * ```
 *
 * Routing, per element: a worker whose pipeline is asking for an element now (its
 * lane is empty and it has demand) first; otherwise the worker with the most free
 * room in its lane; ties go round-robin. Upstream is paused only when every
 * worker's lane is full. No ordering holds across workers; use `partition` when
 * elements with the same key must stay in order. Memory is bounded by
 * `workers × capacity` elements in the lanes.
 *
 * A worker whose output completes early receives nothing more. The output completes
 * when every worker's output has completed, errors as soon as upstream or any worker
 * errors (tearing down every worker), and unsubscribing it tears down upstream and
 * every worker, shedding what is buffered (`cancelled`).
 *
 * ## Example
 * ```ts
 * // Four model replicas; a replica stuck on a long generation gets no new prompts.
 * prompts.pipe(
 *   balance({
 *     workers: 4,
 *     worker: (flow, replica) => flow.pipe(stage((prompt) => clients[replica].generate(prompt), { name: `replica-${replica}` })),
 *   }),
 * );
 * ```
 *
 * Invalid options throw `InvalidOptionsError` naming each bad field.
 *
 * @see partition for key affinity; broadcast to copy every element to every lane.
 */
export function balance<T, R>(options: BalanceOptions<T, R>): FanOutOperator<T, R> {
  const parsed = parseFanOutOptions('balance', balanceOptionsSchema(), options);
  const config = laneConfig(
    'balance',
    parsed,
    parsed.capacity,
    Array.from({ length: parsed.workers }, () => parsed.worker as LaneFactory<T, R>),
  );
  return fanOut(config, parsed.stats, (source, config, stats, subscriber) => new BalanceRun(source, config, stats, subscriber));
}

class BalanceRun<T, R> extends LaneRun<T, R> {
  protected readonly kind = 'balance';
  /** The lane chosen last: ties are broken starting after it. */
  private last = -1;

  constructor(source: Observable<T | Traced<T>>, config: LaneConfig<T, R>, stats: StageStats, subscriber: Subscriber<R>) {
    super(source, config, stats, subscriber);
  }

  /** Free slots over every open lane: any element fits somewhere. */
  room(): number {
    if (this.terminated || this.upstreamDone) return 0;
    let free = 0;
    for (const lane of this.lanes) if (!lane.closed) free += Math.max(0, this.config.capacity - lane.ring.length);
    return free;
  }

  protected route(pending: Pending<T>, asked: boolean): void {
    const lane = this.choose();
    if (lane === undefined) {
      if (!asked) {
        this.unpausable();
        return;
      }
      // A bounded overshoot: upstream was asked, so it goes to the least loaded open lane.
      this.enqueue(this.leastLoaded(), pending);
      return;
    }
    this.last = lane.index;
    this.enqueue(lane, pending);
  }

  /** The open lane with room that should take the next element, if any. */
  private choose(): Lane<T> | undefined {
    const lanes = this.lanes;
    const capacity = this.config.capacity;
    let best: Lane<T> | undefined;
    let bestScore = -1;
    for (let step = 1; step <= lanes.length; step++) {
      const lane = lanes[(this.last + step) % lanes.length]!;
      if (lane.closed) continue;
      const free = capacity - lane.ring.length;
      if (free <= 0) continue;
      // A lane asking right now beats any amount of free room: the element is taken at once.
      const score = lane.ring.length === 0 && lane.wanted() ? capacity + 1 : free;
      if (score > bestScore) {
        best = lane;
        bestScore = score;
      }
    }
    return best;
  }

  private leastLoaded(): Lane<T> {
    let best = this.lanes[0]!;
    for (const lane of this.lanes) if (!lane.closed && (best.closed || lane.ring.length < best.ring.length)) best = lane;
    return best;
  }
}
