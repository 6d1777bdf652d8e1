import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { TestScheduler } from 'rxjs/testing';
import { Observable, concatMap, map, take, throwError, timer } from 'rxjs';
import fc from 'fast-check';
import { type Flow, subscribeWithDemand, type DemandSubscription } from '../../src/flow/demand.js';
import { fromIterable } from '../../src/flow/sources.js';
import { StageStats } from '../../src/flow/stats.js';
import { InvalidOptionsError, UnpausableSourceError } from '../../src/core/errors.js';
import { type Traced, traced } from '../../src/core/trace.js';
import { stage } from '../../operators/stage.js';
import { partition, stableHash, laneOf } from '../../operators/partition.js';
import { balance } from '../../operators/balance.js';
import { broadcast } from '../../operators/broadcast.js';
import { mergeFlows } from '../../operators/merge.js';
import type { LaneShedEvent } from '../../operators/lanes.js';

function scheduler(): TestScheduler {
  return new TestScheduler((actual, expected) => assert.deepEqual(actual, expected));
}

/** A generator that counts how many elements were pulled from it, and whether it was closed. */
function counting<T>(values: (i: number) => T, limit = 1000) {
  const state = { pulled: 0, closed: false };
  function* generate(): Generator<T> {
    try {
      for (let i = 0; i < limit; i++) {
        state.pulled++;
        yield values(i);
      }
    } finally {
      state.closed = true;
    }
  }
  return { state, flow: fromIterable(generate()) };
}

/**
 * A lane pipeline the test drives by hand, like Akka's TestSink.probe: the lane's
 * Flow is subscribed with explicit demand (`initial` up front, more via `request`).
 */
class LaneProbe<T> {
  readonly received: T[] = [];
  completed = false;
  error: unknown;
  subscription: DemandSubscription | undefined;
  constructor(private readonly initial: number) {}

  readonly lane = (flow: Flow<Traced<T>>): Observable<never> =>
    new Observable<never>((subscriber) => {
      const subscription = subscribeWithDemand(flow, {
        next: (element) => this.received.push(element.value),
        error: (err) => {
          this.error = err;
          subscriber.error(err);
        },
        complete: () => {
          this.completed = true;
          subscriber.complete();
        },
      });
      this.subscription = subscription;
      if (this.initial > 0) subscription.request(this.initial);
      return () => subscription.cancel();
    });

  request(n: number): void {
    this.subscription!.request(n);
  }
}

/** Probes for `n` lanes, with their initial demand. */
function probes<T>(...initial: number[]): { probes: LaneProbe<T>[]; lane: (flow: Flow<Traced<T>>, index: number) => Observable<never> } {
  const list = initial.map((demand) => new LaneProbe<T>(demand));
  return { probes: list, lane: (flow, index) => list[index]!.lane(flow) };
}

/** Counts live subscriptions of `source`. */
function tracked<T>(source: Observable<T>, counter: { live: number }): Observable<T> {
  return new Observable<T>((subscriber) => {
    counter.live++;
    const subscription = source.subscribe(subscriber);
    return () => {
      counter.live--;
      subscription.unsubscribe();
    };
  });
}

function assertAccounted(stats: StageStats): void {
  assert.equal(stats.buffered, 0, 'nothing is left buffered');
  assert.equal(stats.received, stats.delivered + stats.shedTotal + stats.failed, 'received = delivered + shed + failed');
}

/** A key that `partition` routes to `lane` among `lanes`. */
function keyFor(lane: number, lanes: number, prefix = 'k'): string {
  for (let i = 0; ; i++) if (laneOf(`${prefix}${i}`, lanes) === lane) return `${prefix}${i}`;
}

function optionIssues(build: () => unknown): { path: string; message: string }[] {
  try {
    build();
  } catch (err) {
    assert.ok(err instanceof InvalidOptionsError, `expected InvalidOptionsError, got ${String(err)}`);
    return [...err.issues];
  }
  assert.fail('expected the options to be rejected');
}

describe('partition', () => {
  it('hashes keys with FNV-1a over UTF-8, so every process maps a key to the same lane', () => {
    assert.equal(stableHash(''), 0x811c9dc5);
    assert.equal(stableHash('a'), 0xe40c292c);
    assert.equal(stableHash('foobar'), 0xbf9cf968);
    const fnv = (bytes: Uint8Array) => bytes.reduce((hash, byte) => Math.imul(hash ^ byte, 0x01000193), 0x811c9dc5) >>> 0;
    for (const key of ['session-42', 'é', '€uro', '😀 emoji', 'mixed ascii ✓ 𝄞', '\ud800 lone surrogate']) {
      assert.equal(stableHash(key), fnv(new TextEncoder().encode(key)), key);
    }
  });

  it('sends every element with the same key to the same lane, in every run whatever the arrival order', () => {
    const keys = ['alice', 'bob', 'carol', 'dave', 'erin', 'frank', 'grace'];
    const runOnce = (order: string[]) => {
      const seen = new Map<string, Set<number>>();
      fromIterable(order)
        .pipe(partition({ lanes: 4, key: (key: string) => key, lane: (flow, index) => flow.pipe(map((element) => ({ key: element.value, index }))) }))
        .subscribe(({ key, index }) => {
          const lanes = seen.get(key) ?? new Set<number>();
          lanes.add(index);
          seen.set(key, lanes);
        });
      return seen;
    };
    const first = runOnce([...keys, ...keys, ...keys]);
    const second = runOnce([...keys].reverse().flatMap((key) => [key, key]));
    for (const key of keys) {
      assert.deepEqual([...first.get(key)!], [laneOf(key, 4)], `${key} took one lane in the first run`);
      assert.deepEqual([...second.get(key)!], [laneOf(key, 4)], `${key} took the same lane in the second run`);
    }
    assert.ok(new Set(keys.map((key) => laneOf(key, 4))).size > 1, 'the keys spread over more than one lane');
  });

  it("merges the lanes' outputs with the source's timing", () => {
    scheduler().run(({ cold, expectObservable }) => {
      const [x, y] = [keyFor(0, 2, 'x'), keyFor(1, 2, 'y')];
      const source = cold('-a-b-c-d|', { a: x, b: y, c: y, d: x });
      const tagged = partition({ lanes: 2, key: (key: string) => key, lane: (flow, index) => flow.pipe(map(() => index)) });
      expectObservable(source.pipe(tagged)).toBe('-a-b-c-d|', { a: 0, b: 1, c: 1, d: 0 });
    });
  });

  it("pauses upstream when the next element's lane is full, even while other lanes have room (head-of-line)", () => {
    const [full, free] = [keyFor(0, 2), keyFor(1, 2)];
    const source = counting((i) => (i < 4 ? full : free));
    const lanes = probes<string>(0, 0);
    const stats = new StageStats();
    const subscription = source.flow.pipe(partition({ lanes: 2, capacity: 2, key: (key: string) => key, lane: lanes.lane, stats })).subscribe();

    // Two fill lane 0, the third waits at the head of the line: upstream stops there.
    assert.equal(source.state.pulled, 3);
    lanes.probes[1]!.request(1);
    assert.equal(source.state.pulled, 3, 'demand in lane 1 does not help: the head element is bound for lane 0');
    assert.deepEqual(lanes.probes[1]!.received, []);

    lanes.probes[0]!.request(1);
    assert.equal(source.state.pulled, 4, 'one taken from lane 0 lets exactly one more in');
    lanes.probes[0]!.request(1);
    // The fourth fits lane 0; the fifth goes straight to lane 1's waiting consumer; two fill lane 1; the eighth waits.
    assert.equal(source.state.pulled, 8);
    assert.deepEqual(lanes.probes[0]!.received, [full, full]);
    assert.deepEqual(lanes.probes[1]!.received, [free]);

    subscription.unsubscribe();
    assert.equal(source.state.closed, true);
    assertAccounted(stats);
    assert.equal(stats.shed.cancelled, 5, 'two buffered in each lane and one at the head are shed on teardown');
  });

  it("holds a slow lane's backlog behind the head of the line (virtual time)", () => {
    scheduler().run(({ expectObservable }) => {
      const [a, b] = [keyFor(0, 2, 'a'), keyFor(1, 2, 'b')];
      // Lane 0 takes 30 per element, lane 1 10; each lane's stage holds 2 (one working, one buffered), its ring 1.
      const source = fromIterable([`${a}:1`, `${a}:2`, `${a}:3`, `${a}:4`, `${b}:1`]);
      const output = source.pipe(
        partition({
          lanes: 2,
          capacity: 1,
          key: (value: string) => value.split(':')[0]!,
          lane: (flow, index) => flow.pipe(stage((value: string) => timer(index === 0 ? 30 : 10).pipe(map(() => value)), { capacity: 1 })),
        }),
        map((element) => element.value),
      );
      // b:1 waits behind a:4 until lane 0 has room at 30, so it comes out at 40, not 10.
      expectObservable(output).toBe('30ms a 9ms b 19ms c 29ms d 29ms (e|)', { a: `${a}:1`, b: `${b}:1`, c: `${a}:2`, d: `${a}:3`, e: `${a}:4` });
    });
  });

  it('sheds what is later routed to a lane whose output completed early, with reason "cancelled"', () => {
    const [short, long] = [keyFor(0, 2), keyFor(1, 2)];
    const stats = new StageStats();
    const shed: LaneShedEvent<string>[] = [];
    const out: string[] = [];
    let completed = false;
    fromIterable([short, long, short, long, short])
      .pipe(
        partition({
          lanes: 2,
          key: (key: string) => key,
          lane: (flow, index) =>
            flow.pipe(
              take(index === 0 ? 1 : Infinity),
              map((element) => element.value),
            ),
          stats,
          onShed: (event) => shed.push(event),
        }),
      )
      .subscribe({ next: (value) => out.push(value), complete: () => (completed = true) });
    assert.deepEqual(out, [short, long, long]);
    assert.equal(completed, true);
    assert.deepEqual(
      shed.map((event) => [event.reason, event.lane, event.seq]),
      [
        ['cancelled', 0, 2],
        ['cancelled', 0, 4],
      ],
    );
    assertAccounted(stats);
    assert.equal(stats.delivered, 3);
  });

  it('fails the stream with StageError when the key function throws', () => {
    let error: unknown;
    fromIterable([1, 2])
      .pipe(
        partition({
          lanes: 2,
          name: 'route',
          key: (n: number) => {
            if (n === 2) throw new Error('no key');
            return String(n);
          },
          lane: (flow) => flow,
        }),
      )
      .subscribe({ error: (err) => (error = err) });
    assert.ok(error instanceof Error && 'code' in error && error.code === 'WORK_FAILED', String(error));
    assert.match((error as Error).message, /"route".*#1.*no key/);
  });

  type Item = { key: string; n: number; i: number };
  it('property: every element comes out exactly once, in order per key, through lanes of any speed and upstream bursts', async () => {
    const input = fc.array(fc.record({ key: fc.constantFrom('a', 'b', 'c', 'd', 'e', 'f'), n: fc.nat() }), { maxLength: 60 });
    const modes = fc.array(fc.constantFrom('plain', 'sync-stage', 'async-stage'), { minLength: 5, maxLength: 5 });
    await fc.assert(
      fc.asyncProperty(
        input,
        fc.integer({ min: 1, max: 5 }),
        fc.integer({ min: 1, max: 4 }),
        modes,
        fc.array(fc.integer({ min: 1, max: 7 }), { maxLength: 10 }),
        fc.integer({ min: 1, max: 3 }),
        async (elements, lanes, capacity, laneModes, requests, expand) => {
          const indexed: Item[] = elements.map((element, i) => ({ ...element, i }));
          // Each pulled element expands into `expand` (a plain operator between): the overshoot past the head of the line.
          const chunks = Array.from({ length: Math.ceil(indexed.length / expand) }, (_, c) => indexed.slice(c * expand, (c + 1) * expand));
          const stats = new StageStats();
          const out: { key: string; i: number; lane: number }[] = [];
          const done = new Promise<void>((resolve, reject) => {
            const subscription = subscribeWithDemand(
              fromIterable(chunks).pipe(
                concatMap((chunk) => chunk),
                partition({
                  lanes,
                  capacity,
                  stats,
                  key: (element: Item) => element.key,
                  lane: (flow, lane) => {
                    const mode = laneModes[lane]!;
                    const tag = map((element: Traced<Item>) => ({ key: element.value.key, i: element.value.i, lane }));
                    if (mode === 'plain') return flow.pipe(tag);
                    const work = mode === 'sync-stage' ? (value: Item) => value : async (value: Item) => value;
                    return flow.pipe(stage<Item, Item>(work, { capacity }), tag);
                  },
                }),
              ),
              { next: (value) => out.push(value), complete: resolve, error: reject },
            );
            void (async () => {
              for (const n of requests) {
                subscription.request(n);
                await new Promise((tick) => setImmediate(tick));
              }
              subscription.request(Infinity);
            })();
          });
          await done;
          assert.deepEqual(
            out.map((element) => element.i).sort((x, y) => x - y),
            indexed.map((element) => element.i),
            'each element exactly once',
          );
          for (const key of new Set(indexed.map((element) => element.key))) {
            const ofKey = out.filter((element) => element.key === key);
            assert.deepEqual(
              ofKey.map((element) => element.i),
              indexed.filter((element) => element.key === key).map((element) => element.i),
              `order kept for key ${key}`,
            );
            assert.ok(
              ofKey.every((element) => element.lane === laneOf(key, lanes)),
              `key ${key} stayed on its lane`,
            );
          }
          assertAccounted(stats);
          assert.equal(stats.delivered, indexed.length);
        },
      ),
      { numRuns: 150 },
    );
  });
});

describe('balance', () => {
  it('sends elements to the worker that is asking, so a worker without demand gets nothing more', () => {
    const workers = probes<number>(1, Infinity);
    const stats = new StageStats();
    let completed = false;
    fromIterable(Array.from({ length: 20 }, (_, i) => i))
      .pipe(balance({ workers: 2, worker: workers.lane, stats }))
      .subscribe({ complete: () => (completed = true) });
    assert.deepEqual(workers.probes[0]!.received, [0], 'worker 0 asked for one');
    assert.equal(workers.probes[1]!.received.length, 19, 'worker 1 took the rest: an asking worker beats an empty lane');
    assert.equal(completed, true, "nothing was parked in worker 0's lane ahead of its demand");
    assertAccounted(stats);
    assert.equal(stats.delivered, 20);
  });

  it('gives a worker slowed by its work fewer elements (virtual time)', () => {
    scheduler().run(({ flush }) => {
      const byWorker: number[][] = [[], []];
      let completed = false;
      fromIterable(Array.from({ length: 12 }, (_, i) => i))
        .pipe(
          balance({
            workers: 2,
            worker: (flow, index) => flow.pipe(stage((n: number) => timer(index === 0 ? 40 : 10).pipe(map(() => ({ n, index }))), { capacity: 1 })),
          }),
        )
        .subscribe({ next: ({ value }) => byWorker[value.index]!.push(value.n), complete: () => (completed = true) });
      flush();
      assert.equal(completed, true);
      const [slow, fast] = byWorker as [number[], number[]];
      assert.deepEqual(
        [...slow, ...fast].sort((x, y) => x - y),
        Array.from({ length: 12 }, (_, i) => i),
        'every element once',
      );
      assert.ok(fast.length >= 2 * slow.length, `fast worker got ${fast.length}, slow worker ${slow.length}`);
    });
  });

  it("pauses upstream only when every worker's lane is full", () => {
    const source = counting((i) => i);
    const workers = probes<number>(0, 0, 0);
    const subscription = source.flow.pipe(balance({ workers: 3, capacity: 2, worker: workers.lane })).subscribe();
    assert.equal(source.state.pulled, 6, 'three lanes of two');
    workers.probes[2]!.request(1);
    assert.equal(source.state.pulled, 7);
    assert.equal(workers.probes[2]!.received.length, 1);
    subscription.unsubscribe();
    assert.equal(source.state.closed, true);
  });

  it('spreads elements round-robin among workers that are all asking', () => {
    const out: number[] = [];
    fromIterable([0, 1, 2, 3, 4, 5])
      .pipe(balance({ workers: 3, worker: (flow, index) => flow.pipe(map(() => index)) }))
      .subscribe((index) => out.push(index));
    assert.deepEqual(out, [0, 1, 2, 0, 1, 2]);
  });
});

describe('broadcast', () => {
  it('delivers every element to every branch', () => {
    scheduler().run(({ cold, expectObservable }) => {
      const source = cold('-a-----b-----|', { a: 'x', b: 'yy' });
      const output = source.pipe(
        broadcast<string, string | number>({
          branches: [(flow) => flow.pipe(map((element) => element.value.toUpperCase())), (flow) => flow.pipe(map((element) => element.value.length))],
        }),
      );
      expectObservable(output).toBe('-(pq)--(rs)--|', { p: 'X', q: 1, r: 'YY', s: 2 });
    });
  });

  it('builds `branches` copies of one pipeline when given a count', () => {
    const out: string[] = [];
    fromIterable(['a', 'b'])
      .pipe(broadcast({ branches: 3, branch: (flow, index) => flow.pipe(map((element) => `${element.value}${index}`)) }))
      .subscribe((value) => out.push(value));
    assert.deepEqual(out, ['a0', 'a1', 'a2', 'b0', 'b1', 'b2']);
  });

  it('is paced by the slowest branch', () => {
    const source = counting((i) => i);
    const branches = probes<number>(Infinity, 2);
    const stats = new StageStats();
    const subscription = source.flow.pipe(broadcast({ branches: 2, branch: branches.lane, capacity: 4, stats })).subscribe();
    assert.equal(source.state.pulled, 6, 'two taken by the slow branch and four buffered for it');
    assert.deepEqual(branches.probes[0]!.received, [0, 1, 2, 3, 4, 5], 'the fast branch waits for the slow one');
    assert.deepEqual(branches.probes[1]!.received, [0, 1]);

    branches.probes[1]!.request(3);
    assert.equal(source.state.pulled, 9);
    assert.equal(branches.probes[0]!.received.length, 9);
    assert.deepEqual(branches.probes[1]!.received, [0, 1, 2, 3, 4]);

    subscription.unsubscribe();
    assertAccounted(stats);
    assert.equal(stats.shed.lagging, 0, 'nothing is shed without maxLag');
    assert.equal(stats.shed.cancelled, 4, "the slow branch's buffer is shed on teardown");
  });

  it('with maxLag, sheds the lagging branch\'s oldest elements (reason "lagging") and lets the others run', () => {
    const branches = probes<number>(Infinity, 0);
    const stats = new StageStats();
    const shed: LaneShedEvent<number>[] = [];
    let completed = false;
    fromIterable(Array.from({ length: 10 }, (_, i) => i))
      .pipe(broadcast({ branches: 2, branch: branches.lane, capacity: 4, maxLag: 2, stats, onShed: (event) => shed.push(event) }))
      .subscribe({ complete: () => (completed = true) });

    assert.deepEqual(branches.probes[0]!.received, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], 'the fast branch got everything');
    assert.equal(branches.probes[0]!.completed, true);
    assert.deepEqual(
      shed.map((event) => [event.reason, event.lane, event.value]),
      [0, 1, 2, 3, 4, 5, 6, 7].map((value) => ['lagging', 1, value]),
    );
    assert.equal(completed, false, 'the slow branch still holds its last two');

    branches.probes[1]!.request(Infinity);
    assert.deepEqual(branches.probes[1]!.received, [8, 9]);
    assert.equal(completed, true);
    assertAccounted(stats);
    assert.deepEqual([stats.received, stats.delivered, stats.shed.lagging], [20, 12, 8]);
  });

  it('records a shed in the trace of a sampled element, naming the operator and the reason', () => {
    const branches = probes<number>(Infinity, 0);
    const shed: LaneShedEvent<number>[] = [];
    fromIterable(Array.from({ length: 6 }, (_, i) => traced(i, { seq: i, sampled: i % 2 === 0 })))
      .pipe(broadcast({ name: 'fan', branches: 2, branch: branches.lane, capacity: 4, maxLag: 2, onShed: (event) => shed.push(event) }))
      .subscribe();
    assert.deepEqual(
      shed.map((event) => [event.value, event.count, event.trace.records?.map((r) => [r.stage, r.shed])]),
      [
        [0, 1, [['fan', 'lagging']]],
        [1, 1, undefined],
        [2, 1, [['fan', 'lagging']]],
        [3, 1, undefined],
      ],
    );
  });

  it('with maxLag, still pauses when even the fastest branch is full', () => {
    const source = counting((i) => i);
    const branches = probes<number>(0, 0);
    const subscription = source.flow.pipe(broadcast({ branches: 2, branch: branches.lane, capacity: 3, maxLag: 1 })).subscribe();
    assert.equal(source.state.pulled, 3);
    subscription.unsubscribe();
  });
});

describe('mergeFlows', () => {
  it('keeps demand: two generators merged never give more than was requested', () => {
    const [a, b] = [counting((i) => `a${i}`), counting((i) => `b${i}`)];
    const out: string[] = [];
    const subscription = subscribeWithDemand(mergeFlows(a.flow, b.flow), { next: (value) => out.push(value) });
    assert.equal(a.state.pulled + b.state.pulled, 0);
    subscription.request(3);
    assert.equal(a.state.pulled + b.state.pulled, 3);
    subscription.request(2);
    assert.equal(a.state.pulled + b.state.pulled, 5);
    assert.equal(out.length, 5);
    subscription.cancel();
    subscription.request(10);
    assert.equal(a.state.pulled + b.state.pulled, 5, 'nothing is pulled after cancel');
  });

  it('pauses both sources while a slow stage downstream is full', () => {
    const [a, b] = [counting((i) => i), counting((i) => -i)];
    const stats = new StageStats();
    const subscription = mergeFlows(a.flow, b.flow)
      .pipe(stage(() => new Promise<number>(() => {}), { capacity: 2, concurrency: 1, stats }))
      .subscribe();
    assert.equal(a.state.pulled + b.state.pulled, 3, 'capacity 2 + concurrency 1, however many sources');
    subscription.unsubscribe();
  });

  it("merges with the sources' timing, like RxJS merge", () => {
    scheduler().run(({ cold, expectObservable }) => {
      expectObservable(mergeFlows(cold('-a---c|'), cold('---b---d|'))).toBe('-a-b-c-d|');
    });
  });
});

describe('fan-out lifecycle', () => {
  it('unsubscribing tears down upstream and every lane, shedding what was buffered', () => {
    const upstream = { live: 0 };
    const lanes = { live: 0 };
    const source = counting((i) => i);
    const stats = new StageStats();
    const out: number[] = [];
    const subscription = tracked(source.flow, upstream)
      .pipe(
        partition({
          lanes: 3,
          capacity: 2,
          key: (n: number) => String(n % 5),
          lane: (flow) => tracked(flow.pipe(stage(() => new Promise<number>(() => {}), { capacity: 1 })), lanes),
          stats,
        }),
      )
      .subscribe((element) => out.push(element.value));
    assert.deepEqual([upstream.live, lanes.live], [1, 3]);
    assert.ok(stats.buffered > 0);
    subscription.unsubscribe();
    assert.deepEqual([upstream.live, lanes.live], [0, 0], 'no subscription left');
    assert.equal(source.state.closed, true, 'the generator was closed');
    assertAccounted(stats);
  });

  it('a lane error errors the output and unsubscribes upstream and the other lanes', () => {
    const upstream = { live: 0 };
    const lanes = { live: 0 };
    const stats = new StageStats();
    let error: unknown;
    tracked(counting((i) => i).flow, upstream)
      .pipe(
        balance({
          workers: 3,
          stats,
          worker: (flow, index) =>
            tracked(
              flow.pipe(
                map((element) => {
                  if (index === 2) throw new Error('worker 2 broke');
                  return element.value;
                }),
              ),
              lanes,
            ),
        }),
        take(100),
      )
      .subscribe({ error: (err) => (error = err) });
    assert.match(String(error), /worker 2 broke/);
    assert.deepEqual([upstream.live, lanes.live], [0, 0]);
    assertAccounted(stats);
  });

  it('a lane that errors while being subscribed errors the output and leaves no lane or upstream subscribed', () => {
    const upstream = { live: 0 };
    const lanes = { live: 0 };
    let error: unknown;
    tracked(counting((i) => i).flow, upstream)
      .pipe(
        balance({
          workers: 3,
          worker: (flow, index) => (index === 0 ? throwError(() => new Error('worker 0 failed to start')) : tracked(flow, lanes)),
        }),
      )
      .subscribe({ error: (err) => (error = err) });
    assert.match(String(error), /worker 0 failed to start/);
    assert.deepEqual([upstream.live, lanes.live], [0, 0]);
  });

  it('an upstream error errors the output; buffered elements count as failed', () => {
    scheduler().run(({ cold, expectObservable, flush }) => {
      const stats = new StageStats();
      const branches = probes<string>(Infinity, 1);
      const output = cold('-a-b-c-#', undefined, new Error('upstream broke')).pipe(broadcast({ branches: 2, branch: branches.lane, stats }));
      expectObservable(output).toBe('-------#', undefined, new Error('upstream broke'));
      flush();
      assert.deepEqual(branches.probes[1]!.received, ['a']);
      assertAccounted(stats);
      assert.equal(stats.failed, 2, 'b and c, still buffered for the slow branch');
    });
  });

  it('completes once upstream completes and every lane has drained', () => {
    const branches = probes<number>(0, 0);
    let completed = false;
    fromIterable([1, 2, 3])
      .pipe(broadcast({ branches: 2, branch: branches.lane }))
      .subscribe({ complete: () => (completed = true) });
    branches.probes[0]!.request(Infinity);
    assert.deepEqual([branches.probes[0]!.completed, completed], [true, false]);
    branches.probes[1]!.request(2);
    assert.equal(completed, false);
    branches.probes[1]!.request(1);
    assert.equal(completed, true);
  });

  it("the lanes' outputs are paced by the consumer's demand", () => {
    const source = counting((i) => i);
    const out: number[] = [];
    const subscription = subscribeWithDemand(
      source.flow.pipe(partition({ lanes: 2, capacity: 1, key: (n: number) => String(n), lane: (flow) => flow.pipe(map((element) => element.value)) })),
      { next: (value) => out.push(value) },
    );
    const bound = 2 * 1 + 1;
    assert.ok(source.state.pulled <= bound, `pulled ${source.state.pulled} with no demand`);
    subscription.request(4);
    assert.equal(out.length, 4);
    assert.ok(source.state.pulled <= 4 + bound, `pulled ${source.state.pulled} for 4 requested`);
    subscription.cancel();
  });

  it('fails with UnpausableSourceError when a plain source pushes past the bound', () => {
    scheduler().run(({ cold, expectObservable }) => {
      const lanes = probes<string>(0);
      expectObservable(cold('(abcd)').pipe(broadcast({ branches: [lanes.lane], capacity: 2, name: 'copy' }))).toBe(
        '#',
        undefined,
        new UnpausableSourceError('copy', 2),
      );
    });
  });
});

describe('fan-out options', () => {
  const lane = (flow: Flow<Traced<number>>) => flow;
  it('rejects lanes: 0, naming the field', () => {
    const issues = optionIssues(() => partition({ lanes: 0, key: String, lane }));
    assert.deepEqual(
      issues.map((issue) => issue.path),
      ['lanes'],
    );
  });
  it('rejects workers: 1.5, naming the field', () => {
    const issues = optionIssues(() => balance({ workers: 1.5, worker: lane }));
    assert.deepEqual(
      issues.map((issue) => issue.path),
      ['workers'],
    );
    assert.match(issues[0]!.message, /integer/);
  });
  it('rejects maxLag: -1, naming the field', () => {
    const issues = optionIssues(() => broadcast({ branches: [lane], maxLag: -1 }));
    assert.deepEqual(
      issues.map((issue) => issue.path),
      ['maxLag'],
    );
  });
  it('rejects maxLag not below capacity, naming the field', () => {
    const issues = optionIssues(() => broadcast({ branches: [lane], maxLag: 4, capacity: 4 }));
    assert.deepEqual(
      issues.map((issue) => issue.path),
      ['maxLag'],
    );
  });
  it('rejects a branch count without `branch`, naming the field', () => {
    const issues = optionIssues(() => broadcast({ branches: 2 } as never));
    assert.deepEqual(
      issues.map((issue) => issue.path),
      ['branch'],
    );
  });
  it('rejects unknown fields, naming them', () => {
    for (const build of [
      () => partition({ lanes: 2, key: String, lane, lane_count: 3 } as never),
      () => balance({ workers: 2, worker: lane, lane_count: 3 } as never),
      () => broadcast({ branches: [lane], lane_count: 3 } as never),
    ]) {
      const issues = optionIssues(build);
      assert.ok(
        issues.some((issue) => issue.message.includes('lane_count')),
        JSON.stringify(issues),
      );
    }
  });
  it('rejects a missing key function, naming the field', () => {
    const issues = optionIssues(() => partition({ lanes: 2, lane } as never));
    assert.deepEqual(
      issues.map((issue) => issue.path),
      ['key'],
    );
  });
});
