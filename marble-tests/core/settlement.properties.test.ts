/**
 * Settlements: whatever a pipeline does with an element (delivers it, sheds it, fails it, merges
 * it, streams several outputs from it, batches it, or ends with it inside), the element's source
 * is told how it ended, once. Random pipelines over plain values, no NATS: the link's settler is
 * replaced by one that records.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { Observable, from, take, tap, type OperatorFunction } from 'rxjs';
import { Settlement, type Settled, type Settler } from '../../src/core/settlement.js';
import { TraceContext, Traced } from '../../src/core/trace.js';
import { fromIterable } from '../../src/flow/sources.js';
import { untraced } from '../../src/flow/sinks.js';
import { stage } from '../../operators/stage.js';
import { batch, unbatch, type Batch } from '../../operators/batch.js';
import { broadcast } from '../../operators/broadcast.js';
import type { Policy } from '../../src/flow/options.js';

class Recorder implements Settler {
  readonly calls: Settled[] = [];
  settle(settled: Settled): void {
    this.calls.push(settled);
  }
}

type Work = 'sync' | 'promise' | 'stream';

interface StagePlan {
  policy: Policy;
  capacity: number;
  concurrency: number;
  work: Work;
  /** Outputs of streaming work: 0 (it filters), 1 or several. */
  outputs: number;
  errorPolicy: 'fail' | 'skip';
}

interface Plan {
  count: number;
  demandSource: boolean;
  a: StagePlan;
  middle: 'none' | 'batch' | 'broadcast';
  b: StagePlan;
  failing: number[];
  take: number | undefined;
}

const stagePlan = (policies: readonly Policy[]): fc.Arbitrary<StagePlan> =>
  fc.record({
    policy: fc.constantFrom(...policies),
    capacity: fc.integer({ min: 1, max: 4 }),
    concurrency: fc.integer({ min: 1, max: 3 }),
    work: fc.constantFrom<Work>('sync', 'promise', 'stream'),
    outputs: fc.integer({ min: 0, max: 3 }),
    errorPolicy: fc.constantFrom<'fail' | 'skip'>('skip', 'skip', 'fail'),
  });

const planArbitrary: fc.Arbitrary<Plan> = fc.record({
  count: fc.integer({ min: 0, max: 25 }),
  demandSource: fc.boolean(),
  a: stagePlan(['pause', 'shed-incoming', 'shed-oldest', 'conflate']),
  middle: fc.constantFrom<'none' | 'batch' | 'broadcast'>('none', 'batch', 'broadcast'),
  b: stagePlan(['pause']),
  failing: fc.array(fc.integer({ min: 0, max: 24 }), { maxLength: 3 }),
  take: fc.option(fc.integer({ min: 1, max: 30 }), { nil: undefined, freq: 3 }),
});

const tick = () => new Promise<void>((resolve) => setTimeout(resolve, 0));

function stageOf(plan: StagePlan, failing: ReadonlySet<number>, name: string): OperatorFunction<Traced<number>, Traced<number>> {
  const check = (value: number): number => {
    if (failing.has(value)) throw new Error(`${name} refuses ${value}`);
    return value;
  };
  const work =
    plan.work === 'sync'
      ? (value: number) => check(value)
      : plan.work === 'promise'
        ? async (value: number) => {
            await tick();
            return check(value);
          }
        : (value: number) =>
            new Observable<number>((subscriber) => {
              check(value);
              let sent = 0;
              const timer = setInterval(() => {
                if (sent < plan.outputs) subscriber.next(value + 1000 * ++sent);
                else subscriber.complete();
              }, 0);
              return () => clearInterval(timer);
            });
  return stage(work, {
    name,
    policy: plan.policy,
    capacity: plan.capacity,
    concurrency: plan.concurrency,
    errorPolicy: plan.errorPolicy,
    ...(plan.policy === 'conflate' ? { conflate: (_older: number, newer: number) => newer } : {}),
  }) as OperatorFunction<Traced<number>, Traced<number>>;
}

/** Runs `plan`; resolves with each emitted element's recorder once the run ended and went quiet. */
async function run(plan: Plan): Promise<{ recorders: Recorder[]; emitted: number; ended: 'complete' | 'error' }> {
  const failing = new Set(plan.failing);
  const recorders: Recorder[] = [];
  const elements = Array.from({ length: plan.count }, (_, i) => {
    const recorder = new Recorder();
    const trace = new TraceContext(i, false);
    trace.settlement = new Settlement(recorder);
    recorders.push(recorder);
    return new Traced(i, trace);
  });
  let emitted = 0;
  const counted = (plan.demandSource ? fromIterable(elements) : from(elements)).pipe(tap(() => emitted++));
  let pipeline = counted.pipe(stageOf(plan.a, failing, 'a'));
  if (plan.middle === 'batch') {
    pipeline = pipeline.pipe(
      batch<number>({ maxSize: 3, maxWait: 1 }),
      stage((group: Batch<number>) => group.withResults(group.items.slice())),
      unbatch<number>(),
    );
  } else if (plan.middle === 'broadcast') {
    pipeline = pipeline.pipe(broadcast<number, Traced<number>>({ branches: 2, branch: (lane) => lane, capacity: 2 }));
  }
  const values = pipeline.pipe(stageOf(plan.b, failing, 'b'), untraced());
  const ended = await new Promise<'complete' | 'error'>((resolve) => {
    (plan.take === undefined ? values : values.pipe(take(plan.take))).subscribe({
      error: () => resolve('error'),
      complete: () => resolve('complete'),
    });
  });
  for (let i = 0; i < 5; i++) await tick(); // work let go by a cancel may still call back
  return { recorders, emitted, ended };
}

describe('settlements: every element its source handed on is settled once, however the run ends', () => {
  it('random pipelines: shed, conflated, failed, streamed, batched, broadcast, cancelled by take, failed runs', async () => {
    await fc.assert(
      fc.asyncProperty(planArbitrary, async (plan) => {
        const { recorders, emitted } = await run(plan);
        recorders.forEach((recorder, i) => {
          if (i < emitted) assert.equal(recorder.calls.length, 1, `element ${i} was settled ${recorder.calls.length} times`);
          else assert.equal(recorder.calls.length, 0, `element ${i} never entered but was settled`);
          const settled = recorder.calls[0];
          // Merged by `conflate`, an element settles as the one it was merged into.
          if (settled?.outcome === 'failed' && plan.a.policy !== 'conflate')
            assert.ok(plan.failing.includes(i), `element ${i} failed, yet no stage refuses it`);
        });
      }),
      { numRuns: Number(process.env.RUNS ?? 150) },
    );
  });

  it('a run that completes settles each element delivered, unless a stage shed or failed it', async () => {
    const recorders = (
      await run({
        count: 6,
        demandSource: true,
        a: { policy: 'pause', capacity: 2, concurrency: 2, work: 'stream', outputs: 2, errorPolicy: 'skip' },
        middle: 'none',
        b: { policy: 'pause', capacity: 2, concurrency: 1, work: 'promise', outputs: 1, errorPolicy: 'skip' },
        failing: [4],
        take: undefined,
      })
    ).recorders;
    assert.deepEqual(
      recorders.map((recorder) => recorder.calls.map((call) => call.outcome)),
      [['delivered'], ['delivered'], ['delivered'], ['delivered'], ['failed'], ['delivered']],
    );
  });
});
