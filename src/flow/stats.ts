import type { ShedReason } from './options.js';

/** A run of a stage, as its stats see it. @internal */
export interface InFlightSource {
  inFlightNow(): number;
}

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
  /** Times the stage stopped its producers because it was full (fused with its source: times its slots filled). */
  pauses = 0;
  /** The stage's live runs: each counts its own work in flight (no shared counter to update per element). */
  private readonly runs = new Set<InFlightSource>();

  /** Work started and not yet fully delivered, now. */
  get inFlight(): number {
    let total = 0;
    for (const run of this.runs) total += run.inFlightNow();
    return total;
  }

  /** A run of the stage began: its work in flight counts from now. @internal */
  track(run: InFlightSource): void {
    this.runs.add(run);
  }

  /** Runs counted now: a run that ended must not stay here (it would be kept alive). @internal */
  get liveRuns(): number {
    return this.runs.size;
  }

  /** A run ended (it holds no work in flight any more). @internal */
  untrack(run: InFlightSource): void {
    this.runs.delete(run);
  }

  get shedTotal(): number {
    let total = 0;
    for (const reason in this.shed) total += this.shed[reason as ShedReason];
    return total;
  }
}
