/**
 * What every probe of the test kit shares: how it fails (a `node:assert`
 * `AssertionError`, so any test runner reports it), how it prints values, and how it
 * waits for asynchronous flows — a bounded number of event-loop turns, never a
 * wall-clock sleep.
 */
import { AssertionError } from 'node:assert';
import { inspect } from 'node:util';
import { checkWaitOptions } from './options.js';

/**
 * How long an asynchronous expectation may wait, counted in event-loop turns rather
 * than milliseconds.
 *
 * ## Example
 * ```ts
 * await eventually(() => sink.expectNext(1), { maxTicks: 10 });
 * ```
 */
export interface WaitOptions {
  /**
   * Turns of `tick` an expectation may wait before it fails. Default 100. A whole
   * Promise chain settles within one turn, so this only bounds chains of macrotasks.
   */
  maxTicks?: number;
  /**
   * Lets asynchronous work progress by one step. Default: one `setImmediate` turn
   * (every pending microtask and Promise continuation runs first). Inject your own to
   * drive a virtual clock between checks.
   */
  tick?: () => unknown;
}

export const DEFAULT_MAX_TICKS = 100;

/** One `setImmediate` turn: microtasks queued before it have all run when it resolves. */
export function immediateTick(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

export interface FailureDetails {
  actual?: unknown;
  expected?: unknown;
  operator?: string;
}

/**
 * An `AssertionError` with exactly `message`, carrying `actual`/`expected` for
 * runners that render their own diff (set after construction: given to the
 * constructor, Node appends a second diff to a message that already shows both).
 */
export function assertionError(message: string, details: FailureDetails = {}): AssertionError {
  const error = new AssertionError({ message, operator: 'fail' });
  if ('actual' in details) error.actual = details.actual;
  if ('expected' in details) error.expected = details.expected;
  if (details.operator !== undefined) error.operator = details.operator;
  return error;
}

/** Throws `assertionError(message, details)`. */
export function fail(message: string, details: FailureDetails = {}): never {
  throw assertionError(message, details);
}

/** A value as one readable line. */
export function show(value: unknown): string {
  return inspect(value, { depth: 4, breakLength: Infinity, maxArrayLength: 50 });
}

/** `a, b, c` — the argument list of an expectation, for messages. */
export function showList(values: readonly unknown[]): string {
  return values.map(show).join(', ');
}

// Failures that may still turn into passes if the flow is given time (too few
// signals so far). Anything else — a wrong value, an unexpected terminal signal —
// cannot improve by waiting, so an asynchronous expectation reports it at once.
const notYetErrors = new WeakSet<object>();

/** Marks `error` as "the awaited signal has not arrived yet"; returns it. */
export function notYet<E extends object>(error: E): E {
  notYetErrors.add(error);
  return error;
}

export function isNotYet(error: unknown): boolean {
  return typeof error === 'object' && error !== null && notYetErrors.has(error);
}

/** Runs `fail` but marks the thrown error as retryable (see `notYet`). */
export function failNotYet(message: string, details: FailureDetails = {}): never {
  throw notYet(assertionError(message, details));
}

/**
 * Retries `check` once per tick while it throws an error `retry` accepts, up to
 * `maxTicks` ticks; resolves as soon as it passes. Returns the ticks waited.
 */
export async function retryUntil(check: () => void, options: WaitOptions, retry: (error: unknown) => boolean): Promise<number> {
  const maxTicks = options.maxTicks ?? DEFAULT_MAX_TICKS;
  const tick = options.tick ?? immediateTick;
  for (let ticks = 0; ; ticks++) {
    try {
      check();
      return ticks;
    } catch (error) {
      if (!retry(error) || ticks >= maxTicks) {
        if (retry(error) && ticks > 0 && error instanceof AssertionError) {
          error.message += `\n  (gave up after waiting ${ticks} tick${ticks === 1 ? '' : 's'})`;
        }
        throw error;
      }
    }
    await tick();
  }
}

/**
 * Retries an assertion until it passes, for flows whose work is asynchronous: the
 * assertion runs at once, then again after each tick (a `setImmediate` turn by
 * default), at most `maxTicks` times; the last failure is rethrown. The wait is
 * bounded by turns of the event loop, not by time, so a test does not become
 * timing-sensitive.
 *
 * ## Example
 * ```ts
 * const sink = TestSink.subscribe(fromIterable([1, 2]).pipe(stage(async (x: number) => x * 10)), { request: 2 });
 * await eventually(() => sink.expectNext(10, 20));
 * await eventually(() => sink.expectComplete());
 * ```
 *
 * An expectation of the kit consumes signals only when it passes, so retrying one is
 * safe; put one consuming expectation in each call (a chain that passed halfway would
 * be retried from its start against signals it already consumed).
 *
 * Give `assert.ok` a message inside it: without one, Node parses the calling file to
 * write the message on every failed try, which can take seconds per try in a long file.
 */
export async function eventually(assertion: () => void, options: WaitOptions = {}): Promise<void> {
  checkWaitOptions(options);
  await retryUntil(assertion, options, () => true);
}
