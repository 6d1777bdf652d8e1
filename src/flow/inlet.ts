import type { DemandLink, Resumable } from './demand.js';

/** What an inlet asks of the consumer that owns it. */
export interface RoomOwner {
  /** Elements the consumer can take right now without breaking its bound. */
  room(): number;
}

/**
 * The upstream-facing side of a consumer: the `DemandLink` its producers ask before
 * every element. One inlet may have several producers (a `merge` of Flows, or the
 * inner Flows of a `mergeMap`).
 *
 * Invariant: elements in transit (emitted upstream, not yet arrived, because a
 * plain operator in between deferred them) count against the consumer's room.
 */
export class Inlet implements DemandLink {
  private readonly outlets: Resumable[] = [];
  private emitting = 0;
  private received = 0;
  private deferredSeen = false;
  private starved = false;
  /** Elements emitted upstream that a deferring operator still holds. */
  inTransit = 0;

  constructor(private readonly owner: RoomOwner) {}

  get producers(): number {
    return this.outlets.length;
  }

  wants(): boolean {
    if (this.owner.room() - this.inTransit > 0) return true;
    this.starved = true;
    return false;
  }

  demand(): number {
    return Math.max(0, this.owner.room() - this.inTransit);
  }

  beforeEmit(): number {
    this.emitting++;
    return this.received;
  }

  afterEmit(receivedBefore: number): void {
    this.emitting--;
    // Nothing arrived during the emit: a filter dropped it, or an operator deferred it.
    // Only once deferral has been seen on this link is it counted as in transit.
    if (this.received === receivedBefore && this.deferredSeen) this.inTransit++;
  }

  /**
   * The consumer calls this for every element it receives. Returns whether the
   * element was asked for (arrived inside a producer's emit, or was in transit):
   * an element that was not came from a source that cannot be paused.
   */
  arrive(): boolean {
    this.received++;
    if (this.emitting > 0) return true;
    if (this.outlets.length > 0) this.deferredSeen = true;
    if (this.inTransit > 0) {
      this.inTransit--;
      return true;
    }
    return false;
  }

  /** Gives up on one in-transit element (a deferring operator dropped it), so the link cannot stall. */
  forgiveOne(): void {
    if (this.inTransit > 0) this.inTransit--;
  }

  /** Room came back: resume producers that stopped for lack of demand. */
  signal(): void {
    if (!this.starved) return;
    this.starved = false;
    for (const outlet of this.outlets.slice()) outlet.resume();
  }

  attach(outlet: Resumable): void {
    this.outlets.push(outlet);
  }

  detach(outlet: Resumable): void {
    const index = this.outlets.indexOf(outlet);
    if (index >= 0) this.outlets.splice(index, 1);
  }
}
