/**
 * User code that calls back into the pipeline while the stage is running it: a consumer that
 * unsubscribes from inside work or a hook, a kill switch fired from inside work, hooks that throw.
 * Each case ends with every element accounted for exactly once and nothing thrown into the producer.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { Subject, Subscriber, config, type Subscription } from 'rxjs';
import { stage, type StageOptions } from '../../operators/stage.js';
import { fromIterable } from '../../src/flow/sources.js';
import { fromPush } from '../../src/flow/push.js';
import type { DemandSubscription } from '../../src/flow/demand.js';
import { StageStats } from '../../src/flow/stats.js';
import { KillSwitch } from '../../src/flow/kill-switch.js';
import { InvalidOptionsError } from '../../src/core/errors.js';
import type { Traced } from '../../src/core/trace.js';

const tick = (ms = 0) => new Promise((resolve) => setTimeout(resolve, ms));

/** received = delivered + shed + failed, with nothing left buffered or in flight. */
function assertAccounted(stats: StageStats): void {
  assert.equal(stats.buffered, 0, 'nothing left buffered');
  assert.equal(stats.inFlight, 0, 'nothing left in flight');
  assert.equal(stats.received, stats.delivered + stats.shedTotal + stats.failed, 'received = delivered + shed + failed');
}

/** Runs `body` and returns what reached `uncaughtException` meanwhile (and one macrotask after). */
async function uncaughtDuring(body: () => Promise<void>): Promise<unknown[]> {
  const caught: unknown[] = [];
  const listener = (err: unknown) => caught.push(err);
  const previous = process.listeners('uncaughtException');
  process.removeAllListeners('uncaughtException');
  process.on('uncaughtException', listener);
  try {
    await body();
    await tick(5);
  } finally {
    process.off('uncaughtException', listener);
    for (const l of previous) process.on('uncaughtException', l);
  }
  return caught;
}

/** A consumer that can unsubscribe itself from inside the pipeline. */
function consumerOf(next: (t: Traced<number>) => void): Subscriber<Traced<number>> {
  return new Subscriber<Traced<number>>({ next, error: () => {}, complete: () => {} });
}

describe('re-entrancy: the consumer leaves from inside work', () => {
  for (const shape of ['fused source', 'stage → stage'] as const) {
    it(`async work that unsubscribes its consumer crashes nothing and sheds the element as cancelled (${shape})`, async () => {
      const stats = new StageStats();
      const got: number[] = [];
      const caught = await uncaughtDuring(async () => {
        const consumer: Subscriber<Traced<number>> = consumerOf((t) => got.push(t.value));
        const work = async (x: number) => {
          if (x === 2) consumer.unsubscribe();
          return x;
        };
        const source = fromIterable([0, 1, 2]);
        const piped =
          shape === 'fused source'
            ? source.pipe(stage(work, { stats }))
            : source.pipe(
                stage((x: number) => x),
                stage(work, { stats }),
              );
        piped.subscribe(consumer);
        await tick(5);
      });
      assert.deepEqual(caught, []);
      assert.deepEqual(got, [0, 1]);
      assert.equal(stats.received, 3);
      assert.equal(stats.shed.cancelled, 1);
      assertAccounted(stats);
    });
  }

  it('sync work that unsubscribes its consumer is called for no later element, and only what was received counts as delivered', () => {
    const stats = new StageStats();
    const called: number[] = [];
    const got: number[] = [];
    const consumer: Subscriber<Traced<number>> = consumerOf((t) => got.push(t.value));
    fromIterable([0, 1, 2, 3])
      .pipe(
        stage(
          (x: number) => {
            called.push(x);
            if (x === 1) consumer.unsubscribe();
            return x;
          },
          { stats },
        ),
      )
      .subscribe(consumer);
    assert.deepEqual(called, [0, 1]);
    assert.deepEqual(got, [0]);
    assert.equal(stats.delivered, 1);
    assert.equal(stats.shed.cancelled, 1);
    assertAccounted(stats);
  });

  it('a consumer leaving inside a synchronous subscribe stops a buffering stage before it starts more work', () => {
    const called: number[] = [];
    const stats = new StageStats();
    const consumer: Subscriber<Traced<number>> = consumerOf((t) => {
      if (t.value === 0) consumer.unsubscribe();
    });
    fromIterable([0, 1, 2, 3, 4])
      .pipe(
        stage(
          (x: number) => {
            called.push(x);
            return x;
          },
          { stats, concurrency: 1 },
        ),
      )
      .subscribe(consumer);
    assert.deepEqual(called, [0]);
    assertAccounted(stats);
  });
});

describe('re-entrancy: the kill switch fired from inside work', () => {
  it('shutdown() inside sync work lets the element being worked on finish and be delivered, then completes', () => {
    const stats = new StageStats();
    const kill = new KillSwitch();
    const got: number[] = [];
    let completed = false;
    fromIterable([0, 1, 2, 3])
      .pipe(
        stage(
          (x: number) => {
            if (x === 1) kill.shutdown();
            return x;
          },
          { stats, killSwitch: kill },
        ),
      )
      .subscribe({ next: (t) => got.push(t.value), complete: () => (completed = true) });
    assert.deepEqual(got, [0, 1]);
    assert.ok(completed);
    assert.equal(stats.delivered, 2);
    assertAccounted(stats);
  });

  it('shutdown() inside async work lets it and everything already received settle and be delivered, then completes', async () => {
    const stats = new StageStats();
    const kill = new KillSwitch();
    const got: number[] = [];
    await new Promise<void>((resolve, reject) =>
      fromIterable([0, 1, 2, 3])
        .pipe(
          stage((x: number) => x),
          stage(
            async (x: number) => {
              if (x === 1) kill.shutdown();
              await tick();
              return x;
            },
            { stats, killSwitch: kill },
          ),
        )
        .subscribe({ next: (t) => got.push(t.value), error: reject, complete: resolve }),
    );
    assert.deepEqual(got, [0, 1, 2, 3].slice(0, stats.received));
    assert.ok(got.includes(1));
    assert.equal(stats.delivered, stats.received);
    assertAccounted(stats);
  });

  for (const kind of ['sync', 'async'] as const) {
    it(`abort() inside ${kind} work counts the element being worked on as failed`, async () => {
      const stats = new StageStats();
      const kill = new KillSwitch();
      const work =
        kind === 'sync'
          ? (x: number) => {
              if (x === 1) kill.abort();
              return x;
            }
          : async (x: number) => {
              if (x === 1) kill.abort();
              return x;
            };
      const error = await new Promise<unknown>((resolve) =>
        fromIterable([0, 1, 2, 3])
          .pipe(stage(work as (x: number) => number, { stats, killSwitch: kill }))
          .subscribe({ error: resolve, complete: () => resolve(undefined) }),
      );
      assert.ok(error instanceof Error);
      assert.equal(stats.delivered, 1);
      assert.equal(stats.failed, stats.received - 1, 'the element being worked on and any buffered behind it');
      assertAccounted(stats);
    });
  }
});

describe('re-entrancy: hooks', () => {
  it('unsubscribing inside onShed (shed-oldest) sheds what is buffered as cancelled and leaves nothing counted twice or lost', async () => {
    const stats = new StageStats();
    const subject = new Subject<number>();
    let subscription: Subscription | undefined;
    const reasons: string[] = [];
    subscription = subject
      .pipe(
        stage(
          async (x: number) => {
            await tick(5);
            return x;
          },
          {
            capacity: 1,
            policy: 'shed-oldest',
            stats,
            onShed: (event) => {
              reasons.push(event.reason);
              subscription?.unsubscribe();
            },
          },
        ),
      )
      .subscribe();
    for (let i = 0; i < 5; i++) subject.next(i);
    await tick(10);
    assert.equal(stats.received, 3);
    assert.equal(stats.shed.evicted, 1);
    assert.equal(stats.shed.cancelled, 2);
    assert.deepEqual(reasons.slice(0, 1), ['evicted']);
    assertAccounted(stats);
  });

  it('cancelling inside fromPush onShed (shed-oldest) sheds what is held and leaves nothing counted twice or lost', () => {
    const stats = new StageStats();
    const subject = new Subject<number>();
    let demand: DemandSubscription | undefined;
    const flow = fromPush(subject, { capacity: 1, policy: 'shed-oldest', stats, onShed: () => demand?.cancel() });
    demand = flow.subscribeWithDemand({});
    for (let i = 0; i < 3; i++) subject.next(i);
    assert.equal(stats.received, 2);
    assert.equal(stats.shed.evicted, 1);
    assert.equal(stats.shed.cancelled, 1);
    assert.equal(stats.buffered, 0);
    assert.equal(stats.received, stats.delivered + stats.shedTotal + stats.failed);
  });

  const throwingHooks: [string, Partial<StageOptions<number>>, (subject: Subject<number>) => void][] = [
    [
      'onShed',
      {
        capacity: 1,
        policy: 'shed-incoming',
        onShed: () => {
          throw new Error('hook failed');
        },
      },
      (subject) => {
        for (let i = 0; i < 4; i++) subject.next(i);
      },
    ],
    [
      'onFailure',
      {
        errorPolicy: 'skip',
        onFailure: () => {
          throw new Error('hook failed');
        },
      },
      (subject) => subject.next(-1),
    ],
  ];
  for (const [hook, options, feed] of throwingHooks) {
    it(`a throwing ${hook} is reported as RxJS reports unhandled errors, never into the producer's Subject.next()`, async () => {
      const reported: unknown[] = [];
      const previous = config.onUnhandledError;
      config.onUnhandledError = (err) => reported.push(err);
      try {
        const stats = new StageStats();
        const subject = new Subject<number>();
        const subscription = subject
          .pipe(
            stage(
              async (x: number) => {
                if (x < 0) throw new Error('bad element');
                await tick(5);
                return x;
              },
              { ...options, stats },
            ),
          )
          .subscribe();
        assert.doesNotThrow(() => feed(subject));
        await tick(20);
        subscription.unsubscribe();
        assert.ok(reported.length >= 1, 'the hook error was reported');
        assert.ok(reported.every((err) => err instanceof Error && err.message === 'hook failed'));
        assertAccounted(stats);
      } finally {
        config.onUnhandledError = previous;
      }
    });
  }
});

describe('stage: work that is not a function', () => {
  for (const work of [42, 'x', null, undefined, {}, [1]]) {
    it(`stage(${JSON.stringify(work) ?? 'undefined'}) fails at construction with InvalidOptionsError naming "work"`, () => {
      assert.throws(
        () => stage(work as never),
        (err: unknown) => err instanceof InvalidOptionsError && err.issues.some((issue) => issue.path === 'work'),
      );
    });
  }
});
