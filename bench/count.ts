/**
 * A fixed workload for instruction counting (steady on a shared machine, where wall
 * clocks are not): `bench/instructions.mjs` runs it under valgrind twice, with
 * COUNT_RUNS=0 and COUNT_RUNS=k after the same warm-up, and divides the difference.
 *
 *     node --conditions=sluice-source --import tsx bench/count.ts   # COUNT_CASE, COUNT_N, COUNT_WARM(_N), COUNT_RUNS
 *
 * Cases: sync-sampled, sync-timed, async-c1, async-c16 (7 stages, as bench/throughput.ts),
 * rxjs-map (7 × `map`, for scale), promise-hops-1 and promise-hops-16 (per stage an `async` call
 * and one `.then`, the floor any async stage pays in V8: bench/throughput.ts). The warm-up runs every sluice case in turn (COUNT_MIX=0:
 * only the measured one), so call sites see sync and async work as in `npm run bench`.
 * COUNT_STAGES (default 7) sets the pipeline's length: counts at two lengths split the cost
 * of a stage in the middle from what each element costs once (source, first buffer, sink).
 * COUNT_GC=1 (with node's --expose-gc) forces a full GC before every measured round, as
 * `npm run bench` did with BENCH_FULL_GC=1: the count then includes re-optimising the code
 * that the GC's freed maps deoptimised (see bench/throughput.ts).
 */
import { map, range, type Observable, type OperatorFunction } from 'rxjs';
import { stage } from '../operators/stage.js';
import { fromIterable } from '../src/flow/sources.js';
import type { Traced } from '../src/core/trace.js';
import { promiseHops } from './floor.js';

const measured = process.env.COUNT_CASE ?? 'sync-sampled';
const mix = process.env.COUNT_MIX !== '0';
const SLUICE_CASES = ['sync-sampled', 'sync-timed', 'async-c1', 'async-c16'];
const n = Number(process.env.COUNT_N ?? 20_000);
const warmN = Number(process.env.COUNT_WARM_N ?? n);
const warm = Number(process.env.COUNT_WARM ?? 3);
const runs = Number(process.env.COUNT_RUNS ?? 0);
const STAGES = Number(process.env.COUNT_STAGES ?? 7);

function* naturals(count: number): Generator<number> {
  for (let i = 0; i < count; i++) yield i;
}
const sync = (x: number): number => x;
const async = async (x: number): Promise<number> => x;

function build(which: string, n: number): Observable<unknown> {
  if (which === 'rxjs-map') {
    let flow: Observable<unknown> = range(0, n);
    for (let i = 0; i < STAGES; i++) flow = (map(sync) as OperatorFunction<unknown, unknown>)(flow);
    return flow;
  }
  let flow: Observable<unknown> = fromIterable(naturals(n));
  for (let i = 0; i < STAGES; i++) {
    const first = i === 0;
    const name = `s${i + 1}`;
    const op =
      which === 'sync-sampled'
        ? stage(sync, first ? { name, sampleRate: 0.01 } : { name })
        : which === 'sync-timed'
          ? stage(sync, first ? { name, sampleRate: 1 } : { name })
          : which === 'async-c1'
            ? stage(async, first ? { name, sampleRate: 0.01 } : { name })
            : which === 'async-c16'
              ? stage(async, first ? { name, sampleRate: 0.01, concurrency: 16 } : { name, concurrency: 16 })
              : undefined;
    if (op === undefined) throw new Error(`unknown COUNT_CASE "${which}"`);
    flow = (op as OperatorFunction<unknown, unknown>)(flow);
  }
  return flow;
}

async function once(which: string, n: number): Promise<void> {
  const hops = /^promise-hops-(\d+)$/.exec(which);
  if (hops !== null) {
    const { count, sum } = await promiseHops(Number(hops[1]), STAGES)(n);
    if (count !== n || sum !== (n * (n - 1)) / 2) throw new Error(`${which}: lost or duplicated elements (${count})`);
    return;
  }
  let count = 0;
  let sum = 0;
  // Decided once, not per element: a string compare per element is the harness's cost, not the pipeline's.
  const plain = which === 'rxjs-map';
  await new Promise<void>((resolve, reject) =>
    build(which, n).subscribe({
      next: (output) => {
        count++;
        sum += plain ? (output as number) : (output as Traced<number>).value;
      },
      error: reject,
      complete: resolve,
    }),
  );
  if (count !== n || sum !== (n * (n - 1)) / 2) throw new Error(`${which}: lost or duplicated elements (${count})`);
}

for (let i = 0; i < warm; i++) {
  for (const which of mix && SLUICE_CASES.includes(measured) ? SLUICE_CASES : [measured]) await once(which, warmN);
}
const started = process.hrtime.bigint();
const collect = (globalThis as { gc?: () => void }).gc;
for (let i = 0; i < runs; i++) {
  if (process.env.COUNT_GC === '1') collect?.();
  await once(measured, n);
}
// COUNT_TIME=1: also the wall time of the measured rounds (outside valgrind), to tell instructions from stalls.
if (process.env.COUNT_TIME === '1' && runs > 0) {
  console.log(`${measured}: ${(Number(process.hrtime.bigint() - started) / runs / n / STAGES).toFixed(1)} ns/element/stage (wall, ${runs} rounds)`);
}
