/**
 * `handoff`: a Flow whose source is handed over later — a request that waits in a shared
 * pipeline's queue, then streams its own tokens. Demand goes through to the source once it is
 * there: one element asked at a time, as the consumer wants it.
 */
import type { Observable } from 'rxjs';
import { Flow, type Outlet, type Producer } from './demand.js';
import { subscribeWithDemand, type DemandSubscription } from './subscribe-with-demand.js';

/** What `handoff`'s `open` gets: how to hand the source over, or end the Flow without one. */
export interface HandoffHandle<T> {
  /** Streams `source` to the consumer with its demand; ignored after the Flow ended or another source was attached. */
  attach(source: Observable<T>): void;
  /** Ends the Flow with `err` (a request refused or failed before its source existed). */
  fail(err: unknown): void;
  /** True once the consumer left or the Flow ended. */
  readonly closed: boolean;
}

/**
 * A Flow that calls `open` at each subscription; `open` hands a source over later with
 * `handle.attach`, or fails the Flow with `handle.fail`. The function `open` returns is called
 * when the consumer leaves first (to withdraw the request), never after the Flow ended.
 */
export function handoff<T>(open: (handle: HandoffHandle<T>) => (() => void) | undefined): Flow<T> {
  return new Flow<T>((outlet) => new HandoffProducer(outlet, open));
}

class HandoffProducer<T> implements Producer, HandoffHandle<T> {
  private source: DemandSubscription | undefined;
  private withdraw: (() => void) | undefined = undefined;
  private ended = false;

  constructor(
    private readonly outlet: Outlet<T>,
    private readonly open: (handle: HandoffHandle<T>) => (() => void) | undefined,
  ) {}

  get closed(): boolean {
    return this.ended || this.outlet.closed;
  }

  start(): void {
    try {
      this.withdraw = this.open(this);
    } catch (err) {
      this.fail(err);
    }
  }

  attach(source: Observable<T>): void {
    if (this.closed || this.source !== undefined) return;
    this.source = subscribeWithDemand(source, {
      next: (value) => {
        this.outlet.next(value);
        this.pull();
      },
      error: (err: unknown) => this.end(() => this.outlet.error(err)),
      complete: () => this.end(() => this.outlet.complete()),
    });
    this.pull();
  }

  fail(err: unknown): void {
    if (this.closed) return;
    this.end(() => this.outlet.error(err));
  }

  /** One element asked at a time, while the consumer wants one. */
  pull(): void {
    const source = this.source;
    if (source === undefined || source.closed || source.outstanding > 0) return;
    if (this.outlet.wants()) source.request(1);
  }

  cancel(): void {
    if (this.ended) return;
    this.ended = true;
    const withdraw = this.withdraw;
    this.withdraw = undefined;
    this.source?.cancel();
    if (typeof withdraw === 'function') withdraw();
  }

  private end(terminal: () => void): void {
    if (this.ended) return;
    this.ended = true;
    this.withdraw = undefined;
    terminal();
  }
}
