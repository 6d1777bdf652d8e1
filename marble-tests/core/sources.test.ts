import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { Readable } from 'node:stream';
import v8 from 'node:v8';
import vm from 'node:vm';
import { TestScheduler } from 'rxjs/testing';
import { NEVER, Subject, delay, firstValueFrom, map, of, toArray, type Observable } from 'rxjs';
import { fromAsyncIterable, fromIterable, fromReadable } from '../../src/flow/sources.js';
import { fromPush } from '../../src/flow/push.js';
import { subscribeWithDemand } from '../../src/flow/demand.js';
import { stage } from '../../operators/stage.js';
import type { Traced } from '../../src/core/trace.js';
import { StageStats } from '../../src/flow/stats.js';
import { DrainTimeoutError, InvalidOptionsError, OverflowError } from '../../src/core/errors.js';
import { KillSwitch } from '../../src/flow/kill-switch.js';
import { eventually } from '../../src/testing/assert.js';

function scheduler(): TestScheduler {
  return new TestScheduler((actual, expected) => assert.deepEqual(actual, expected));
}

function counting(limit = Infinity): { pulled: () => number; generator: Generator<number> } {
  let pulled = 0;
  function* generate(): Generator<number> {
    for (let i = 0; i < limit; i++) {
      pulled++;
      yield i;
    }
  }
  return { pulled: () => pulled, generator: generate() };
}

const tick = () => new Promise<void>((resolve) => setImmediate(resolve));

describe('fromIterable', () => {
  it('emits synchronously to a plain subscriber, like from(array)', () => {
    const seen: number[] = [];
    fromIterable([1, 2, 3]).subscribe((x) => seen.push(x));
    assert.deepEqual(seen, [1, 2, 3]);
  });

  it('pulls an infinite generator only as far as demand goes', () => {
    const source = counting();
    const seen: number[] = [];
    const subscription = subscribeWithDemand(fromIterable(source.generator), { next: (x) => seen.push(x) });
    assert.equal(source.pulled(), 0);
    subscription.request(3);
    assert.deepEqual(seen, [0, 1, 2]);
    assert.equal(source.pulled(), 3);
    subscription.cancel();
  });

  it('closes the generator when the consumer cancels (its finally block runs)', () => {
    let finalized = false;
    function* generate(): Generator<number> {
      try {
        for (let i = 0; ; i++) yield i;
      } finally {
        finalized = true;
      }
    }
    const subscription = subscribeWithDemand(fromIterable(generate()), {});
    subscription.request(2);
    subscription.cancel();
    assert.equal(finalized, true);
  });

  it('an iterator that throws errors the Flow', () => {
    function* broken(): Generator<number> {
      yield 1;
      throw new Error('disk gone');
    }
    const events: string[] = [];
    fromIterable(broken()).subscribe({ next: (x) => events.push(`next ${x}`), error: (e: Error) => events.push(`error ${e.message}`) });
    assert.deepEqual(events, ['next 1', 'error disk gone']);
  });

  it('keeps a slow stage fed without ever holding more than capacity + concurrency', async () => {
    const source = counting(2_000);
    const stats = new StageStats();
    let worst = 0;
    const work = async (x: number) => {
      worst = Math.max(worst, source.pulled() - stats.delivered);
      await tick();
      return x;
    };
    const out = await firstValueFrom(fromIterable(source.generator).pipe(stage(work, { capacity: 8, concurrency: 2, stats }), toArray()));
    assert.equal(out.length, 2_000);
    assert.ok(worst <= 8 + 2, `held ${worst} elements, bound is 10`);
  });
});

describe('fromIterable straight into a pause stage', () => {
  /** Async work that takes a tick, noting how far the source was ahead of delivery when each element started. */
  function slowWork(source: { pulled: () => number }, stats: StageStats, worst: { held: number }) {
    return async (x: number) => {
      worst.held = Math.max(worst.held, source.pulled() - stats.delivered);
      await tick();
      return x;
    };
  }

  it('is read ahead as any producer is: the stage holds at most capacity + concurrency', async () => {
    const source = counting(500);
    const stats = new StageStats();
    const worst = { held: 0 };
    let buffered = 0;
    const out = await firstValueFrom(
      fromIterable(source.generator).pipe(
        stage(slowWork(source, stats, worst), { capacity: 8, concurrency: 2, stats }),
        map((t) => {
          buffered = Math.max(buffered, stats.buffered);
          return t.value;
        }),
        toArray(),
      ),
    );
    assert.deepEqual(
      out,
      Array.from({ length: 500 }, (_, i) => i),
    );
    assert.ok(worst.held > 3 && worst.held <= 8 + 2, `held ${worst.held}, bound 10`);
    assert.ok(buffered <= 8, `buffered ${buffered}`);
    assert.deepEqual([stats.received, stats.delivered, stats.buffered, stats.inFlight], [500, 500, 0, 0]);
  });

  it('a plain operator in between changes nothing: the stage fills its buffer the same way', async () => {
    const source = counting(500);
    const stats = new StageStats();
    const worst = { held: 0 };
    await firstValueFrom(
      fromIterable(source.generator).pipe(
        map((x) => x),
        stage(slowWork(source, stats, worst), { capacity: 8, concurrency: 2, stats }),
        toArray(),
      ),
    );
    assert.ok(worst.held > 3 && worst.held <= 8 + 2, `held ${worst.held}`);
  });

  it('shed-incoming sheds what finds the buffer full', async () => {
    const stats = new StageStats();
    const out = await firstValueFrom(
      fromIterable(Array.from({ length: 10 }, (_, i) => i)).pipe(
        stage(async (x: number) => x, { policy: 'shed-incoming', capacity: 2, stats }),
        map((t) => t.value),
        toArray(),
      ),
    );
    assert.deepEqual(out, [0, 1, 2]);
    assert.deepEqual([stats.received, stats.shed['buffer-full']], [10, 7]);
  });

  it('a throw from the iterator errors the stage at once; every element taken is delivered or failed', async () => {
    function* broken(): Generator<number> {
      for (let i = 0; i < 5; i++) yield i;
      throw new Error('disk gone');
    }
    const stats = new StageStats();
    const seen: number[] = [];
    const error = await new Promise<Error>((resolve) =>
      fromIterable(broken())
        .pipe(stage(async (x: number) => x, { concurrency: 2, stats }))
        .subscribe({ next: (t) => seen.push(t.value), error: resolve }),
    );
    assert.equal(error.message, 'disk gone');
    assert.deepEqual(seen, [0, 1, 2, 3].slice(0, seen.length));
    assert.equal(stats.received, 5);
    assert.equal(stats.received, stats.delivered + stats.failed + stats.shedTotal);
    assert.equal(stats.delivered, seen.length);
  });

  it('unsubscribing closes the generator (its finally block runs) and aborts the work in flight', async () => {
    let finalized = false;
    let pulled = 0;
    function* generate(): Generator<number> {
      try {
        for (let i = 0; ; i++) {
          pulled++;
          yield i;
        }
      } finally {
        finalized = true;
      }
    }
    const aborted: number[] = [];
    const stats = new StageStats();
    const subscription = fromIterable(generate())
      .pipe(
        stage(
          (x: number, { signal }) =>
            new Promise<number>((resolve) => {
              signal.addEventListener('abort', () => aborted.push(x));
              if (x < 3) setImmediate(() => resolve(x));
            }),
          { capacity: 4, concurrency: 2, stats },
        ),
      )
      .subscribe();
    await eventually(() => assert.equal(stats.delivered, 3));
    assert.ok(pulled <= 3 + 4 + 2, `pulled ${pulled}: delivered + capacity + concurrency`);
    subscription.unsubscribe();
    assert.equal(finalized, true);
    assert.deepEqual(aborted.sort(), [3, 4]);
    assert.equal(stats.received, stats.delivered + stats.failed + stats.shedTotal);
  });

  it('a kill switch shutdown stops reading, finishes what was taken and completes', async () => {
    const source = counting();
    const kill = new KillSwitch();
    const stats = new StageStats();
    const seen: number[] = [];
    await new Promise<void>((resolve, reject) =>
      fromIterable(source.generator)
        .pipe(
          stage(
            async (x: number) => {
              if (x === 10) kill.shutdown();
              await tick();
              return x;
            },
            { capacity: 4, concurrency: 2, killSwitch: kill, stats },
          ),
        )
        .subscribe({ next: (t) => seen.push(t.value), error: reject, complete: resolve }),
    );
    assert.deepEqual(
      seen,
      Array.from({ length: seen.length }, (_, i) => i),
    );
    assert.ok(seen.length >= 11 && seen.length <= 11 + 4 + 2, `delivered ${seen.length}`);
    assert.equal(source.pulled(), seen.length);
    assert.deepEqual([stats.received, stats.delivered], [seen.length, seen.length]);
  });
});

describe('fromIterable into a stage: the same with or without a plain operator in between', () => {
  const shapes: [string, <T>(source: Observable<T>) => Observable<T>][] = [
    ['straight', (source) => source],
    ['through map', (source) => source.pipe(map((x) => x))],
  ];
  for (const [shape, between] of shapes) {
    it(`${shape}: the end of the source is seen while work is stuck, so drainTimeout fires`, async () => {
      const stats = new StageStats();
      const started = Date.now();
      const error = await new Promise<unknown>((resolve) =>
        between(fromIterable([0, 1, 2]))
          .pipe(stage((x: number) => (x === 1 ? NEVER : x), { drainTimeout: 30, stats }))
          .subscribe({ error: resolve, complete: () => resolve('completed') }),
      );
      assert.ok(error instanceof DrainTimeoutError, String(error));
      assert.ok(Date.now() - started < 1_000);
      assert.deepEqual([stats.received, stats.delivered, stats.failed], [3, 1, 2]);
    });

    it(`${shape}: a generator that throws after two items errors the stage at once, nothing delivered`, async () => {
      function* twoThenThrow(): Generator<number> {
        yield 0;
        yield 1;
        throw new Error('disk gone');
      }
      const stats = new StageStats();
      const seen: number[] = [];
      const error = await new Promise<unknown>((resolve) =>
        between(fromIterable(twoThenThrow()))
          .pipe(
            stage(
              async (x: number) => {
                await new Promise((r) => setTimeout(r, 20));
                return x;
              },
              { stats },
            ),
          )
          .subscribe({ next: (t: Traced<number>) => seen.push(t.value), error: resolve }),
      );
      assert.equal((error as Error).message, 'disk gone');
      assert.deepEqual(seen, []);
      assert.deepEqual([stats.received, stats.delivered, stats.failed], [2, 0, 2]);
    });
  }

  it('a bare array source completes with its last element, as the same through a stage does', () => {
    for (const through of [false, true]) {
      const seen: unknown[] = [];
      let completed = false;
      const source = fromIterable(['a', 'b', 'c']);
      const flow: Observable<unknown> = through
        ? source.pipe(
            stage((x: string) => x),
            map((t) => t.value),
          )
        : source;
      const demand = subscribeWithDemand(flow, { next: (x) => seen.push(x), complete: () => (completed = true) });
      demand.request(2);
      assert.deepEqual(seen, ['a', 'b']);
      assert.equal(completed, false);
      demand.request(1);
      assert.deepEqual(seen, ['a', 'b', 'c']);
      assert.equal(completed, true, `completed without being asked again (${through ? 'through a stage' : 'bare'})`);
    }
  });
});

describe('fromReadable: memory stays flat', () => {
  it('an object-mode Readable whose read() pushes synchronously, through an async stage: 300k elements grow the live heap by < 10 MB', async () => {
    v8.setFlagsFromString('--expose-gc');
    const gc = vm.runInNewContext('gc') as () => void;
    let i = 0;
    const n = 300_000;
    const readable = new Readable({
      objectMode: true,
      read() {
        this.push(i < n ? { i: i++ } : null);
      },
    });
    gc();
    const before = process.memoryUsage().heapUsed;
    let peak = 0;
    let seen = 0;
    await new Promise<void>((resolve, reject) =>
      fromReadable<{ i: number }>(readable)
        .pipe(stage(async (x: { i: number }) => x, { capacity: 2 }))
        .subscribe({
          next: () => {
            if (++seen % 50_000 === 0) {
              gc();
              peak = Math.max(peak, process.memoryUsage().heapUsed - before);
            }
          },
          error: reject,
          complete: resolve,
        }),
    );
    assert.equal(seen, n);
    assert.ok(peak < 10e6, `live heap grew ${(peak / 1e6).toFixed(1)} MB`);
  });
});

describe('fromAsyncIterable', () => {
  it('calls next() only on demand, one at a time', async () => {
    let calls = 0;
    const iterable: AsyncIterable<number> = {
      [Symbol.asyncIterator]: () => ({
        next: async () => ({ done: false, value: calls++ }),
        return: async () => ({ done: true, value: undefined }),
      }),
    };
    const seen: number[] = [];
    const subscription = subscribeWithDemand(fromAsyncIterable(iterable), { next: (x) => seen.push(x) });
    await tick();
    assert.equal(calls, 0);
    subscription.request(2);
    await tick();
    await tick();
    assert.deepEqual(seen, [0, 1]);
    assert.equal(calls, 2);
    subscription.cancel();
  });

  it('delivers an async generator completely and in order through a stage', async () => {
    async function* generate() {
      for (let i = 0; i < 50; i++) yield i;
    }
    const out = await firstValueFrom(
      fromAsyncIterable(generate()).pipe(
        stage(async (x: number) => x * 2, { capacity: 2 }),
        map((t) => t.value),
        toArray(),
      ),
    );
    assert.deepEqual(
      out,
      Array.from({ length: 50 }, (_, i) => i * 2),
    );
  });
});

describe('fromReadable', () => {
  it('reads an object-mode Readable in paused mode, only as far as demand goes', async () => {
    let produced = 0;
    const readable = new Readable({
      objectMode: true,
      highWaterMark: 4,
      read() {
        this.push(produced < 1000 ? produced++ : null);
      },
    });
    const seen: number[] = [];
    const subscription = subscribeWithDemand(fromReadable<number>(readable), { next: (x) => seen.push(x) });
    subscription.request(5);
    await tick();
    assert.deepEqual(seen, [0, 1, 2, 3, 4]);
    assert.ok(produced <= 5 + 4 + 1, `the Readable produced ${produced}; its highWaterMark bounds read-ahead`);
    subscription.cancel();
    assert.equal(readable.destroyed, true);
  });

  it('delivers a whole Readable and completes', async () => {
    const out = await firstValueFrom(fromReadable<string>(Readable.from(['a', 'b', 'c'])).pipe(toArray()));
    assert.deepEqual(out, ['a', 'b', 'c']);
  });

  it('a Readable error errors the Flow', async () => {
    const readable = new Readable({ objectMode: true, read() {} });
    const result = firstValueFrom(fromReadable(readable));
    readable.destroy(new Error('socket reset'));
    await assert.rejects(result, /socket reset/);
  });
});

describe('fromPush', () => {
  it('refuses policy pause at construction, saying why', () => {
    assert.throws(
      () => fromPush(new Subject<number>(), { capacity: 4, policy: 'pause' as never }),
      (err: unknown) =>
        err instanceof InvalidOptionsError && err.issues[0]!.path === 'policy' && /cannot be paused|emits without being asked/.test(err.message),
    );
  });

  it('shed-oldest keeps the newest elements while the consumer is slow, and counts every shed', () => {
    const stats = new StageStats();
    const shed: number[] = [];
    const subject = new Subject<number>();
    const seen: number[] = [];
    const subscription = subscribeWithDemand(fromPush(subject, { capacity: 2, policy: 'shed-oldest', stats, onShed: (e) => shed.push(e.value) }), {
      next: (x) => seen.push(x),
    });
    for (let i = 0; i < 6; i++) subject.next(i);
    subscription.request(10);
    assert.deepEqual(seen, [4, 5]);
    assert.deepEqual(shed, [0, 1, 2, 3]);
    assert.equal(stats.shed.evicted, 4);
    assert.equal(stats.received, stats.delivered + stats.shedTotal + stats.failed);
  });

  it('conflate merges what the consumer could not take yet', () => {
    const subject = new Subject<string>();
    const seen: string[] = [];
    const subscription = subscribeWithDemand(fromPush(subject, { capacity: 1, policy: 'conflate', conflate: (a, b) => a + b }), {
      next: (x) => seen.push(x),
    });
    for (const token of ['Hel', 'lo', ' wor', 'ld']) subject.next(token);
    subscription.request(1);
    assert.deepEqual(seen, ['Hello world']);
  });

  it('fail delivers what it holds, then errors with OverflowError', () => {
    const subject = new Subject<number>();
    const events: string[] = [];
    const subscription = subscribeWithDemand(fromPush(subject, { name: 'clicks', capacity: 2, policy: 'fail' }), {
      next: (x) => events.push(`next ${x}`),
      error: (e: unknown) => events.push(e instanceof OverflowError ? `overflow ${e.stage} ${e.capacity}` : 'other'),
    });
    for (let i = 0; i < 3; i++) subject.next(i);
    assert.equal(subject.observed, false, 'the push source is unsubscribed at the overflow');
    subscription.request(5);
    assert.deepEqual(events, ['next 0', 'next 1', 'overflow clicks 2']);
  });

  it('feeds a pausing stage from a hot source in virtual time: only the push adapter sheds', () => {
    const stats = new StageStats();
    scheduler().run(({ hot, expectObservable }) => {
      const source = fromPush(hot<string>('-a-b-c-d-e|', { a: 'a', b: 'b', c: 'c', d: 'd', e: 'e' }), { capacity: 1, policy: 'shed-incoming', stats });
      const slow = (x: string) => of(x).pipe(delay(4));
      expectObservable(
        source.pipe(
          stage(slow, { capacity: 1 }),
          map((t) => t.value),
        ),
      ).toBe('-----a---b---c---(d|)');
    });
    assert.equal(stats.shed['buffer-full'], 1);
  });

  it('sheds what it holds as cancelled when the consumer leaves', () => {
    const stats = new StageStats();
    const subject = new Subject<number>();
    const subscription = subscribeWithDemand(fromPush(subject, { capacity: 4, policy: 'shed-incoming', stats }), {});
    subject.next(1);
    subject.next(2);
    subscription.cancel();
    assert.equal(stats.shed.cancelled, 2);
    assert.equal(subject.observed, false);
  });
});
