import type { ShedReason } from '../flow/options.js';
import type { StageStats } from '../flow/stats.js';
import { fail } from './assert.js';

/**
 * Counters a test expects of a finished stage run; any field left out is not checked.
 *
 * ## Example
 * ```ts
 * expectAccounted(stats, { received: 5, delivered: 3, shed: { 'buffer-full': 2 } });
 * ```
 */
export interface ExpectedAccounting {
  received?: number;
  delivered?: number;
  emitted?: number;
  failed?: number;
  conflated?: number;
  /** Shed counts by reason; reasons left out are not checked. */
  shed?: Partial<Record<ShedReason, number>>;
  /** Shed count over every reason. */
  shedTotal?: number;
}

/**
 * Asserts that a stage accounted for every element once its run has ended: nothing
 * is still buffered or in flight, and `received === delivered + shed + failed`
 * (every element that enters leaves exactly once). Counters named in `expected` are
 * checked too. Throws an `AssertionError` showing the whole breakdown.
 *
 * ## Example
 * ```ts
 * const stats = new StageStats();
 * const sink = TestSink.subscribe(source.pipe(stage(work, { capacity: 2, policy: 'shed-incoming', stats })));
 * source.emit(1, 2, 3, 4, 5);
 * sink.cancel();
 * expectAccounted(stats, { received: 5, shed: { 'buffer-full': 2, cancelled: 3 } });
 * ```
 */
export function expectAccounted(stats: StageStats, expected: ExpectedAccounting = {}): void {
  const breakdown =
    `\n  received ${stats.received}, delivered ${stats.delivered}, failed ${stats.failed}, shed ${stats.shedTotal} ${JSON.stringify(stats.shed)}` +
    `\n  emitted ${stats.emitted}, conflated ${stats.conflated}, buffered now ${stats.buffered}, in flight now ${stats.inFlight}`;
  if (stats.buffered !== 0 || stats.inFlight !== 0) {
    fail(`expectAccounted: the run has not ended (elements are still buffered or in flight); check after the stream terminates or is cancelled.${breakdown}`);
  }
  const accounted = stats.delivered + stats.shedTotal + stats.failed;
  if (stats.received !== accounted) {
    fail(
      `expectAccounted: received ${stats.received} but delivered + shed + failed = ${accounted}: ${stats.received - accounted} element(s) unaccounted for.${breakdown}`,
      {
        actual: accounted,
        expected: stats.received,
        operator: 'strictEqual',
      },
    );
  }
  const mismatches: string[] = [];
  const check = (name: string, actual: number, wanted: number | undefined): void => {
    if (wanted !== undefined && actual !== wanted) mismatches.push(`${name}: expected ${wanted}, got ${actual}`);
  };
  check('received', stats.received, expected.received);
  check('delivered', stats.delivered, expected.delivered);
  check('emitted', stats.emitted, expected.emitted);
  check('failed', stats.failed, expected.failed);
  check('conflated', stats.conflated, expected.conflated);
  check('shedTotal', stats.shedTotal, expected.shedTotal);
  for (const [reason, count] of Object.entries(expected.shed ?? {})) check(`shed["${reason}"]`, stats.shed[reason as ShedReason], count);
  if (mismatches.length > 0) fail(`expectAccounted: ${mismatches.join('; ')}.${breakdown}`);
}
