import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { AssertionError } from 'node:assert';
import { VirtualTimeScheduler, filter, merge } from 'rxjs';
import { TestSink, TestSource, eventually, expectAccounted, verify } from 'sluice/testing';
import { stage, type ShedEvent, type StageOptions } from '../../operators/stage.js';
import { StageStats } from '../../src/flow/stats.js';
import { IllegalDemandError, OverflowError, StageError, StageTimeoutError } from '../../src/core/errors.js';
import { pathsOf } from '../support/invalid-options.js';
import { Traced } from '../../src/core/trace.js';

const times10 = (x: number): number => x * 10;

/** TestSource → stage(x * 10, capacity 2, concurrency 1, ...) → TestSink with no demand. */
function probe(options: StageOptions<number> = {}) {
  const stats = new StageStats();
  const shed: ShedEvent<number>[] = [];
  const source = new TestSource<number>();
  const sink = TestSink.subscribe(
    source.pipe(stage(times10, { name: 'times10', capacity: 2, concurrency: 1, stats, onShed: (event) => shed.push(event), ...options })),
  );
  return { source, sink, stats, shed };
}

/** Runs `fn`, expecting an AssertionError; returns its message. */
function failureOf(fn: () => unknown): string {
  try {
    fn();
  } catch (error) {
    assert.ok(error instanceof AssertionError, `expected an AssertionError, got ${String(error)}`);
    return error.message;
  }
  assert.fail('expected the call to throw');
}

describe('the test kit checks its options', () => {
  it('TestSink.subscribe, verify and eventually name each bad field', async () => {
    const source = new TestSource<number>();
    assert.throws(
      () => TestSink.subscribe(source, { request: -1, unwarp: false } as never),
      (error: unknown) => pathsOf(error).join() === 'request,unwarp',
    );
    assert.throws(
      () => verify(source, { scheduler: {}, maxTicks: 1.5, requst: 1 } as never),
      (error: unknown) => pathsOf(error).join() === 'maxTicks,requst,scheduler',
    );
    await assert.rejects(
      eventually(() => {}, { maxTick: 3, tick: 1 } as never),
      (error: unknown) => pathsOf(error).join() === 'maxTick,tick',
    );
  });
});

describe('stage demand, driven by TestSource and TestSink', () => {
  it('asks upstream for capacity + concurrency before the sink requests anything', () => {
    const { source, sink } = probe();
    assert.equal(source.subscribed, true);
    source.expectDemand(3);
    assert.deepEqual(source.pulls, [3]);
    assert.equal(sink.outstanding, 0);
    sink.expectNoEvents();
  });

  it('stops asking once its buffer and worker are full', () => {
    const { source, sink } = probe();
    source.emit(1, 2, 3);
    source.expectDemand(0);
    assert.equal(source.wants, false);
    assert.equal(source.offer(4), false);
    assert.throws(() => source.emit(4), AssertionError);
    assert.deepEqual(source.emitted, [1, 2, 3]);
    sink.expectNoEvents();
  });

  it('turns one request downstream into exactly one more demand upstream', () => {
    const { source, sink } = probe();
    source.emit(1, 2, 3);
    sink.request(1).expectNext(10).expectNoEvents();
    source.expectDemand(1);
    assert.deepEqual(source.pulls, [3, 1]);
    source.emit(4);
    source.expectDemand(0);
    sink.request(2).expectNext(20, 30);
    source.expectDemand(2);
    assert.deepEqual(source.pulls, [3, 1, 2]);
  });

  it('resumes a lone producer it stopped once a quarter of its room is free, not at every freed slot', () => {
    const { source, sink, stats } = probe({ capacity: 7 }); // room 8: resumed at 2 free
    source.emit(1, 2, 3, 4, 5, 6, 7, 8);
    source.expectDemand(0);
    assert.equal(stats.pauses, 1); // each time it fills up
    sink.request(1).expectNext(10);
    source.expectDemand(1); // it may send (asked, the answer is yes) but is not woken for one slot
    assert.deepEqual(source.pulls, [8]);
    sink.request(1).expectNext(20);
    assert.deepEqual(source.pulls, [8, 2]);
    source.emit(9, 10);
    assert.equal(stats.pauses, 2);
    sink.request(8).expectNext(30, 40, 50, 60, 70, 80, 90, 100);
    assert.deepEqual(source.pulls, [8, 2, 8]); // one wake for the whole batch the sink took
  });

  it('resumes every producer at any free slot when there are several (none can keep another out)', () => {
    const a = new TestSource<number>();
    const b = new TestSource<number>();
    const sink = TestSink.subscribe(merge(a, b).pipe(stage(times10, { name: 'merged', capacity: 7 })));
    a.emit(1, 2, 3, 4);
    b.emit(5, 6, 7, 8);
    a.expectDemand(0);
    const [aPulls, bPulls] = [a.pulls.length, b.pulls.length];
    sink.request(1).expectNext(10);
    assert.equal(a.pulls.length, aPulls + 1);
    assert.equal(b.pulls.length, bPulls + 1);
    a.expectDemand(1);
  });

  it('passes elements straight through while the sink has demand, keeping upstream demand at capacity + concurrency', () => {
    const { source, sink, stats } = probe();
    sink.request(5);
    source.emit(1, 2);
    sink.expectNext(10, 20);
    source.expectDemand(3);
    assert.equal(sink.outstanding, 3);
    assert.equal(stats.buffered, 0);
  });

  it('completes only after delivering what it holds, and accounts for every element', () => {
    const { source, sink, stats } = probe();
    source.emit(1, 2, 3);
    source.complete();
    sink.expectNoEvents();
    sink.request(2).expectNext(10, 20).expectNoEvents();
    sink.request(1).expectNext(30).expectComplete();
    expectAccounted(stats, { received: 3, delivered: 3, emitted: 3, shedTotal: 0, failed: 0 });
  });

  it('sheds the incoming element when the buffer is full and reports it (shed-incoming)', () => {
    const { source, sink, stats, shed } = probe({ policy: 'shed-incoming' });
    source.expectDemand(Infinity); // a shedding stage never backpressures
    source.emit(1, 2, 3, 4, 5);
    assert.deepEqual(
      shed.map((event) => [event.value, event.reason]),
      [
        [4, 'buffer-full'],
        [5, 'buffer-full'],
      ],
    );
    source.complete();
    sink.request(10).expectNext(10, 20, 30).expectComplete();
    expectAccounted(stats, { received: 5, delivered: 3, shed: { 'buffer-full': 2 } });
  });

  it('evicts the oldest buffered element and keeps the incoming one (shed-oldest)', () => {
    const { source, sink, stats, shed } = probe({ policy: 'shed-oldest' });
    source.emit(1, 2, 3, 4, 5);
    assert.deepEqual(
      shed.map((event) => [event.value, event.reason]),
      [
        [2, 'evicted'],
        [3, 'evicted'],
      ],
    );
    source.complete();
    sink.request(10).expectNext(10, 40, 50).expectComplete();
    expectAccounted(stats, { received: 5, delivered: 3, shed: { evicted: 2 } });
  });

  it('delivers what it holds, then errors with OverflowError, and cancels upstream (policy fail)', () => {
    const { source, sink, stats } = probe({ policy: 'fail' });
    source.emit(1, 2, 3, 4);
    source.expectCancelled();
    sink.expectNoEvents();
    sink.request(10).expectNext(10, 20, 30).expectError(OverflowError);
    expectAccounted(stats, { received: 4, delivered: 3, failed: 1 });
  });

  for (const illegal of [0, -1, 1.5, Number.NaN]) {
    it(`errors the stream with IllegalDemandError on request(${illegal}) and cancels upstream (§3.9)`, () => {
      const { source, sink } = probe();
      source.emit(1);
      assert.doesNotThrow(() => sink.request(illegal));
      sink.expectError(IllegalDemandError);
      assert.equal((sink.error as IllegalDemandError).requested, illegal);
      assert.equal(sink.closed, true);
      source.expectCancelled();
    });
  }

  it('matches the §3.9 error by its code too', () => {
    const { sink } = probe();
    sink.request(0).expectError('ILLEGAL_DEMAND');
  });

  it('ignores requests after cancel, even illegal ones (§3.6)', () => {
    const { source, sink } = probe();
    source.emit(1, 2, 3);
    sink.cancel();
    sink.request(5).request(0);
    assert.equal(sink.outstanding, 0);
    sink.expectNoEvents();
    assert.equal(sink.errored, false);
    assert.deepEqual(source.pulls, [3]);
  });

  it('propagates cancel to the source and sheds what the stage held as cancelled', () => {
    const { source, sink, stats, shed } = probe();
    source.emit(1, 2, 3);
    sink.request(1).expectNext(10);
    sink.cancel();
    source.expectCancelled();
    assert.equal(source.subscribed, false);
    assert.equal(source.offer(4), false); // a late element after cancel is refused, not thrown (§2.8)
    assert.deepEqual(
      shed.map((event) => [event.value, event.reason]),
      [
        [3, 'cancelled'], // the buffered element first,
        [2, 'cancelled'], // then the one in flight
      ],
    );
    expectAccounted(stats, { received: 3, delivered: 1, shed: { cancelled: 2 } });
  });

  it('errors downstream with StageError when work throws, and cancels upstream', () => {
    const source = new TestSource<number>();
    const stats = new StageStats();
    const sink = TestSink.subscribe(
      source.pipe(
        stage(
          (x: number) => {
            if (x === 2) throw new Error('two is not allowed');
            return x;
          },
          { name: 'picky', stats },
        ),
      ),
      { request: 5 },
    );
    source.emit(1, 2);
    sink.expectNext(1).expectError(StageError);
    assert.equal((sink.error as StageError).stage, 'picky');
    source.expectCancelled();
    expectAccounted(stats, { received: 2, delivered: 1, failed: 1 });
  });

  it('gives back the demand of elements a filter dropped once a later element arrives', () => {
    const source = new TestSource<number>();
    const sink = TestSink.subscribe(
      source.pipe(
        filter((x: number) => x % 2 === 0),
        stage(times10, { capacity: 2, concurrency: 1 }),
      ),
    );
    source.emit(1, 3); // dropped by the filter
    source.emit(2); // arrives: the stage now holds one element, so two places are left
    source.expectDemand(2);
    source.emit(4);
    source.expectDemand(1);
    sink.request(2).expectNext(20, 40);
  });

  it('holds at most the sum of capacity + concurrency across two chained stages', () => {
    const source = new TestSource<number>();
    TestSink.subscribe(source.pipe(stage(times10, { capacity: 1, concurrency: 1 }), stage(times10, { capacity: 1, concurrency: 1 })));
    let taken = 0;
    while (source.offer(taken)) taken++;
    assert.equal(taken, 4);
  });

  it('pauses a Flow returned by work while its output waits for the sink', () => {
    const tokens = new TestSource<string>();
    const source = new TestSource<number>();
    const sink = TestSink.subscribe(source.pipe(stage((_: number) => tokens)));
    source.emit(1);
    assert.equal(tokens.subscribed, true);
    tokens.expectDemand(1); // one output may wait in the stage
    tokens.emit('a');
    tokens.expectDemand(0);
    sink.request(1).expectNext('a');
    tokens.expectDemand(1);
    assert.deepEqual(tokens.pulls, [1, 1]);
    tokens.emit('b');
    tokens.complete();
    sink.request(1).expectNext('b');
  });

  it('holds results of async work until the sink asks for them', async () => {
    const source = new TestSource<number>();
    const stats = new StageStats();
    await verify(source.pipe(stage(async (x: number) => x * 10, { capacity: 2, concurrency: 1, stats })))
      .thenDo(() => source.expectDemand(3).emit(1, 2, 3))
      .expectNoEvents()
      .thenDo(() => source.expectDemand(0))
      .request(2)
      .expectNext(10, 20)
      .thenDo(() => source.expectDemand(2))
      .thenRequest(1)
      .expectNext(30)
      .thenDo(() => source.expectDemand(3))
      .thenDo(() => source.complete())
      .expectComplete()
      .run();
    expectAccounted(stats, { received: 3, delivered: 3 });
  });

  it('times slow work out on an injected virtual clock, never the wall clock', async () => {
    const scheduler = new VirtualTimeScheduler();
    const source = new TestSource<number>();
    const never = (): Promise<number> => new Promise<number>(() => {});
    await verify(source.pipe(stage(never, { timeout: 50, scheduler })), { scheduler, request: 1 })
      .thenDo(() => source.emit(1))
      .thenAwait(49)
      .expectNoEvents()
      .thenAwait(1)
      .expectError(StageTimeoutError)
      .thenDo(() => source.expectCancelled())
      .run();
    assert.equal(scheduler.now(), 50);
  });

  it('passes the sink’s explicit demand straight to a source it subscribes directly', () => {
    const source = new TestSource<string>();
    const sink = TestSink.subscribe(source);
    source.expectDemand(0);
    sink.request(2);
    source.expectDemand(2);
    source.emit('a', 'b');
    source.expectDemand(0);
    sink.expectNext('a', 'b');
    sink.request(Infinity);
    source.expectDemand(Infinity);
    assert.deepEqual(source.pulls, [0, 2, Infinity]);
  });
});

describe('the test kit itself', () => {
  it('gives a plain subscriber unbounded demand', () => {
    const source = new TestSource<number>();
    const seen: number[] = [];
    const subscription = source.subscribe((x) => seen.push(x));
    source.expectDemand(Infinity);
    source.emit(1, 2, 3);
    assert.deepEqual(seen, [1, 2, 3]);
    subscription.unsubscribe();
    source.expectCancelled();
  });

  it('throws when an element is emitted without demand (§1.1), naming the rule, and sends nothing', () => {
    const source = new TestSource<number>();
    const sink = TestSink.subscribe(source);
    const message = failureOf(() => source.emit(1));
    assert.match(message, /without demand \(Reactive Streams §1\.1\)/);
    assert.match(message, /demand is 0/);
    assert.deepEqual(sink.received, []);
    assert.deepEqual(source.emitted, []);
  });

  it('throws when emitting before anything subscribed or after completion (§1.7)', () => {
    const source = new TestSource<number>();
    assert.match(
      failureOf(() => source.emit(1)),
      /nothing has subscribed/,
    );
    const sink = TestSink.subscribe(source, { request: 1 });
    source.complete();
    sink.expectComplete();
    assert.match(
      failureOf(() => source.emit(1)),
      /already completed \(Reactive Streams §1\.7\)/,
    );
    assert.match(
      failureOf(() => source.complete()),
      /already completed/,
    );
  });

  it('rejects a second subscriber while the first is active', () => {
    const source = new TestSource<number>();
    TestSink.subscribe(source);
    const second = TestSink.subscribe(source);
    second.expectError(AssertionError);
    assert.match(String((second.error as Error).message), /one subscriber at a time/);
    assert.equal(source.subscriptions, 1);
  });

  it('reports an expectNext mismatch with expected, actual and everything received', () => {
    const source = new TestSource<number>();
    const sink = TestSink.subscribe(source, { request: 3 });
    source.emit(1, 2, 3);
    sink.expectNext(1);
    const message = failureOf(() => sink.expectNext(2, 4));
    assert.match(message, /expectNext\(2, 4\): the element at index 2 differs \(value 2 of 2 expected\)/);
    assert.match(message, /expected: 4\n\s+actual: {3}3/);
    assert.match(message, /received: \[1, 2, 3\]/);
    assert.match(message, /unconsumed: \[next\(2\), next\(3\)\]/);
    sink.expectNext(2, 3); // a failed expectation consumed nothing
  });

  it('says how many elements arrived when too few did', () => {
    const sink = TestSink.subscribe(new TestSource<number>());
    assert.match(
      failureOf(() => sink.expectNext(1, 2)),
      /expected 2 element\(s\); none has arrived[\s\S]*outstanding demand 0/,
    );
  });

  it('fails expectComplete while elements are still unconsumed', () => {
    const source = new TestSource<number>();
    const sink = TestSink.subscribe(source, { request: 1 });
    source.emit(7);
    source.complete();
    assert.match(
      failureOf(() => sink.expectComplete()),
      /expected completion, but the stream emitted 7/,
    );
    sink.expectNext(7).expectComplete();
  });

  it('fails expectError when the error does not match the class or code', () => {
    const sink = TestSink.subscribe(new TestSource<number>());
    sink.request(0);
    assert.match(
      failureOf(() => sink.expectError(StageError)),
      /IllegalDemandError \[ILLEGAL_DEMAND\].*does not match/,
    );
    assert.match(
      failureOf(() => sink.expectError('OVERFLOW')),
      /does not match/,
    );
    sink.expectError(IllegalDemandError);
  });

  it('unwraps Traced elements for expectations and keeps the envelopes readable', () => {
    const source = new TestSource<string>();
    const sink = TestSink.subscribe(source.pipe(stage((s: string) => s.toUpperCase())), { request: 1 });
    source.emit('a');
    sink.expectNext('A');
    assert.equal(sink.traced.length, 1);
    assert.ok(sink.traced[0] instanceof Traced);
    assert.match(sink.traced[0]!.trace.traceId, /^[0-9a-f]{32}$/);

    const rawSource = new TestSource<string>();
    const raw = TestSink.subscribe(rawSource.pipe(stage((s: string) => s.toUpperCase())), { request: 1, unwrap: false });
    rawSource.emit('b');
    raw.consumeNextWith((envelope) => {
      assert.ok(envelope instanceof Traced);
      assert.equal(envelope.value, 'B');
    });
  });

  it('does not subscribe before run(), and cancels a subscription left open at the end', async () => {
    const source = new TestSource<number>();
    const script = verify(source).request(1);
    assert.equal(source.subscriptions, 0);
    const sink = await script.run();
    assert.equal(source.subscriptions, 1);
    source.expectCancelled();
    assert.equal(sink.cancelled, true);
  });

  it('names the failing verify step and shows what was received', async () => {
    const source = new TestSource<number>();
    await assert.rejects(
      verify(source, { request: 2 })
        .thenDo(() => source.emit(1, 2))
        .expectNext(1, 3)
        .run(),
      (error: unknown) => {
        assert.ok(error instanceof AssertionError);
        assert.match(error.message, /^verify: step 2 of 2, expectNext\(1, 3\), failed:/);
        assert.match(error.message, /received: \[1, 2\]/);
        return true;
      },
    );
  });

  it('gives up on an element that never arrives after a bounded number of ticks', async () => {
    let ticks = 0;
    const tick = (): Promise<void> => {
      ticks++;
      return new Promise((resolve) => setImmediate(resolve));
    };
    const never = (): Promise<number> => new Promise<number>(() => {});
    const source = new TestSource<number>();
    await assert.rejects(
      verify(source.pipe(stage(never)), { request: 1, maxTicks: 5, tick })
        .thenDo(() => source.emit(1))
        .expectNext(1)
        .run(),
      /gave up after waiting 5 ticks/,
    );
    assert.equal(ticks, 5);
  });

  it('fails a wrong value at once instead of waiting for the budget', async () => {
    let ticks = 0;
    const tick = (): Promise<void> => {
      ticks++;
      return new Promise((resolve) => setImmediate(resolve));
    };
    const source = new TestSource<number>();
    await assert.rejects(
      verify(source, { request: 1, tick })
        .thenDo(() => source.emit(1))
        .expectNext(2)
        .run(),
      /the element at index 0 differs/,
    );
    assert.equal(ticks, 0);
  });

  it('refuses thenAwait without a virtual clock', async () => {
    await assert.rejects(verify(new TestSource<number>()).thenAwait(10).run(), /needs a virtual clock/);
  });

  it('retries an assertion with eventually until async work lands', async () => {
    const source = new TestSource<number>();
    const sink = TestSink.subscribe(source.pipe(stage(async (x: number) => x + 1)), { request: 1 });
    source.emit(1);
    assert.throws(() => sink.expectNext(2), AssertionError);
    await eventually(() => sink.expectNext(2));
    await assert.rejects(
      eventually(() => sink.expectNext(3), { maxTicks: 3 }),
      /gave up after waiting 3 ticks/,
    );
  });

  it('finds an element a stage lost track of', () => {
    const stats = new StageStats();
    stats.received = 3;
    stats.delivered = 1;
    stats.shed['buffer-full'] = 1;
    assert.match(
      failureOf(() => expectAccounted(stats)),
      /received 3 but delivered \+ shed \+ failed = 2: 1 element\(s\) unaccounted for/,
    );
  });

  it('refuses to judge accounting while a stage still holds elements, and checks named counters', () => {
    const { source, sink, stats } = probe();
    source.emit(1, 2);
    assert.match(
      failureOf(() => expectAccounted(stats)),
      /has not ended/,
    );
    sink.cancel();
    assert.match(
      failureOf(() => expectAccounted(stats, { delivered: 2 })),
      /delivered: expected 2, got 0/,
    );
    expectAccounted(stats, { received: 2, delivered: 0, shed: { cancelled: 2 } });
  });
});
