import type { ShedReason } from './options.js';

/** A run of a stage, as its stats see it. @internal */
export interface InFlightSource {
  inFlightNow(): number;
  /** Elements it received so far (the stats add them while it runs, and keep them when it ends). */
  receivedNow(): number;
  /** Elements it delivered as one output each, unmerged, counted once for both `delivered` and `emitted`. */
  passedNow(): number;
}

/**
 * Counters and gauges of one stage, shared by every subscription of it. Pass one as
 * `stats` to read them (the metrics module exports them to Prometheus).
 *
 * Invariant, once a run has ended: `received === delivered + shed + failed`.
 */
export class StageStats {
  /**
   * What `received`, `delivered` and `emitted` hold beyond what live stage runs count themselves.
   * A stage run counts its elements in fields of its own, one increment per element instead of three
   * read-modify-writes of this shared object; the getters add them up (figures:
   * docs/internals/stage-hot-path.md). Operators other than `stage` add here. @internal
   */
  receivedCount = 0;
  /** `delivered` beyond what live runs count (see `receivedCount`). @internal */
  deliveredCount = 0;
  /** `emitted` beyond what live runs count (see `receivedCount`). @internal */
  emittedCount = 0;
  /** Inputs merged into another by `conflate`; they count as delivered too. */
  conflated = 0;
  /** Elements shed, by reason. */
  readonly shed: Record<ShedReason, number> = { 'buffer-full': 0, evicted: 0, lagging: 0, cancelled: 0 };
  /** Elements whose work failed. */
  failed = 0;
  /** Elements waiting in buffers now. */
  buffered = 0;
  /** Times the stage stopped its producers because it was full. */
  pauses = 0;
  /**
   * Elements its link gave up on (a deferring operator held them longer than the link
   * waited, see *deferring and dropping*) that arrived after all: each may take the
   * segment one beyond its bound.
   */
  lateArrivals = 0;
  /**
   * Elements beyond its room its link may let out before it has seen a deferral (a
   * missing element may have been dropped by a `filter`): 16, times 4 after each wait
   * for missing elements that ended with none arrived (a filter dropping a long run, or
   * a first deferral longer than `transitTimeout`). The largest any run reached.
   */
  transitSlack = 16;
  /** The stage's live runs: each counts its own work in flight (no shared counter to update per element). */
  private readonly runs = new Set<InFlightSource>();

  /** Elements that entered the stage. */
  get received(): number {
    let total = this.receivedCount;
    for (const run of this.runs) total += run.receivedNow();
    return total;
  }
  /** Operators other than `stage` count here. @internal */
  set received(value: number) {
    this.receivedCount += value - this.received;
  }

  /** Inputs whose work finished and whose outputs all went downstream. */
  get delivered(): number {
    return this.deliveredCount + this.passed();
  }
  /** Operators other than `stage` count here. @internal */
  set delivered(value: number) {
    this.deliveredCount += value - this.delivered;
  }

  /** Outputs emitted downstream (one input may yield many, e.g. tokens). */
  get emitted(): number {
    return this.emittedCount + this.passed();
  }
  /** Operators other than `stage` count here. @internal */
  set emitted(value: number) {
    this.emittedCount += value - this.emitted;
  }

  private passed(): number {
    let total = 0;
    for (const run of this.runs) total += run.passedNow();
    return total;
  }

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

  /** A run ended (it holds no work in flight any more): its counts stay, in the counters. @internal */
  untrack(run: InFlightSource): void {
    if (!this.runs.delete(run)) return;
    const passed = run.passedNow();
    this.receivedCount += run.receivedNow();
    this.deliveredCount += passed;
    this.emittedCount += passed;
  }

  /** Elements shed, every reason together. */
  get shedTotal(): number {
    let total = 0;
    for (const reason in this.shed) total += this.shed[reason as ShedReason];
    return total;
  }
}
