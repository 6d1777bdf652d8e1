/**
 * Backpressure at work: a fast source feeding a slow "inference" stage.
 *
 * The same pipeline runs twice, once on sluice stages and once on plain RxJS
 * `mergeMap`. sluice pulls from the source only as fast as inference finishes, so
 * memory stays flat; `mergeMap` pulls everything at once and buffers it.
 *
 * Run: npm run demo   (env DEMO_N sets the number of requests, default 200000)
 */
import { filter, lastValueFrom, mergeMap, map, tap, range, scan } from 'rxjs';
import { fromIterable, stage, StageStats, type Traced } from 'sluice';

const N = Number(process.env.DEMO_N ?? 200_000);
const INFER_CONCURRENCY = 8;

/** Stand-in for a model call: yields to the event loop like real I/O does. */
function infer(prompt: string): Promise<{ prompt: string; score: number }> {
  return new Promise((resolve) => setImmediate(() => resolve({ prompt, score: prompt.length % 7 })));
}

function tokenize(prompt: string): string {
  return prompt.trim().toLowerCase();
}

const mb = (bytes: number) => `${(bytes / 1024 / 1024).toFixed(1)} MB`;

async function runSluice(): Promise<void> {
  let pulled = 0;
  function* prompts() {
    for (let i = 0; i < N; i++) {
      pulled++;
      yield `  Prompt number ${i} `;
    }
  }
  const tokenStats = new StageStats();
  const inferStats = new StageStats();
  let peakHeld = 0;
  let delivered = 0;
  let dropped = 0;
  const report = setInterval(() => {
    console.log(
      `  sluice  pulled ${String(pulled).padStart(7)}  buffered ${String(tokenStats.buffered + inferStats.buffered).padStart(3)}  in flight ${String(inferStats.inFlight).padStart(2)}  delivered ${String(delivered).padStart(7)}  heap ${mb(process.memoryUsage().heapUsed)}`,
    );
  }, 250);

  let sampleTrace: Traced<{ prompt: string; score: number }> | undefined;
  await lastValueFrom(
    fromIterable(prompts()).pipe(
      stage(tokenize, { name: 'tokenize', capacity: 16, stats: tokenStats, sampleRate: 0.001 }),
      // A plain operator between stages: demand passes through it, and what it drops costs no credit.
      filter((t) => (t.value.endsWith('13') ? (dropped++, false) : true)),
      stage(infer, { name: 'infer', capacity: 32, concurrency: INFER_CONCURRENCY, stats: inferStats }),
      tap((t) => {
        delivered++;
        peakHeld = Math.max(peakHeld, pulled - delivered - dropped);
        if (t.trace.sampled && !sampleTrace && t.trace.seq > 0) sampleTrace = t;
      }),
      scan((count) => count + 1, 0),
    ),
  );
  clearInterval(report);
  console.log(
    `  sluice: ${delivered} delivered of ${N}; at most ${peakHeld} elements between source and sink (bound: capacities 16 + 32 + concurrency 1 + ${INFER_CONCURRENCY} = ${16 + 32 + 1 + INFER_CONCURRENCY})`,
  );
  if (sampleTrace) {
    const t = sampleTrace.trace;
    console.log(`  a sampled element: traceparent ${t.traceparent}`);
    for (const r of t.records ?? []) {
      console.log(`    ${r.stage.padEnd(9)} queue wait ${r.queueWait.toFixed(3)} ms  service ${r.service.toFixed(3)} ms  paused ${r.paused.toFixed(3)} ms`);
    }
  }
}

async function runMergeMap(n: number): Promise<void> {
  let pulled = 0;
  let delivered = 0;
  let peakHeld = 0;
  const report = setInterval(() => {
    console.log(`  mergeMap pulled ${String(pulled).padStart(7)}  delivered ${String(delivered).padStart(7)}  heap ${mb(process.memoryUsage().heapUsed)}`);
  }, 250);
  await lastValueFrom(
    range(0, n).pipe(
      map((i) => {
        pulled++;
        return tokenize(`  Prompt number ${i} `);
      }),
      filter((p) => !p.endsWith('13')),
      mergeMap((p) => infer(p), INFER_CONCURRENCY),
      tap(() => {
        delivered++;
        peakHeld = Math.max(peakHeld, pulled - delivered);
      }),
      scan((count) => count + 1, 0),
    ),
  );
  clearInterval(report);
  console.log(`  mergeMap: ${delivered} delivered; up to ${peakHeld} elements held in its unbounded buffer`);
}

console.log(`sluice backpressure demo: ${N} prompts, a fast source, inference at concurrency ${INFER_CONCURRENCY}\n`);
console.log('1) sluice stages (pull-based: the source is read only as fast as inference finishes)');
await runSluice();
// mergeMap drains its buffer with Array.shift(), O(n) per element: keep its run smaller.
const mergeMapN = Math.min(N, 50_000);
console.log(`\n2) plain RxJS mergeMap on ${mergeMapN} prompts (push-based: the source is read at once and buffered)`);
await runMergeMap(mergeMapN);
