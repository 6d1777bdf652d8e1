/**
 * The demand protocol against the Reactive Streams rules (reactive-streams-jvm
 * numbering), checked on a bare `fromIterable` Flow and on a stage, plus plain RxJS
 * operators between two stages.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { TestScheduler } from 'rxjs/testing';
import { Observable, Subject, concatMap, config as rxjsConfig, delay, filter, from, map, mergeMap, of, take, tap, timer, type Subscriber } from 'rxjs';
import { fromIterable } from '../../src/flow/sources.js';
import { subscribeWithDemand, type DemandSubscription, type Flow } from '../../src/flow/demand.js';
import { batch } from '../../operators/batch.js';
import { partition } from '../../operators/partition.js';
import { balance } from '../../operators/balance.js';
import { broadcast } from '../../operators/broadcast.js';
import { stage } from '../../operators/stage.js';
import { StageStats } from '../../src/flow/stats.js';
import { KillSwitch } from '../../src/flow/kill-switch.js';
import { IllegalDemandError, SluiceError, StageError } from '../../src/core/errors.js';
import type { Traced } from '../../src/core/trace.js';

/** A generator that counts how far it was pulled and whether it was closed. */
function counting(limit = Infinity) {
  const state = { pulled: 0, closed: false };
  function* generate(): Generator<number> {
    try {
      for (let i = 0; i < limit; i++) {
        state.pulled++;
        yield i;
      }
    } finally {
      state.closed = true;
    }
  }
  return { state, generator: generate() };
}

interface Recorder<T> {
  values: T[];
  /** Elements received (also counted when `keep` is false). */
  count: number;
  completed: number;
  errors: unknown[];
  /** Signals seen after the first terminal signal (§1.7): must stay 0. */
  afterTerminal: number;
  /** Signals that arrived while another signal was still being handled (§1.3): must stay 0. */
  overlapping: number;
  /** Called on each `next` with the subscription (it may request more, or cancel). */
  onNext?: (value: T, subscription: DemandSubscription) => void;
  subscription: DemandSubscription;
}

/** Subscribes with demand and records every signal, checking §1.3 and §1.7 on the way. */
function record<T>(source: Observable<T>, onNext?: (value: T, subscription: DemandSubscription) => void, keep = true): Recorder<T> {
  let inside = false;
  let terminated = false;
  const recorder = { values: [], count: 0, completed: 0, errors: [], afterTerminal: 0, overlapping: 0, onNext } as unknown as Recorder<T>;
  const enter = (): void => {
    if (inside) recorder.overlapping++;
    if (terminated) recorder.afterTerminal++;
    inside = true;
  };
  recorder.subscription = subscribeWithDemand(source, {
    next: (value) => {
      enter();
      recorder.count++;
      if (keep) recorder.values.push(value);
      recorder.onNext?.(value, recorder.subscription);
      inside = false;
    },
    error: (error) => {
      enter();
      terminated = true;
      recorder.errors.push(error);
      inside = false;
    },
    complete: () => {
      enter();
      terminated = true;
      recorder.completed++;
      inside = false;
    },
  });
  return recorder;
}

const identity = (x: number): number => x;
const tick = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

/** The subjects the rules are checked against: a bare Flow, and the same Flow through a stage. */
const subjects: { name: string; make: (generator: Iterable<number>) => Observable<unknown> }[] = [
  { name: 'fromIterable', make: (generator) => fromIterable(generator) },
  { name: 'fromIterable → stage', make: (generator) => fromIterable(generator).pipe(stage(identity, { capacity: 2 })) },
];

for (const subject of subjects) {
  describe(`Reactive Streams rules: subscribeWithDemand(${subject.name})`, () => {
    it('§1.1 never emits more than requested, however demand arrives', () => {
      const source = counting(100);
      const recorder = record(subject.make(source.generator));
      let requested = 0;
      for (const n of [1, 3, 2, 7, 1, 1, 5]) {
        assert.equal(recorder.values.length, requested);
        requested += n;
        recorder.subscription.request(n);
        assert.equal(recorder.values.length, requested, `after request(${n})`);
      }
      assert.equal(recorder.completed, 0);
      recorder.subscription.cancel();
    });

    it('§1.1 requesting from inside next still delivers one element per request', () => {
      const source = counting(50);
      let requested = 1;
      const recorder = record(subject.make(source.generator), (_value, subscription) => {
        assert.ok(recorder.values.length <= requested, `delivered ${recorder.values.length} of ${requested} requested`);
        if (recorder.values.length < 20) {
          requested++;
          subscription.request(1);
        }
      });
      recorder.subscription.request(1);
      assert.equal(recorder.values.length, 20);
      recorder.subscription.cancel();
    });

    it('§1.3 signals are serial: next is never re-entered, even when it requests more', () => {
      const recorder = record(subject.make(counting(1000).generator), (_value, subscription) => subscription.request(2));
      recorder.subscription.request(1);
      assert.equal(recorder.values.length, 1000);
      assert.equal(recorder.completed, 1);
      assert.equal(recorder.overlapping, 0);
    });

    it('§1.7 nothing follows complete, even when more is requested', () => {
      const recorder = record(subject.make(counting(3).generator));
      recorder.subscription.request(10);
      assert.equal(recorder.completed, 1);
      recorder.subscription.request(5);
      recorder.subscription.cancel();
      recorder.subscription.request(5);
      assert.equal(recorder.values.length, 3);
      assert.equal(recorder.completed, 1);
      assert.equal(recorder.afterTerminal, 0);
      assert.equal(recorder.subscription.closed, true);
    });

    it('§1.7 nothing follows an error', () => {
      function* failing(): Generator<number> {
        yield 1;
        throw new Error('boom');
      }
      const recorder = record(subject.make(failing()));
      recorder.subscription.request(10);
      assert.equal(recorder.errors.length, 1);
      const delivered = recorder.values.length; // a stage fails at once on an upstream error: what it buffered is failed, not delivered
      recorder.subscription.request(10);
      assert.equal(recorder.values.length, delivered);
      assert.equal(recorder.afterTerminal, 0);
      assert.equal(recorder.completed, 0);
    });

    it('§1.7 / §3.6 nothing follows cancel, and request after cancel is a no-op that pulls nothing', () => {
      const source = counting();
      const recorder = record(subject.make(source.generator));
      recorder.subscription.request(3);
      recorder.subscription.cancel();
      const pulled = source.state.pulled;
      assert.equal(source.state.closed, true, 'cancel closes the generator');
      recorder.subscription.request(5);
      recorder.subscription.request(0);
      recorder.subscription.request(-1);
      assert.equal(source.state.pulled, pulled);
      assert.equal(recorder.values.length, 3);
      assert.equal(recorder.errors.length, 0, 'an illegal request after cancel is a no-op too');
      assert.equal(recorder.completed, 0);
      assert.equal(recorder.subscription.closed, true);
    });

    it('§3.8 demand is additive: request(2) + request(3) delivers 5', () => {
      const source = counting();
      const recorder = record(subject.make(source.generator));
      recorder.subscription.request(2);
      recorder.subscription.request(3);
      assert.equal(recorder.values.length, 5);
      assert.equal(recorder.subscription.outstanding, 0);
      recorder.subscription.cancel();
    });

    for (const illegal of [0, -1, 1.5, Number.NaN, -Infinity]) {
      it(`§3.9 request(${illegal}) errors the stream with IllegalDemandError instead of throwing, and cancels upstream`, () => {
        const source = counting();
        const recorder = record(subject.make(source.generator));
        recorder.subscription.request(1);
        assert.doesNotThrow(() => recorder.subscription.request(illegal));
        assert.equal(recorder.errors.length, 1);
        const error = recorder.errors[0];
        assert.ok(error instanceof IllegalDemandError, `got ${String(error)}`);
        assert.equal(error.code, 'ILLEGAL_DEMAND');
        assert.ok(Object.is(error.requested, illegal));
        assert.equal(source.state.closed, true);
        recorder.subscription.request(1);
        assert.equal(recorder.values.length, 1);
        assert.equal(recorder.afterTerminal, 0);
      });
    }

    it('§3.17 request(Infinity) is unbounded demand', () => {
      const recorder = record(subject.make(counting(10_000).generator));
      recorder.subscription.request(Infinity);
      assert.equal(recorder.values.length, 10_000);
      assert.equal(recorder.completed, 1);
    });

    it('§3.17 repeated request(Number.MAX_SAFE_INTEGER) saturates at unbounded instead of overflowing', () => {
      const source = counting();
      const recorder = record(subject.make(source.generator), (_value, subscription) => {
        if (recorder.values.length === 100) {
          subscription.request(Number.MAX_SAFE_INTEGER);
          subscription.request(Number.MAX_SAFE_INTEGER);
          assert.equal(subscription.outstanding, Infinity);
        }
        if (recorder.values.length === 5000) subscription.cancel();
      });
      recorder.subscription.request(Number.MAX_SAFE_INTEGER - 1);
      assert.equal(recorder.values.length, 5000);
      assert.equal(recorder.errors.length, 0);
      assert.equal(source.state.closed, true);
    });
  });
}

describe('Reactive Streams §3.3: demand does not recurse without bound', () => {
  const N = 1_000_000;
  const pipeline = (generator: Iterable<number>) => fromIterable(generator).pipe(stage(identity), stage(identity), stage(identity));

  it('a synchronous source of 1,000,000 elements through 3 stages, request(1) from inside next, does not overflow the stack', () => {
    let sum = 0;
    const recorder = record(
      pipeline(counting(N).generator),
      (value, subscription) => {
        sum += (value as Traced<number>).value;
        subscription.request(1);
      },
      false,
    );
    recorder.subscription.request(1);
    assert.deepEqual(recorder.errors, []);
    assert.equal(recorder.count, N);
    assert.equal(sum, (N * (N - 1)) / 2);
    assert.equal(recorder.completed, 1);
    assert.equal(recorder.overlapping, 0);
  });

  it('the same pipeline with unbounded demand delivers all 1,000,000 elements', () => {
    const recorder = record(pipeline(counting(N).generator), undefined, false);
    recorder.subscription.request(Infinity);
    assert.deepEqual(recorder.errors, []);
    assert.equal(recorder.count, N);
    assert.equal(recorder.completed, 1);
  });
});

describe('Reactive Streams rules through a stage with asynchronous work', () => {
  it('§1.1 never delivers more than requested while work completes later', async () => {
    const recorder = record(fromIterable(counting(30).generator).pipe(stage(async (x: number) => x, { capacity: 3, concurrency: 2 })));
    let requested = 0;
    for (const n of [2, 1, 4, 3]) {
      requested += n;
      recorder.subscription.request(n);
      for (let i = 0; i < 5; i++) await tick();
      assert.equal(recorder.values.length, requested);
    }
    recorder.subscription.cancel();
  });

  it('§1.7 nothing follows cancel although work in flight finishes afterwards', async () => {
    const recorder = record(fromIterable(counting(30).generator).pipe(stage(async (x: number) => x, { capacity: 3, concurrency: 3, ordered: false })));
    recorder.subscription.request(10);
    recorder.subscription.cancel();
    for (let i = 0; i < 5; i++) await tick();
    assert.equal(recorder.values.length, 0);
    assert.equal(recorder.afterTerminal, 0);
  });

  it('§1.7 an error from work ends the stream; later completions of other work are not signalled', async () => {
    let calls = 0;
    const recorder = record(
      fromIterable(counting(30).generator).pipe(
        stage(
          async (x: number) => {
            calls++;
            if (x === 2) throw new Error('bad element');
            await tick();
            return x;
          },
          { capacity: 3, concurrency: 3 },
        ),
      ),
    );
    recorder.subscription.request(Infinity);
    for (let i = 0; i < 10; i++) await tick();
    assert.equal(recorder.errors.length, 1);
    assert.ok(recorder.errors[0] instanceof StageError);
    assert.equal(recorder.afterTerminal, 0);
    assert.equal(recorder.completed, 0);
    assert.ok(calls >= 3);
  });
});

describe('plain RxJS operators between two stages', () => {
  /**
   * generator → stage A (sync, capacity 4, concurrency 2) → operator → stage B (slow:
   * each element takes 3 frames, capacity 4, concurrency 2) → subscriber, in virtual
   * time. Elements between the generator and the end are held by A, B, or the
   * operator; those the operator holds count against B's room (in transit), so
   * pulled − done never exceeds A's and B's capacity + concurrency: 12.
   *
   * The documented slack of a deferring operator (see `Inlet`): before its first
   * element comes back, a link lets 16 elements go missing beyond its room, and waits
   * (up to `transitTimeout`) before it lets more go: any deferral shorter than that
   * costs 16, whatever its length, its spread or its queue.
   */
  const N = 50_000;
  const A = { capacity: 4, concurrency: 2 };
  const B = { capacity: 4, concurrency: 2 };
  const bound = A.capacity + A.concurrency + B.capacity + B.concurrency;
  /** Latencies between 1 and 40 frames, the same on every run. */
  const jitter = (value: number): number => 1 + ((value * 7919) % 40);

  function run(name: string, between: (dropped: () => void) => (source: Observable<Traced<number>>) => Observable<Traced<number>>, allowed = bound) {
    const what = allowed === bound ? `${bound} elements` : `${bound} + ${allowed - bound} (deferral slack) elements`;
    it(`${name}: never stalls, never loses, and pulls at most ${what} ahead of the consumer`, () => {
      const scheduler = new TestScheduler((actual, expected) => assert.deepEqual(actual, expected));
      scheduler.run(() => {
        const source = counting(N);
        let done = 0;
        let worst = 0;
        let delivered = 0;
        let sum = 0;
        let expectedSum = 0;
        let completed = false;
        const statsB = new StageStats();
        const check = (): void => {
          worst = Math.max(worst, source.state.pulled - done);
        };
        const counted = fromIterable(
          (function* () {
            for (;;) {
              const step = source.generator.next();
              check(); // right after the pull: the element just pulled counts
              if (step.done) return;
              yield step.value;
            }
          })(),
        );
        counted
          .pipe(
            stage(identity, { name: 'A', ...A }),
            between(() => done++),
            tap((t) => (expectedSum += t.value)),
            stage((x: number) => timer(3).pipe(map(() => x)), { name: 'B', ...B, stats: statsB }),
          )
          .subscribe({
            next: (t) => {
              done++;
              delivered++;
              sum += t.value;
              check();
            },
            complete: () => (completed = true),
          });
        scheduler.flush();
        assert.equal(completed, true, 'the pipeline completed (no stall)');
        assert.equal(source.state.pulled, N);
        assert.equal(done, N, 'every element was delivered or dropped by the operator');
        assert.equal(statsB.received, statsB.delivered);
        assert.ok(worst <= allowed, `pulled − done reached ${worst}, allowed ${allowed}`);
        assert.equal(delivered, statsB.emitted);
        assert.equal(sum, expectedSum);
      });
    });
  }

  run('map', () => map((t) => t));
  run('filter (drops two thirds, and every element of a long run)', (dropped) =>
    filter((t) => {
      const keep = t.value % 3 === 0 && (t.value < 20_000 || t.value > 30_000);
      if (!keep) dropped();
      return keep;
    }),
  );
  run('mergeMap(x => of(x).pipe(delay(1)))', () => mergeMap((t) => of(t).pipe(delay(1))), bound + 16);
  run('delay(5)', () => delay(5), bound + 16);
  run('delay(300)', () => delay(300), bound + 16);
  // Out of order: the link learns the spread of transit times as they come (quick ones first), so it may let a few more past.
  run('mergeMap over latencies of 1 to 40 frames (out of order)', () => mergeMap((t) => timer(jitter(t.value)).pipe(map(() => t))), 3 * bound + 16);
  run('concatMap over 2-frame waits (a queue: transit grows with its length)', () => concatMap((t) => timer(2).pipe(map(() => t))), bound + 16);
  run(
    'delay(20) then a filter dropping nine in ten (drops after a deferral)',
    (dropped) => (source) =>
      source.pipe(
        delay(20),
        filter((t) => {
          const keep = t.value % 10 === 0;
          if (!keep) dropped();
          return keep;
        }),
      ),
    bound + 16,
  );

  run(
    'concatMap to an inner Flow of two copies, the second filtered out (each inner links to B, even one subscribed as the previous completes)',
    () => (source) =>
      source.pipe(
        concatMap((t) => fromIterable([t, t])),
        filter((_t, i) => i % 2 === 0),
      ),
    bound + 16, // concatMap's queue holds A's elements: the same slack as a deferral, until its first inner completes
  );

  it('an element held longer than the link waited is taken when it comes (never an error), counted in stats.lateArrivals, and the link waits longer after it', () => {
    const scheduler = new TestScheduler((actual, expected) => assert.deepEqual(actual, expected));
    scheduler.run(({ flush }) => {
      const statsB = new StageStats();
      const seen: number[] = [];
      let worst = 0;
      let error: unknown;
      // Transits of 1 frame, except every 50th element: 300 frames (out of order through mergeMap).
      fromIterable(counting(500).generator)
        .pipe(
          stage(identity, { name: 'A', ...A }),
          mergeMap((t) => timer(t.value % 50 === 49 ? 300 : 1).pipe(map(() => t))),
          stage(
            (x: number) => {
              worst = Math.max(worst, statsB.buffered + statsB.inFlight - statsB.lateArrivals);
              return x;
            },
            { name: 'B', ...B, stats: statsB },
          ),
        )
        .subscribe({ next: (t) => seen.push(t.value), error: (e: unknown) => (error = e) });
      flush();
      assert.equal(error, undefined);
      assert.equal(seen.length, 500);
      assert.ok(statsB.lateArrivals >= 1 && statsB.lateArrivals < 10, `late arrivals ${statsB.lateArrivals}: the first slow one, not each`);
      assert.ok(worst <= B.capacity + B.concurrency + 16, `buffered + in flight − late arrivals reached ${worst}`);
    });
  });

  it('a filter dropping a long run before its first pass grows the slack a later deferral may use (stats.transitSlack), and no further', () => {
    const scheduler = new TestScheduler((actual, expected) => assert.deepEqual(actual, expected));
    scheduler.run(({ flush }) => {
      const statsB = new StageStats();
      const seen: number[] = [];
      let worst = 0;
      // 40 drops (more than B's room + 16: the link waits them out once, and the slack becomes 64), then every element deferred 20 frames.
      fromIterable(counting(300).generator)
        .pipe(
          stage(identity, { name: 'A', ...A }),
          filter((t) => t.value >= 40),
          delay(20),
          tap(() => (worst = Math.max(worst, statsB.buffered + statsB.inFlight + 1))), // the element arriving counts
          stage((x: number) => timer(3).pipe(map(() => x)), { name: 'B', ...B, stats: statsB }),
        )
        .subscribe({ next: (t) => seen.push(t.value) });
      flush();
      assert.equal(seen.length, 260);
      assert.equal(statsB.transitSlack, 64);
      assert.ok(worst > B.capacity + B.concurrency + 16, `the grown slack is what bounds it: reached ${worst}`);
      assert.ok(worst <= B.capacity + B.concurrency + statsB.transitSlack, `buffered + in flight reached ${worst}`);
    });
  });

  it('drops after a deferral do not crawl: delay(20) then a filter keeping one in ten takes at most 3× as long as delay(20) alone', () => {
    const finish = (keep: (value: number) => boolean): number => {
      const scheduler = new TestScheduler((actual, expected) => assert.deepEqual(actual, expected));
      let completedAt = -1;
      scheduler.run(({ flush }) => {
        fromIterable(counting(3000).generator)
          .pipe(
            stage(identity, { name: 'A', ...A }),
            delay(20),
            filter((t) => keep(t.value)),
            stage(identity, { name: 'B', ...B }),
          )
          .subscribe({ complete: () => (completedAt = scheduler.now()) });
        flush();
      });
      return completedAt;
    };
    const alone = finish(() => true);
    const filtered = finish((value) => value % 10 === 0);
    assert.ok(alone > 0 && filtered > 0, 'both completed');
    assert.ok(filtered <= 3 * alone, `with the filter ${filtered} frames, without ${alone}`);
  });

  it('a stage that answers synchronously after a deferring operator resumes its producer (no stall)', () => {
    const scheduler = new TestScheduler((actual, expected) => assert.deepEqual(actual, expected));
    scheduler.run(({ flush }) => {
      const source = counting(5000);
      let delivered = 0;
      let worst = 0;
      let completed = false;
      fromIterable(source.generator)
        .pipe(
          stage(identity, { name: 'A', ...A }),
          mergeMap((t) => of(t).pipe(delay(1))),
          stage(identity, { name: 'B', ...B }),
        )
        .subscribe({
          next: () => {
            delivered++;
            worst = Math.max(worst, source.state.pulled - delivered);
          },
          complete: () => (completed = true),
        });
      flush();
      assert.equal(completed, true);
      assert.equal(delivered, 5000);
      assert.ok(worst <= bound + 16, `pulled − delivered reached ${worst}`);
    });
  });

  it('concatMap over 1 ms timers or Promises in real time: never more than room + 16 between the stages (a transit read as 0 ms is not a silence)', async () => {
    const inners: Record<string, (t: Traced<number>) => Observable<Traced<number>> | Promise<Traced<number>>> = {
      timer: (t) => timer(1).pipe(map(() => t)),
      promise: (t) => new Promise((resolve) => setTimeout(() => resolve(t), 1)),
    };
    for (const [kind, inner] of Object.entries(inners)) {
      for (let run = 0; run < 15; run++) {
        const statsA = new StageStats();
        const statsB = new StageStats();
        let worst = 0;
        await new Promise<void>((resolve, reject) => {
          fromIterable(counting(150).generator)
            .pipe(
              stage(identity, { name: 'A', capacity: 4, stats: statsA }),
              concatMap(inner),
              tap(() => (worst = Math.max(worst, statsA.delivered - statsB.received + statsB.buffered + statsB.inFlight))),
              stage(async (x: number) => x, { name: 'B', capacity: 4, stats: statsB }),
            )
            .subscribe({ error: reject, complete: resolve });
        });
        assert.ok(worst <= 4 + 1 + 16, `${kind} run ${run}: ${worst} held between the stages, bound ${4 + 1 + 16}`);
      }
    }
  });

  it('delay(1) then a filter keeping one in 100 does not crawl: in virtual time within 6× the time of delay(1) alone', () => {
    const finish = (keep: (value: number) => boolean): number => {
      const scheduler = new TestScheduler((actual, expected) => assert.deepEqual(actual, expected));
      let completedAt = -1;
      scheduler.run(({ flush }) => {
        fromIterable(counting(1000).generator)
          .pipe(
            stage(identity, { name: 'A', capacity: 4 }),
            delay(1),
            filter((t) => keep(t.value)),
            stage(identity, { name: 'B', capacity: 4 }),
          )
          .subscribe({ complete: () => (completedAt = scheduler.now()) });
        flush();
      });
      return completedAt;
    };
    const alone = finish(() => true);
    const filtered = finish((value) => value % 100 === 0);
    assert.ok(alone > 0 && filtered > 0, 'both completed');
    assert.ok(filtered <= 6 * alone, `with the filter ${filtered} frames, without ${alone}`);
  });

  it('a queue then a filter (concatMap over 1 ms timers, then 1 in 100 or 1,000 kept): within room + slack at every step, at the pace of the queue', () => {
    const run = (oneIn: number) => {
      const scheduler = new TestScheduler((actual, expected) => assert.deepEqual(actual, expected));
      const statsA = new StageStats();
      const statsB = new StageStats();
      let dropped = 0;
      let worst = 0;
      let bound = 0;
      let completedAt = -1;
      const observe = () => {
        const held = statsA.delivered - dropped - statsB.received + statsB.buffered + statsB.inFlight;
        if (held - statsB.transitSlack - statsB.lateArrivals > worst - bound) [worst, bound] = [held, 3 + 2 + statsB.transitSlack + statsB.lateArrivals];
      };
      scheduler.run(({ flush }) => {
        fromIterable(counting(5000).generator)
          .pipe(
            stage(identity, { name: 'A', capacity: 4, stats: statsA }),
            concatMap((t) => timer(1).pipe(map(() => t))),
            // The first pass comes only after oneIn − 1 drops: until then nothing shows the filter drops.
            filter((t) => (t.value + 1) % oneIn === 0 || (dropped++, false)),
            tap(observe),
            stage(
              (x: number) => {
                observe();
                return x;
              },
              { name: 'B', capacity: 3, concurrency: 2, stats: statsB },
            ),
          )
          .subscribe({ complete: () => (completedAt = scheduler.now()) });
        flush();
      });
      return { worst, bound, completedAt, late: statsB.lateArrivals };
    };
    for (const oneIn of [100, 1000]) {
      const { worst, bound, completedAt, late } = run(oneIn);
      assert.ok(completedAt > 0, `1 in ${oneIn}: completed`);
      assert.ok(worst <= bound + 1, `1 in ${oneIn}: held ${worst}, room + slack + late arrivals ${bound}`);
      assert.ok(late <= 1, `1 in ${oneIn}: ${late} elements given up on came back`);
      // The queue's own pace is 5,000 frames; before the first pass the link waits transitTimeout per fourfold wave, a few times.
      assert.ok(completedAt <= 5000 * 1.5 + 5 * 1000, `1 in ${oneIn}: ${completedAt} frames`);
    }
  });

  it('mergeMap(x => of(x).pipe(delay(1))) in real time: delivers all, pulled − delivered stays within the bound + 16', async () => {
    const source = counting(2000);
    let delivered = 0;
    let worst = 0;
    await new Promise<void>((resolve, reject) => {
      fromIterable(source.generator)
        .pipe(
          stage(identity, { name: 'A', ...A }),
          mergeMap((t) => of(t).pipe(delay(1))),
          stage(async (x: number) => x, { name: 'B', ...B }),
        )
        .subscribe({
          next: () => {
            delivered++;
            worst = Math.max(worst, source.state.pulled - delivered);
          },
          error: reject,
          complete: resolve,
        });
    });
    assert.equal(delivered, 2000);
    assert.ok(worst <= bound + 16, `pulled − delivered reached ${worst}, allowed ${bound + 16}`);
  });
});

describe('a filter between two stages', () => {
  it('once an element has passed, runs of drops of any length never make the link wait: a synchronous pipeline completes synchronously', () => {
    const source = counting(20_000);
    const seen: number[] = [];
    let completed = false;
    fromIterable(source.generator)
      .pipe(
        stage(identity, { capacity: 2 }),
        filter((t) => t.value % 5000 === 0), // passes 0, then drops 4999 in a row, four times
        stage(identity, { capacity: 2 }),
      )
      .subscribe({ next: (t) => seen.push(t.value), complete: () => (completed = true) });
    assert.deepEqual(seen, [0, 5000, 10_000, 15_000]);
    assert.equal(completed, true);
  });

  it('a run of drops before the first pass within the grace (16 beyond the room) never waits', () => {
    const scheduler = new TestScheduler((actual, expected) => assert.deepEqual(actual, expected));
    scheduler.run(({ flush }) => {
      let completedAt = -1;
      fromIterable(counting(100).generator)
        .pipe(
          stage(identity, { capacity: 2 }),
          filter((t) => t.value >= 15),
          stage(identity, { capacity: 2 }),
        )
        .subscribe({ complete: () => (completedAt = scheduler.now()) });
      flush();
      assert.equal(completedAt, 0);
    });
  });

  it('a longer run of drops before the first pass waits transitTimeout per fourfold wave, once: 19,000 drops cost 5 waits', () => {
    for (const transitTimeout of [1000, 10]) {
      const scheduler = new TestScheduler((actual, expected) => assert.deepEqual(actual, expected));
      scheduler.run(({ flush }) => {
        let completedAt = -1;
        const seen: number[] = [];
        fromIterable(counting(20_000).generator)
          .pipe(
            stage(identity, { capacity: 2 }),
            filter((t) => t.value >= 19_000),
            stage(identity, { capacity: 2, transitTimeout }),
          )
          .subscribe({ next: (t) => seen.push(t.value), complete: () => (completedAt = scheduler.now()) });
        flush();
        // Waves of 19, 64, 256, 1024, 4096 and 16384 elements: the sixth reaches the first pass. After it, no more waits.
        assert.equal(seen.length, 1000);
        assert.ok(completedAt >= 5 * transitTimeout && completedAt <= 5 * transitTimeout + 5, `completed at frame ${completedAt}`);
      });
    }
  });
});

describe('subscribeWithDemand through plain operators', () => {
  it('§1.1 across a deferring operator: request(3) through delay(30) delivers exactly 3, however long the wait; the rest on request', async () => {
    function* count(): Generator<number> {
      for (let i = 0; i < 100; i++) yield i;
    }
    const seen: number[] = [];
    let completed = false;
    const demand = subscribeWithDemand(fromIterable(count()).pipe(delay(30)), { next: (x) => seen.push(x), complete: () => (completed = true) });
    demand.request(3);
    await new Promise((resolve) => setTimeout(resolve, 150));
    assert.deepEqual(seen, [0, 1, 2]);
    demand.request(2);
    await new Promise((resolve) => setTimeout(resolve, 100));
    assert.deepEqual(seen, [0, 1, 2, 3, 4]);
    demand.request(Infinity);
    await until(() => completed, 5_000);
    assert.deepEqual(
      seen,
      Array.from({ length: 100 }, (_, i) => i),
    );
  });

  /** Waits (in real time: in-transit waits use `asyncScheduler`) until `done()` holds. */
  async function until(done: () => boolean, ticks = 500): Promise<void> {
    for (let i = 0; i < ticks && !done(); i++) await new Promise((resolve) => setTimeout(resolve, 1));
  }

  it('a filter between a Flow and the consumer does not use up credits: no leak, no stall, never more than requested', async () => {
    const source = counting(100);
    const recorder = record(fromIterable(source.generator).pipe(filter((x) => x % 4 === 0)));
    recorder.subscription.request(3);
    await until(() => recorder.values.length === 3);
    assert.deepEqual(recorder.values, [0, 4, 8]);
    recorder.subscription.request(2);
    await until(() => recorder.values.length === 5);
    assert.deepEqual(recorder.values, [0, 4, 8, 12, 16]);
    await until(() => false, 20); // nothing more arrives while we wait
    assert.equal(recorder.values.length, 5);
    recorder.subscription.request(Infinity);
    assert.equal(recorder.values.length, 25);
    assert.equal(recorder.completed, 1);
  });

  it('a filter after a stage does not use up credits either', async () => {
    const recorder = record(
      fromIterable(counting(100).generator).pipe(
        stage(identity),
        filter((t) => t.value % 4 === 0),
      ),
    );
    recorder.subscription.request(3);
    await until(() => recorder.values.length === 3);
    assert.deepEqual(
      recorder.values.map((t) => t.value),
      [0, 4, 8],
    );
    recorder.subscription.cancel();
  });

  it('a filter that lets every element through answers synchronously', () => {
    const recorder = record(fromIterable(counting(100).generator).pipe(filter(() => true)));
    recorder.subscription.request(3);
    assert.deepEqual(recorder.values, [0, 1, 2]);
    recorder.subscription.cancel();
  });

  it('an inner Flow of mergeMap uses the credit, not the outer element it came from', () => {
    const recorder = record(fromIterable([1, 2, 3]).pipe(mergeMap((x) => fromIterable([x, x * 10]))));
    recorder.subscription.request(3);
    assert.deepEqual(recorder.values, [1, 10, 2]);
    recorder.subscription.request(10);
    assert.deepEqual(
      [...recorder.values].sort((a, b) => a - b),
      [1, 2, 3, 10, 20, 30],
    );
    assert.equal(recorder.completed, 1);
  });
});

describe('ending early stops the source at once', () => {
  it('a consumer that ends inside a synchronous subscribe (take) stops an infinite generator through two stages', () => {
    const source = counting();
    const seen: number[] = [];
    let completed = false;
    fromIterable(source.generator)
      .pipe(stage(identity), stage(identity), take(3))
      .subscribe({ next: (t) => seen.push(t.value), complete: () => (completed = true) });
    assert.deepEqual(seen, [0, 1, 2]);
    assert.equal(completed, true);
    assert.equal(source.state.closed, true);
    // The stages may fill their buffers (default capacity 16, concurrency 1) before their teardown runs, no more.
    assert.ok(source.state.pulled <= 3 + 2 * (16 + 1), `pulled ${source.state.pulled}`);
  });

  for (const policy of ['fail', 'pause'] as const) {
    it(`a stage with policy "${policy}" that overflows stops a synchronous plain source at once`, async () => {
      const source = counting();
      const stats = new StageStats();
      let error: unknown;
      from(source.generator)
        .pipe(stage(async (x: number) => x, { capacity: 2, policy, stats }))
        .subscribe({ error: (e) => (error = e) });
      // One element in flight, two buffered, the one that overflowed: then the source is closed.
      assert.equal(source.state.closed, true);
      assert.equal(source.state.pulled, 4);
      assert.equal(stats.received, 4);
      for (let i = 0; i < 5; i++) await tick(); // policy "fail" delivers what it holds before the error
      assert.ok(error instanceof SluiceError, String(error));
      assert.equal(error.code, policy === 'fail' ? 'OVERFLOW' : 'UNPAUSABLE_SOURCE');
    });
  }

  it('a stage whose kill switch was shut down before it started completes without subscribing its source', () => {
    const killSwitch = new KillSwitch();
    killSwitch.shutdown();
    const subject = new Subject<number>();
    let completed = false;
    subject.pipe(stage(identity, { killSwitch })).subscribe({ complete: () => (completed = true) });
    assert.equal(completed, true);
    assert.equal(subject.observed, false);
  });

  it('work whose output the consumer took before unsubscribing counts as delivered, not shed', async () => {
    const stats = new StageStats();
    const seen: number[] = [];
    fromIterable([1, 2, 3])
      .pipe(
        stage(async (x: number) => x, { capacity: 1, concurrency: 2, stats }),
        take(1),
      )
      .subscribe((t) => seen.push(t.value));
    for (let i = 0; i < 5; i++) await tick();
    assert.deepEqual(seen, [1]);
    assert.equal(stats.delivered, 1);
    assert.equal(stats.shed.cancelled, 2);
    assert.equal(stats.received, stats.delivered + stats.shedTotal + stats.failed);
  });
});

describe('a consumer that leaves inside a synchronous subscribe', () => {
  for (const [name, operator] of [
    ['stage (pause)', stage((x: number) => x)],
    ['stage (shed-oldest)', stage((x: number) => x, { policy: 'shed-oldest' })],
    ['batch', batch<number>({ maxSize: 2, maxWait: 10 })],
    ['partition', partition({ lanes: 2, key: (x: number) => String(x), lane: (flow) => flow })],
    ['balance', balance({ workers: 2, worker: (flow: Flow<Traced<number>>) => flow })],
    ['broadcast', broadcast({ branches: 2, branch: (flow: Flow<Traced<number>>) => flow })],
  ] as const) {
    it(`stops an endless synchronous source at once through ${name} (take)`, () => {
      let pulled = 0;
      function* naturals(): Generator<number> {
        for (let i = 0; ; i++) {
          pulled++;
          if (pulled > 10_000) throw new Error('runaway source');
          yield i;
        }
      }
      const received: unknown[] = [];
      (fromIterable(naturals()).pipe(operator as never) as Observable<unknown>).pipe(take(2)).subscribe({ next: (x) => received.push(x) });
      assert.equal(received.length, 2);
      assert.ok(pulled < 100, `pulled ${pulled} elements for 2`);
    });
  }
});

describe('accounting when the consumer leaves early', () => {
  it('a stage that never pauses is cancelled the moment its consumer leaves inside a synchronous subscribe: nothing arrives after', () => {
    const stats = new StageStats();
    const received: unknown[] = [];
    fromIterable([0])
      .pipe(
        stage((x: number) => fromIterable([x, x + 1]), { capacity: 1 }),
        stage((x: number) => x, { capacity: 1, policy: 'conflate', conflate: (_: number, b: number) => b, stats }),
        take(1),
      )
      .subscribe((t) => received.push(t.value));
    assert.deepEqual(received, [0]);
    assert.equal(stats.received, 1);
    assert.equal(stats.shed.cancelled, 0);
    assert.equal(stats.received, stats.delivered + stats.shedTotal + stats.failed);
  });
});

describe('subscribeWithDemand is its own RxJS subscriber, with what SafeSubscriber guaranteed', () => {
  it('a throw from the observer during a signal of the source is reported, not thrown into the source, which goes on', async () => {
    const reported: unknown[] = [];
    const previous = rxjsConfig.onUnhandledError;
    rxjsConfig.onUnhandledError = (err) => reported.push(err);
    try {
      const received: number[] = [];
      const subscription = subscribeWithDemand(fromIterable([1, 2, 3]), {
        next: (value) => {
          received.push(value);
          if (value === 1) throw new Error('observer failed');
        },
      });
      subscription.request(3);
      assert.deepEqual(received, [1, 2, 3]);
      await new Promise((resolve) => setTimeout(resolve, 5));
      assert.equal(reported.length, 1);
      assert.equal((reported[0] as Error).message, 'observer failed');
    } finally {
      rxjsConfig.onUnhandledError = previous;
    }
  });

  it("a plain source's teardown runs once, after the observer got its terminal signal", () => {
    const order: string[] = [];
    const source = new Observable<number>((subscriber) => {
      subscriber.next(1);
      subscriber.complete();
      return () => order.push('teardown');
    });
    const subscription = subscribeWithDemand(source, { next: (v) => order.push(`next ${v}`), complete: () => order.push('complete') });
    subscription.request(1);
    subscription.cancel();
    assert.deepEqual(order, ['next 1', 'complete', 'teardown']);
    assert.equal(subscription.closed, true);
  });

  it('cancel runs the teardown of the source and of every operator between', () => {
    const torn: string[] = [];
    let emit!: (value: number) => void;
    const source = new Observable<number>((subscriber) => {
      emit = (value) => subscriber.next(value);
      return () => torn.push('source');
    }).pipe(
      map((x) => x * 10),
      tap({ finalize: () => torn.push('tap') }),
    );
    const received: number[] = [];
    const subscription = subscribeWithDemand(source, { next: (v) => received.push(v) });
    subscription.request(Infinity);
    emit(1);
    subscription.cancel();
    emit(2);
    assert.deepEqual(received, [10]);
    assert.deepEqual(torn.sort(), ['source', 'tap']);
    assert.equal(subscription.closed, true);
  });

  it('a hand-written source that goes on after cancel or after its end is not heard', () => {
    let signals!: Subscriber<number>;
    const received: string[] = [];
    const subscription = subscribeWithDemand(
      new Observable<number>((subscriber) => {
        signals = subscriber;
      }),
      { next: (v) => received.push(`next ${v}`), error: () => received.push('error'), complete: () => received.push('complete') },
    );
    subscription.request(Infinity);
    signals.next(1);
    signals.complete();
    signals.next(2);
    signals.error(new Error('late'));
    assert.deepEqual(received, ['next 1', 'complete']);

    const cancelled: string[] = [];
    const other = subscribeWithDemand(
      new Observable<number>((subscriber) => {
        signals = subscriber;
      }),
      { next: (v) => cancelled.push(`next ${v}`), complete: () => cancelled.push('complete') },
    );
    other.request(Infinity);
    other.cancel();
    signals.next(1);
    signals.complete();
    assert.deepEqual(cancelled, []);
  });
});
