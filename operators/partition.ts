import type * as z from 'zod';
import type { Observable, Subscriber } from 'rxjs';
import type { Holds, SchemaMatches } from '../src/core/zod.js';
import { functionSchema, positiveInt } from '../src/flow/options.js';
import { StageError } from '../src/core/errors.js';
import { LaneRun, fanOut, type FanOutOperator, type LaneConfig, type LaneFactory, type Pending } from './lanes.js';
import { capacitySchema, fanOutSchema, laneConfig, parseFanOutOptions, type LaneOptions } from './fan-out-options.js';
import type { StageStats } from '../src/flow/stats.js';
import type { Traced } from '../src/core/trace.js';

export interface PartitionOptions<T, R> extends LaneOptions<T> {
  /** Number of lanes. */
  lanes: number;
  /** The affinity key: elements with equal keys always take the same lane, in order. */
  key: (value: T) => string;
  /** Builds lane `index`'s pipeline from its Flow (subscribe the Flow once). */
  lane: LaneFactory<T, R>;
  /** Elements each lane may buffer for its pipeline. Default 16. */
  capacity?: number;
}

const partitionOptionsSchema = fanOutSchema(() => ({
  lanes: positiveInt('lanes'),
  key: functionSchema<(value: unknown) => string>(),
  lane: functionSchema<LaneFactory<unknown, unknown>>(),
  capacity: capacitySchema().default(16),
}));

/** @internal Fails to compile when `PartitionOptions` and the schema's input part ways. */
export type PartitionOptionsInStep = Holds<SchemaMatches<PartitionOptions<unknown, unknown>, z.input<ReturnType<typeof partitionOptionsSchema>>>>;

/**
 * FNV-1a (32-bit) over the UTF-8 bytes of `key`: a fixed function of the key alone,
 * so a key maps to the same lane in every process and every run (session affinity
 * across replicas), unlike anything seeded or based on insertion order.
 *
 * `stableHash('') === 0x811c9dc5`, `stableHash('a') === 0xe40c292c`.
 */
export function stableHash(key: string): number {
  let hash = 0x811c9dc5;
  for (let i = 0; i < key.length; i++) {
    let code = key.charCodeAt(i);
    if (code < 0x80) {
      hash = Math.imul(hash ^ code, 0x01000193);
      continue;
    }
    if (code >= 0xd800 && code <= 0xdbff && i + 1 < key.length) {
      const low = key.charCodeAt(i + 1);
      if (low >= 0xdc00 && low <= 0xdfff) {
        code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
        i++;
      }
    }
    // A lone surrogate is encoded as U+FFFD, as TextEncoder does.
    if (code >= 0xd800 && code <= 0xdfff) code = 0xfffd;
    if (code < 0x800) {
      hash = Math.imul(hash ^ (0xc0 | (code >> 6)), 0x01000193);
    } else if (code < 0x10000) {
      hash = Math.imul(hash ^ (0xe0 | (code >> 12)), 0x01000193);
      hash = Math.imul(hash ^ (0x80 | ((code >> 6) & 0x3f)), 0x01000193);
    } else {
      hash = Math.imul(hash ^ (0xf0 | (code >> 18)), 0x01000193);
      hash = Math.imul(hash ^ (0x80 | ((code >> 12) & 0x3f)), 0x01000193);
      hash = Math.imul(hash ^ (0x80 | ((code >> 6) & 0x3f)), 0x01000193);
    }
    hash = Math.imul(hash ^ (0x80 | (code & 0x3f)), 0x01000193);
  }
  return hash >>> 0;
}

/** The lane `key` takes among `lanes` lanes: `stableHash(key) % lanes`. */
export function laneOf(key: string, lanes: number): number {
  return stableHash(key) % lanes;
}

interface PartitionConfig<T, R> extends LaneConfig<T, R> {
  readonly key: (value: T) => string;
}

/**
 * Splits a stream into `lanes` keyed lanes: each element goes to lane
 * `stableHash(key(value)) % lanes`, so elements with the same key (a session, a
 * user, a tenant) always meet the same lane's pipeline, in order. The lanes' outputs
 * are merged, each paced by the consumer's demand.
 *
 * ```
 * source:        --a1--b1--a2--c1--b2--|      (letter = key)
 * partition({ lanes: 2, key, lane: (flow, i) => flow.pipe(map(tag(i))) })
 * lane 0 gets:   --a1------a2--c1------|
 * lane 1 gets:   ------b1----------b2--|
 * output:        --A1--B1--A2--C1--B2--|
 * ```
 *
 * Each lane buffers up to `capacity` elements for its pipeline. Upstream is paused
 * as soon as the next element's lane is full: the element waits at the head of the
 * line, and elements behind it wait too, even those bound for lanes with room.
 * This head-of-line blocking is inherent to keyed routing with order per key — the
 * next element's key is unknown until it arrives — so size `capacity` for the
 * slowest lane's bursts. Memory is bounded by `lanes × capacity + 1` elements.
 *
 * Lane `i` receives a `Flow<Traced<T>>` and returns any Observable; subscribe the
 * Flow once. A lane whose output completes early (e.g. `take(3)`) sheds what is
 * later routed to it (reason `cancelled`). The output completes when every lane's
 * output has completed (after upstream completes and lanes drain), errors as soon
 * as upstream or any lane errors (tearing down every lane), and unsubscribing it
 * tears down upstream and every lane, shedding what is buffered (`cancelled`).
 *
 * The output is a plain Observable rather than a `Flow`: each lane's output links
 * directly to the consumer, which is what keeps the merge demand-aware.
 *
 * ## Example
 * ```ts
 * // One conversation's turns never overtake each other; conversations run in parallel.
 * requests.pipe(
 *   partition({
 *     lanes: 4,
 *     key: (request: ChatRequest) => request.sessionId,
 *     lane: (flow) => flow.pipe(stage(generate, { name: 'generate' })),
 *   }),
 * );
 * ```
 *
 * Invalid options throw `InvalidOptionsError` naming each bad field.
 *
 * @see balance to route to whichever lane has room; broadcast to copy to every lane.
 */
export function partition<T, R>(options: PartitionOptions<T, R>): FanOutOperator<T, R> {
  const parsed = parseFanOutOptions('partition', partitionOptionsSchema(), options);
  const factories = Array.from({ length: parsed.lanes }, () => parsed.lane as LaneFactory<T, R>);
  const config: PartitionConfig<T, R> = { ...laneConfig('partition', parsed, parsed.capacity, factories), key: parsed.key as (value: T) => string };
  return fanOut(config, parsed.stats, (source, config, stats, subscriber) => new PartitionRun(source, config, stats, subscriber));
}

class PartitionRun<T, R> extends LaneRun<T, R> {
  protected readonly kind = 'partition';
  constructor(
    source: Observable<T | Traced<T>>,
    protected override readonly config: PartitionConfig<T, R>,
    stats: StageStats,
    subscriber: Subscriber<R>,
  ) {
    super(source, config, stats, subscriber);
  }

  /** One more than the fewest free slots of any open lane: that many arrive safely whatever their keys (the last may wait at the head). */
  room(): number {
    if (this.terminated || this.upstreamDone || this.held.length > 0) return 0;
    let free = Infinity;
    for (const lane of this.lanes) if (!lane.closed) free = Math.min(free, this.config.capacity - lane.ring.length);
    return free === Infinity ? 1 : Math.max(0, free) + 1;
  }

  protected route(pending: Pending<T>, asked: boolean): void {
    let index: number;
    try {
      index = laneOf(String(this.config.key(pending.element.value)), this.lanes.length);
    } catch (err) {
      this.stats.failed++;
      this.fail(new StageError(this.config.name, pending.seq, err));
      return;
    }
    const lane = this.lanes[index]!;
    if (this.held.length > 0) {
      // Already blocked: only an element upstream was asked for (a bounded overshoot) may queue behind.
      if (!asked) {
        this.unpausable();
        return;
      }
      this.held.push({ lane, pending });
      this.stats.buffered++;
      return;
    }
    if (lane.closed || lane.ring.length < this.config.capacity) {
      this.enqueue(lane, pending);
      return;
    }
    this.held.push({ lane, pending });
    this.stats.buffered++;
  }

  /** Moves held elements, oldest first, into their lanes as those free up; stops at the first that still does not fit. */
  protected override settle(): boolean {
    let moved = false;
    for (let head = this.held.peek(); head !== undefined; head = this.held.peek()) {
      if (!head.lane.closed && head.lane.ring.length >= this.config.capacity) break;
      this.held.shift();
      this.stats.buffered--;
      this.enqueue(head.lane, head.pending);
      moved = true;
    }
    return moved;
  }
}
