/** Tokens a bucket holds at `now`, having held `tokens` at `at`. */
function refill(tokens: number, at: number, now: number, rate: number, burst: number): number {
  return Math.min(burst, tokens + ((now - at) * rate) / 1000);
}

/**
 * One token bucket, kept by its owner (a connection's frame rate): it lives as long as the owner and
 * a take changes it in place, where a bucket in a shared map was made again each time it had filled up.
 */
export class TokenBucket {
  private tokens: number;
  private at: number;

  constructor(
    /** Tokens added per second. */
    readonly rate: number,
    /** Tokens the bucket holds at most (it starts full). */
    readonly burst: number,
    private readonly now: () => number,
  ) {
    this.tokens = burst;
    this.at = now();
  }

  /** Spends one token; returns false (spending nothing) when there is less than one. */
  take(): boolean {
    const now = this.now();
    const tokens = refill(this.tokens, this.at, now, this.rate, this.burst);
    if (tokens < 1) return false;
    this.tokens = tokens - 1;
    this.at = now;
    return true;
  }
}

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
    const tokens = refill(bucket.tokens, bucket.at, this.now(), this.rate, this.burst);
    if (tokens >= this.burst) this.buckets.delete(key); // a full bucket is the same as no bucket
    return tokens;
  }

  /** Spends one token of `key`; returns false (spending nothing) when it has less than one. */
  take(key: string): boolean {
    const tokens = this.tokens(key);
    if (tokens < 1) return false;
    // In place when the key has a bucket: a new object in a long-lived map is promoted with it.
    const bucket = this.buckets.get(key);
    if (bucket === undefined) this.buckets.set(key, { tokens: tokens - 1, at: this.now() });
    else {
      bucket.tokens = tokens - 1;
      bucket.at = this.now();
    }
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
