/**
 * Counters and gauges of a cache, shared by every cache and wrapper that is given
 * the same object. Field names map one to one onto Prometheus metrics: counters
 * become `sluice_cache_<field>_total`, gauges `sluice_cache_<field>` (`bytes` is
 * already in base units); {@link CacheStats.metrics} lists them for an exporter.
 *
 * Invariant: every request a `cached` work sees is exactly one of `hits`,
 * `semanticHits`, `misses` or `joins`.
 *
 * ## Example
 * ```ts
 * const stats = new CacheStats();
 * const generate = cached(llm, { response: { maxBytes: 64 << 20 }, singleFlight: true, stats });
 * // later: stats.hits / stats.requests is the exact-hit ratio
 * ```
 */
export class CacheStats {
  /** Requests answered from the response cache (exact key). */
  hits = 0;
  /** Requests answered from the semantic cache (similar prompt). */
  semanticHits = 0;
  /** Requests that ran the work. */
  misses = 0;
  /** Requests that shared an inference already in flight (single-flight). */
  joins = 0;
  /** Entries removed to stay under a bound (bytes or entries). */
  evictions = 0;
  /** Entries found past their time to live and removed. */
  expirations = 0;
  /** Answers not stored because one alone exceeds the byte bound. */
  rejected = 0;
  /** Estimated bytes held now, by every cache sharing these stats. */
  bytes = 0;
  /** Entries held now, by every cache sharing these stats. */
  entries = 0;

  /** Every request counted: hits + semanticHits + misses + joins. */
  get requests(): number {
    return this.hits + this.semanticHits + this.misses + this.joins;
  }

  /**
   * The exporter's view: each field with its metric name, type and help text.
   * Ratios are left to PromQL (`rate(sluice_cache_hits_total[5m]) / rate(...)`).
   */
  static readonly metrics: readonly CacheMetric[] = [
    { field: 'hits', name: 'sluice_cache_hits_total', type: 'counter', help: 'Requests answered from the response cache.' },
    { field: 'semanticHits', name: 'sluice_cache_semantic_hits_total', type: 'counter', help: 'Requests answered from the semantic cache.' },
    { field: 'misses', name: 'sluice_cache_misses_total', type: 'counter', help: 'Requests that ran the inference.' },
    { field: 'joins', name: 'sluice_cache_joins_total', type: 'counter', help: 'Requests that shared an inference in flight.' },
    { field: 'evictions', name: 'sluice_cache_evictions_total', type: 'counter', help: 'Entries evicted to stay within bounds.' },
    { field: 'expirations', name: 'sluice_cache_expirations_total', type: 'counter', help: 'Entries removed after their time to live.' },
    { field: 'rejected', name: 'sluice_cache_rejected_total', type: 'counter', help: 'Answers larger than the byte bound, not stored.' },
    { field: 'bytes', name: 'sluice_cache_bytes', type: 'gauge', help: 'Estimated bytes held by the caches.' },
    { field: 'entries', name: 'sluice_cache_entries', type: 'gauge', help: 'Entries held by the caches.' },
  ];
}

/** One field of {@link CacheStats} as a Prometheus metric. */
export interface CacheMetric {
  readonly field: 'hits' | 'semanticHits' | 'misses' | 'joins' | 'evictions' | 'expirations' | 'rejected' | 'bytes' | 'entries';
  readonly name: string;
  readonly type: 'counter' | 'gauge';
  readonly help: string;
}
