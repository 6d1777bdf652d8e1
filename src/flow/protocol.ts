/**
 * The demand protocol between a consumer and its producers: what a consumer's link
 * answers before every element, and what a producer must be to be resumed.
 */
import type { TraceRef } from '../core/trace.js';

/** Set on `Flow.prototype`: marks a sluice Flow (its outlet asks its consumer before every element). @internal */
export const FLOW: unique symbol = Symbol('sluice.flow');
/** What a consumer tells its producers. */
export interface DemandLink {
  /** True while the consumer can take one more element now (from `outlet`, when the producer says who it is). */
  wants(outlet?: Resumable): boolean;
  /** How many elements the consumer would take now (for probes and tests; `Infinity` when unbounded). */
  demand(outlet?: Resumable): number;
  /** Called by an outlet around each element it emits; returns a token for `afterEmit`. */
  beforeEmit(): number;
  /** `outlet`: the producer that emitted (so a link can tell its producers' elements apart). */
  afterEmit(token: number, outlet?: Resumable): void;
  /** Producers that must be resumed when demand returns. */
  attach(outlet: Resumable): void;
  detach(outlet: Resumable): void;
  /**
   * Elements `outlet` may send without asking again: its consumer's room while it is the
   * consumer's only producer, else 0. Only links whose consumer lends its room have it.
   */
  credit?(outlet: Resumable): number;
  /** An element a plain operator between the producers and this consumer dropped outside any emit (see `probeSegment`). */
  dropped?(): void;
  /** An element moved from one plain operator between the producers and this consumer to the next. */
  moved?(): void;
}

export interface Resumable {
  resume(): void;
  /** A second producer joined the consumer: credit taken while this one was alone is void. */
  revoke?(): void;
}

/** A consumer of traced elements as their parts. @internal */
export interface TracedSink {
  onTracedNext(value: unknown, trace: TraceRef): void;
  /** `onTracedNext` for an element from settled async work (see `Outlet.nextSettled`). */
  onSettledNext(value: unknown, trace: TraceRef): void;
}

/**
 * A subscriber that is its consumer's own, subscribed with `link`: every element it
 * gets from a Flow linked to `link` was asked for and arrives during the emit, so the
 * outlet skips the in-transit bookkeeping and hands elements over directly.
 * @internal
 */
export interface DirectConsumer<T> {
  readonly directLink: DemandLink;
  askedNext(value: T): void;
  /** A traced element as its parts (`nextTraced`), for a consumer without a `tracedSink`: it makes the envelope. */
  tracedNext(value: unknown, trace: TraceRef): void;
  /** Takes traced elements as parts itself, if it does: the outlet calls it without the subscriber in between. */
  readonly tracedSink: TracedSink | undefined;
  /** The consumer's room shrinks only by this producer's elements: the producer may take all of it as credit (see `FlowOutlet.wants`). */
  readonly lendsRoom: boolean;
}
