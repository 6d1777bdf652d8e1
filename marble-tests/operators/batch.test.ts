import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { TestScheduler } from 'rxjs/testing';
import { Subject, VirtualTimeScheduler, delay, filter, map, of, take, tap, type Observable, type OperatorFunction } from 'rxjs';
import { Batch, batch, unbatch, type BatchOptions } from '../../operators/batch.js';
import { stage } from '../../operators/stage.js';
import { subscribeWithDemand, type Flow } from '../../src/flow/demand.js';
import { fromIterable } from '../../src/flow/sources.js';
import { StageStats } from '../../src/flow/stats.js';
import { TraceContext, Traced, traced } from '../../src/core/trace.js';
import { BatchMismatchError, InvalidOptionsError, UnpausableSourceError } from '../../src/core/errors.js';

function scheduler(): TestScheduler {
  return new TestScheduler((actual, expected) => assert.deepEqual(actual, expected));
}

const itemsOf = <T>(): OperatorFunction<Traced<Batch<T>>, T[]> => map((t) => [...t.value.items]);
const keyedItemsOf = <T>(): OperatorFunction<Traced<Batch<T>>, { key: string | undefined; items: T[] }> =>
  map((t) => ({ key: t.value.key, items: [...t.value.items] }));

/**
 * An endless source that counts how many elements were pulled from it and whether it was closed.
 * It fails after `runaway` pulls so an operator that ignores backpressure fails the test instead of hanging it.
 */
function counting(runaway = 10_000): { source: Flow<number>; pulled: () => number; closed: () => boolean } {
  let pulled = 0;
  let closed = false;
  function* generate(): Generator<number> {
    try {
      for (let i = 0; ; i++) {
        if (pulled === runaway) throw new Error(`runaway: ${runaway} elements pulled`);
        pulled++;
        yield i;
      }
    } finally {
      closed = true;
    }
  }
  return { source: fromIterable(generate()), pulled: () => pulled, closed: () => closed };
}

/** Runs virtual time forward to `frame`, leaving the clock there even when nothing was scheduled. */
function advanceTo(vts: VirtualTimeScheduler, frame: number): void {
  vts.maxFrames = frame;
  vts.flush();
  vts.frame = frame;
}

function invalid(fn: () => unknown): InvalidOptionsError {
  try {
    fn();
  } catch (err) {
    assert.ok(err instanceof InvalidOptionsError, `expected InvalidOptionsError, got ${String(err)}`);
    assert.equal(err.code, 'INVALID_OPTIONS');
    return err;
  }
  assert.fail('expected the options to be rejected');
}

describe('batch: size and time', () => {
  it('emits a batch the moment it holds maxSize items, and the rest on completion', () => {
    scheduler().run(({ cold, expectObservable }) => {
      const source = cold('a-b-c-d-e|');
      expectObservable(source.pipe(batch<string>({ maxSize: 2, maxWait: 100 }), itemsOf())).toBe('--x---y--(z|)', {
        x: ['a', 'b'],
        y: ['c', 'd'],
        z: ['e'],
      });
    });
  });

  it('behaves as its documented marble diagram', () => {
    scheduler().run(({ cold, expectObservable }) => {
      const source = cold('-a-b-c-------d-------e--|');
      expectObservable(source.pipe(batch<string>({ maxSize: 3, maxWait: 5 }), itemsOf())).toBe('-----x------------y-----(z|)', {
        x: ['a', 'b', 'c'],
        y: ['d'],
        z: ['e'],
      });
    });
  });

  it('emits a partial batch maxWait after its first item arrived (not after subscription)', () => {
    scheduler().run(({ cold, expectObservable }) => {
      const source = cold('---a-b 20ms c|');
      expectObservable(source.pipe(batch<string>({ maxSize: 10, maxWait: 10 }), itemsOf())).toBe('13ms x 13ms (y|)', {
        x: ['a', 'b'],
        y: ['c'],
      });
    });
  });

  it('gathers one batch per key, each with its own timer, and a key that fills does not reset the others', () => {
    scheduler().run(({ cold, expectObservable }) => {
      const source = cold('a-b--c-d------e 20ms |', { a: 'x1', b: 'y1', c: 'x2', d: 'x3', e: 'x4' });
      const keyed = batch<string>({ maxSize: 3, maxWait: 10, key: (s) => s[0]! });
      expectObservable(source.pipe(keyed, keyedItemsOf())).toBe('7ms x 4ms y 11ms z 10ms |', {
        x: { key: 'x', items: ['x1', 'x2', 'x3'] }, // full at 7
        y: { key: 'y', items: ['y1'] }, // its own timer: 2 + 10
        z: { key: 'x', items: ['x4'] }, // a new timer from x4's arrival: 14 + 10
      });
    });
  });

  it('reads timers and the clock from the scheduler option', () => {
    const vts = new VirtualTimeScheduler();
    const subject = new Subject<string>();
    const seen: [number, string[]][] = [];
    subject.pipe(batch<string>({ maxSize: 10, maxWait: 7, scheduler: vts })).subscribe((t) => seen.push([vts.now(), [...t.value.items]]));
    subject.next('a');
    advanceTo(vts, 6);
    assert.deepEqual(seen, []);
    advanceTo(vts, 7);
    assert.deepEqual(seen, [[7, ['a']]]);
  });
});

describe('batch: backpressure', () => {
  it('holds a due batch while downstream has no demand, keeps filling it, and emits it when demand arrives — never an overflow error', () => {
    const ts = scheduler();
    ts.run(({ hot, flush }) => {
      //            a@0 b@2  due@4 (no demand)  c@9 fills it  d@11 e@13 due@15          g@32
      const source = hot('a-b------c-d-e------------------g');
      const seen: [number, string[]][] = [];
      const errors: unknown[] = [];
      const subscription = subscribeWithDemand(source.pipe(batch<string>({ maxSize: 3, maxWait: 4 })), {
        next: (t) => seen.push([ts.now(), [...t.value.items]]),
        error: (err) => errors.push(err),
      });
      ts.schedule(() => subscription.request(1), 20);
      ts.schedule(() => subscription.request(2), 30);
      flush();
      assert.deepEqual(errors, []);
      assert.deepEqual(seen, [
        [20, ['a', 'b', 'c']], // due at 4, grew to maxSize while waiting, out at the first request
        [30, ['d', 'e']], // due at 15, waited for the second request
        [36, ['g']], // demand was left over: out on time
      ]);
    });
  });

  it('a batch that fills while it waits for demand is sealed: the next item opens a new batch with its own timer', () => {
    const vts = new VirtualTimeScheduler();
    const subject = new Subject<number>();
    const seen: number[][] = [];
    const subscription = subscribeWithDemand(subject.pipe(batch<number>({ maxSize: 2, maxWait: 5, scheduler: vts })), {
      next: (t) => seen.push([...t.value.items]),
    });
    subject.next(1);
    advanceTo(vts, 10); // due, no demand
    subject.next(2); // fills it
    subject.next(3); // a new batch, due at 15
    assert.deepEqual(seen, []);
    subscription.request(1);
    assert.deepEqual(seen, [[1, 2]]);
    subscription.request(1);
    assert.deepEqual(seen, [[1, 2]], 'the new batch is not due before its own maxWait');
    advanceTo(vts, 15);
    assert.deepEqual(seen, [[1, 2], [3]]);
  });

  it('in a pipeline, batches wait while a slow stage downstream is busy: nothing lost, no overflow', () => {
    scheduler().run(({ cold, expectObservable }) => {
      const source = cold('abcdefgh|');
      const slowInference = (b: Batch<string>) => of(b).pipe(delay(10));
      const pipeline = source.pipe(batch<string>({ maxSize: 2, maxWait: 3 }), stage(slowInference, { capacity: 1 }), itemsOf());
      // [a,b] is worked on from 1, [c,d] waits in the stage, [e,f] and [g,h] wait in the batcher for demand.
      expectObservable(pipeline).toBe('11ms w 9ms x 9ms y 9ms (z|)', {
        w: ['a', 'b'],
        x: ['c', 'd'],
        y: ['e', 'f'],
        z: ['g', 'h'],
      });
    });
  });

  it('stops pulling upstream when capacity items are held, and resumes as batches leave', () => {
    const vts = new VirtualTimeScheduler();
    const { source, pulled, closed } = counting();
    const stats = new StageStats();
    const seen: number[][] = [];
    const subscription = subscribeWithDemand(source.pipe(batch<number>({ maxSize: 2, maxWait: 10, capacity: 4, scheduler: vts, stats })), {
      next: (t) => seen.push([...t.value.items]),
    });
    assert.equal(pulled(), 4, 'an endless source is pulled only up to capacity');
    assert.equal(stats.buffered, 4);
    assert.equal(stats.pauses, 1);
    advanceTo(vts, 100);
    assert.equal(pulled(), 4, 'time passing pulls nothing more');
    subscription.request(1);
    assert.deepEqual(seen, [[0, 1]]);
    assert.equal(pulled(), 6, 'one batch out, room for two more items');
    subscription.request(2);
    assert.deepEqual(seen, [
      [0, 1],
      [2, 3],
      [4, 5],
    ]);
    assert.equal(pulled(), 10);
    subscription.cancel();
    assert.ok(closed(), 'cancel ends the upstream (the generator is returned)');
    assert.equal(stats.shed.cancelled, 4);
    assert.equal(stats.received, stats.delivered + stats.shedTotal + stats.failed);
  });

  it('pulls a synchronous endless source only up to capacity, and ends it when a take() downstream has had enough', () => {
    const { source, pulled, closed } = counting();
    const seen: number[][] = [];
    const subscription = subscribeWithDemand(source.pipe(batch<number>({ maxSize: 3, maxWait: 10 }), take(2)), {
      next: (t) => seen.push([...t.value.items]),
    });
    assert.equal(pulled(), 12, 'default capacity is maxSize × 4');
    subscription.request(Infinity);
    assert.deepEqual(seen, [
      [0, 1, 2],
      [3, 4, 5],
    ]);
    assert.equal(pulled(), 12);
    assert.ok(closed());
  });

  it('fails with UnpausableSourceError when a source that cannot be paused exceeds capacity', () => {
    const vts = new VirtualTimeScheduler();
    const subject = new Subject<number>();
    const stats = new StageStats();
    const errors: unknown[] = [];
    subscribeWithDemand(subject.pipe(batch<number>({ name: 'gather', maxSize: 2, maxWait: 5, capacity: 2, scheduler: vts, stats })), {
      error: (err) => errors.push(err),
    });
    subject.next(1);
    subject.next(2);
    assert.equal(errors.length, 0);
    subject.next(3);
    assert.equal(errors.length, 1);
    const [error] = errors;
    assert.ok(error instanceof UnpausableSourceError);
    assert.equal(error.stage, 'gather');
    assert.equal(subject.observed, false);
    assert.equal(stats.failed, 3);
    assert.equal(vts.actions.length, 0);
  });
});

describe('batch: completion, errors, unsubscription', () => {
  it('on completion flushes every open batch as demand allows, then completes', () => {
    const vts = new VirtualTimeScheduler();
    const seen: number[][] = [];
    let completed = false;
    const subscription = subscribeWithDemand(
      fromIterable([1, 2, 3, 4, 5]).pipe(batch<number>({ maxSize: 2, maxWait: 10, key: (n) => (n % 2 ? 'odd' : 'even'), scheduler: vts })),
      { next: (t) => seen.push([...t.value.items]), complete: () => (completed = true) },
    );
    assert.deepEqual(seen, []);
    subscription.request(1);
    assert.deepEqual(seen, [[1, 3]]);
    assert.equal(completed, false, 'held batches are still owed');
    subscription.request(2);
    assert.deepEqual(seen, [[1, 3], [2, 4], [5]]);
    assert.equal(completed, true);
    assert.equal(vts.actions.length, 0, 'no timer outlives the stream');
  });

  it('an upstream error errors at once, dropping open batches and counting their items as failed', () => {
    const stats = new StageStats();
    scheduler().run(({ cold, expectObservable }) => {
      const source = cold('a-b-c-#', undefined, new Error('boom'));
      expectObservable(source.pipe(batch<string>({ maxSize: 2, maxWait: 100, stats }), itemsOf())).toBe('--x---#', { x: ['a', 'b'] }, new Error('boom'));
    });
    assert.equal(stats.received, 3);
    assert.equal(stats.delivered, 2);
    assert.equal(stats.failed, 1);
    assert.equal(stats.buffered, 0);
  });

  it('unsubscribing ends the upstream subscription', () => {
    scheduler().run(({ cold, expectObservable, expectSubscriptions }) => {
      const source = cold('a-b-c 50ms |');
      expectObservable(source.pipe(batch<string>({ maxSize: 10, maxWait: 20 }), itemsOf()), '---!').toBe('');
      expectSubscriptions(source.subscriptions).toBe('^--!');
    });
  });

  it('unsubscribing clears every timer (one per open key)', () => {
    const vts = new VirtualTimeScheduler();
    const subject = new Subject<string>();
    const stats = new StageStats();
    const seen: string[][] = [];
    const subscription = subject
      .pipe(batch<string>({ maxSize: 10, maxWait: 20, key: (s) => s, scheduler: vts, stats }))
      .subscribe((t) => seen.push([...t.value.items]));
    subject.next('x');
    subject.next('y');
    subject.next('x');
    assert.equal(vts.actions.length, 2, 'one timer per open batch');
    subscription.unsubscribe();
    assert.equal(vts.actions.length, 0);
    assert.equal(subject.observed, false);
    vts.flush();
    assert.deepEqual(seen, []);
    assert.equal(stats.shed.cancelled, 3);
    assert.equal(stats.buffered, 0);
  });
});

describe('batch: options', () => {
  it('rejects maxSize 0, naming the field', () => {
    const err = invalid(() => batch({ maxSize: 0, maxWait: 10 }));
    assert.deepEqual(
      err.issues.map((i) => i.path),
      ['maxSize'],
    );
    assert.match(err.message, /maxSize/);
  });

  it('rejects a negative maxWait, naming the field', () => {
    const err = invalid(() => batch({ maxSize: 1, maxWait: -1 }));
    assert.deepEqual(
      err.issues.map((i) => i.path),
      ['maxWait'],
    );
  });

  it('names every bad field at once', () => {
    const err = invalid(() => batch({ maxSize: 1.5, maxWait: 0, key: 'model' } as unknown as BatchOptions<unknown>));
    assert.deepEqual(err.issues.map((i) => i.path).sort(), ['key', 'maxSize', 'maxWait']);
  });

  it('rejects an unknown field, naming it', () => {
    const err = invalid(() => batch({ maxSize: 1, maxWait: 1, maxsize: 2 } as BatchOptions<unknown>));
    assert.match(err.message, /maxsize/);
  });

  it('rejects missing maxSize and maxWait, and a capacity below maxSize', () => {
    const missing = invalid(() => batch({} as BatchOptions<unknown>));
    assert.deepEqual(missing.issues.map((i) => i.path).sort(), ['maxSize', 'maxWait']);
    const small = invalid(() => batch({ maxSize: 4, maxWait: 1, capacity: 3 }));
    assert.deepEqual(
      small.issues.map((i) => i.path),
      ['capacity'],
    );
  });

  it('unbatch rejects a capacity of 0 and unknown fields', () => {
    assert.deepEqual(
      invalid(() => unbatch({ capacity: 0 })).issues.map((i) => i.path),
      ['capacity'],
    );
    assert.match(invalid(() => unbatch({ size: 2 } as object)).message, /size/);
  });
});

describe('batch: traces', () => {
  it('gives plain inputs new traces, keeps traced inputs’ traces per item, and uses the first as the envelope trace', () => {
    const inputs = [traced('a', { seq: 100 }), traced('b', { seq: 101 })];
    const out: Traced<Batch<string>>[] = [];
    fromIterable<string | Traced<string>>([inputs[0]!, 'plain', inputs[1]!])
      .pipe(batch<string>({ maxSize: 3, maxWait: 10 }))
      .subscribe((t) => out.push(t));
    assert.equal(out.length, 1);
    const [only] = out;
    assert.deepEqual(only!.value.items, ['a', 'plain', 'b']);
    assert.equal(only!.value.traces[0], inputs[0]!.trace);
    assert.equal(only!.value.traces[2], inputs[1]!.trace);
    assert.ok(only!.value.traces[1] instanceof TraceContext);
    assert.notEqual(only!.value.traces[1], inputs[0]!.trace);
    assert.equal(only!.trace, inputs[0]!.trace);
  });

  it('records, for sampled items, how long each waited for its batch and how long the batch waited for demand', () => {
    const vts = new VirtualTimeScheduler();
    const subject = new Subject<string>();
    const traces: TraceContext[] = [];
    const options = { name: 'gather', maxSize: 10, maxWait: 10, sampleRate: 1, scheduler: vts };
    const subscription = subscribeWithDemand(subject.pipe(batch<string>(options)), { next: (t) => traces.push(...t.value.traces) });
    vts.schedule(() => subject.next('a'), 0);
    vts.schedule(() => subject.next('b'), 3);
    vts.schedule(() => subscription.request(1), 15); // due at 10, out at 15
    vts.flush();
    assert.equal(traces.length, 2);
    assert.deepEqual(
      traces.map((t) => t.record('gather')),
      [
        { stage: 'gather', queueWait: 10, service: 0, paused: 5, retries: 0, conflated: 0 },
        { stage: 'gather', queueWait: 7, service: 0, paused: 5, retries: 0, conflated: 0 },
      ],
    );
  });
});

describe('Batch', () => {
  it('withResults maps results back to items, keeping key and per-item traces', () => {
    const traces = [new TraceContext(0, false), new TraceContext(1, false)];
    const original = new Batch('m', ['p', 'q'], traces);
    const results = original.withResults([10, 20]);
    assert.equal(results.key, 'm');
    assert.deepEqual(results.items, [10, 20]);
    assert.equal(results.traces, original.traces);
  });

  it('withResults throws BatchMismatchError when the result count differs from the item count', () => {
    const original = new Batch(undefined, ['p', 'q'], [new TraceContext(0, false), new TraceContext(1, false)]);
    assert.throws(
      () => original.withResults([1]),
      (err: unknown) => err instanceof BatchMismatchError && err.code === 'BATCH_MISMATCH' && err.expected === 2 && err.actual === 1,
    );
    assert.throws(() => new Batch(undefined, ['p'], []), BatchMismatchError);
  });
});

describe('unbatch', () => {
  const batchOf = <T>(items: T[], seq0: number): Batch<T> =>
    new Batch(
      undefined,
      items,
      items.map((_, i) => new TraceContext(seq0 + i, false)),
    );

  it('emits one output per item, each with its own item trace (not the envelope trace)', () => {
    const b1 = batchOf(['a', 'b'], 0);
    const b2 = batchOf(['c'], 2);
    const out: Traced<string>[] = [];
    let completed = false;
    fromIterable<Batch<string> | Traced<Batch<string>>>([new Traced(b1, new TraceContext(99, false)), b2])
      .pipe(unbatch())
      .subscribe({ next: (t) => out.push(t), complete: () => (completed = true) });
    assert.deepEqual(
      out.map((t) => t.value),
      ['a', 'b', 'c'],
    );
    assert.deepEqual(
      out.map((t) => t.trace),
      [...b1.traces, ...b2.traces],
    );
    assert.ok(completed);
  });

  it('emits items only while downstream wants them and pulls the next batch only when the current one is out', () => {
    let pulled = 0;
    function* batches(): Generator<Batch<number>> {
      pulled++;
      yield batchOf([1, 2, 3], 0);
      pulled++;
      yield batchOf([4], 3);
    }
    const seen: number[] = [];
    let completed = false;
    const subscription = subscribeWithDemand(fromIterable(batches()).pipe(unbatch<number>()), {
      next: (t) => seen.push(t.value),
      complete: () => (completed = true),
    });
    assert.equal(pulled, 1, 'one batch is held before any demand');
    assert.deepEqual(seen, []);
    subscription.request(2);
    assert.deepEqual(seen, [1, 2]);
    assert.equal(pulled, 1);
    subscription.request(1);
    assert.deepEqual(seen, [1, 2, 3]);
    assert.equal(pulled, 2);
    assert.equal(completed, false);
    subscription.request(5);
    assert.deepEqual(seen, [1, 2, 3, 4]);
    assert.ok(completed);
  });

  it('behaves as its documented marble diagram', () => {
    scheduler().run(({ cold, expectObservable }) => {
      const source = cold('----x---------(y|)', { x: batchOf(['a', 'b', 'c'], 0), y: batchOf(['d'], 3) });
      expectObservable(
        source.pipe(
          unbatch<string>(),
          map((t) => t.value),
        ),
      ).toBe('----(abc)-----(d|)');
    });
  });

  it('round-trips per-item traces through batch → batched stage → unbatch', () => {
    const inputs = Array.from({ length: 7 }, (_, i) => traced(i, { seq: i }));
    const stats = new StageStats();
    const out: Traced<number>[] = [];
    const sizes: number[] = [];
    const pipeline: Observable<Traced<number>> = fromIterable(inputs).pipe(
      batch({ maxSize: 3, maxWait: 10, stats }),
      stage((b: Batch<number>) => {
        sizes.push(b.size);
        return b.withResults(b.items.map((x) => x * 10));
      }),
      unbatch(),
    );
    pipeline.subscribe((t) => out.push(t));
    assert.deepEqual(sizes, [3, 3, 1]);
    assert.deepEqual(
      out.map((t) => t.value),
      [0, 10, 20, 30, 40, 50, 60],
    );
    out.forEach((t, i) => assert.equal(t.trace, inputs[i]!.trace, `item ${i} keeps its own trace`));
    assert.equal(stats.emitted, 3);
    assert.equal(stats.delivered, 7);
  });
});

describe('batch: properties', () => {
  it('under any demand, timing and filter upstream, every input appears exactly once, in order within its key, in batches of 1..maxSize, never beyond demand or capacity', () => {
    const step = fc.oneof(fc.record({ request: fc.integer({ min: 1, max: 3 }) }), fc.record({ advance: fc.integer({ min: 1, max: 15 }) }));
    fc.assert(
      fc.property(
        fc.array(fc.constantFrom('a', 'b', 'c'), { maxLength: 40 }),
        fc.integer({ min: 1, max: 5 }),
        fc.integer({ min: 0, max: 6 }),
        fc.boolean(),
        fc.boolean(),
        fc.array(step, { maxLength: 30 }),
        (keys, maxSize, extraCapacity, keyed, filtered, steps) => {
          const vts = new VirtualTimeScheduler();
          const capacity = maxSize + extraCapacity;
          let passed = 0;
          const inputs = keys.map((key, id) => ({ key, id }));
          // A filter between source and batcher swallows demand without delivering: it must not stall or leak.
          const kept = (x: { key: string; id: number }): boolean => !filtered || x.id % 3 !== 0;
          const expected = inputs.filter(kept);
          const options: BatchOptions<{ key: string; id: number }> = { maxSize, maxWait: 10, capacity, scheduler: vts };
          if (keyed) options.key = (x) => x.key;
          const emitted: Batch<{ key: string; id: number }>[] = [];
          const errors: unknown[] = [];
          let completed = false;
          let requested = 0;
          const subscription = subscribeWithDemand(
            fromIterable(inputs).pipe(
              filter(kept),
              tap(() => passed++),
              batch(options),
            ),
            {
              next: (t) => emitted.push(t.value),
              error: (err) => errors.push(err),
              complete: () => (completed = true),
            },
          );
          const check = (): void => {
            const delivered = emitted.reduce((n, b) => n + b.size, 0);
            assert.ok(emitted.length <= requested, 'never more batches than requested');
            assert.ok(passed - delivered <= capacity, 'never more than capacity held');
          };
          check();
          for (const s of steps) {
            if ('request' in s) {
              requested += s.request;
              subscription.request(s.request);
            } else {
              advanceTo(vts, vts.frame + s.advance);
            }
            check();
          }
          requested += 1000;
          subscription.request(1000);
          advanceTo(vts, vts.frame + 1000);
          check();

          assert.deepEqual(errors, []);
          assert.ok(completed);
          assert.equal(vts.actions.length, 0);
          const seen = new Map<string, number[]>();
          for (const b of emitted) {
            assert.ok(b.size >= 1 && b.size <= maxSize, `batch of ${b.size} with maxSize ${maxSize}`);
            for (const item of b.items) {
              if (keyed) assert.equal(item.key, b.key);
              else assert.equal(b.key, undefined);
              const group = keyed ? item.key : '';
              seen.set(group, [...(seen.get(group) ?? []), item.id]);
            }
          }
          const all = [...seen.values()].flat().sort((x, y) => x - y);
          assert.deepEqual(
            all,
            expected.map((x) => x.id),
            'every input exactly once',
          );
          for (const ids of seen.values())
            assert.deepEqual(
              ids,
              [...ids].sort((x, y) => x - y),
              'in order within a key',
            );
        },
      ),
      { numRuns: 300 },
    );
  });
});
