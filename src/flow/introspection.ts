/**
 * The hook an inspector attaches to see pipelines while they run: every `Flow` whose producer
 * is an `InspectedRun` (a stage's run, a batcher's...) is reported when it is subscribed —
 * with the link it takes elements through and the link of the consumer it feeds, which is how
 * the inspector learns the edges — and when its subscription ends. Off by default: a
 * subscription reads one module variable, nothing happens per element.
 */
import type { DemandLink } from './protocol.js';
import type { ShedReason } from './options.js';
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

/** An operator's counts, for one that keeps them other than in `StageStats` (a NATS link receiver). */
export interface RunCounters {
  readonly received: number;
  readonly delivered: number;
  /** Outputs sent downstream (a generation's tokens); `delivered` when each element leaves as one output. */
  readonly emitted?: number;
  readonly shed: Readonly<Partial<Record<ShedReason, number>>>;
  readonly failed: number;
  readonly buffered: number;
  readonly inFlight: number;
}

/** A run of an operator, as an inspector sees it. */
export interface InspectedRun {
  /** Shared by every run of the same operator: the inspector's node, and its counts unless `counters` says otherwise. */
  readonly stats: StageStats;
  /** The operator's counts, when `stats` does not hold them. */
  counters?(): RunCounters;
  describe(): RunDescription;
  /**
   * Elements its consumer would take now (`Infinity` for one that does not speak demand); 0 while
   * the run holds an output it was refused and has not been resumed for (the consumer resumes its
   * producers only once a quarter of its room is free): it is held back, whatever room has freed.
   */
  demandNow(): number;
  /** The link it takes elements through: what a run feeding it reports as `feeds`. */
  ownLink(): DemandLink | undefined;
  /** A part of another run of the same operator (a fan-out's lane): its demand and edges count, it is not a run of its own. */
  readonly part?: boolean;
}

/** Whether a Flow's producer can be inspected. @internal */
export function isInspectedRun(producer: object): producer is InspectedRun {
  return typeof (producer as Partial<InspectedRun>).describe === 'function' && (producer as Partial<InspectedRun>).stats !== undefined;
}

/** A message an operator moved to its dead-letter store (a NATS link receiver's), as the inspector lists it: never its body nor its reason's text. */
export interface DeadLetterRecord {
  /** The subject it was published on. */
  readonly subject: string;
  /** Its sequence in the link's stream. */
  readonly seq: number;
  /** Why, as a code: a failed element's error code (`WORK_FAILED`, `STAGE_TIMEOUT`...), `INVALID_MESSAGE`, `WORKER_STOPPED`, `MAX_DELIVER`, `TERMINATED`. */
  readonly code: string;
  /** Times it was delivered before it was given up on. */
  readonly deliveries: number;
}

export interface Introspector {
  /**
   * A run started. `own` is the link it takes elements through (what a run it consumes
   * reports as `feeds`); `feeds` is its consumer's link, undefined for a plain subscriber.
   * `within`: the run whose work subscribed it (a stage streaming a model's tokens), which it feeds.
   */
  runStarted(run: InspectedRun, own: DemandLink | undefined, feeds: DemandLink | undefined, within?: InspectedRun): void;
  /** The run ended (completed, failed or unsubscribed); called once. */
  runEnded(run: InspectedRun): void;
  /** An element failed in the run (its work threw or rejected, or timed out). */
  elementFailed?(run: InspectedRun, seq: number, error: unknown): void;
  /** The run moved a message to its dead-letter store. */
  deadLettered?(run: InspectedRun, letter: DeadLetterRecord): void;
}

const attached: Introspector[] = [];
let active: Introspector | undefined;

/** Every attached introspector as one. */
const all: Introspector = {
  runStarted: (run, own, feeds, within) => {
    for (const introspector of attached) introspector.runStarted(run, own, feeds, within);
  },
  runEnded: (run) => {
    for (const introspector of attached) introspector.runEnded(run);
  },
  elementFailed: (run, seq, error) => {
    for (const introspector of attached) introspector.elementFailed?.(run, seq, error);
  },
  deadLettered: (run, letter) => {
    for (const introspector of attached) introspector.deadLettered?.(run, letter);
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

let within: InspectedRun | undefined;

/** Runs `subscribe` with `run` as the one whose work subscribes what starts now (see `runStarted`'s `within`). @internal */
export function subscribedWithin<R>(run: InspectedRun, subscribe: () => R): R {
  const outer = within;
  within = run;
  try {
    return subscribe();
  } finally {
    within = outer;
  }
}

/** The run whose work is subscribing now, if one said so. @internal */
export function currentWithin(): InspectedRun | undefined {
  return within;
}
