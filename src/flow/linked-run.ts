import type { Observable, Subscription } from 'rxjs';
import type { Producer } from './demand.js';
import type { Inlet, RoomOwner } from './inlet.js';
import { subscribeUpstream, type UpstreamHandler } from './upstream.js';

/**
 * The lifecycle every demand-aware operator run shares: subscribe upstream through its
 * inlet once started, drain when downstream pulls, and end once on cancel. A run
 * supplies its state machine (`drain`, `room`, the upstream signals) and what
 * cancelling and releasing mean for what it holds.
 */
export abstract class LinkedRun<In> implements Producer, RoomOwner, UpstreamHandler<In> {
  protected abstract readonly source: Observable<In>;
  protected abstract readonly inlet: Inlet;
  protected upstream: Subscription | undefined;
  protected upstreamDone = false;
  protected terminated = false;

  start(): void {
    if (this.terminated) return;
    this.upstream = subscribeUpstream(this.source, this.inlet, this);
    if (this.terminated || this.upstreamDone) this.upstream.unsubscribe();
  }

  pull(): void {
    this.drain();
  }

  /** The consumer went away: account for what is held (`onCancel`), then release everything. */
  cancel(): void {
    if (this.terminated) return;
    this.terminated = true;
    this.onCancel();
    this.release();
  }

  /** Known before the first element, so ending early stops even a synchronous source at once. */
  onSubscribe(subscription: Subscription): void {
    this.upstream = subscription;
  }

  /** Counts what the run still holds as shed `cancelled`. */
  protected onCancel(): void {}

  abstract room(): number;
  abstract onNext(value: In): void;
  abstract onUpstreamError(err: unknown): void;
  abstract onUpstreamComplete(): void;
  protected abstract drain(): void;
  protected abstract release(): void;
}
