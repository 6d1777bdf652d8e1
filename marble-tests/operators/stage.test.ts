import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { TestScheduler } from 'rxjs/testing';
import { NEVER, Observable, delay, lastValueFrom, map, of, take, toArray, type OperatorFunction } from 'rxjs';
import { stage, type ShedEvent } from '../../operators/stage.js';
import { fromAsyncIterable, fromIterable } from '../../src/flow/sources.js';
import { StageStats } from '../../src/flow/stats.js';
import { KillSwitch } from '../../src/flow/kill-switch.js';
import { TraceContext, type Traced } from '../../src/core/trace.js';
import { monotonicNow } from '../../src/core/clock.js';
import { TestSink, eventually } from '../../src/testing/index.js';
import {
  AbortedError,
  DrainTimeoutError,
  InvalidOptionsError,
  OverflowError,
  StageError,
  StageTimeoutError,
  UnpausableSourceError,
} from '../../src/core/errors.js';

const values = <T>(): OperatorFunction<Traced<T>, T> => map((t) => t.value);

function scheduler(): TestScheduler {
  return new TestScheduler((actual, expected) => assert.deepEqual(actual, expected));
}

/** Work that takes `frames` of virtual time. */
const slow =
  (frames: number) =>
  <T>(x: T): Observable<T> =>
    of(x).pipe(delay(frames));

function shedLog(): { events: ShedEvent<string>[]; onShed: (e: ShedEvent<string>) => void } {
  const events: ShedEvent<string>[] = [];
  return { events, onShed: (e) => events.push(e) };
}

describe('stage: values and timing', () => {
  it('maps each element and keeps the timing of a synchronous stage', () => {
    scheduler().run(({ cold, expectObservable }) => {
      const source = cold('-a-b-c|', { a: 1, b: 2, c: 3 });
      expectObservable(
        source.pipe(
          stage((x: number) => x * 10),
          values(),
        ),
      ).toBe('-a-b-c|', { a: 10, b: 20, c: 30 });
    });
  });

  it('serialises work at concurrency 1: each element waits for the previous one', () => {
    scheduler().run(({ cold, expectObservable }) => {
      const source = cold('ab|');
      expectObservable(source.pipe(stage(slow(5), { capacity: 4 }), values())).toBe('5ms a 4ms (b|)');
    });
  });

  it('runs work concurrently and, unordered, emits whichever finishes first', () => {
    scheduler().run(({ cold, expectObservable }) => {
      const source = cold('ab|');
      const work = (x: string) => of(x).pipe(delay(x === 'a' ? 10 : 2));
      expectObservable(source.pipe(stage(work, { concurrency: 2, ordered: false }), values())).toBe('---b 6ms (a|)');
    });
  });

  it('runs work concurrently but, ordered, emits in arrival order', () => {
    scheduler().run(({ cold, expectObservable }) => {
      const source = cold('ab|');
      const work = (x: string) => of(x).pipe(delay(x === 'a' ? 10 : 2));
      expectObservable(source.pipe(stage(work, { concurrency: 2 }), values())).toBe('10ms (ab|)');
    });
  });

  it('ordered async work that settles out of order: the later output goes out right after the earlier, with input still open', async () => {
    // The source never completes, so only the earlier task's settling can release the later output.
    let release0!: () => void;
    let release1!: () => void;
    const gates = [new Promise<void>((resolve) => (release0 = resolve)), new Promise<void>((resolve) => (release1 = resolve))];
    const started: number[] = [];
    const work = async (x: number): Promise<number> => {
      started.push(x);
      await gates[x];
      return x * 10;
    };
    const seen: number[] = [];
    const subscription = fromAsyncIterable(
      (async function* () {
        yield 0;
        yield 1;
        await new Promise(() => {}); // open for good
      })(),
    )
      .pipe(stage(work, { concurrency: 2 }), values())
      .subscribe((value) => seen.push(value));
    await eventually(() => assert.deepEqual(started, [0, 1]));
    release1();
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(seen, []); // done, but behind element 0
    release0();
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(seen, [0, 10]);
    subscription.unsubscribe();
  });

  it('streams many outputs per element from an Observable result (one prompt, many tokens)', () => {
    scheduler().run(({ cold, expectObservable }) => {
      const source = cold('a|');
      const tokens = () => cold('-x-y-(z|)');
      expectObservable(source.pipe(stage(tokens), values())).toBe('-x-y-(z|)');
    });
  });
});

describe('stage: a consumer that has asked for nothing', () => {
  // Work starts into free slots whatever the demand (its output waits in the task, counted in
  // flight); the rest waits in the buffer; nothing is emitted until asked. The same for each
  // way an element can arrive: an async stage hands it over by a path of its own.
  const upstreams: [string, (source: Observable<number>) => Observable<number | Traced<number>>, number][] = [
    ['a source', (source: Observable<number>) => source, 3],
    ['a settled async stage', (source: Observable<number>) => source.pipe(stage(async (x: number) => x, { name: 'first' })), 3],
    ['a synchronous stage', (source: Observable<number>) => source.pipe(stage((x: number) => x, { name: 'first' })), 3],
  ];
  for (const [from, upstream, taken] of upstreams) {
    it(`from ${from}: work fills the free slot, the rest is buffered, nothing is emitted until asked`, { timeout: 10_000 }, async () => {
      const started: number[] = [];
      const stats = new StageStats();
      const second = async (x: number): Promise<number> => {
        started.push(x);
        return x * 10;
      };
      const sink = TestSink.subscribe(upstream(fromIterable([1, 2, 3])).pipe(stage(second, { name: 'second', stats })), { request: 0 });
      await eventually(() => assert.equal(stats.received, taken));
      await new Promise((resolve) => setImmediate(resolve)); // the started work settles; its output must wait
      assert.deepEqual(started, [1]);
      assert.deepEqual([stats.received, stats.inFlight, stats.buffered, stats.emitted], [taken, 1, taken - 1, 0]);
      assert.equal(sink.signals.length, 0);
      sink.request(3);
      await eventually(() => assert.equal(sink.signals.length, 4));
      sink.expectNext(10, 20, 30).expectComplete();
      assert.deepEqual(started, [1, 2, 3]);
      assert.deepEqual([stats.received, stats.inFlight, stats.buffered, stats.delivered], [3, 0, 0, 3]);
    });
  }
});

describe('stage: stats', () => {
  it('count every run of a stage while it runs and after it ends, and take increments from other code', async () => {
    const stats = new StageStats();
    const twice = stage(async (x: number) => x * 2, { name: 'twice', stats });
    const a = TestSink.subscribe(fromIterable([1, 2, 3]).pipe(twice), { request: 1 });
    const b = TestSink.subscribe(fromIterable([4, 5]).pipe(twice), { request: 0 });
    await eventually(() => assert.equal(stats.emitted, 1));
    assert.equal(stats.liveRuns, 2);
    assert.deepEqual([stats.received, stats.delivered, stats.inFlight], [5, 1, 2]); // a: 1 out, 1 in flight, 1 buffered; b: 1 in flight, 1 buffered
    a.request(10);
    b.request(10);
    await eventually(() => assert.equal(stats.liveRuns, 0));
    a.expectNext(2, 4, 6).expectComplete();
    b.expectNext(8, 10).expectComplete();
    assert.deepEqual([stats.received, stats.delivered, stats.emitted, stats.inFlight], [5, 5, 5, 0]);
    stats.received++; // a custom operator sharing the stats
    stats.emitted += 2;
    assert.deepEqual([stats.received, stats.delivered, stats.emitted], [6, 5, 7]);
  });
});

describe('stage: overflow policies (hot source 1 element / 2 frames, work 10 frames, capacity 1)', () => {
  const marbles = '-a-b-c-d-e|';

  it('pause fails loudly when a source that cannot be paused overflows it', () => {
    scheduler().run(({ hot, expectObservable, expectSubscriptions }) => {
      const source = hot(marbles);
      expectObservable(source.pipe(stage(slow(10), { name: 's', capacity: 1 }), values())).toBe('-----#', undefined, new UnpausableSourceError('s', 1));
      expectSubscriptions(source.subscriptions).toBe('^----!');
    });
  });

  it('pause loses nothing when the source can be paused', () => {
    scheduler().run(({ expectObservable }) => {
      const source = fromIterable(['a', 'b', 'c', 'd']);
      expectObservable(source.pipe(stage(slow(10), { capacity: 1 }), values())).toBe('10ms a 9ms b 9ms c 9ms (d|)');
    });
  });

  it('shed-incoming sheds the arriving element and reports it with reason buffer-full', () => {
    const log = shedLog();
    const stats = new StageStats();
    scheduler().run(({ hot, expectObservable }) => {
      const source = hot(marbles);
      expectObservable(source.pipe(stage(slow(10), { name: 's', capacity: 1, policy: 'shed-incoming', onShed: log.onShed, stats }), values())).toBe(
        '- 10ms a 9ms (b|)',
      );
    });
    assert.deepEqual(
      log.events.map((e) => [e.value, e.reason, e.stage]),
      [
        ['c', 'buffer-full', 's'],
        ['d', 'buffer-full', 's'],
        ['e', 'buffer-full', 's'],
      ],
    );
    assert.equal(stats.shed['buffer-full'], 3);
    assert.equal(stats.received, stats.delivered + stats.shedTotal + stats.failed);
  });

  it('records the shed in the trace of a sampled element, so a dead letter says where and why', () => {
    const log = shedLog();
    scheduler().run(({ hot, expectObservable }) => {
      const source = hot('-a-b-c|');
      expectObservable(source.pipe(stage(slow(10), { name: 'llm', capacity: 1, policy: 'shed-incoming', sampleRate: 1, onShed: log.onShed }), values())).toBe(
        '- 10ms a 9ms (b|)',
      );
    });
    assert.deepEqual(
      log.events.map((e) => e.trace.records!.map((r) => [r.stage, r.shed])),
      [[['llm', 'buffer-full']]],
    );
  });

  it('shed-oldest evicts the oldest buffered element and keeps the arriving one', () => {
    const log = shedLog();
    scheduler().run(({ hot, expectObservable }) => {
      const source = hot(marbles);
      expectObservable(source.pipe(stage(slow(10), { capacity: 1, policy: 'shed-oldest', onShed: log.onShed }), values())).toBe('- 10ms a 9ms (e|)');
    });
    assert.deepEqual(
      log.events.map((e) => [e.value, e.reason]),
      [
        ['b', 'evicted'],
        ['c', 'evicted'],
        ['d', 'evicted'],
      ],
    );
  });

  it('fail delivers what was buffered and in flight, then errors with OverflowError naming stage and capacity', () => {
    const stats = new StageStats();
    scheduler().run(({ hot, expectObservable, expectSubscriptions }) => {
      const source = hot(marbles);
      expectObservable(source.pipe(stage(slow(10), { name: 's', capacity: 1, policy: 'fail', stats }), values())).toBe(
        '- 10ms a 9ms (b#)',
        undefined,
        new OverflowError('s', 1),
      );
      expectSubscriptions(source.subscriptions).toBe('^----!');
    });
    assert.deepEqual([stats.received, stats.delivered, stats.failed], [3, 2, 1]);
  });

  it('conflate merges pending elements with the reducer: lossless in content, bounded in count', () => {
    const stats = new StageStats();
    scheduler().run(({ hot, expectObservable }) => {
      const source = hot(marbles);
      const joined = source.pipe(stage(slow(10), { capacity: 1, policy: 'conflate', conflate: (a: string, b: string) => a + b, stats }), values());
      expectObservable(joined).toBe('- 10ms a 9ms (x|)', { a: 'a', x: 'bcde' });
    });
    assert.equal(stats.conflated, 3);
    assert.equal(stats.received, stats.delivered + stats.shedTotal + stats.failed);
  });
});

describe('stage: errors', () => {
  it('a throwing work function ends the stream with a StageError carrying stage and sequence', () => {
    scheduler().run(({ cold, expectObservable }) => {
      const work = (x: string) => {
        if (x === 'b') throw new Error('bad input');
        return x;
      };
      expectObservable(cold('a-b-c|').pipe(stage(work, { name: 'parse' }), values())).toBe(
        'a-#',
        { a: 'a' },
        new StageError('parse', 1, new Error('bad input')),
      );
    });
  });

  it('errorPolicy skip reports the failed element and goes on', () => {
    const failures: [string, number, string][] = [];
    scheduler().run(({ cold, expectObservable }) => {
      const work = (x: string) => {
        if (x === 'b') throw new Error('bad input');
        return x;
      };
      const op = stage(work, { name: 'parse', errorPolicy: 'skip', onFailure: (e) => failures.push([e.value, e.seq, e.error.code]) });
      expectObservable(cold('a-b-c|').pipe(op, values())).toBe('a---c|');
    });
    assert.deepEqual(failures, [['b', 1, 'WORK_FAILED']]);
  });

  it('errorPolicy skip with async work: a task reused after a failure carries nothing of it over', { timeout: 10_000 }, async () => {
    // Retired Promise tasks are reused for later elements; a failed flag left set would count the
    // next success as failed, or ignore the next failure and stall the stage.
    const stats = new StageStats();
    const failures: number[] = [];
    const work = async (x: number): Promise<number> => {
      if (x % 2 === 1) throw new Error(`bad ${x}`);
      return x;
    };
    async function* spaced(): AsyncGenerator<number> {
      for (let x = 1; x <= 7; x++) {
        await new Promise((resolve) => setImmediate(resolve)); // each arrives at an idle stage: the shortest start
        yield x;
      }
    }
    const out = await lastValueFrom(
      fromAsyncIterable(spaced()).pipe(
        stage(work, { name: 'odd-fails', errorPolicy: 'skip', stats, onFailure: (e) => failures.push(e.seq) }),
        values(),
        toArray(),
      ),
    );
    assert.deepEqual(out, [2, 4, 6]);
    assert.deepEqual(failures, [0, 2, 4, 6]);
    assert.equal(stats.delivered, 3);
    assert.equal(stats.failed, 4);
  });

  it('a timeout aborts the work signal and fails the element with StageTimeoutError', () => {
    const signals: AbortSignal[] = [];
    scheduler().run(({ cold, expectObservable }) => {
      const work = (_: string, ctx: { signal: AbortSignal }) => {
        signals.push(ctx.signal);
        return NEVER;
      };
      expectObservable(cold('a|').pipe(stage(work, { name: 'llm', timeout: 5 }), values())).toBe('-----#', undefined, new StageTimeoutError('llm', 0, 5));
    });
    assert.equal(signals.length, 1);
    assert.equal(signals[0]!.aborted, true);
    assert.ok(signals[0]!.reason instanceof StageTimeoutError);
  });

  it('an upstream error passes through', () => {
    scheduler().run(({ cold, expectObservable }) => {
      expectObservable(
        cold('a-#', undefined, new Error('boom')).pipe(
          stage((x: string) => x),
          values(),
        ),
      ).toBe('a-#', undefined, new Error('boom'));
    });
  });
});

describe('stage: lifecycle', () => {
  it('a run is counted by its stats only while it lives: after completion, error or unsubscribe none is left', async () => {
    const stats = new StageStats();
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const held = fromIterable([1])
      .pipe(stage(async (x: number) => (await gate, x), { stats }))
      .subscribe();
    await eventually(() => assert.equal(stats.inFlight, 1));
    assert.equal(stats.liveRuns, 1);
    held.unsubscribe();
    assert.deepEqual([stats.liveRuns, stats.inFlight], [0, 0], 'after unsubscribe');
    release();

    await lastValueFrom(
      fromIterable([1, 2]).pipe(
        stage(async (x: number) => x, { stats }),
        toArray(),
      ),
    );
    assert.equal(stats.liveRuns, 0, 'after completion');

    const failing = stage(
      (x: number) => {
        if (x === 2) throw new Error('boom');
        return x;
      },
      { stats },
    );
    await assert.rejects(lastValueFrom(fromIterable([1, 2, 3]).pipe(failing)), StageError);
    assert.equal(stats.liveRuns, 0, 'after error');
  });

  it('completion drains buffered and in-flight work before completing', () => {
    scheduler().run(({ cold, expectObservable }) => {
      expectObservable(cold('(abc|)').pipe(stage(slow(3), { capacity: 4 }), values())).toBe('---a--b--(c|)');
    });
  });

  it('a drain deadline fails what is left when upstream has completed', () => {
    scheduler().run(({ cold, expectObservable }) => {
      const work = (x: string) => (x === 'a' ? of(x).pipe(delay(2)) : NEVER);
      expectObservable(cold('(ab|)').pipe(stage(work, { name: 'gen', drainTimeout: 10, capacity: 4 }), values())).toBe(
        '--a 7ms #',
        undefined,
        new DrainTimeoutError('gen', 10, 1),
      );
    });
  });

  it('kill switch shutdown stops taking input, finishes what it holds, then completes', () => {
    const kill = new KillSwitch();
    scheduler().run(({ hot, expectObservable, expectSubscriptions, cold }) => {
      const source = hot('-a-b-c-d|');
      cold('----k').subscribe(() => kill.shutdown());
      expectObservable(source.pipe(stage(slow(4), { capacity: 4, killSwitch: kill }), values())).toBe('-----a---(b|)');
      expectSubscriptions(source.subscriptions).toBe('^---!');
    });
    assert.equal(kill.listenerCount, 0);
  });

  it('kill switch abort errors at once and aborts in-flight work', () => {
    const kill = new KillSwitch();
    const signals: AbortSignal[] = [];
    scheduler().run(({ hot, expectObservable, cold }) => {
      const source = hot('-a-b-c|');
      cold('----k').subscribe(() => kill.abort(new AbortedError('s', 'operator pulled the plug')));
      const work = (x: string, ctx: { signal: AbortSignal }) => {
        signals.push(ctx.signal);
        return of(x).pipe(delay(10));
      };
      expectObservable(source.pipe(stage(work, { name: 's', capacity: 4, killSwitch: kill }), values())).toBe(
        '----#',
        undefined,
        new AbortedError('s', 'operator pulled the plug'),
      );
    });
    assert.equal(signals.length, 1);
    assert.equal(signals[0]!.aborted, true);
  });

  it('unsubscribing aborts in-flight work, sheds the buffer as cancelled and leaves no timer or subscription', () => {
    const ts = scheduler();
    const stats = new StageStats();
    const kill = new KillSwitch();
    const signals: AbortSignal[] = [];
    ts.run(({ cold, expectSubscriptions }) => {
      // A cold source that completes at once: the only timers left are the stage's own.
      const source = cold('(abcd|)');
      const work = (x: string, ctx: { signal: AbortSignal }) => {
        signals.push(ctx.signal);
        return of(x).pipe(delay(20));
      };
      const subscription = source.pipe(stage(work, { capacity: 4, timeout: 100, drainTimeout: 100, killSwitch: kill, stats })).subscribe();
      ts.schedule(() => {
        subscription.unsubscribe();
        assert.equal(ts.actions.filter((a) => !a.closed).length, 0, 'no timer may survive the unsubscribe');
      }, 6);
      expectSubscriptions(source.subscriptions).toBe('(^!)');
    });
    assert.equal(signals.length, 1);
    assert.equal(signals[0]!.aborted, true);
    assert.equal(stats.shed.cancelled, 4, 'three buffered and one in flight');
    assert.deepEqual([stats.buffered, stats.inFlight], [0, 0]);
    assert.equal(stats.received, stats.delivered + stats.shedTotal + stats.failed);
    assert.equal(kill.listenerCount, 0);
  });

  it('a consumer that leaves while settled async work is on its way gets nothing more, and every element is accounted for', async () => {
    // `async` work in ordered stages without timeouts settles by the shortcut, which does not look at the subscriber
    // (`wantsSettled`): leaving must have closed the tasks that settle after it.
    const gates = new Map<number, () => void>();
    const gated = async (x: number): Promise<number> => {
      await new Promise<void>((resolve) => gates.set(x, resolve));
      return x;
    };
    const first = new StageStats();
    const second = new StageStats();
    const got: number[] = [];
    let completed = false;
    fromIterable([0, 1, 2, 3, 4, 5, 6, 7])
      .pipe(
        stage(gated, { name: 'gated', concurrency: 4, stats: first }),
        stage(async (x: number) => x, { name: 'next', concurrency: 4, stats: second }),
        values(),
        take(2),
      )
      .subscribe({ next: (x) => got.push(x), complete: () => (completed = true) });
    await eventually(() => gates.size === 4);
    for (const x of [0, 1, 2, 3]) gates.get(x)!(); // all four settle; `take(2)` leaves during the second's emit
    await eventually(() => completed);
    await new Promise((resolve) => setImmediate(resolve)); // the settles after the leave have run
    assert.deepEqual(got, [0, 1]);
    for (const stats of [first, second]) {
      assert.equal(stats.received, stats.delivered + stats.shedTotal + stats.failed, `${stats.received} in`);
      assert.deepEqual([stats.inFlight, stats.buffered], [0, 0]);
    }
    assert.equal(second.delivered, 2);
    assert.ok(second.shed.cancelled >= 1, 'what the next stage had started when the consumer left is shed as cancelled');
  });
});

describe('stage: link scope', () => {
  it('two Flows handed the same stage subscriber share its room: credit is lent only to a lone producer', async () => {
    const stats = new StageStats();
    async function* trickle(): AsyncGenerator<number> {
      for (let i = 0; i < 5; i++) yield await new Promise<number>((resolve) => setTimeout(() => resolve(i), 1));
    }
    // A hand-rolled merge: both Flows get the stage's own subscriber, so both are linked to it directly.
    const both = new Observable<number>((subscriber) => {
      const first = fromAsyncIterable(trickle()).subscribe(subscriber);
      const second = fromIterable([10, 11, 12, 13, 14]).subscribe(subscriber);
      return () => {
        first.unsubscribe();
        second.unsubscribe();
      };
    });
    let maxBuffered = 0;
    const never = new Promise<number>(() => {});
    const subscription = both.pipe(stage((_: number) => never, { name: 'held', capacity: 2, stats })).subscribe();
    for (let tick = 0; tick < 20; tick++) {
      maxBuffered = Math.max(maxBuffered, stats.buffered);
      await new Promise((resolve) => setTimeout(resolve, 1));
    }
    subscription.unsubscribe();
    // Capacity 2, concurrency 1. The first producer's credit, taken while it was alone, must not outlive the
    // second's arrival (without that rule: 5 buffered). One element over is the async Flow's: it asked before
    // its next() and its element came after the other Flow had filled the room (a pending request, §1.1).
    assert.ok(maxBuffered <= 3, `buffered ${maxBuffered}`);
    assert.ok(stats.received <= 4, `received ${stats.received}`);
  });

  it('a Flow the work subscribes for itself is not paced by the stage that is emitting to it', () => {
    const counts: number[] = [];
    const countAll = (x: number) => {
      let n = 0;
      fromIterable(Array.from({ length: 100 }, (_, i) => i)).subscribe(() => n++);
      counts.push(n);
      return x;
    };
    fromIterable([1, 2, 3])
      .pipe(
        stage((x: number) => x),
        map((t) => t),
        stage(countAll, { capacity: 1 }),
      )
      .subscribe();
    fromIterable([4])
      .pipe(stage(countAll, { capacity: 1 }))
      .subscribe();
    assert.deepEqual(counts, [100, 100, 100, 100]);
  });
});

describe('stage: traces', () => {
  it('wraps plain inputs in a trace, passes traced inputs through, and records timing for sampled elements', () => {
    const ts = scheduler();
    const seen: Traced<string>[] = [];
    ts.run(({ cold, expectObservable }) => {
      const pipeline = cold('a--b|').pipe(
        stage((x: string) => x.toUpperCase(), { name: 'upper', sampleRate: 1, scheduler: ts }),
        stage(slow(2), { name: 'wait', scheduler: ts }),
        map((t) => (seen.push(t), t.value)),
      );
      expectObservable(pipeline).toBe('--a--(b|)', { a: 'A', b: 'B' });
    });
    // A streaming result's record is completed when its stream ends; the trace object is shared.
    assert.deepEqual(
      seen.map((t) => t.trace.records!.map((r) => [r.stage, r.queueWait, r.service, r.paused])),
      [
        [
          ['upper', 0, 0, 0],
          ['wait', 0, 2, 0],
        ],
        [
          ['upper', 0, 0, 0],
          ['wait', 0, 2, 0],
        ],
      ],
    );
  });

  it('keeps records in stage order; an array read mid-way grows with the stages after; addRecord adds only to sampled traces', async () => {
    const held: (readonly unknown[])[] = [];
    const out = await lastValueFrom(
      fromIterable(['a', 'b']).pipe(
        stage((x: string) => x, { name: 'first', sampleRate: 1 }),
        map((t) => (held.push(t.trace.records!), t)), // read after one stage: one record so far
        stage((x: string) => x, { name: 'second' }),
        stage((x: string) => x, { name: 'third' }),
        toArray(),
      ),
    );
    assert.equal(held.length, 2);
    for (const [i, t] of out.entries()) {
      assert.deepEqual(
        t.trace.records!.map((r) => r.stage),
        ['first', 'second', 'third'],
      );
      assert.equal(t.trace.records, held[i], 'the array read after the first stage is the one that grew');
      assert.deepEqual(Object.keys(t.trace.records![0]!), ['stage', 'queueWait', 'service', 'paused', 'retries', 'conflated']);
    }
    const trace = out[0]!.trace;
    trace.addRecord({ stage: 'mine', queueWait: 1, service: 2, paused: 3, retries: 0, conflated: 0, shed: 'buffer-full' });
    assert.deepEqual(trace.record('mine'), { stage: 'mine', queueWait: 1, service: 2, paused: 3, retries: 0, conflated: 0, shed: 'buffer-full' });
    assert.equal(trace.records!.length, 4);
    const unsampled = new TraceContext(0, false);
    unsampled.addRecord({ stage: 'mine', queueWait: 1, service: 2, paused: 3, retries: 0, conflated: 0 });
    assert.equal(unsampled.records, undefined);
  });

  it('keeps a streaming stage’s record in stage order: placed when its first output leaves, completed when its stream ends', () => {
    const ts = scheduler();
    let seen: Traced<string> | undefined;
    const held: (readonly unknown[])[] = [];
    ts.run(({ cold, expectObservable }) => {
      const pipeline = cold('a|').pipe(
        // Three tokens, one frame apart; each passes `post` before the stream of `generate` ends.
        stage((x: string) => cold('-x-y-(z|)', { x: `${x}1`, y: `${x}2`, z: `${x}3` }), { name: 'generate', sampleRate: 1, scheduler: ts }),
        map((t) => (held.push(t.trace.records!), t)),
        stage((x: string) => x.toUpperCase(), { name: 'post', scheduler: ts }),
        map((t) => ((seen = t), t.value)),
      );
      expectObservable(pipeline).toBe('-x-y-(z|)', { x: 'A1', y: 'A2', z: 'A3' });
    });
    const records = seen!.trace.records!;
    assert.deepEqual(
      records.map((r) => r.stage),
      ['generate', 'post', 'post', 'post'],
    );
    assert.equal(records[0]!.service, 5, 'the record of generate is complete: its stream took 5 frames');
    assert.equal(held[0], records, 'an array read at the first token is the one that grew');
    assert.equal(new Set(held).size, 1);
  });

  it('records queue wait and time paused by backpressure', () => {
    const ts = scheduler();
    const seen: Traced<string>[] = [];
    ts.run(({ cold, expectObservable }) => {
      const pipeline = cold('(ab|)').pipe(
        stage((x: string) => x, { name: 'source', sampleRate: 1, scheduler: ts }),
        stage(slow(3), { name: 'slow', capacity: 4, scheduler: ts }),
        map((t) => (seen.push(t), t.value)),
      );
      expectObservable(pipeline).toBe('---a--(b|)');
    });
    const slowRecords = seen.map((t) => t.trace.record('slow')!);
    assert.deepEqual(
      slowRecords.map((r) => [r.queueWait, r.service]),
      [
        [0, 3],
        [3, 3],
      ],
    );
  });

  it('without a scheduler, times are read on performance.now()’s time line, in milliseconds', async () => {
    // The stage reads the clock through process.hrtime (cheaper than performance.now()); this checks origin and unit.
    for (let i = 0; i < 100; i++) {
      const before = performance.now();
      const read = monotonicNow();
      const after = performance.now();
      assert.ok(read >= before - 0.5 && read <= after + 0.5, `${before} ≤ ${read} ≤ ${after}`);
    }
    const busy =
      (ms: number) =>
      <T>(x: T): T => {
        const until = performance.now() + ms;
        while (performance.now() < until);
        return x;
      };
    const [out] = await lastValueFrom(fromIterable(['a']).pipe(stage(busy(3), { name: 'busy', sampleRate: 1 }), stage(busy(2), { name: 'after' }), toArray()));
    const [first, second] = out!.trace.records!;
    // At least the time spent; an upper bound would be a timed test, but a unit slip (ns, s) is off by 10³.
    assert.ok(first!.service >= 3 - 0.5 && first!.service < 3_000, `busy: ${first!.service} ms`);
    assert.ok(second!.service >= 2 - 0.5 && second!.service < 2_000, `after: ${second!.service} ms`);
  });

  it('records every async stage of a sampled element, and none of an unsampled one, on the settled-hop path', async () => {
    // Async stages hand settled outputs on by a path of their own; sampled elements must leave it for the recording one.
    const ids = [0, 1, 2, 3, 4, 5];
    const out = await lastValueFrom(
      fromIterable(ids).pipe(
        stage(async (x: number) => x, { name: 'a', sampleRate: 0.5 }),
        stage(async (x: number) => x, { name: 'b' }),
        stage(async (x: number) => x, { name: 'c', concurrency: 2 }),
        toArray(),
      ),
    );
    assert.deepEqual(
      out.map((t) => [t.value, t.trace.sampled, t.trace.records?.map((r) => r.stage)]),
      ids.map((x) => (x % 2 === 0 ? [x, true, ['a', 'b', 'c']] : [x, false, undefined])),
    );
  });

  it('lets work note decisions on the element, always on and namespaced by stage', () => {
    const out: Traced<number>[] = [];
    fromIterable([1, 2])
      .pipe(
        stage((x: number, ctx) => (ctx.note('hit', x === 1), x), { name: 'cache' }),
        stage((x: number, ctx) => (ctx.note('variant', 'b'), x), { name: 'route' }),
      )
      .subscribe((t) => out.push(t));
    assert.deepEqual(
      out.map((t) => t.trace.notes),
      [
        { 'cache.hit': true, 'route.variant': 'b' },
        { 'cache.hit': false, 'route.variant': 'b' },
      ],
    );
  });

  it('gives every element W3C-compatible ids, shared by all outputs of one input', async () => {
    const out: Traced<string>[] = [];
    await new Promise<void>((resolve) =>
      fromIterable(['p'])
        .pipe(stage(() => fromIterable(['t1', 't2'])))
        .subscribe({ next: (t) => out.push(t), complete: resolve }),
    );
    assert.equal(out.length, 2);
    assert.match(out[0]!.trace.traceId, /^[0-9a-f]{32}$/);
    assert.match(out[0]!.trace.spanId, /^[0-9a-f]{16}$/);
    assert.match(out[0]!.trace.traceparent, /^00-[0-9a-f]{32}-[0-9a-f]{16}-0[01]$/);
    assert.equal(out[0]!.trace, out[1]!.trace);
  });

  // Between linked stages an unsampled trace travels as its bare seq until something reads it (see `TraceRef`):
  // each reader must make the context once and pass that one on, on every path an element can take.
  for (const mode of ['sync', 'async'] as const) {
    it(`${mode}: the work's context, the notes and the output share one trace, begun at the first stage (work started ${mode === 'sync' ? 'at once' : 'from the buffer'})`, async () => {
      const n = 40;
      const seen = new Map<number, unknown>();
      const pass = mode === 'sync' ? (x: number) => x : async (x: number) => x;
      const noting = (x: number, ctx: { trace: unknown; note(key: string, value: number): void }) => {
        seen.set(x, ctx.trace);
        ctx.note('x', x);
        return mode === 'sync' ? x : Promise.resolve(x);
      };
      const out = await lastValueFrom(
        fromIterable(Array.from({ length: n }, (_, i) => i)).pipe(
          stage(pass, { name: 'first', concurrency: 3 }),
          stage(noting, { name: 'noting', capacity: 8 }), // concurrency 1: async elements wait in its buffer
          stage(pass, { name: 'last', concurrency: 2 }),
          toArray(),
        ),
      );
      assert.deepEqual(
        out.map((t) => t.value),
        Array.from({ length: n }, (_, i) => i),
      );
      for (const t of out) {
        assert.equal(t.trace, seen.get(t.value), `element ${t.value}: the work's context.trace is the output's`);
        assert.equal(t.trace.seq, t.value);
        assert.equal(t.trace.sampled, false);
        assert.deepEqual(t.trace.notes, { 'noting.x': t.value });
      }
      assert.equal(new Set(out.map((t) => t.trace.traceId)).size, n, 'one trace id per element');
    });

    it(`${mode}: every output of one input shares its trace after stages that never read it`, async () => {
      const pass = mode === 'sync' ? (x: number) => x : async (x: number) => x;
      const passText = mode === 'sync' ? (x: string) => x : async (x: string) => x;
      const out = await lastValueFrom(
        fromIterable([0, 1, 2]).pipe(
          stage(pass, { concurrency: 2 }),
          stage((x: number) => fromIterable([`${x}a`, `${x}b`, `${x}c`]), { concurrency: 2 }),
          stage(passText),
          toArray(),
        ),
      );
      assert.deepEqual(
        out.map((t) => t.value),
        ['0a', '0b', '0c', '1a', '1b', '1c', '2a', '2b', '2c'],
      );
      for (let i = 0; i < 3; i++) {
        const group = out.slice(3 * i, 3 * i + 3).map((t) => t.trace);
        assert.ok(
          group.every((trace) => trace === group[0]),
          `outputs of ${i} share one context`,
        );
        assert.equal(group[0]!.seq, i);
      }
      assert.notEqual(out[0]!.trace.traceId, out[3]!.trace.traceId);
    });
  }

  it('reports a shed or failed element with the trace its first stage began', async () => {
    const shed: ShedEvent<number>[] = [];
    const failedSeqs: number[] = [];
    let open!: () => void;
    const gate = new Promise<void>((resolve) => (open = resolve));
    const out = await lastValueFrom(
      fromIterable([0, 1, 2, 3, 4, 5]).pipe(
        stage((x: number) => x, { name: 'first' }),
        stage((x: number) => (x === 0 ? gate.then(() => x) : x), {
          name: 'narrow',
          capacity: 2,
          policy: 'shed-incoming',
          onShed: (e) => (shed.push(e), shed.length === 3 && open()),
        }),
        stage(
          (x: number) => {
            if (x % 2 === 1) throw new Error(`odd ${x}`);
            return x;
          },
          { name: 'evens', errorPolicy: 'skip', onFailure: (e) => failedSeqs.push(e.trace.seq) },
        ),
        toArray(),
      ),
    );
    // 0 waits on the gate, 1 and 2 fill the buffer, 3, 4 and 5 are shed; of 0, 1 and 2 the odd one fails.
    assert.deepEqual(
      out.map((t) => [t.value, t.trace.seq]),
      [
        [0, 0],
        [2, 2],
      ],
    );
    assert.deepEqual(
      shed.map((e) => [e.value, e.seq, e.trace.seq, e.trace.sampled, e.reason]),
      [
        [3, 3, 3, false, 'buffer-full'],
        [4, 4, 4, false, 'buffer-full'],
        [5, 5, 5, false, 'buffer-full'],
      ],
    );
    assert.deepEqual(failedSeqs, [1]);
  });
});

describe('stage: work that looks async', () => {
  // The fast path for `async` functions trusts that their result is a native Promise: anything that only looks like one
  // (a Proxy with an `apply` trap, an ordinary function given AsyncFunction's prototype) must take the general path.
  const AsyncFunctionPrototype = Object.getPrototypeOf(async () => {}) as object;
  const cases: [string, (x: number) => unknown][] = [
    ['a Proxy of an async function whose apply returns a plain value', new Proxy(async (x: number) => x, { apply: (_target, _this, [x]: [number]) => x * 10 })],
    [
      'an ordinary function with the prototype of an async one',
      Object.setPrototypeOf((x: number) => ({ then: undefined, x }), AsyncFunctionPrototype) as (x: number) => unknown,
    ],
    [
      'a bound async function',
      async function (this: { k: number }, x: number) {
        return x * this.k;
      }.bind({ k: 10 }),
    ],
  ];
  for (const [what, work] of cases) {
    it(`${what}: every element is delivered, in order`, async () => {
      const out = await lastValueFrom(
        fromIterable([1, 2, 3, 4, 5]).pipe(
          stage(async (x: number) => x, { concurrency: 2 }), // settles into the next stage: its own fast path
          stage(work, { concurrency: 2 }),
          stage(async (x: unknown) => x, { concurrency: 2 }),
          map((t) => t.value),
          toArray(),
        ),
      );
      assert.equal(out.length, 5);
      assert.deepEqual(
        out.map((x) => (typeof x === 'object' && x !== null ? (x as { x: number }).x * 10 : x)),
        [10, 20, 30, 40, 50],
      );
    });
  }
});

describe('stage: the work context', () => {
  it("gives every work that can see a second argument a context with the element's stage, seq and trace", async () => {
    const seen: { stage: string; seq: number; traced: boolean }[][] = [];
    const record = (i: number, ctx: { stage: string; seq: number; trace: unknown } | undefined) => {
      (seen[i] ??= []).push({ stage: ctx!.stage, seq: ctx!.seq, traced: ctx!.trace !== undefined });
    };
    const shapes: ((value: string, ...rest: never[]) => unknown)[] = [
      (x: string, ctx: { stage: string; seq: number; trace: unknown }) => (record(0, ctx), x),
      // Declared length 1, yet it can read the context: a default, `arguments`, a rest parameter, a bound or a method.
      (x: string, ctx: { stage: string; seq: number; trace: unknown } | undefined = undefined) => (record(1, ctx), x),
      function (this: unknown, x: string) {
        // eslint-disable-next-line prefer-rest-params
        record(2, arguments[1] as never);
        return x;
      },
      (...args: unknown[]) => (record(3, args[1] as never), args[0]),
      function (this: { i: number }, x: string, ctx: never) {
        record(this.i, ctx);
        return x;
      }.bind({ i: 4 }),
      {
        m(x: string, ctx: never) {
          record(5, ctx);
          return x;
        },
      }.m,
    ];
    for (const work of shapes) {
      const out = await lastValueFrom(fromIterable(['a', 'b', 'c']).pipe(stage(work as never, { name: 'w' }), toArray()));
      assert.deepEqual(
        out.map((t) => (t as Traced<string>).value),
        ['a', 'b', 'c'],
      );
    }
    const expected = [0, 1, 2].map((seq) => ({ stage: 'w', seq, traced: true }));
    assert.deepEqual(
      seen,
      shapes.map(() => expected),
    );
  });

  it('work that cannot see one (an arrow of one plain parameter) still reports seq and trace on failure, and its tasks still abort', async () => {
    const failures: [number, boolean][] = [];
    const out = await lastValueFrom(
      fromIterable(['a', 'b', 'c']).pipe(
        stage(
          (x: string) => {
            if (x === 'b') throw new Error('bad');
            return x;
          },
          { name: 'parse', errorPolicy: 'skip', onFailure: (e) => failures.push([e.seq, e.trace !== undefined]) },
        ),
        toArray(),
      ),
    );
    assert.deepEqual(
      out.map((t) => t.value),
      ['a', 'c'],
    );
    assert.deepEqual(failures, [[1, true]]);
    // An async one-parameter arrow becomes a task: a timeout fails it with its seq.
    await assert.rejects(
      lastValueFrom(
        fromIterable(['a']).pipe(stage(async (x: string) => new Promise<string>((resolve) => setTimeout(() => resolve(x), 50)), { name: 'slow', timeout: 5 })),
      ),
      (err: unknown) => err instanceof StageTimeoutError && err.seq === 0,
    );
  });
});

describe('stage: options', () => {
  const bad: [string, Record<string, unknown>, string][] = [
    ['capacity 0', { capacity: 0 }, 'capacity'],
    ['capacity not an integer', { capacity: 1.5 }, 'capacity'],
    ['concurrency below 1', { concurrency: 0 }, 'concurrency'],
    ['an unknown policy', { policy: 'drop-latest' }, 'policy'],
    ['conflate without a reducer', { policy: 'conflate' }, 'conflate'],
    ['a negative timeout', { timeout: -1 }, 'timeout'],
    ['a misspelt field', { capactiy: 4 }, 'capactiy'],
  ];
  for (const [what, options, path] of bad) {
    it(`rejects ${what} at construction, naming the field`, () => {
      assert.throws(
        () => stage((x: number) => x, options as never),
        (err: unknown) => {
          assert.ok(err instanceof InvalidOptionsError);
          assert.equal(err.code, 'INVALID_OPTIONS');
          assert.ok(
            err.issues.some((i) => i.path === path),
            `expected an issue at "${path}", got ${JSON.stringify(err.issues)}`,
          );
          assert.match(err.message, new RegExp(path));
          return true;
        },
      );
    });
  }
});
