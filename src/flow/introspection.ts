/**
 * The hook an inspector attaches to see pipelines while they run: an operator tells it when
 * one of its runs starts — with the link it takes elements through and the link of the
 * consumer it feeds, which is how the inspector learns the edges — and when the run ends.
 * Off by default: a run reads one module variable when it starts, nothing per element.
 */
import type { DemandLink } from './protocol.js';
import type { StageStats } from './stats.js';

/** What a running operator is, as the inspector draws it. */
export interface RunDescription {
  readonly name: string;
  /** `stage`, `batch`, `redact`... */
  readonly kind: string;
  /** Elements it may buffer. */
  readonly capacity: number;
  /** Elements it works on at once. */
  readonly concurrency: number;
  /** What happens when it is full (`pause`, `shed-incoming`...). */
  readonly policy: string;
}

/** A run of an operator, as an inspector sees it. */
export interface InspectedRun {
  /** Shared by every run of the same operator: the inspector's node. */
  readonly stats: StageStats;
  describe(): RunDescription;
  /** Elements its consumer would take now (`Infinity` for one that does not speak demand). */
  demandNow(): number;
}

export interface Introspector {
  /**
   * A run started. `own` is the link it takes elements through (what a run it consumes
   * reports as `feeds`); `feeds` is its consumer's link, undefined for a plain subscriber.
   */
  runStarted(run: InspectedRun, own: DemandLink | undefined, feeds: DemandLink | undefined): void;
  /** The run ended (completed, failed or unsubscribed); called once. */
  runEnded(run: InspectedRun): void;
}

const attached: Introspector[] = [];
let active: Introspector | undefined;

/** Every attached introspector as one. */
const all: Introspector = {
  runStarted: (run, own, feeds) => {
    for (const introspector of attached) introspector.runStarted(run, own, feeds);
  },
  runEnded: (run) => {
    for (const introspector of attached) introspector.runEnded(run);
  },
};

/** Attaches an introspector to every run started from now on; the returned function detaches it. */
export function attachIntrospector(introspector: Introspector): () => void {
  attached.push(introspector);
  active = attached.length === 1 ? introspector : all;
  return () => {
    const at = attached.indexOf(introspector);
    if (at < 0) return;
    attached.splice(at, 1);
    active = attached.length === 0 ? undefined : attached.length === 1 ? attached[0] : all;
  };
}

/** The introspector a run starting now reports to, if any. @internal */
export function activeIntrospector(): Introspector | undefined {
  return active;
}
