/**
 * Sinks that keep backpressure: `toWritable` into real Node Writables, `toAsyncIterable`
 * under `for await`, and `untraced()` between a stage and either. How far the source was
 * pulled is read through the generator itself, so every bound is measured, not assumed.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { Readable, Writable } from 'node:stream';
import { fromIterable } from '../../src/flow/sources.js';
import { Flow, subscribeWithDemand } from '../../src/flow/demand.js';
import { stage } from '../../operators/stage.js';
import { AlreadyIteratedError, WritableClosedError, toAsyncIterable, toWritable, untraced } from '../../src/flow/sinks.js';
import { InvalidOptionsError } from '../../src/core/errors.js';
import { Traced } from '../../src/core/trace.js';

/** A generator that counts how far it was pulled and whether it was closed; it throws `failure` at `failAt`. */
function counting(limit = Infinity, failAt = Infinity, failure: unknown = new Error('source failed')) {
  const state = { pulled: 0, closed: false };
  function* generate(): Generator<number> {
    try {
      for (let i = 0; i < limit; i++) {
        if (i === failAt) throw failure;
        state.pulled++;
        yield i;
      }
    } finally {
      state.closed = true;
    }
  }
  return { state, generator: generate() };
}

const tick = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));
const ticks = async (n: number): Promise<void> => {
  for (let i = 0; i < n; i++) await tick();
};

/** An object-mode Writable that records what it got, calling back synchronously or on `setImmediate` every `slowEvery` writes. */
function recordingWritable(highWaterMark: number, slowEvery = Infinity) {
  const got: unknown[] = [];
  const writable = new Writable({
    objectMode: true,
    highWaterMark,
    write(value: unknown, _encoding, callback) {
      got.push(value);
      if (got.length % slowEvery === 0) setImmediate(callback);
      else callback();
    },
  });
  return { got, writable };
}

function invalidPath(fn: () => unknown): string {
  try {
    fn();
  } catch (error) {
    assert.ok(error instanceof InvalidOptionsError, `expected InvalidOptionsError, got ${String(error)}`);
    return error.issues.map((issue) => issue.path).join(',');
  }
  assert.fail('expected a throw at construction');
}

describe('toWritable', () => {
  it('writes 1,000,000 elements through a stage into a slow writable: none lost, in order, pulled − written bounded', async (t) => {
    const N = 1_000_000;
    const capacity = 16;
    const concurrency = 1;
    const writableMark = 8;
    let pulled = 0;
    let written = 0;
    let peak = 0;
    function* numbers(): Generator<number> {
      for (let i = 0; i < N; i++) {
        pulled++;
        if (pulled - written > peak) peak = pulled - written;
        yield i;
      }
    }
    let outOfOrder = 0;
    let sum = 0;
    let hash = 0;
    const writable = new Writable({
      objectMode: true,
      highWaterMark: writableMark,
      write(value: number, _encoding, callback) {
        if (value !== written) outOfOrder++;
        written++;
        sum += value;
        hash = (Math.imul(hash, 31) + value) | 0;
        if (written % 4 === 0) setImmediate(callback);
        else callback();
      },
    });
    let finishedFirst = false;
    writable.on('finish', () => (finishedFirst = true));

    await toWritable(
      fromIterable(numbers()).pipe(
        stage((x: number) => x, { capacity, concurrency }),
        untraced(),
      ),
      writable,
    );

    let expectedHash = 0;
    for (let i = 0; i < N; i++) expectedHash = (Math.imul(expectedHash, 31) + i) | 0;
    assert.equal(written, N, 'count');
    assert.equal(sum, (N * (N - 1)) / 2, 'sum');
    assert.equal(hash, expectedHash, 'order-sensitive checksum');
    assert.equal(outOfOrder, 0);
    assert.ok(finishedFirst && writable.writableFinished, 'resolved after the writable finished');
    // Held between the generator and the writable's write(): the stage (capacity + concurrency), the
    // writable's buffer up to its mark, and the credits outstanding when write() said false (the sink's
    // mark, by default the writable's).
    const bound = capacity + concurrency + writableMark + writableMark;
    t.diagnostic(`peak pulled − written: ${peak} (bound ${bound})`);
    assert.ok(peak <= bound, `peak pulled − written ${peak} > ${bound}`);
  });

  it("pulls nothing more while write() returns false, and resumes on 'drain'", async () => {
    const source = counting();
    const held: (() => void)[] = [];
    const writable = new Writable({
      objectMode: true,
      highWaterMark: 2,
      write(_value, _encoding, callback) {
        held.push(callback);
      },
    });
    let drains = 0;
    writable.on('drain', () => drains++);
    const controller = new AbortController();
    const run = toWritable(fromIterable(source.generator), writable, { highWaterMark: 2, signal: controller.signal });

    await ticks(10);
    const blockedAt = source.state.pulled;
    assert.ok(blockedAt > 0 && blockedAt <= 2 + 2, `pulled ${blockedAt}: at most the sink's mark + the writable's`);
    assert.equal(writable.writableNeedDrain, true, 'write() returned false');
    await ticks(10);
    assert.equal(source.state.pulled, blockedAt, 'no pull while the writable is full');

    while (held.length > 0) {
      held.shift()!();
      await tick();
      if (drains > 0) break;
    }
    assert.equal(drains, 1);
    await ticks(2);
    assert.ok(source.state.pulled > blockedAt, 'pulls again after drain');

    controller.abort(new Error('enough'));
    await assert.rejects(run, { message: 'enough' });
    assert.equal(source.state.closed, true);
  });

  it('the writable erroring mid-way rejects with its error and cancels the source (its finally ran)', async () => {
    const source = counting();
    const failure = new Error('disk full');
    const writable = new Writable({
      objectMode: true,
      highWaterMark: 4,
      write(value: number, _encoding, callback) {
        if (value === 1000) callback(failure);
        else if (value % 3 === 0) setImmediate(callback);
        else callback();
      },
    });
    await assert.rejects(
      toWritable(
        fromIterable(source.generator).pipe(
          stage((x: number) => x),
          untraced(),
        ),
        writable,
      ),
      (error) => error === failure,
    );
    assert.equal(source.state.closed, true, 'generator finally ran');
    const pulled = source.state.pulled;
    assert.ok(pulled <= 1000 + 17 + 4 + 4, `pulled ${pulled}`);
    await ticks(5);
    assert.equal(source.state.pulled, pulled, 'no pull after the failure');
  });

  it('a writable closed before finishing rejects with a premature close and cancels the source', async () => {
    const source = counting();
    const { writable } = recordingWritable(4, 2);
    const run = toWritable(fromIterable(source.generator), writable);
    await ticks(3);
    writable.destroy();
    await assert.rejects(run, { code: 'ERR_STREAM_PREMATURE_CLOSE' });
    assert.equal(source.state.closed, true);
  });

  it('a writable ended by someone else rejects with WritableClosedError and cancels the source', async () => {
    const source = counting();
    const held: (() => void)[] = [];
    const writable = new Writable({ objectMode: true, highWaterMark: 1, write: (_value, _encoding, callback) => held.push(callback) });
    writable.write('not from the source'); // fills the writable: the sink waits for 'drain'
    const run = toWritable(fromIterable(source.generator), writable);
    await ticks(2);
    assert.equal(source.state.pulled, 0, 'waits for drain before asking');
    writable.end();
    held.shift()!();
    await assert.rejects(run, WritableClosedError);
    assert.equal(source.generator.next().done, true, 'the source was cancelled (return() called) before its first pull');
  });

  it('an upstream error destroys the writable with it and rejects', async () => {
    const failure = new Error('model unavailable');
    const source = counting(Infinity, 50, failure);
    const { got, writable } = recordingWritable(4, 3);
    await assert.rejects(
      toWritable(
        fromIterable(source.generator).pipe(
          stage(async (x: number) => x),
          untraced(),
        ),
        writable,
      ),
      (error) => error === failure,
    );
    assert.equal(writable.destroyed, true);
    assert.equal(writable.errored, failure);
    assert.ok(got.length <= 50);
    assert.equal(source.state.closed, true);
  });

  it('an abort cancels the source, destroys the writable and rejects with the reason', async () => {
    const source = counting();
    const { writable } = recordingWritable(4, 1);
    const controller = new AbortController();
    const run = toWritable(fromIterable(source.generator), writable, { signal: controller.signal });
    await ticks(3);
    const reason = new Error('client left');
    controller.abort(reason);
    await assert.rejects(run, (error) => error === reason);
    assert.equal(source.state.closed, true);
    assert.equal(writable.destroyed, true);
    const pulled = source.state.pulled;
    await ticks(3);
    assert.equal(source.state.pulled, pulled);
  });

  it('lets the event loop turn between synchronous writes: an abort from a macrotask stops a long synchronous run', async () => {
    const source = counting(200_000); // finite, so that a sink that never yields fails here instead of hanging
    const writable = new Writable({ objectMode: true, write: (_value, _encoding, callback) => callback() });
    const controller = new AbortController();
    setImmediate(() => controller.abort(new Error('stop')));
    await assert.rejects(toWritable(fromIterable(source.generator), writable, { signal: controller.signal }), { message: 'stop' });
    assert.equal(source.state.closed, true);
    assert.ok(source.state.pulled <= 1024 + 16, `pulled ${source.state.pulled} in one turn`);
  });

  it('end: false leaves the writable open and resolves once every write was flushed', async () => {
    const { got, writable } = recordingWritable(4, 1);
    await toWritable(fromIterable([1, 2, 3, 4, 5, 6, 7]), writable, { end: false });
    assert.deepEqual(got, [1, 2, 3, 4, 5, 6, 7]);
    assert.equal(writable.writableLength, 0, 'flushed');
    assert.equal(writable.writableEnded, false);
    await toWritable(fromIterable([8, 9]), writable, { end: false });
    assert.deepEqual(got.slice(7), [8, 9]);
    assert.equal(writable.listenerCount('error'), 0, 'no listener left behind');
    writable.end();
  });

  it('writes elements as they come: a stage output stays a Traced envelope without untraced()', async () => {
    const { got, writable } = recordingWritable(4);
    await toWritable(fromIterable(['a', 'b']).pipe(stage((s: string) => s.toUpperCase())), writable);
    assert.ok(got.every((element) => element instanceof Traced));
    assert.deepEqual(
      got.map((element) => (element as Traced<string>).value),
      ['A', 'B'],
    );
  });
});

describe('toAsyncIterable', () => {
  it('for await over a stage pipeline gets every element in order; pulled − consumed stays within the capacities', async (t) => {
    const N = 20_000;
    const highWaterMark = 8;
    let pulled = 0;
    let consumed = 0;
    let peak = 0;
    let closed = false;
    function* numbers(): Generator<number> {
      try {
        for (let i = 0; i < N; i++) {
          pulled++;
          if (pulled - consumed > peak) peak = pulled - consumed;
          yield i;
        }
      } finally {
        closed = true;
      }
    }
    const pipeline = fromIterable(numbers()).pipe(
      stage((x: number) => x, { capacity: 8 }),
      stage(async (x: number) => x, { capacity: 4, concurrency: 2 }),
      untraced(),
    );
    for await (const value of toAsyncIterable(pipeline, { highWaterMark })) {
      assert.equal(value, consumed);
      consumed++;
      if (consumed % 100 === 0) await tick(); // let the pipeline fill up behind a slow loop
    }
    assert.equal(consumed, N);
    assert.equal(closed, true);
    // The iterator's buffer plus what it asked for, each stage's capacity + concurrency, and the
    // element handed to the loop that its body has not counted yet.
    const bound = highWaterMark + (8 + 1) + (4 + 2) + 1;
    t.diagnostic(`peak pulled − consumed: ${peak} (bound ${bound})`);
    assert.ok(peak <= bound, `peak pulled − consumed ${peak} > ${bound}`);
  });

  it('buffers at most highWaterMark elements ahead of a loop that does not ask', async () => {
    const source = counting();
    const iterator = toAsyncIterable(fromIterable(source.generator), { highWaterMark: 4 });
    assert.equal(source.state.pulled, 0, 'subscribed on the first next()');
    assert.deepEqual(await iterator.next(), { value: 0, done: false });
    await ticks(5);
    assert.ok(source.state.pulled - 1 <= 4, `pulled ${source.state.pulled}`);
    for (let consumed = 1; consumed <= 50; consumed++) {
      assert.deepEqual(await iterator.next(), { value: consumed, done: false });
      await tick();
      assert.ok(source.state.pulled - (consumed + 1) <= 4, `pulled ${source.state.pulled} after ${consumed + 1}`);
    }
    await iterator.return();
    assert.equal(source.state.closed, true);
  });

  it('break after k elements cancels the source: its finally ran, no more pulls', async () => {
    const source = counting();
    const seen: number[] = [];
    for await (const value of toAsyncIterable(
      fromIterable(source.generator).pipe(
        stage((x: number) => x),
        untraced(),
      ),
      { highWaterMark: 4 },
    )) {
      seen.push(value);
      if (seen.length === 5) break;
    }
    assert.deepEqual(seen, [0, 1, 2, 3, 4]);
    assert.equal(source.state.closed, true);
    const pulled = source.state.pulled;
    await ticks(5);
    assert.equal(source.state.pulled, pulled);
  });

  it('an upstream error is thrown from the loop after the elements buffered before it', async () => {
    const failure = new Error('upstream broke');
    const source = counting(Infinity, 5, failure);
    const seen: number[] = [];
    // Straight from the source: a stage would drop what it buffered on an upstream error (docs/pipelines.md).
    await assert.rejects(
      async () => {
        for await (const value of toAsyncIterable(fromIterable(source.generator), { highWaterMark: 16 })) seen.push(value);
      },
      (error) => error === failure,
    );
    assert.deepEqual(seen, [0, 1, 2, 3, 4]);
  });

  it('an error from a stage pipeline is thrown from the loop', async () => {
    const source = counting();
    const failure = new Error('model unavailable');
    const seen: number[] = [];
    const work = async (x: number): Promise<number> => {
      if (x === 7) throw failure;
      return x;
    };
    await assert.rejects(
      async () => {
        for await (const value of toAsyncIterable(fromIterable(source.generator).pipe(stage(work, { name: 'model' }), untraced()))) seen.push(value);
      },
      (error: Error) => error.cause === failure && (error as { stage?: string }).stage === 'model',
    );
    assert.deepEqual(seen, [0, 1, 2, 3, 4, 5, 6]);
    assert.equal(source.state.closed, true);
  });

  it('throw() rejects the pending next() and cancels the source; later calls are done', async () => {
    let cancelled = false;
    const silent = new Flow<number>(() => ({ pull: () => {}, cancel: () => (cancelled = true) }));
    const iterator = toAsyncIterable(silent);
    const pending = iterator.next();
    const failure = new Error('stop');
    assert.deepEqual(await iterator.throw(failure), { value: undefined, done: true });
    await assert.rejects(pending, (error) => error === failure);
    assert.equal(cancelled, true);
    assert.deepEqual(await iterator.next(), { value: undefined, done: true });
  });

  it('return() answers a pending next() with done', async () => {
    let cancelled = false;
    const silent = new Flow<number>(() => ({ pull: () => {}, cancel: () => (cancelled = true) }));
    const iterator = toAsyncIterable(silent);
    const pending = iterator.next();
    await iterator.return();
    assert.deepEqual(await pending, { value: undefined, done: true });
    assert.equal(cancelled, true);
  });

  it('an abort rejects the pending next() with the reason and cancels the source', async () => {
    const source = counting();
    const controller = new AbortController();
    const iterator = toAsyncIterable(
      fromIterable(source.generator).pipe(
        stage((x: number) => new Promise<number>((resolve) => setTimeout(resolve, 5, x))),
        untraced(),
      ),
      {
        signal: controller.signal,
      },
    );
    const pending = iterator.next();
    const reason = new Error('deadline');
    controller.abort(reason);
    await assert.rejects(pending, (error) => error === reason);
    assert.equal(source.state.closed, true);
  });

  it('a second [Symbol.asyncIterator]() throws AlreadyIteratedError instead of running the pipeline again', async () => {
    const source = counting(3);
    const iterable = toAsyncIterable(fromIterable(source.generator));
    const seen: number[] = [];
    for await (const value of iterable) seen.push(value);
    assert.deepEqual(seen, [0, 1, 2]);
    assert.throws(() => iterable[Symbol.asyncIterator](), AlreadyIteratedError);
  });
});

describe('untraced', () => {
  it('keeps backpressure: request(3) after a stage delivers 3 payloads and pulls no further than the stage holds', () => {
    const source = counting();
    const seen: number[] = [];
    const subscription = subscribeWithDemand(
      fromIterable(source.generator).pipe(
        stage((x: number) => x * 2, { capacity: 4 }),
        untraced(),
      ),
      {
        next: (value) => seen.push(value),
      },
    );
    subscription.request(3);
    assert.deepEqual(seen, [0, 2, 4]);
    assert.ok(source.state.pulled <= 3 + 4 + 1, `pulled ${source.state.pulled}`);
    subscription.cancel();
    assert.equal(source.state.closed, true);
  });
});

describe('sink options', () => {
  const writable = () => new Writable({ objectMode: true, write: (_value, _encoding, callback) => callback() });

  it('bad options throw InvalidOptionsError at construction, naming the field, before subscribing', () => {
    const source = counting();
    const flow = fromIterable(source.generator);
    assert.equal(
      invalidPath(() => toWritable(flow, writable(), { highWaterMark: 0 })),
      'highWaterMark',
    );
    assert.equal(
      invalidPath(() => toWritable(flow, writable(), { highWaterMark: 1.5 })),
      'highWaterMark',
    );
    assert.equal(
      invalidPath(() => toWritable(flow, writable(), { highWatermark: 4 } as never)),
      'highWatermark',
    );
    assert.equal(
      invalidPath(() => toWritable(flow, writable(), { end: 'yes' } as never)),
      'end',
    );
    assert.equal(
      invalidPath(() => toWritable(flow, writable(), { signal: {} } as never)),
      'signal',
    );
    assert.equal(
      invalidPath(() => toWritable(flow, new Readable() as never)),
      'writable',
    );
    assert.equal(
      invalidPath(() => toWritable(flow, {} as never)),
      'writable',
    );
    assert.equal(
      invalidPath(() => toWritable([1, 2] as never, writable())),
      'source',
    );
    assert.equal(
      invalidPath(() => toAsyncIterable(flow, { highWaterMark: 0 })),
      'highWaterMark',
    );
    assert.equal(
      invalidPath(() => toAsyncIterable(flow, { highWaterMark: -2, capacity: 3 } as never)),
      'highWaterMark,capacity',
    );
    assert.equal(
      invalidPath(() => toAsyncIterable(null as never)),
      'source',
    );
    assert.equal(source.state.pulled, 0);
    assert.match(
      (() => {
        try {
          toWritable(flow, new Readable() as never);
        } catch (error) {
          return (error as Error).message;
        }
        return '';
      })(),
      /writable: must be a Node Writable .*got Readable/,
    );
  });
});
