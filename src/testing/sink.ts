import { isDeepStrictEqual } from 'node:util';
import type { Observable } from 'rxjs';
import { subscribeWithDemand, type DemandSubscription } from '../flow/demand.js';
import { Traced } from '../core/trace.js';
import { fail, failNotYet, show, showList } from './assert.js';
import { checkSinkOptions } from './options.js';

/**
 * The payload type of `T` once a `Traced` envelope is opened; other types stay as
 * they are. It is what a `TestSink` expects by default.
 *
 * ## Example
 * ```ts
 * type A = Unwrapped<Traced<string>>;   // string
 * type B = Unwrapped<number>;           // number
 * ```
 */
export type Unwrapped<T> = T extends Traced<infer V> ? V : T;

/**
 * What an expected error is matched by: an error class (`instanceof`) or a `code`.
 *
 * ## Example
 * ```ts
 * sink.expectError(IllegalDemandError);   // by class
 * sink.expectError('ILLEGAL_DEMAND');     // by code
 * ```
 */
export type ErrorMatcher = string | (abstract new (...args: never[]) => unknown);

/**
 * Options of `TestSink.subscribe` (and of `verify`).
 *
 * ## Example
 * ```ts
 * const sink = TestSink.subscribe(flow, { request: 2, unwrap: false }); // two elements may flow; expectations see Traced envelopes
 * ```
 */
export interface TestSinkOptions {
  /**
   * Whether expectations see the payload of `Traced` elements (`true`, the default:
   * `expectNext(10)` against a stage's `Traced<number>` output) or the envelopes
   * themselves (`false`). The envelopes stay readable in `traced` either way;
   * elements that are not `Traced` are compared as they are.
   */
  unwrap?: boolean;
  /**
   * Demand to request right after subscribing. Default 0: like Akka's `TestSink.probe`
   * and `StepVerifier.create(flux, 0)`, nothing flows until the test asks for it.
   */
  request?: number;
}

/**
 * One signal the sink received, in order: an element (its payload and the raw
 * element), completion, or an error.
 *
 * ## Example
 * ```ts
 * assert.deepEqual(sink.signals.map((s) => s.kind), ['next', 'next', 'complete']);
 * ```
 */
export type SinkSignal<V, T> =
  | { readonly kind: 'next'; readonly value: V; readonly raw: T }
  | { readonly kind: 'complete' }
  | { readonly kind: 'error'; readonly error: unknown };

/**
 * A probe downstream (Akka's `TestSink.probe`): subscribes with explicit Reactive
 * Streams demand and records every signal, so a test decides when the flow may emit
 * and checks what came out, one expectation at a time.
 *
 * Expectations (`expectNext`, `expectComplete`...) consume the recorded signals in
 * order and throw a `node:assert` `AssertionError` naming what was expected, what
 * arrived and everything received so far. They are synchronous and consume only
 * when they pass; for flows that finish work asynchronously use `verify` or wrap an
 * expectation in `eventually`.
 *
 * Demand is exactly `subscribeWithDemand`'s, so what the sink sees is what any
 * explicit-demand consumer of the flow would see.
 *
 * ## Example
 * ```ts
 * const sink = TestSink.subscribe(fromIterable([1, 2, 3]).pipe(stage((x: number) => x * 10)));
 * sink.expectNoEvents();               // no demand yet, nothing emitted
 * sink.request(2);
 * sink.expectNext(10, 20);             // payloads: Traced envelopes are unwrapped by default
 * sink.traced[0]?.trace.traceId;      // ...and still there
 * sink.request(1);
 * sink.expectNext(30).expectComplete();
 * ```
 */
export class TestSink<V, T = V> {
  private readonly signalLog: SinkSignal<V, T>[] = [];
  private cursor = 0;
  private readonly subscription: DemandSubscription;
  private cancelledByTest = false;

  /** Subscribes to `source` with explicit demand; expectations see the `Traced` envelopes. */
  static subscribe<T>(source: Observable<T>, options: TestSinkOptions & { unwrap: false }): TestSink<T, T>;
  /** Subscribes to `source` with explicit demand; expectations see payloads of `Traced` elements (the default). */
  static subscribe<T>(source: Observable<T>, options?: TestSinkOptions & { unwrap?: true }): TestSink<Unwrapped<T>, T>;
  /** Subscribes to `source` with explicit demand; `unwrap` decided at run time. */
  static subscribe<T>(source: Observable<T>, options?: TestSinkOptions): TestSink<T | Unwrapped<T>, T>;
  static subscribe<T>(source: Observable<T>, options: TestSinkOptions = {}): TestSink<T | Unwrapped<T>, T> {
    checkSinkOptions(options);
    const sink = new TestSink<T | Unwrapped<T>, T>(source, options.unwrap ?? true);
    if (options.request !== undefined && options.request !== 0) sink.request(options.request);
    return sink;
  }

  private constructor(source: Observable<T>, unwrap: boolean) {
    this.subscription = subscribeWithDemand(source, {
      next: (raw) => {
        const value = (unwrap && raw instanceof Traced ? (raw as Traced<unknown>).value : raw) as V;
        this.signalLog.push({ kind: 'next', value, raw });
      },
      error: (error: unknown) => this.signalLog.push({ kind: 'error', error }),
      complete: () => this.signalLog.push({ kind: 'complete' }),
    });
  }

  // ---- driving ----

  /**
   * Asks for `n` more elements (additive, §3.8). A non-positive or non-integer `n`
   * errors the stream with `IllegalDemandError` (§3.9) — recorded as the sink's
   * error signal, never thrown; after `cancel()` it does nothing (§3.6).
   */
  request(n: number): this {
    this.subscription.request(n);
    return this;
  }

  /** Cancels the subscription: the flow and everything upstream of it are released. */
  cancel(): this {
    this.cancelledByTest = true;
    this.subscription.cancel();
    return this;
  }

  // ---- what arrived ----

  /** Every element received (payloads when unwrapping), consumed by expectations or not. */
  get received(): readonly V[] {
    const values: V[] = [];
    for (const signal of this.signalLog) if (signal.kind === 'next') values.push(signal.value);
    return values;
  }

  /** Every element exactly as the flow emitted it. */
  get raw(): readonly T[] {
    const values: T[] = [];
    for (const signal of this.signalLog) if (signal.kind === 'next') values.push(signal.raw);
    return values;
  }

  /** The `Traced` envelopes among the received elements (all of them for a stage's output): read traces here. */
  get traced(): readonly Traced<Unwrapped<T>>[] {
    const envelopes: Traced<Unwrapped<T>>[] = [];
    for (const signal of this.signalLog) if (signal.kind === 'next' && signal.raw instanceof Traced) envelopes.push(signal.raw as Traced<Unwrapped<T>>);
    return envelopes;
  }

  /** Every signal received, in order. */
  get signals(): readonly SinkSignal<V, T>[] {
    return this.signalLog;
  }

  /** Signals not yet consumed by an expectation. */
  get pending(): readonly SinkSignal<V, T>[] {
    return this.signalLog.slice(this.cursor);
  }

  /** True once the flow completed. */
  get completed(): boolean {
    return this.signalLog.some((s) => s.kind === 'complete');
  }

  /** True once the flow errored. */
  get errored(): boolean {
    return this.signalLog.some((s) => s.kind === 'error');
  }

  /** The error the flow signalled, if it did. */
  get error(): unknown {
    for (const signal of this.signalLog) if (signal.kind === 'error') return signal.error;
    return undefined;
  }

  /** Whether the test called `cancel()`. */
  get cancelled(): boolean {
    return this.cancelledByTest;
  }

  /** True once nothing more can arrive (terminal signal, cancel, or an illegal request). */
  get closed(): boolean {
    return this.subscription.closed;
  }

  /** Demand requested and not yet used. */
  get outstanding(): number {
    return this.subscription.outstanding;
  }

  // ---- expectations ----

  /** Expects the next signals to be these elements, in order (deep, strict equality). */
  expectNext(...expected: V[]): this {
    const what = `expectNext(${showList(expected)})`;
    for (let i = 0; i < expected.length; i++) {
      const signal = this.signalLog[this.cursor + i];
      if (signal === undefined) {
        this.missing(what, `expected ${expected.length} element(s); ${i === 0 ? 'none has' : `only ${i} ha${i === 1 ? 's' : 've'}`} arrived`);
      }
      if (signal.kind !== 'next') {
        fail(`${what}: expected ${show(expected[i])} at index ${this.cursor + i}, but the stream ${this.describeSignal(signal)}.${this.report()}`, {
          actual: this.nextValues(expected.length),
          expected,
          operator: 'deepStrictEqual',
        });
      }
      if (!isDeepStrictEqual(signal.value, expected[i])) {
        fail(
          `${what}: the element at index ${this.cursor + i} differs` +
            (expected.length > 1 ? ` (value ${i + 1} of ${expected.length} expected)` : '') +
            `\n  expected: ${show(expected[i])}\n  actual:   ${show(signal.value)}${this.report()}`,
          { actual: this.nextValues(expected.length), expected, operator: 'deepStrictEqual' },
        );
      }
    }
    this.cursor += expected.length;
    return this;
  }

  /** Expects `n` more elements, whatever they are. */
  expectNextCount(n: number): this {
    const what = `expectNextCount(${n})`;
    for (let i = 0; i < n; i++) {
      const signal = this.signalLog[this.cursor + i];
      if (signal === undefined) this.missing(what, `${i} of ${n} element(s) arrived`);
      if (signal.kind !== 'next') fail(`${what}: after ${i} element(s) the stream ${this.describeSignal(signal)}.${this.report()}`);
    }
    this.cursor += n;
    return this;
  }

  /** Expects one more element and hands it to `assertion` (with the raw element, e.g. its `Traced` envelope). */
  consumeNextWith(assertion: (value: V, raw: T) => void): this {
    const signal = this.signalLog[this.cursor];
    if (signal === undefined) this.missing('consumeNextWith(...)', 'no element has arrived');
    if (signal.kind !== 'next') fail(`consumeNextWith(...): expected an element, but the stream ${this.describeSignal(signal)}.${this.report()}`);
    assertion(signal.value, signal.raw);
    this.cursor++;
    return this;
  }

  /** Expects that nothing arrived that an expectation has not consumed yet. */
  expectNoEvents(): this {
    if (this.cursor < this.signalLog.length) {
      const unexpected = this.signalLog.slice(this.cursor);
      fail(`expectNoEvents(): ${unexpected.length} unexpected signal(s): ${unexpected.map((s) => this.showSignal(s)).join(', ')}.${this.report()}`);
    }
    return this;
  }

  /** Expects the next signal to be completion. */
  expectComplete(): this {
    const signal = this.signalLog[this.cursor];
    if (signal === undefined) this.missing('expectComplete()', 'the stream has not completed');
    if (signal.kind !== 'complete') fail(`expectComplete(): expected completion, but the stream ${this.describeSignal(signal)}.${this.report()}`);
    this.cursor++;
    return this;
  }

  /**
   * Expects the next signal to be an error, matched by class (`instanceof`) or by
   * `code` when `matcher` is given. The error itself is in `sink.error`.
   */
  expectError(matcher?: ErrorMatcher): this {
    const what = `expectError(${matcher === undefined ? '' : typeof matcher === 'string' ? show(matcher) : matcher.name})`;
    const signal = this.signalLog[this.cursor];
    if (signal === undefined) this.missing(what, 'the stream has not errored');
    if (signal.kind !== 'error') fail(`${what}: expected an error, but the stream ${this.describeSignal(signal)}.${this.report()}`);
    if (matcher !== undefined && !matches(signal.error, matcher)) {
      fail(`${what}: the stream errored with ${describeError(signal.error)}, which does not match.${this.report()}`, {
        actual: signal.error,
        expected: matcher,
      });
    }
    this.cursor++;
    return this;
  }

  // ---- messages ----

  /** Not enough signals: retryable while more may come, final once the subscription is closed. */
  private missing(what: string, problem: string): never {
    const message = `${what}: ${problem}.${this.report()}`;
    if (this.closed) fail(message);
    return failNotYet(message);
  }

  private nextValues(count: number): unknown[] {
    return this.signalLog.slice(this.cursor, this.cursor + count).map((s) => (s.kind === 'next' ? s.value : this.showSignal(s)));
  }

  private describeSignal(signal: SinkSignal<V, T>): string {
    switch (signal.kind) {
      case 'next':
        return `emitted ${show(signal.value)}`;
      case 'complete':
        return 'completed';
      case 'error':
        return `errored with ${describeError(signal.error)}`;
    }
  }

  private showSignal(signal: SinkSignal<V, T>): string {
    switch (signal.kind) {
      case 'next':
        return `next(${show(signal.value)})`;
      case 'complete':
        return 'complete';
      case 'error':
        return `error(${describeError(signal.error)})`;
    }
  }

  /** What the sink has seen, for every failure message. */
  private report(): string {
    const state = this.completed
      ? 'completed'
      : this.errored
        ? `errored with ${describeError(this.error)}`
        : this.cancelledByTest
          ? 'cancelled by the test'
          : this.closed
            ? 'closed'
            : `open, outstanding demand ${this.outstanding}`;
    return (
      `\n  received: [${showList(this.received)}] (${this.cursor} signal(s) consumed by earlier expectations)` +
      `\n  unconsumed: [${this.signalLog
        .slice(this.cursor)
        .map((s) => this.showSignal(s))
        .join(', ')}]` +
      `\n  stream: ${state}`
    );
  }
}

function matches(error: unknown, matcher: ErrorMatcher): boolean {
  if (typeof matcher === 'string') return typeof error === 'object' && error !== null && (error as { code?: unknown }).code === matcher;
  return error instanceof matcher;
}

function describeError(error: unknown): string {
  if (error instanceof Error) {
    const code = (error as { code?: unknown }).code;
    return `${error.name}${code === undefined ? '' : ` [${String(code)}]`}: ${error.message}`;
  }
  return show(error);
}
