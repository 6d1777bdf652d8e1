import type { ShedReason } from './options.js';

/**
 * Counters and gauges of one stage, shared by every subscription of it. Pass one as
 * `stats` to read them (the metrics module exports them to Prometheus).
 *
 * Invariant, once a run has ended: `received === delivered + shed + failed`.
 */
export class StageStats {
  received = 0;
  /** Inputs whose work finished and whose outputs all went downstream. */
  delivered = 0;
  /** Outputs emitted downstream (one input may yield many, e.g. tokens). */
  emitted = 0;
  failed = 0;
  /** Inputs merged into another by `conflate`; they count as delivered too. */
  conflated = 0;
  readonly shed: Record<ShedReason, number> = { 'buffer-full': 0, evicted: 0, lagging: 0, cancelled: 0 };
  /** Elements waiting in buffers now. */
  buffered = 0;
  /** Work started and not yet fully delivered, now. */
  inFlight = 0;
  /** Times the stage stopped its producers because it was full. */
  pauses = 0;

  get shedTotal(): number {
    let total = 0;
    for (const reason in this.shed) total += this.shed[reason as ShedReason];
    return total;
  }
}
