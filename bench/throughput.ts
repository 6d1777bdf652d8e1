/**
 * Throughput: 7 identity stages, N elements, every peer consuming its own idiomatic
 * source. Each run counts its outputs and sums their values; a run that loses or
 * duplicates an element throws, so nothing can be optimised away unnoticed.
 */
import { Readable, Transform, Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { setImmediate as immediate } from 'node:timers/promises';
import { concatMap, map, mergeMap, of, range, type Observable, type OperatorFunction } from 'rxjs';
import { fromIterable, stage, type Traced } from 'sluice';
import { PipelineGraph } from 'sluice/serve';
import { collect, median, nowNs, settle } from './harness.js';
import { promiseHops } from './floor.js';

export const STAGES = 7;

export type Family = 'baseline' | 'sluice' | 'rxjs' | 'node' | 'async-generator';

export interface ThroughputCase {
  readonly id: string;
  readonly label: string;
  readonly family: Family;
  readonly mode: 'sync' | 'async';
  /** Does the pipeline hold a bounded number of elements whatever the speeds? */
  readonly bounded: 'yes' | 'no' | '—';
  /** The sluice case this one is compared with (ratios). */
  readonly compareTo?: string;
  /** Elements per run for a requested N: quadratic peers run fewer. */
  readonly size: (n: number) => number;
  readonly note?: string;
  /** Runs the whole pipeline once; resolves with the sum of the values that came out. */
  readonly run: (n: number) => Promise<Checked>;
}

export interface Checked {
  readonly count: number;
  readonly sum: number;
}

export interface ThroughputResult {
  readonly id: string;
  readonly label: string;
  readonly family: Family;
  readonly mode: 'sync' | 'async';
  readonly bounded: 'yes' | 'no' | '—';
  readonly compareTo: string | undefined;
  readonly note: string | undefined;
  readonly n: number;
  /** Wall-clock ns per element per stage, one per timed run. */
  readonly samples: readonly number[];
  readonly median: number;
  readonly best: number;
  /** The same from this process's CPU time (user + system): steadier than wall time on a shared machine. */
  readonly cpuSamples: readonly number[];
  readonly cpuMedian: number;
}

function* naturals(n: number): Generator<number> {
  for (let i = 0; i < n; i++) yield i;
}

async function* naturalsAsync(n: number): AsyncGenerator<number> {
  for (let i = 0; i < n; i++) yield i;
}

const identity = (x: number): number => x;
const identityAsync = async (x: number): Promise<number> => x;

/** `source.pipe(op1, ..., op7)` for a programmatic list of operators. */
function chain(source: Observable<unknown>, operators: readonly OperatorFunction<unknown, unknown>[]): Observable<unknown> {
  return operators.reduce((upstream, operator) => operator(upstream), source);
}

function repeat<T>(times: number, make: (index: number) => T): T[] {
  return Array.from({ length: times }, (_, index) => make(index));
}

/** Subscribes and resolves with the count and sum of what came out; `value` unwraps an envelope. */
function drain(source: Observable<unknown>, value: (output: unknown) => number): Promise<Checked> {
  return new Promise((resolve, reject) => {
    let count = 0;
    let sum = 0;
    source.subscribe({
      next: (output) => {
        count++;
        sum += value(output);
      },
      error: reject,
      complete: () => resolve({ count, sum }),
    });
  });
}

/** The same run with an inspector watching (its hook and sampling timer on), for the cost of leaving one on. */
function inspected(run: (n: number) => Promise<Checked>) {
  return async (n: number): Promise<Checked> => {
    const graph = new PipelineGraph().start();
    try {
      return await run(n);
    } finally {
      graph.stop();
    }
  };
}

const plainValue = (output: unknown): number => output as number;
const tracedValue = (output: unknown): number => (output as Traced<number>).value;

function sluiceSync(sampleRate: number) {
  return (n: number) =>
    drain(
      chain(
        fromIterable(naturals(n)),
        repeat(STAGES, (i) => stage(identity, { name: `s${i + 1}`, ...(i === 0 ? { sampleRate } : {}) }) as OperatorFunction<unknown, unknown>),
      ),
      tracedValue,
    );
}

function sluiceAsync(concurrency: number) {
  return (n: number) =>
    drain(
      chain(
        fromIterable(naturals(n)),
        repeat(
          STAGES,
          (i) => stage(identityAsync, { name: `s${i + 1}`, concurrency, ...(i === 0 ? { sampleRate: 0.01 } : {}) }) as OperatorFunction<unknown, unknown>,
        ),
      ),
      tracedValue,
    );
}

function rxjs(make: () => OperatorFunction<number, number>) {
  return (n: number) =>
    drain(
      chain(
        range(0, n),
        repeat(STAGES, () => make() as OperatorFunction<unknown, unknown>),
      ),
      plainValue,
    );
}

async function nodeStreams(n: number, transform: (chunk: number, callback: (error: Error | null, out?: number) => void) => void): Promise<Checked> {
  let count = 0;
  let sum = 0;
  const options = { objectMode: true, highWaterMark: 256 } as const;
  await pipeline([
    Readable.from(naturals(n), options),
    ...repeat(STAGES, () => new Transform({ ...options, transform: (chunk: number, _encoding, callback) => transform(chunk, callback) })),
    new Writable({
      ...options,
      write(chunk: number, _encoding, callback) {
        count++;
        sum += chunk;
        callback();
      },
    }),
  ]);
  return { count, sum };
}

async function* pass(source: AsyncIterable<number>): AsyncGenerator<number> {
  for await (const x of source) yield x;
}

async function* passAsync(source: AsyncIterable<number>): AsyncGenerator<number> {
  for await (const x of source) yield await identityAsync(x);
}

async function asyncGenerators(n: number, stageFn: (source: AsyncIterable<number>) => AsyncIterable<number>): Promise<Checked> {
  let source: AsyncIterable<number> = naturalsAsync(n);
  for (let i = 0; i < STAGES; i++) source = stageFn(source);
  let count = 0;
  let sum = 0;
  for await (const x of source) {
    count++;
    sum += x;
  }
  return { count, sum };
}

/** 7 plain function calls per element: the floor (the checked sum keeps the calls from being optimised away). */
const calls = repeat(STAGES, () => (x: number) => x);
async function plainCalls(n: number): Promise<Checked> {
  const [f1, f2, f3, f4, f5, f6, f7] = calls as [
    typeof identity,
    typeof identity,
    typeof identity,
    typeof identity,
    typeof identity,
    typeof identity,
    typeof identity,
  ];
  let count = 0;
  let sum = 0;
  for (let i = 0; i < n; i++) {
    const x = f7(f6(f5(f4(f3(f2(f1(i)))))));
    count++;
    sum += x;
  }
  return { count, sum };
}

const all = (n: number) => n;

/** RxJS `mergeMap` buffers all of `range` and drains with `Array#shift()`: its cost per element grows with N. */
export function quadraticSize(cap: number) {
  return (n: number) => Math.min(n, cap);
}

export function throughputCases(rxjsAsyncCap: number): ThroughputCase[] {
  return [
    { id: 'baseline-calls', label: 'plain function calls', family: 'baseline', mode: 'sync', bounded: '—', size: all, run: plainCalls },
    {
      id: 'baseline-promise-hops-1',
      label: '`async x => x` called and `.then` taken, 1 element at a time (the floor for async)',
      family: 'baseline',
      mode: 'async',
      bounded: '—',
      compareTo: 'sluice-async-c1',
      size: all,
      run: promiseHops(1, STAGES),
    },
    {
      id: 'baseline-promise-hops-16',
      label: 'the same, 16 elements at a time',
      family: 'baseline',
      mode: 'async',
      bounded: '—',
      compareTo: 'sluice-async-c16',
      size: all,
      run: promiseHops(16, STAGES),
    },
    {
      id: 'sluice-sync-sampled',
      label: 'sluice `stage(x => x)`, ids on, timing sampled 1%',
      family: 'sluice',
      mode: 'sync',
      bounded: 'yes',
      size: all,
      run: sluiceSync(0.01),
    },
    {
      id: 'sluice-sync-timed',
      label: 'sluice `stage(x => x)`, full timing (sampleRate 1)',
      family: 'sluice',
      mode: 'sync',
      bounded: 'yes',
      compareTo: 'sluice-sync-sampled',
      size: all,
      run: sluiceSync(1),
    },
    {
      id: 'sluice-async-c1',
      label: 'sluice `stage(async x => x)`, concurrency 1',
      family: 'sluice',
      mode: 'async',
      bounded: 'yes',
      size: all,
      run: sluiceAsync(1),
    },
    {
      id: 'sluice-async-c16',
      label: 'sluice `stage(async x => x)`, concurrency 16',
      family: 'sluice',
      mode: 'async',
      bounded: 'yes',
      size: all,
      run: sluiceAsync(16),
    },
    {
      id: 'sluice-sync-inspected',
      label: 'sluice `stage(x => x)`, timing sampled 1%, inspector on',
      family: 'sluice',
      mode: 'sync',
      bounded: 'yes',
      compareTo: 'sluice-sync-sampled',
      size: all,
      run: inspected(sluiceSync(0.01)),
    },
    {
      id: 'sluice-async-c16-inspected',
      label: 'sluice `stage(async x => x)`, concurrency 16, inspector on',
      family: 'sluice',
      mode: 'async',
      bounded: 'yes',
      compareTo: 'sluice-async-c16',
      size: all,
      run: inspected(sluiceAsync(16)),
    },
    {
      id: 'rxjs-map',
      label: 'RxJS `map`',
      family: 'rxjs',
      mode: 'sync',
      bounded: 'no',
      compareTo: 'sluice-sync-sampled',
      size: all,
      run: rxjs(() => map(identity)),
    },
    {
      id: 'rxjs-concatMap-of',
      label: 'RxJS `concatMap(x => of(x))`',
      family: 'rxjs',
      mode: 'sync',
      bounded: 'no',
      compareTo: 'sluice-sync-sampled',
      size: all,
      run: rxjs(() => concatMap((x: number) => of(x))),
    },
    {
      id: 'rxjs-mergeMap-of-16',
      label: 'RxJS `mergeMap(x => of(x), 16)`',
      family: 'rxjs',
      mode: 'sync',
      bounded: 'no',
      compareTo: 'sluice-sync-sampled',
      size: all,
      run: rxjs(() => mergeMap((x: number) => of(x), 16)),
    },
    {
      id: 'rxjs-mergeMap-promise-16',
      label: 'RxJS `mergeMap(x => Promise.resolve(x), 16)`',
      family: 'rxjs',
      mode: 'async',
      bounded: 'no',
      compareTo: 'sluice-async-c16',
      size: quadraticSize(rxjsAsyncCap),
      note: 'buffers all of range() and drains it with Array#shift(): cost per element grows with N',
      run: rxjs(() => mergeMap((x: number) => Promise.resolve(x), 16)),
    },
    {
      id: 'node-stream-sync',
      label: 'Node object-mode `stream.pipeline`, hwm 256, sync transform',
      family: 'node',
      mode: 'sync',
      bounded: 'yes',
      compareTo: 'sluice-sync-sampled',
      size: all,
      run: (n) => nodeStreams(n, (chunk, callback) => callback(null, chunk)),
    },
    {
      id: 'node-stream-async',
      label: 'Node object-mode `stream.pipeline`, hwm 256, async transform',
      family: 'node',
      mode: 'async',
      bounded: 'yes',
      compareTo: 'sluice-async-c1',
      size: all,
      run: (n) =>
        nodeStreams(n, (chunk, callback) => {
          identityAsync(chunk).then(
            (out) => callback(null, out),
            (err: Error) => callback(err),
          );
        }),
    },
    {
      id: 'async-generator-sync',
      label: 'async generators, `yield x`',
      family: 'async-generator',
      mode: 'sync',
      bounded: 'yes',
      compareTo: 'sluice-sync-sampled',
      size: all,
      run: (n) => asyncGenerators(n, pass),
    },
    {
      id: 'async-generator-async',
      label: 'async generators, `yield await f(x)`',
      family: 'async-generator',
      mode: 'async',
      bounded: 'yes',
      compareTo: 'sluice-async-c1',
      size: all,
      run: (n) => asyncGenerators(n, passAsync),
    },
  ];
}

/**
 * BENCH_FULL_GC=1 forces a full GC before every timed run, as earlier versions of this
 * bench did. By default it does not. A full GC between runs, when no object of the
 * finished pipeline is alive, frees V8's hidden classes (maps) of those objects and the
 * optimised code built on them: in the async pipeline 100–128 functions were re-optimised
 * in every run (counted with --trace-opt), so each run timed re-optimisation on top of
 * the pipeline, and every family paid it (see the README). A pipeline that keeps running
 * does not; the previous run's garbage is young and dies in the scavenges of the next.
 */
const FULL_GC = process.env.BENCH_FULL_GC === '1';

function expectedSum(n: number): number {
  return (n * (n - 1)) / 2;
}

/** One timed run: ns per element per stage, by wall clock and by CPU time. Throws if an element was lost or duplicated. */
async function timedRun(testCase: ThroughputCase, n: number): Promise<{ wall: number; cpu: number }> {
  if (FULL_GC) collect();
  const cpuStart = process.cpuUsage();
  const start = nowNs();
  const { count, sum } = await testCase.run(n);
  const elapsed = Number(nowNs() - start);
  const cpu = process.cpuUsage(cpuStart);
  if (count !== n || sum !== expectedSum(n)) {
    throw new Error(`${testCase.id}: expected ${n} elements summing to ${expectedSum(n)}, got ${count} summing to ${sum}`);
  }
  return { wall: elapsed / n / STAGES, cpu: ((cpu.user + cpu.system) * 1000) / n / STAGES };
}

export interface ThroughputPlan {
  readonly n: number;
  readonly repeats: number;
  readonly onProgress?: (message: string) => void;
}

/**
 * Warms every case up, then runs `repeats` rounds, each round every case once, so
 * that all cases share the same JIT state (as they would in one application) and
 * slow drifts (thermal, GC of the old generation) spread over all of them.
 */
export async function measureThroughput(cases: readonly ThroughputCase[], plan: ThroughputPlan): Promise<ThroughputResult[]> {
  const samples = new Map<string, number[]>(cases.map((c) => [c.id, []]));
  const cpuSamples = new Map<string, number[]>(cases.map((c) => [c.id, []]));
  for (const testCase of cases) {
    const n = Math.max(1, Math.floor(testCase.size(plan.n) / 5));
    plan.onProgress?.(`warm-up ${testCase.id} (${n} elements ×2)`);
    await timedRun(testCase, n);
    await timedRun(testCase, n);
    await (FULL_GC ? settle() : immediate());
  }
  for (let round = 0; round < plan.repeats; round++) {
    for (const testCase of cases) {
      const n = testCase.size(plan.n);
      const { wall, cpu } = await timedRun(testCase, n);
      samples.get(testCase.id)!.push(wall);
      cpuSamples.get(testCase.id)!.push(cpu);
      plan.onProgress?.(`round ${round + 1}/${plan.repeats} ${testCase.id}: ${wall.toFixed(1)} ns/element/stage (cpu ${cpu.toFixed(1)})`);
      await (FULL_GC ? settle() : immediate());
    }
  }
  return cases.map((c) => {
    const values = samples.get(c.id)!;
    const cpuValues = cpuSamples.get(c.id)!;
    return {
      id: c.id,
      label: c.label,
      family: c.family,
      mode: c.mode,
      bounded: c.bounded,
      compareTo: c.compareTo,
      note: c.note,
      n: c.size(plan.n),
      samples: values,
      median: median(values),
      best: Math.min(...values),
      cpuSamples: cpuValues,
      cpuMedian: median(cpuValues),
    };
  });
}
