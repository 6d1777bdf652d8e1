/**
 * The demand protocol between a consumer and its producers: what a consumer's link
 * answers before every element, and what a producer must be to be resumed.
 */
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
}

export interface Resumable {
  resume(): void;
  /** A second producer joined the consumer: credit taken while this one was alone is void. */
  revoke?(): void;
}
