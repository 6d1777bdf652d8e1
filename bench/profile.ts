/**
 * A focused sluice pipeline to profile, without the peers around it:
 *
 *     node --conditions=sluice-source --import tsx --cpu-prof --cpu-prof-dir=.prof bench/profile.ts
 *     PROFILE_CASE=sync-timed PROFILE_N=2000000 PROFILE_RUNS=8 node ... bench/profile.ts
 *
 * Cases: `sync-sampled` (default: 7 × `stage(x => x)`, 1% timing on the first stage),
 * `sync-timed` (sampleRate 1), `async-c1`, `async-c16` (7 × `stage(async x => x)`),
 * `source` (fromIterable alone, no stage). Prints ns per element per stage for each run,
 * by the wall clock and by this process's CPU time (steadier when the machine is shared).
 */
import type { Observable, OperatorFunction } from 'rxjs';
import { fromIterable, stage, type StageOptions, type Traced } from 'sluice';
import { envInt } from './harness.js';

const which = process.env.PROFILE_CASE ?? 'sync-sampled';
const n = envInt('PROFILE_N', 1_000_000);
const runs = envInt('PROFILE_RUNS', 6);
const stages = which === 'source' ? 0 : 7;

function* naturals(count: number): Generator<number> {
  for (let i = 0; i < count; i++) yield i;
}

function build(count: number): Observable<unknown> {
  const sync = (x: number): number => x;
  const async = async (x: number): Promise<number> => x;
  const options = (i: number): StageOptions<number> => {
    const first = i === 0;
    switch (which) {
      case 'sync-sampled':
        return first ? { name: `s${i}`, sampleRate: 0.01 } : { name: `s${i}` };
      case 'sync-timed':
        return first ? { name: `s${i}`, sampleRate: 1 } : { name: `s${i}` };
      case 'async-c1':
        return first ? { name: `s${i}`, sampleRate: 0.01 } : { name: `s${i}` };
      case 'async-c16':
        return first ? { name: `s${i}`, sampleRate: 0.01, concurrency: 16 } : { name: `s${i}`, concurrency: 16 };
      default:
        throw new Error(`PROFILE_CASE must be sync-sampled, sync-timed, async-c1, async-c16 or source; got "${which}"`);
    }
  };
  let flow: Observable<unknown> = fromIterable(naturals(count));
  for (let i = 0; i < stages; i++) {
    const work = which.startsWith('async') ? async : sync;
    flow = (stage(work, options(i)) as OperatorFunction<unknown, unknown>)(flow);
  }
  return flow;
}

for (let run = 0; run < runs; run++) {
  const cpuStart = process.cpuUsage();
  const start = process.hrtime.bigint();
  const count = await new Promise<number>((resolve, reject) => {
    let seen = 0;
    build(n).subscribe({
      next: (output) => {
        seen += stages === 0 ? 1 : (output as Traced<number>).value === seen ? 1 : NaN;
      },
      error: reject,
      complete: () => resolve(seen),
    });
  });
  const elapsed = Number(process.hrtime.bigint() - start);
  const cpu = process.cpuUsage(cpuStart);
  if (count !== n) throw new Error(`expected ${n} elements in order, got ${count}`);
  const per = (ns: number) => (ns / n / Math.max(1, stages)).toFixed(1);
  // CPU time is this process's own: steadier than wall time when the machine is shared.
  console.log(`${which} run ${run + 1}: ${per(elapsed)} ns/element${stages ? '/stage' : ''} wall, ${per((cpu.user + cpu.system) * 1000)} cpu`);
}
