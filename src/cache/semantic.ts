import { lazySchema } from '../core/zod.js';
import { asyncScheduler, type SchedulerLike } from 'rxjs';
import { functionSchema, parseOptions, positiveInt, schedulerSchema } from '../flow/options.js';
import { CacheStats } from './stats.js';
import { ENTRY_OVERHEAD, estimateSize } from './size.js';

/** Turns text into a vector. Must honour `signal`: it fires when nobody waits for the answer any more. */
export type Embedder = (text: string, signal: AbortSignal) => Promise<Float32Array>;

/** Options of `SemanticCache`: the embedder, the similarity threshold and the bounds. */
export interface SemanticCacheOptions<V> {
  embed: Embedder;
  /** Cosine similarity (-1..1) from which a cached answer is served. Pick it per embedder: 0.95 is a common start. */
  threshold: number;
  /** Entries kept; the least recently used goes first. Default 1000 (an exact scan of that size costs well under a ms). */
  maxEntries?: number;
  /** Time to live of an entry, in ms. Default: no expiry. */
  ttl?: number;
  /** Bytes a value holds, for `stats.bytes`. Default {@link estimateSize}. */
  sizeOf?: (value: V) => number;
  scheduler?: SchedulerLike;
  stats?: CacheStats;
}

const semanticOptionsSchema = lazySchema((z) =>
  z
    .object({
      embed: functionSchema<Embedder>(),
      threshold: z.number({ error: 'threshold must be a number' }).min(-1, { error: 'threshold must be ≥ -1' }).max(1, { error: 'threshold must be ≤ 1' }),
      maxEntries: positiveInt('maxEntries').default(1000),
      ttl: z.number({ error: 'ttl must be a number' }).positive({ error: 'ttl must be > 0 ms' }).optional(),
      sizeOf: functionSchema<(value: unknown) => number>().optional(),
      scheduler: schedulerSchema().optional(),
      stats: z.instanceof(CacheStats, { error: 'stats must be a CacheStats' }).optional(),
    })
    .strict(),
);

/** What a lookup found: always the query's normalised vector (to store under it later), and a hit when one was close enough. */
export interface SemanticLookup<V> {
  readonly vector: Float32Array;
  readonly hit: { readonly value: V; readonly similarity: number } | undefined;
}

interface Entry<V> {
  readonly vector: Float32Array;
  readonly scope: string;
  readonly value: V;
  readonly bytes: number;
  readonly expiresAt: number;
}

/**
 * Unit-length copy of `vector`, so cosine similarity is a dot product. A zero
 * vector stays zero (similar to nothing).
 *
 * ## Example
 * ```ts
 * normalize(new Float32Array([3, 4])); // Float32Array [0.6, 0.8]
 * ```
 */
export function normalize(vector: Float32Array): Float32Array {
  let sum = 0;
  for (let i = 0; i < vector.length; i++) sum += vector[i]! * vector[i]!;
  const out = new Float32Array(vector.length);
  if (sum === 0) return out;
  const scale = 1 / Math.sqrt(sum);
  for (let i = 0; i < vector.length; i++) out[i] = vector[i]! * scale;
  return out;
}

/**
 * Cosine similarity of two vectors of the same length: 1 for the same direction, 0 for orthogonal,
 * 0 when either is all zeros.
 *
 * ## Example
 * ```ts
 * cosineSimilarity([1, 0], [2, 0]); // 1
 * ```
 */
export function cosineSimilarity(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let dot = 0;
  let na = 0;
  let nb = 0;
  for (let i = 0; i < a.length; i++) {
    dot += a[i]! * b[i]!;
    na += a[i]! * a[i]!;
    nb += b[i]! * b[i]!;
  }
  return dot / Math.sqrt(na * nb || 1);
}

/** The cosine of two unit vectors: the cache normalises every vector once, so its scan needs only this. */
function dotProduct(a: Float32Array, b: Float32Array): number {
  let dot = 0;
  for (let i = 0; i < a.length; i++) dot += a[i]! * b[i]!;
  return dot;
}

/**
 * A cache looked up by meaning: the query is embedded, and the stored answer whose
 * prompt embedding is most similar (cosine, at least `threshold`) is returned with
 * its similarity. The scan is exact and linear — right up to a few thousand
 * entries, which `maxEntries` bounds (least recently used first out).
 *
 * Entries carry a `scope` and match only queries of the same scope: an answer of
 * one model, or of one temperature, must not be served for another however similar
 * the prompt.
 *
 * ## Example
 * ```ts
 * const faq = new SemanticCache<string>({ embed: (text, signal) => embedder.embed(text, { signal }), threshold: 0.93 });
 * const { vector, hit } = await faq.lookup('How do I reset my password?', { signal });
 * if (hit) return hit.value;                       // hit.similarity says how close
 * faq.store(vector, await llm(prompt));
 * ```
 */
export class SemanticCache<V> {
  readonly stats: CacheStats;
  readonly threshold: number;
  private readonly embed: Embedder;
  private readonly maxEntries: number;
  private readonly ttl: number;
  private readonly sizeOf: (value: V) => number;
  private readonly clock: SchedulerLike;
  /** Insertion order is recency order: the first entry is the least recently used. */
  private readonly entries = new Map<number, Entry<V>>();
  private nextId = 0;

  constructor(options: SemanticCacheOptions<V>) {
    const parsed = parseOptions(semanticOptionsSchema(), options, 'SemanticCache options');
    this.embed = parsed.embed;
    this.threshold = parsed.threshold;
    this.maxEntries = parsed.maxEntries;
    this.ttl = parsed.ttl ?? Infinity;
    this.sizeOf = (parsed.sizeOf as ((value: V) => number) | undefined) ?? estimateSize;
    this.clock = parsed.scheduler ?? asyncScheduler;
    this.stats = parsed.stats ?? new CacheStats();
  }

  /** Entries held now. */
  get size(): number {
    return this.entries.size;
  }

  /** Embeds `text` and finds the closest live entry of `scope` at or above the threshold. */
  async lookup(text: string, options: { scope?: string; signal?: AbortSignal } = {}): Promise<SemanticLookup<V>> {
    const vector = normalize(await this.embed(text, options.signal ?? new AbortController().signal));
    return { vector, hit: this.nearest(vector, options.scope ?? '') };
  }

  /** The closest live entry of `scope` to a normalised `vector`, if at or above the threshold; made the most recent. */
  nearest(vector: Float32Array, scope = ''): { value: V; similarity: number } | undefined {
    const now = this.clock.now();
    let best: [number, Entry<V>] | undefined;
    let bestSimilarity = -Infinity;
    for (const [id, entry] of this.entries) {
      if (entry.expiresAt <= now) {
        this.remove(id, entry);
        this.stats.expirations++;
        continue;
      }
      // A vector of another length comes from another embedder: it is comparable to nothing here.
      if (entry.scope !== scope || entry.vector.length !== vector.length) continue;
      const similarity = dotProduct(vector, entry.vector);
      if (similarity > bestSimilarity) {
        bestSimilarity = similarity;
        best = [id, entry];
      }
    }
    if (best === undefined || bestSimilarity < this.threshold) return undefined;
    const [id, entry] = best;
    this.entries.delete(id);
    this.entries.set(id, entry);
    return { value: entry.value, similarity: bestSimilarity };
  }

  /** Stores `value` under a normalised `vector` (from {@link lookup}), evicting the least recently used past `maxEntries`. */
  store(vector: Float32Array, value: V, scope = ''): void {
    const bytes = ENTRY_OVERHEAD + vector.byteLength + scope.length * 2 + this.sizeOf(value);
    this.entries.set(this.nextId++, { vector, scope, value, bytes, expiresAt: this.ttl === Infinity ? Infinity : this.clock.now() + this.ttl });
    this.stats.bytes += bytes;
    this.stats.entries++;
    for (const [id, entry] of this.entries) {
      if (this.entries.size <= this.maxEntries) break;
      this.remove(id, entry);
      this.stats.evictions++;
    }
  }

  /** Removes every entry. */
  clear(): void {
    for (const [id, entry] of this.entries) this.remove(id, entry);
  }

  private remove(id: number, entry: Entry<V>): void {
    this.entries.delete(id);
    this.stats.bytes -= entry.bytes;
    this.stats.entries--;
  }
}
