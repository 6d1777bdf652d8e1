/**
 * `sluice/testing` — probes for demand-driven tests (Akka's `TestSource`/`TestSink`,
 * Reactor's `TestPublisher`/`StepVerifier`), for any test runner: failures are
 * `node:assert` `AssertionError`s and nothing here depends on `node:test`.
 *
 * - `TestSource`: an upstream probe; the test sees the demand and emits by hand.
 * - `TestSink`: a downstream probe; the test requests and checks what arrived.
 * - `verify(flow)`: a step-by-step script over a `TestSink`, for asynchronous flows.
 * - `expectAccounted(stats)`: every element a stage received left it exactly once.
 * - `eventually(assertion)`: retries an assertion for a bounded number of event-loop turns.
 *
 * ## Example
 * ```ts
 * import { TestSource, TestSink } from 'sluice/testing';
 *
 * const source = new TestSource<number>();
 * const sink = TestSink.subscribe(source.pipe(stage((x: number) => x + 1, { capacity: 2 })));
 * source.expectDemand(3).emit(1, 2, 3);
 * sink.request(1).expectNext(2);
 * ```
 *
 * @module
 */
export { TestSource, type TestSourceState } from './source.js';
export { TestSink, type TestSinkOptions, type SinkSignal, type Unwrapped, type ErrorMatcher } from './sink.js';
export { verify, Verifier, type VerifyOptions } from './verify.js';
export { expectAccounted, type ExpectedAccounting } from './accounting.js';
export { eventually, type WaitOptions } from './assert.js';
