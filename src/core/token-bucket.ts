/**
 * Token buckets, one per key, refilled continuously from a clock: a key may spend
 * `burst` at once, then `rate` per second. Buckets are created full on first use and
 * forgotten once full again, so memory follows the active keys, not every key seen.
 */
export class TokenBuckets {
  private readonly buckets = new Map<string, { tokens: number; at: number }>();

  constructor(
    /** Tokens added per second. */
    readonly rate: number,
    /** Tokens a bucket holds at most. */
    readonly burst: number,
    private readonly now: () => number,
  ) {}

  /** Tokens `key` has now. */
  tokens(key: string): number {
    const bucket = this.buckets.get(key);
    if (bucket === undefined) return this.burst;
    const tokens = Math.min(this.burst, bucket.tokens + ((this.now() - bucket.at) * this.rate) / 1000);
    if (tokens >= this.burst) this.buckets.delete(key); // a full bucket is the same as no bucket
    return tokens;
  }

  /** Spends one token of `key`; returns false (spending nothing) when it has less than one. */
  take(key: string): boolean {
    const tokens = this.tokens(key);
    if (tokens < 1) return false;
    this.buckets.set(key, { tokens: tokens - 1, at: this.now() });
    return true;
  }

  /** Drops `key`'s bucket: its owner is gone (a bucket not yet full again would otherwise stay). */
  forget(key: string): void {
    this.buckets.delete(key);
  }

  /** Buckets held now (keys that spent tokens and are not full again). */
  get size(): number {
    return this.buckets.size;
  }

  /** How long (ms, whole) until `key` has `count` tokens. */
  timeUntil(key: string, count: number): number {
    const missing = count - this.tokens(key);
    return missing <= 0 ? 0 : Math.ceil((missing * 1000) / this.rate);
  }
}
