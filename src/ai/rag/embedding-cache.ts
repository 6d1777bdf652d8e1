/**
 * A least-recently-used cache of embeddings keyed by text, with counters. A `Map`
 * keeps insertion order, so re-inserting on a hit makes its first key the least
 * recently used: both operations are O(1).
 *
 * Vectors are returned by reference: callers must not mutate them.
 */
export class EmbeddingCache {
  readonly capacity: number;
  hits = 0;
  misses = 0;
  evictions = 0;
  private readonly entries = new Map<string, Float32Array>();

  constructor(capacity: number) {
    if (!Number.isInteger(capacity) || capacity < 1) throw new RangeError(`capacity must be a positive integer, got ${String(capacity)}`);
    this.capacity = capacity;
  }

  get size(): number {
    return this.entries.size;
  }

  /** The cached vector for `text` (now the most recently used), counting a hit or a miss. */
  get(text: string): Float32Array | undefined {
    const vector = this.entries.get(text);
    if (vector === undefined) {
      this.misses++;
      return undefined;
    }
    this.hits++;
    this.entries.delete(text);
    this.entries.set(text, vector);
    return vector;
  }

  set(text: string, vector: Float32Array): void {
    this.entries.delete(text);
    this.entries.set(text, vector);
    if (this.entries.size > this.capacity) {
      this.entries.delete(this.entries.keys().next().value as string);
      this.evictions++;
    }
  }

  has(text: string): boolean {
    return this.entries.has(text);
  }
}
