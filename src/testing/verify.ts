import { AssertionError } from 'node:assert';
import type { Observable, VirtualTimeScheduler } from 'rxjs';
import { assertionError, fail, isNotYet, retryUntil, show, showList, immediateTick, DEFAULT_MAX_TICKS, type WaitOptions } from './assert.js';
import { TestSink, type ErrorMatcher, type TestSinkOptions, type Unwrapped } from './sink.js';
import { checkVerifyOptions } from './options.js';

/**
 * Options of `verify`: those of `TestSink.subscribe`, the wait budget of
 * expectations, and the virtual clock `thenAwait` advances.
 *
 * ## Example
 * ```ts
 * const scheduler = new VirtualTimeScheduler();
 * await verify(source.pipe(stage(work, { timeout: 50, scheduler })), { scheduler, request: 1, maxTicks: 20 })
 *   .thenDo(() => source.emit(1))
 *   .thenAwait(50)
 *   .expectError(StageTimeoutError)
 *   .run();
 * ```
 */
export interface VerifyOptions extends TestSinkOptions, WaitOptions {
  /**
   * A virtual clock for `thenAwait(ms)`: the scheduler your stages were given as
   * their `scheduler` option (a `VirtualTimeScheduler` or RxJS `TestScheduler`).
   */
  scheduler?: VirtualTimeScheduler;
}

interface Step<V, T> {
  readonly description: string;
  /** Expectations wait (boundedly) for signals that have not arrived; actions run once. */
  readonly expectation: boolean;
  readonly run: (sink: TestSink<V, T>) => unknown;
}

/**
 * A step-by-step script over one subscription (Reactor's `StepVerifier`): demand,
 * actions and expectations run in order when `run()` is awaited. Build one with
 * `verify(flow)`; a script can be run more than once, each run on a new subscription.
 *
 * ## Example
 * ```ts
 * const script = verify(fromIterable([1, 2])).request(2).expectNext(1, 2).expectComplete();
 * await script.run();
 * ```
 */
export class Verifier<V, T = V> {
  private readonly steps: Step<V, T>[] = [];

  /** @internal Use `verify(flow, options)`. */
  constructor(
    private readonly source: Observable<T>,
    private readonly options: VerifyOptions,
  ) {}

  /** Requests `n` more elements (see `TestSink.request`). */
  request(n: number): this {
    return this.action(`request(${n})`, (sink) => void sink.request(n));
  }

  /** Same as `request(n)`; reads better after an expectation. */
  thenRequest(n: number): this {
    return this.request(n);
  }

  /** Cancels the subscription. */
  thenCancel(): this {
    return this.action('thenCancel()', (sink) => void sink.cancel());
  }

  /**
   * Runs `action` at this point of the script, awaiting what it returns (so it may be
   * async): emit from a `TestSource`, fire a kill switch, assert on stats...
   */
  thenDo(action: (sink: TestSink<V, T>) => unknown): this {
    return this.action(`thenDo(${action.name || 'action'})`, action);
  }

  /**
   * Advances the virtual clock given as `options.scheduler` by `ms`, running every
   * timer that falls due (and the Promise continuations they start). Never sleeps.
   */
  thenAwait(ms: number): this {
    return this.action(`thenAwait(${ms})`, () => this.advance(ms));
  }

  /** Expects these elements next (see `TestSink.expectNext`), waiting for them if the flow is asynchronous. */
  expectNext(...values: V[]): this {
    return this.expectation(`expectNext(${showList(values)})`, (sink) => void sink.expectNext(...values));
  }

  /** Expects `n` more elements, whatever they are. */
  expectNextCount(n: number): this {
    return this.expectation(`expectNextCount(${n})`, (sink) => void sink.expectNextCount(n));
  }

  /** Expects one more element and hands it (and its raw `Traced` envelope) to `assertion`. */
  consumeNextWith(assertion: (value: V, raw: T) => void): this {
    return this.expectation('consumeNextWith(...)', (sink) => void sink.consumeNextWith(assertion));
  }

  /** Lets the flow run for the whole wait budget (`maxTicks` ticks), then expects that nothing new arrived. */
  expectNoEvents(): this {
    return this.action('expectNoEvents()', async (sink) => {
      const tick = this.options.tick ?? immediateTick;
      for (let i = 0; i < (this.options.maxTicks ?? DEFAULT_MAX_TICKS); i++) {
        if (sink.pending.length > 0) break;
        await tick();
      }
      sink.expectNoEvents();
    });
  }

  /** Expects completion next. */
  expectComplete(): this {
    return this.expectation('expectComplete()', (sink) => void sink.expectComplete());
  }

  /** Expects an error next, matched by class or `code` when given. */
  expectError(matcher?: ErrorMatcher): this {
    const name = matcher === undefined ? '' : typeof matcher === 'string' ? show(matcher) : matcher.name;
    return this.expectation(`expectError(${name})`, (sink) => void sink.expectError(matcher));
  }

  /**
   * Subscribes (nothing happens before this), runs every step in order and resolves
   * with the sink, for further checks on `received`, `traced` or stats. A failing
   * step rejects with an `AssertionError` naming the step and what the sink received.
   * A subscription still open at the end is cancelled, so nothing leaks between tests.
   */
  async run(): Promise<TestSink<V, T>> {
    const { unwrap, request } = this.options;
    const sinkOptions: TestSinkOptions = { ...(unwrap !== undefined && { unwrap }), ...(request !== undefined && { request }) };
    const sink = TestSink.subscribe(this.source, sinkOptions) as unknown as TestSink<V, T>;
    try {
      for (const [index, step] of this.steps.entries()) {
        try {
          if (step.expectation) await retryUntil(() => void step.run(sink), this.options, isNotYet);
          else await step.run(sink);
        } catch (error) {
          if (error instanceof AssertionError) {
            throw assertionError(`verify: step ${index + 1} of ${this.steps.length}, ${step.description}, failed:\n${error.message}`, {
              actual: error.actual,
              expected: error.expected,
              operator: error.operator,
            });
          }
          throw error;
        }
      }
    } finally {
      if (!sink.closed) sink.cancel();
    }
    return sink;
  }

  private action(description: string, run: (sink: TestSink<V, T>) => unknown): this {
    this.steps.push({ description, expectation: false, run });
    return this;
  }

  private expectation(description: string, run: (sink: TestSink<V, T>) => void): this {
    this.steps.push({ description, expectation: true, run });
    return this;
  }

  private async advance(ms: number): Promise<void> {
    const scheduler = this.options.scheduler;
    if (scheduler === undefined) {
      fail(`thenAwait(${ms}) needs a virtual clock: pass the stages' scheduler as verify(flow, { scheduler }). The test kit never sleeps on the wall clock.`);
    }
    const target = scheduler.now() + ms;
    const maxFrames = scheduler.maxFrames;
    const tick = this.options.tick ?? immediateTick;
    const maxTicks = this.options.maxTicks ?? DEFAULT_MAX_TICKS;
    try {
      // Timers that fire may start Promise work that schedules more timers before `target`.
      for (let ticks = 0; scheduler.actions.some((action) => action.delay <= target); ticks++) {
        if (ticks > maxTicks) fail(`thenAwait(${ms}): timers kept falling due after ${maxTicks} ticks.`);
        scheduler.maxFrames = target;
        scheduler.flush();
        await tick();
      }
    } finally {
      scheduler.maxFrames = maxFrames;
    }
    if (scheduler.frame < target) scheduler.frame = target;
  }
}

/**
 * Builds a step-by-step verification of a flow (Reactor's `StepVerifier`). The flow
 * is subscribed when `run()` is awaited, with demand 0 unless `options.request` says
 * otherwise; `Traced` elements are unwrapped for expectations (see `TestSinkOptions`).
 *
 * Expectations wait for asynchronous work a bounded number of event-loop turns
 * (`maxTicks`, default 100 `setImmediate` turns) and fail at once on a wrong value or
 * an unexpected terminal signal; timers are advanced with `thenAwait(ms)` on an
 * injected virtual scheduler, never slept through.
 *
 * ## Example
 * ```ts
 * const source = new TestSource<number>();
 * await verify(source.pipe(stage(async (x: number) => x * 10, { capacity: 2 })))
 *   .thenDo(() => source.expectDemand(3))       // capacity 2 + concurrency 1
 *   .thenDo(() => source.emit(1, 2, 3))
 *   .request(2)
 *   .expectNext(10, 20)
 *   .thenRequest(1)
 *   .expectNext(30)
 *   .thenDo(() => source.complete())
 *   .expectComplete()
 *   .run();
 * ```
 */
export function verify<T>(source: Observable<T>, options: VerifyOptions & { unwrap: false }): Verifier<T, T>;
export function verify<T>(source: Observable<T>, options?: VerifyOptions & { unwrap?: true }): Verifier<Unwrapped<T>, T>;
export function verify<T>(source: Observable<T>, options?: VerifyOptions): Verifier<T | Unwrapped<T>, T>;
export function verify<T>(source: Observable<T>, options: VerifyOptions = {}): Verifier<T | Unwrapped<T>, T> {
  checkVerifyOptions(options);
  return new Verifier<T | Unwrapped<T>, T>(source, options);
}
