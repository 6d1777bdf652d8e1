/**
 * A byte budget for the KV caches a decoder's generations keep between steps. A generation whose
 * reader wants nothing keeps its cache (its next step is one position, not the whole text); when
 * the caches together pass the budget, the ones idle longest are dropped, and each of those
 * generations recomputes its cache from its tokens (one prefill) at its next step.
 */

/** One generation's hold on the budget. */
export interface CacheHold {
  /** Its cache now weighs `bytes` (after a step); may evict others' to stay within the budget. */
  used(bytes: number): void;
  /** Ends the hold (the generation ended). */
  release(): void;
}

/** Counters of a `CacheBudget`. */
export interface CacheBudgetStats {
  /** Bytes of the caches held now. */
  readonly bytes: number;
  /** Caches dropped to stay within the budget. */
  readonly evictions: number;
}

interface Entry {
  bytes: number;
  evict: () => void;
}

/** The caches of one decoder's generations, least recently stepped first. */
export class CacheBudget {
  /** Insertion order is recency: a stepped entry is moved to the end. */
  private readonly entries = new Map<object, Entry>();
  private total = 0;
  private evictions = 0;

  /** `maxBytes`: what the caches may weigh together. */
  constructor(readonly maxBytes: number) {}

  /** The bytes held now and the caches dropped so far. */
  get stats(): CacheBudgetStats {
    return { bytes: this.total, evictions: this.evictions };
  }

  /** A hold for a new generation; `evict` drops its cache (it recomputes it when it steps again). */
  hold(evict: () => void): CacheHold {
    const key = {};
    const entry: Entry = { bytes: 0, evict };
    this.entries.set(key, entry);
    return {
      used: (bytes) => {
        this.total += bytes - entry.bytes;
        entry.bytes = bytes;
        this.entries.delete(key);
        this.entries.set(key, entry);
        this.fit(key);
      },
      release: () => {
        if (!this.entries.delete(key)) return;
        this.total -= entry.bytes;
      },
    };
  }

  /** Drops the least recently stepped caches, never `keep`'s, until the rest fit. */
  private fit(keep: object): void {
    for (const [key, entry] of this.entries) {
      if (this.total <= this.maxBytes) return;
      if (key === keep || entry.bytes === 0) continue;
      this.total -= entry.bytes;
      entry.bytes = 0;
      this.evictions++;
      entry.evict();
    }
  }
}
