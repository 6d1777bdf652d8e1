import { lazySchema } from '../core/zod.js';
import { asyncScheduler, type SchedulerLike } from 'rxjs';
import { functionSchema, parseOptions, positiveInt, schedulerSchema } from '../flow/options.js';
import { CacheStats } from './stats.js';
import { ENTRY_OVERHEAD, estimateSize } from './size.js';

/** Options of `LruCache`: its bounds in entries and bytes, and the time to live. */
export interface LruCacheOptions<V> {
  /** Upper bound of the estimated bytes held (entries, keys and overhead). Required: a cache is bounded. */
  maxBytes: number;
  /** Also bound the number of entries. Default: bytes only. */
  maxEntries?: number;
  /** Time to live of an entry, in ms from when it was stored. Default: no expiry. */
  ttl?: number;
  /** Bytes a value holds. Default {@link estimateSize}. */
  sizeOf?: (value: V) => number;
  /** The clock for `ttl` (only `now()` is read). Inject a `TestScheduler` for virtual time. */
  scheduler?: SchedulerLike;
  /** Counters and gauges; share one object between caches to add them up. */
  stats?: CacheStats;
}

const lruOptionsSchema = lazySchema((z) =>
  z
    .object({
      maxBytes: positiveInt('maxBytes'),
      maxEntries: positiveInt('maxEntries').optional(),
      ttl: z.number({ error: 'ttl must be a number' }).positive({ error: 'ttl must be > 0 ms' }).optional(),
      sizeOf: functionSchema<(value: unknown) => number>().optional(),
      scheduler: schedulerSchema().optional(),
      stats: z.instanceof(CacheStats, { error: 'stats must be a CacheStats' }).optional(),
    })
    .strict(),
);

interface Entry<V> {
  readonly value: V;
  readonly bytes: number;
  readonly expiresAt: number;
}

/**
 * A least-recently-used cache bounded in bytes, with an optional time to live.
 *
 * Storing makes an entry the most recent, reading a live entry too; when the
 * estimated bytes pass `maxBytes` (or the count passes `maxEntries`) the least
 * recent entries are evicted until both bounds hold again, so `bytes <= maxBytes`
 * always. A value whose entry alone is larger than `maxBytes` is not stored
 * (counted in `stats.rejected`): evicting the whole cache for it would not help.
 * Expired entries are removed when read (`stats.expirations`) or evicted as the
 * least recent ones.
 *
 * An entry costs 96 bytes of overhead + 2 bytes per character of its key +
 * `sizeOf(value)`.
 *
 * ## Example
 * ```ts
 * const answers = new LruCache<string>({ maxBytes: 32 << 20, ttl: 10 * 60_000 });
 * answers.set(cacheKey(request), text);
 * answers.get(cacheKey(request)); // the text, until evicted or ten minutes have passed
 * ```
 */
export class LruCache<V> {
  readonly stats: CacheStats;
  readonly maxBytes: number;
  private readonly maxEntries: number;
  private readonly ttl: number;
  private readonly sizeOf: (value: V) => number;
  private readonly clock: SchedulerLike;
  /** Map iteration order is insertion order: the first entry is the least recently used. */
  private readonly entries = new Map<string, Entry<V>>();
  private held = 0;

  constructor(options: LruCacheOptions<V>) {
    const parsed = parseOptions(lruOptionsSchema(), options, 'LruCache options');
    this.maxBytes = parsed.maxBytes;
    this.maxEntries = parsed.maxEntries ?? Infinity;
    this.ttl = parsed.ttl ?? Infinity;
    this.sizeOf = (parsed.sizeOf as ((value: V) => number) | undefined) ?? estimateSize;
    this.clock = parsed.scheduler ?? asyncScheduler;
    this.stats = parsed.stats ?? new CacheStats();
  }

  /** Estimated bytes held now (never more than `maxBytes`). */
  get bytes(): number {
    return this.held;
  }

  /** Entries held now. */
  get size(): number {
    return this.entries.size;
  }

  /** The live value under `key`, made the most recent; undefined if absent or expired. */
  get(key: string): V | undefined {
    const entry = this.entries.get(key);
    if (entry === undefined) return undefined;
    if (this.clock.now() >= entry.expiresAt) {
      this.remove(key, entry);
      this.stats.expirations++;
      return undefined;
    }
    this.entries.delete(key);
    this.entries.set(key, entry);
    return entry.value;
  }

  /** Whether a live value is under `key`, without touching its recency. */
  has(key: string): boolean {
    const entry = this.entries.get(key);
    return entry !== undefined && this.clock.now() < entry.expiresAt;
  }

  /**
   * Stores `value` as the most recent entry and evicts the least recent ones past
   * the bounds. Returns false, storing nothing, when the entry alone exceeds `maxBytes`.
   */
  set(key: string, value: V): boolean {
    const bytes = ENTRY_OVERHEAD + key.length * 2 + this.sizeOf(value);
    const previous = this.entries.get(key);
    if (previous !== undefined) this.remove(key, previous);
    if (bytes > this.maxBytes) {
      this.stats.rejected++;
      return false;
    }
    this.entries.set(key, { value, bytes, expiresAt: this.ttl === Infinity ? Infinity : this.clock.now() + this.ttl });
    this.held += bytes;
    this.stats.bytes += bytes;
    this.stats.entries++;
    // The new entry is the most recent and fits alone, so this stops before reaching it.
    for (const [oldest, entry] of this.entries) {
      if (this.held <= this.maxBytes && this.entries.size <= this.maxEntries) break;
      this.remove(oldest, entry);
      this.stats.evictions++;
    }
    return true;
  }

  /** Removes `key`; true when it was there. */
  delete(key: string): boolean {
    const entry = this.entries.get(key);
    if (entry === undefined) return false;
    this.remove(key, entry);
    return true;
  }

  /** Removes every entry. */
  clear(): void {
    for (const [key, entry] of this.entries) this.remove(key, entry);
  }

  /** Keys from least to most recently used (expired ones included until removed). */
  keys(): IterableIterator<string> {
    return this.entries.keys();
  }

  private remove(key: string, entry: Entry<V>): void {
    this.entries.delete(key);
    this.held -= entry.bytes;
    this.stats.bytes -= entry.bytes;
    this.stats.entries--;
  }
}
