import { Flow, currentLink, type DemandLink, type Outlet, type Producer } from '../flow/demand.js';
import { assertionError, fail, show, showList } from './assert.js';

/**
 * Where the current subscription of a `TestSource` stands: `idle` before anything
 * subscribed, `active` while both sides go on, then `cancelled` (the consumer left),
 * `completed` or `errored` (the test ended it).
 *
 * ## Example
 * ```ts
 * sink.cancel();
 * assert.equal(source.state, 'cancelled');
 * ```
 */
export type TestSourceState = 'idle' | 'active' | 'cancelled' | 'completed' | 'errored';

/** One subscription of a TestSource: what the consumer asked for and what the test sent. */
class Connection<T> {
  state: TestSourceState = 'active';
  readonly pulls: number[] = [];
  readonly emitted: T[] = [];

  constructor(
    readonly outlet: Outlet<T>,
    /** The consumer's link, captured while the Flow is subscribed; `undefined` for a plain subscriber. */
    readonly link: DemandLink | undefined,
  ) {}

  demand(): number {
    if (this.state !== 'active' || this.outlet.closed) return 0;
    return this.link === undefined ? Infinity : this.link.demand();
  }
}

/**
 * A probe upstream (Akka's `TestSource.probe`, Reactor's `TestPublisher`): a `Flow`
 * the test drives by hand while it watches what the consumer asks for.
 *
 * The source behaves like a producer that always has more to send: it asks its
 * consumer `wants()` before and after every element, so the framework pulls it
 * whenever demand comes back; every pull is recorded in `pulls` with the demand
 * seen at that moment. `emit` refuses to send without demand (Reactive Streams
 * §1.1), which turns a stage that asks for too little into a failing test rather
 * than a silent overflow.
 *
 * One consumer at a time: a second subscription while one is active receives an
 * `AssertionError`. After the first ends (cancel, complete, error) the source may be
 * subscribed again; the probe then reports on the new subscription.
 *
 * ## Example
 * ```ts
 * const source = new TestSource<number>();
 * const sink = TestSink.subscribe(source.pipe(stage((x: number) => x * 10, { capacity: 2, concurrency: 1 })));
 * source.expectDemand(3);            // capacity + concurrency, although the sink asked for nothing
 * source.emit(1, 2, 3);
 * source.expectDemand(0);            // full: a 4th emit would throw
 * sink.request(1);
 * sink.expectNext(10);
 * source.expectDemand(1);            // exactly one more
 * assert.deepEqual(source.pulls, [3, 1]);
 * ```
 */
export class TestSource<T> extends Flow<T> {
  private connection: Connection<T> | undefined;
  private subscriptionCount = 0;

  constructor() {
    super((outlet) => this!.connect(outlet));
  }

  /** This source as a `Flow<T>` (it is one; the accessor reads well in `verify(source.flow.pipe(...))`). */
  get flow(): Flow<T> {
    return this;
  }

  /** How many elements the consumer would take now: the link's `demand()`, `Infinity` for a plain subscriber, 0 when nothing is subscribed. */
  get demand(): number {
    return this.connection?.demand() ?? 0;
  }

  /** Whether the consumer would take one more element now (what a producer asks before each `next`). */
  get wants(): boolean {
    const connection = this.connection;
    return connection !== undefined && connection.state === 'active' && connection.outlet.wants();
  }

  /** True while a consumer is subscribed and neither side has ended the subscription. */
  get subscribed(): boolean {
    return this.connection?.state === 'active';
  }

  /** True when the consumer went away (unsubscribe or cancel) before this source completed or errored. */
  get cancelled(): boolean {
    return this.connection?.state === 'cancelled';
  }

  /** Where the current (latest) subscription stands. */
  get state(): TestSourceState {
    return this.connection?.state ?? 'idle';
  }

  /** How many times this source has been subscribed. */
  get subscriptions(): number {
    return this.subscriptionCount;
  }

  /** The demand seen each time the framework called the producer's `pull()`, oldest first (current subscription). */
  get pulls(): readonly number[] {
    return this.connection?.pulls ?? [];
  }

  /** The values sent to the current subscription. */
  get emitted(): readonly T[] {
    return this.connection?.emitted ?? [];
  }

  /**
   * Sends `values` downstream, one at a time, each only if the consumer wants it.
   * Throws an `AssertionError` before sending a value without demand (§1.1), before
   * anything subscribed, after `complete()`/`error()` and after the consumer cancelled;
   * values before the offending one have been sent.
   */
  emit(...values: T[]): void {
    for (const value of values) {
      const connection = this.requireActive(`emit(${show(value)})`);
      if (!connection.outlet.wants()) {
        fail(
          `TestSource.emit(${show(value)}) without demand (Reactive Streams §1.1): the consumer's demand is ${connection.demand()}. ` +
            `Sent on this subscription: [${showList(connection.emitted)}]; demand seen at each pull: [${connection.pulls.join(', ')}]. ` +
            'Use offer() to probe whether an element would be taken.',
        );
      }
      this.send(connection, value);
    }
  }

  /**
   * Sends `value` if the consumer wants it now; returns whether it was sent. Never
   * throws: for tests that probe demand, or that emit after a cancel on purpose (§2.8).
   */
  offer(value: T): boolean {
    const connection = this.connection;
    if (connection === undefined || connection.state !== 'active' || !connection.outlet.wants()) return false;
    this.send(connection, value);
    return true;
  }

  /** Completes the current subscription. A no-op after the consumer cancelled; an `AssertionError` before any subscription or after a terminal signal (§1.7). */
  complete(): void {
    const connection = this.terminalTarget('complete()');
    if (connection === undefined) return;
    connection.state = 'completed'; // before the outlet closes, so its cancel() is not taken for the consumer's
    connection.outlet.complete();
  }

  /** Errors the current subscription with `error`. Same rules as `complete()`. */
  error(error: unknown): void {
    const connection = this.terminalTarget(`error(${show(error)})`);
    if (connection === undefined) return;
    connection.state = 'errored';
    connection.outlet.error(error);
  }

  /** Asserts the consumer's demand is exactly `n` now. */
  expectDemand(n: number): this {
    const demand = this.demand;
    if (demand !== n) {
      fail(`TestSource: expected demand ${n}, but it is ${demand}${this.describe()}`, { actual: demand, expected: n, operator: 'strictEqual' });
    }
    return this;
  }

  /** Asserts the consumer's demand is at least `n` now. */
  expectDemandAtLeast(n: number): this {
    const demand = this.demand;
    if (!(demand >= n)) {
      fail(`TestSource: expected demand of at least ${n}, but it is ${demand}${this.describe()}`, { actual: demand, expected: n, operator: '>=' });
    }
    return this;
  }

  /** Asserts the consumer cancelled the current subscription. */
  expectCancelled(): this {
    if (!this.cancelled) fail(`TestSource: expected the consumer to have cancelled${this.describe()}`);
    return this;
  }

  private connect(outlet: Outlet<T>): Producer {
    // The consumer's link scope is still open while a Flow builds its producer.
    const link = currentLink();
    if (this.connection?.state === 'active') {
      return {
        start: () => outlet.error(assertionError('TestSource accepts one subscriber at a time: it was subscribed again while active.')),
        pull: () => {},
        cancel: () => {},
      };
    }
    const connection = new Connection(outlet, link);
    this.connection = connection;
    this.subscriptionCount++;
    return {
      pull: () => {
        if (connection.state !== 'active') return;
        connection.outlet.wants(); // asked like any producer, so the consumer resumes us when demand returns
        connection.pulls.push(connection.demand());
      },
      cancel: () => {
        if (connection.state === 'active') connection.state = 'cancelled';
      },
    };
  }

  private send(connection: Connection<T>, value: T): void {
    connection.emitted.push(value);
    connection.outlet.next(value);
    // Ask again, as a producer with more to send would: a consumer that has just
    // run out of room then knows to pull this source when room returns.
    if (connection.state === 'active') connection.outlet.wants();
  }

  private requireActive(what: string): Connection<T> {
    const connection = this.connection;
    if (connection === undefined) return fail(`TestSource.${what}: nothing has subscribed to this source yet.`);
    switch (connection.state) {
      case 'active':
        return connection;
      case 'cancelled':
        return fail(`TestSource.${what}: the consumer has cancelled (use offer() to emit after a cancel on purpose).`);
      default:
        return fail(`TestSource.${what}: this source has already ${connection.state === 'completed' ? 'completed' : 'errored'} (Reactive Streams §1.7).`);
    }
  }

  private terminalTarget(what: string): Connection<T> | undefined {
    const connection = this.connection;
    if (connection?.state === 'cancelled') return undefined;
    return this.requireActive(what);
  }

  private describe(): string {
    const connection = this.connection;
    if (connection === undefined) return ' (nothing has subscribed).';
    return ` (subscription ${connection.state}; sent [${showList(connection.emitted)}]; demand seen at each pull: [${connection.pulls.join(', ')}]).`;
  }
}
