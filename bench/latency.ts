/**
 * Wakeup latency: from the moment an element becomes available to an idle stage
 * (a promise it waits on resolves, or a value is pushed) to the moment the work of
 * the stage that receives it starts. One element at a time, the pipeline quiet (a
 * macrotask turn) before each one, many samples, `process.hrtime.bigint()`.
 */
import { Readable, Transform, Writable } from 'node:stream';
import { setImmediate as immediate } from 'node:timers/promises';
import { Subject, map, mergeMap, type Subscription } from 'rxjs';
import { fromAsyncIterable, fromIterable, stage } from 'sluice';
import { collect, nowNs, percentile } from './harness.js';

/** A promise the driver resolves: what an idle stage is waiting on. */
class Gate<T> {
  private resolver: ((value: T) => void) | undefined;

  wait(): Promise<T> {
    if (this.resolver !== undefined) throw new Error('Gate: already waited on');
    return new Promise<T>((resolve) => {
      this.resolver = resolve;
    });
  }

  get armed(): boolean {
    return this.resolver !== undefined;
  }

  open(value: T): void {
    const resolve = this.resolver;
    if (resolve === undefined) throw new Error('Gate: nobody is waiting (the stage is not idle on it)');
    this.resolver = undefined;
    resolve(value);
  }
}

/** When the receiving stage's work started (0n: not yet). */
let seen = 0n;
function mark(): void {
  seen = nowNs();
}

interface Probe {
  /** Puts one element in front of the idle stage, if the scenario needs that before `fire`. */
  arm?(index: number): void;
  /** Makes the element available. The clock starts just before this call. */
  fire(index: number): void;
  close(): void | Promise<void>;
}

export interface LatencyScenario {
  readonly id: string;
  readonly label: string;
  readonly family: 'baseline' | 'sluice' | 'rxjs' | 'node' | 'async-generator';
  readonly open: () => Probe;
}

export interface LatencyResult {
  readonly id: string;
  readonly label: string;
  readonly family: LatencyScenario['family'];
  readonly samples: number;
  /** Microseconds. */
  readonly p50: number;
  readonly p90: number;
  readonly p99: number;
  readonly p999: number;
  readonly max: number;
  readonly mean: number;
}

function* naturals(): Generator<number> {
  for (let i = 0; ; i++) yield i;
}

function controllableIterable(gate: Gate<IteratorResult<number>>): AsyncIterable<number> {
  return {
    [Symbol.asyncIterator]: () => ({
      next: () => gate.wait(),
      return: async () => ({ done: true, value: undefined }),
    }),
  };
}

const failOnError = (err: unknown): void => {
  throw err;
};

export const latencyScenarios: readonly LatencyScenario[] = [
  {
    id: 'clock',
    label: 'clock read only (measurement floor)',
    family: 'baseline',
    open: () => ({ fire: mark, close: () => {} }),
  },
  {
    id: 'microtask',
    label: 'resolve a promise → its `then` runs',
    family: 'baseline',
    open: () => {
      const gate = new Gate<number>();
      return {
        arm: () => void gate.wait().then(mark),
        fire: (i) => gate.open(i),
        close: () => {},
      };
    },
  },
  {
    id: 'setImmediate',
    label: '`setImmediate` → callback runs',
    family: 'baseline',
    open: () => ({ fire: () => void setImmediate(mark), close: () => {} }),
  },
  {
    id: 'sluice-source-to-stage',
    label: 'sluice: `fromAsyncIterable` next() resolves → idle stage work starts',
    family: 'sluice',
    open: () => {
      const gate = new Gate<IteratorResult<number>>();
      const subscription = fromAsyncIterable(controllableIterable(gate))
        .pipe(
          stage(
            (x: number) => {
              mark();
              return x;
            },
            { name: 'idle' },
          ),
        )
        .subscribe({ error: failOnError });
      return { fire: (i) => gate.open({ value: i, done: false }), close: () => subscription.unsubscribe() };
    },
  },
  {
    id: 'sluice-stage-to-stage',
    label: 'sluice: promise an upstream stage awaits resolves → idle next stage work starts',
    family: 'sluice',
    open: () => {
      const gate = new Gate<number>();
      const subscription = fromIterable(naturals())
        .pipe(
          stage((_x: number) => gate.wait(), { name: 'upstream' }),
          stage(
            (x: number) => {
              mark();
              return x;
            },
            { name: 'idle' },
          ),
        )
        .subscribe({ error: failOnError });
      return { fire: (i) => gate.open(i), close: () => subscription.unsubscribe() };
    },
  },
  {
    id: 'rxjs-stage-to-stage',
    label: 'RxJS: promise a `mergeMap` inner awaits resolves → next `map` runs',
    family: 'rxjs',
    open: () => {
      const gate = new Gate<number>();
      const subject = new Subject<number>();
      const subscription: Subscription = subject
        .pipe(
          mergeMap(() => gate.wait(), 1),
          map((x) => {
            mark();
            return x;
          }),
        )
        .subscribe({ error: failOnError });
      return { arm: (i) => subject.next(i), fire: (i) => gate.open(i), close: () => subscription.unsubscribe() };
    },
  },
  {
    id: 'node-source-to-stage',
    label: 'Node streams: `readable.push(x)` into an idle pipeline → transform runs',
    family: 'node',
    open: () => {
      const options = { objectMode: true, highWaterMark: 256 } as const;
      const readable = new Readable({ ...options, read() {} });
      const done = nodePipeline(readable, [
        new Transform({
          ...options,
          transform(chunk: number, _encoding, callback) {
            mark();
            callback(null, chunk);
          },
        }),
      ]);
      return {
        fire: (i) => readable.push(i),
        close: async () => {
          readable.push(null);
          await done;
        },
      };
    },
  },
  {
    id: 'node-stage-to-stage',
    label: 'Node streams: promise an async transform awaits resolves → next transform runs',
    family: 'node',
    open: () => {
      const options = { objectMode: true, highWaterMark: 256 } as const;
      const gate = new Gate<number>();
      const readable = new Readable({ ...options, read() {} });
      const done = nodePipeline(readable, [
        new Transform({
          ...options,
          transform(_chunk: number, _encoding, callback) {
            gate.wait().then((x) => callback(null, x), callback);
          },
        }),
        new Transform({
          ...options,
          transform(chunk: number, _encoding, callback) {
            mark();
            callback(null, chunk);
          },
        }),
      ]);
      return {
        arm: (i) => readable.push(i),
        fire: (i) => gate.open(i),
        close: async () => {
          readable.push(null);
          await done;
        },
      };
    },
  },
  {
    id: 'async-generator-stage-to-stage',
    label: 'async generators: promise the upstream generator awaits resolves → next generator runs',
    family: 'async-generator',
    open: () => {
      const gate = new Gate<number>();
      let stopped = false;
      async function* upstream(): AsyncGenerator<number> {
        for (;;) yield await gate.wait();
      }
      async function* idle(source: AsyncIterable<number>): AsyncGenerator<number> {
        for await (const x of source) {
          mark();
          yield x;
        }
      }
      const done = (async () => {
        for await (const _ of idle(upstream())) if (stopped) break;
      })();
      return {
        fire: (i) => gate.open(i),
        close: async () => {
          stopped = true;
          gate.open(-1);
          await done;
        },
      };
    },
  },
];

function nodePipeline(readable: Readable, transforms: Transform[]): Promise<void> {
  const sink = new Writable({ objectMode: true, highWaterMark: 256, write: (_chunk, _encoding, callback) => callback() });
  let last: NodeJS.ReadableStream = readable;
  for (const transform of transforms) last = last.pipe(transform);
  last.pipe(sink);
  return new Promise((resolve, reject) => {
    sink.on('finish', resolve);
    for (const stream of [readable, ...transforms, sink]) stream.on('error', reject);
  });
}

export async function measureLatency(scenario: LatencyScenario, samples: number, warmup: number): Promise<LatencyResult> {
  const probe = scenario.open();
  const latencies = new Float64Array(samples);
  collect();
  try {
    for (let i = 0; i < warmup + samples; i++) {
      probe.arm?.(i);
      await immediate(); // the pipeline is quiet: no microtask, no tick pending
      seen = 0n;
      const start = nowNs();
      probe.fire(i);
      for (let turns = 0; seen === 0n; turns++) {
        if (turns > 100) throw new Error(`${scenario.id}: the element never reached the stage`);
        await immediate();
      }
      if (i >= warmup) latencies[i - warmup] = Number(seen - start) / 1000;
    }
  } finally {
    await probe.close();
  }
  latencies.sort();
  let total = 0;
  for (const value of latencies) total += value;
  return {
    id: scenario.id,
    label: scenario.label,
    family: scenario.family,
    samples,
    p50: percentile(latencies, 50),
    p90: percentile(latencies, 90),
    p99: percentile(latencies, 99),
    p999: percentile(latencies, 99.9),
    max: latencies[latencies.length - 1]!,
    mean: total / samples,
  };
}
