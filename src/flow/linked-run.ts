import type { Observable, Subscription } from 'rxjs';
import type { Outlet, Producer } from './demand.js';
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
  /** The last drain ended without room: counted once per pause (`onPause`), not once per drain. */
  protected paused = false;
  /** Drain passes due: 0 when no drain runs (see `drain`). */
  protected wip = 0;

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

  /**
   * The drain loop, never re-entered (a call while it runs makes it loop once more, §3.3):
   * `deliver` while downstream wants; once upstream is done and nothing is `holding`,
   * `finish`; then `afterDrain`.
   */
  protected drain(): void {
    if (this.wip++ !== 0) return;
    do {
      this.deliver();
      if (this.terminated) {
        this.wip = 0;
        return;
      }
      if (this.upstreamDone && !this.holding()) {
        this.wip = 0;
        this.finish();
        return;
      }
    } while (--this.wip !== 0);
    this.afterDrain();
  }

  /** Ends the run: upstream is done and everything went out. By default: release, then complete. */
  protected finish(): void {
    this.terminated = true;
    this.release();
    this.outlet.complete();
  }

  /** After a drain: ask upstream for more while there is room, else note a pause (`onPause`, once per pause). */
  protected afterDrain(): void {
    if (this.upstreamDone) return;
    if (this.room() > 0) {
      this.paused = false;
      this.inlet.signal();
    } else if (!this.paused) {
      this.paused = true;
      this.onPause();
    }
  }

  /** The run stopped asking upstream for lack of room (counted in stats by runs that keep `pauses`). */
  protected onPause(): void {}

  /** Where the run's end goes: an `Outlet`, or the `Subscriber` of a run whose output is a plain Observable (the fan-out runs). */
  protected abstract readonly outlet: Pick<Outlet<unknown>, 'complete'>;
  abstract room(): number;
  abstract onNext(value: In): void;
  abstract onUpstreamError(err: unknown): void;
  /** No more input: what is held still goes out, then the run finishes (see `drain`). */
  onUpstreamComplete(): void {
    if (this.terminated || this.upstreamDone) return;
    this.upstreamDone = true;
    this.upstream?.unsubscribe();
    this.drain();
  }

  /** Emits what is ready while the outlet wants it. */
  protected abstract deliver(): void;
  /** Whether anything is still to go out. */
  protected abstract holding(): boolean;
  protected abstract release(): void;
}
