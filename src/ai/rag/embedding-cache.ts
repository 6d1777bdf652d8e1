/**
 * A least-recently-used cache of embeddings keyed by text, with counters. A `Map`
 * keeps insertion order, so re-inserting on a hit makes its first key the least
 * recently used: both operations are O(1).
 *
 * Vectors are returned by reference: callers must not mutate them.
 */
import { CacheStats } from '../../cache/stats.js';
import { EmbedderOutputError } from './errors.js';

/** A bounded cache of text embeddings, so a repeated passage or question is embedded once. */
export class EmbeddingCache {
  readonly capacity: number;
  /**
   * Its hits, misses, evictions, entries and bytes, as every cache of sluice counts them
   * (export with `SluiceMetrics.registerCache`). Shared with other caches when given one.
   */
  readonly stats: CacheStats;
  private readonly entries = new Map<string, Float32Array>();

  constructor(capacity: number, stats: CacheStats = new CacheStats()) {
    if (!Number.isInteger(capacity) || capacity < 1) throw new RangeError(`capacity must be a positive integer, got ${String(capacity)}`);
    this.capacity = capacity;
    this.stats = stats;
  }

  /** Lookups that found a vector. */
  get hits(): number {
    return this.stats.hits;
  }

  /** Lookups that found none. */
  get misses(): number {
    return this.stats.misses;
  }

  /** Vectors dropped to stay within `capacity`. */
  get evictions(): number {
    return this.stats.evictions;
  }

  /** Vectors held now. */
  get size(): number {
    return this.entries.size;
  }

  /** The cached vector for `text` (now the most recently used), counting a hit or a miss. */
  get(text: string): Float32Array | undefined {
    const vector = this.entries.get(text);
    if (vector === undefined) {
      this.stats.misses++;
      return undefined;
    }
    this.stats.hits++;
    this.entries.delete(text);
    this.entries.set(text, vector);
    return vector;
  }

  /** Stores the vector of `text`. */
  set(text: string, vector: Float32Array): void {
    this.remove(text);
    this.entries.set(text, vector);
    this.stats.entries++;
    this.stats.bytes += sizeOf(text, vector);
    if (this.entries.size > this.capacity) {
      this.remove(this.entries.keys().next().value as string);
      this.stats.evictions++;
    }
  }

  /** True when the vector of `text` is cached. */
  has(text: string): boolean {
    return this.entries.has(text);
  }

  /**
   * The vectors of `texts`, in order, through this cache: the texts it holds are not embedded again,
   * the others go to `embedder` in one call, each text once, and are kept (as copies, so a vector
   * never holds on to the rest of its batch's output). Rejects as `embedder` does, and with
   * `EmbedderOutputError` (naming `stage`) when it returns a vector count other than the texts'.
   *
   * ```ts
   * const sentences = new EmbeddingCache(8192);
   * const vectors = await sentences.embed(['First sentence.', 'Second one.'], embedder, signal);
   * ```
   */
  async embed(
    texts: readonly string[],
    embedder: (texts: string[], signal: AbortSignal) => Promise<Float32Array[]>,
    signal: AbortSignal,
    stage = 'embed',
  ): Promise<Float32Array[]> {
    // Read before waiting: what another caller evicts meanwhile is still this call's.
    const known = new Map<string, Float32Array>();
    const missing = new Set<string>();
    for (const text of texts) {
      if (known.has(text) || missing.has(text)) continue;
      const vector = this.get(text);
      if (vector === undefined) missing.add(text);
      else known.set(text, vector);
    }
    if (missing.size > 0) {
      const asked = [...missing];
      const vectors = await embedder(asked, signal);
      if (!Array.isArray(vectors) || vectors.length !== asked.length)
        throw new EmbedderOutputError(stage, `returned ${Array.isArray(vectors) ? vectors.length : String(vectors)} vectors for ${asked.length} texts`);
      asked.forEach((text, i) => {
        const vector = vectors[i]!.slice();
        known.set(text, vector);
        this.set(text, vector);
      });
    }
    return texts.map((text) => known.get(text)!);
  }

  private remove(text: string): void {
    const vector = this.entries.get(text);
    if (vector === undefined) return;
    this.entries.delete(text);
    this.stats.entries--;
    this.stats.bytes -= sizeOf(text, vector);
  }
}

/** The bytes an entry holds, roughly: its vector and its key's UTF-16 characters. */
function sizeOf(text: string, vector: Float32Array): number {
  return vector.byteLength + text.length * 2;
}
