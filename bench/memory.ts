/**
 * Memory bound: a generator of small request objects feeding a stage about 10× slower
 * than the source: every 10th element the slow stage awaits (a Promise), the rest
 * pass straight through, so a source that is not paused runs far ahead of it. The run
 * reports how much slower than its source the stage really was.
 *
 * sluice: `fromIterable(generator) → stage(x => x) → stage(slow)`; the peak of
 * `buffered + inFlight` over both stages is read from `StageStats` while it runs.
 * RxJS: `from(generator) → mergeMap(slow, 4)`; its buffer is what the source emitted
 * minus what `mergeMap` started (it has no stats).
 *
 * Heap: `global.gc()` then `heapUsed` before, periodically during (with and without
 * a forced GC: live heap vs. live heap plus garbage not yet collected) and after.
 */
import { from, mergeMap, of, tap, type Observable } from 'rxjs';
import { StageStats, fromIterable, stage, type Traced } from 'sluice';
import { collect, nowNs } from './harness.js';

export interface MemoryResult {
  readonly id: string;
  readonly label: string;
  readonly n: number;
  readonly seconds: number;
  /** Peak elements held between source and sink (buffered + in flight). */
  readonly peakBuffered: number;
  /** Peak live heap above the baseline (forced GC before each sample). */
  readonly peakLiveGrowth: number;
  /** Peak `heapUsed` above the baseline without forcing GC (includes young garbage). */
  readonly peakRawGrowth: number;
  /** Heap still held after the run completed and a GC. */
  readonly retainedGrowth: number;
  readonly samples: number;
  /** How the peak splits, when there is more than one holder. */
  readonly detail?: string;
}

/** What flows: a small object per element, as a request would be (numbers would hide the heap cost of buffering). */
interface Request {
  readonly id: number;
  readonly prompt: string;
}

function* requests(n: number): Generator<Request> {
  for (let id = 0; id < n; id++) yield { id, prompt: 'summarise this' };
}

/** The slow stage: 9 of 10 elements pass straight through, every 10th is awaited. */
function slowly(request: Request): Request | Promise<Request> {
  return request.id % 10 === 0 ? Promise.resolve(request) : request;
}

/** Stats every 1024 elements, the heap every 65536, and a GC'd (live) heap sample every `liveEvery`. */
function checkpointFor(id: number, liveEvery: number, checkpoint: (live?: boolean) => void): void {
  if ((id & 0x3ff) !== 0) return;
  if (id % liveEvery === 0) checkpoint(true);
  else if ((id & 0xffff) === 0) checkpoint(false);
  else checkpoint(undefined);
}

/** The source alone (warmed up, best of 3): ns per element of the generator, for the "× slower" figure. */
export function sourceNsPerElement(n: number): number {
  let best = Infinity;
  for (let run = 0; run < 3; run++) {
    const start = nowNs();
    let sum = 0;
    for (const request of requests(n)) sum += request.id;
    const elapsed = Number(nowNs() - start);
    if (sum !== (n * (n - 1)) / 2) throw new Error('source check failed');
    best = Math.min(best, elapsed / n);
  }
  return best;
}

class HeapWatch {
  private readonly base: number;
  peakLive = 0;
  peakRaw = 0;
  samples = 0;

  constructor() {
    collect();
    this.base = process.memoryUsage().heapUsed;
  }

  /** Samples the heap; `live` forces a GC first (a full GC of a small heap costs about a millisecond). */
  sample(live: boolean): void {
    this.samples++;
    this.peakRaw = Math.max(this.peakRaw, process.memoryUsage().heapUsed - this.base);
    if (!live) return;
    collect();
    this.peakLive = Math.max(this.peakLive, process.memoryUsage().heapUsed - this.base);
  }

  retained(): number {
    collect();
    return process.memoryUsage().heapUsed - this.base;
  }
}

/** Runs `body` while sampling `buffered()` and the heap every `intervalMs` (when the loop turns) and at `checkpoint()`s. */
async function watch(
  id: string,
  label: string,
  n: number,
  buffered: () => number,
  /** `checkpoint(true)`: live heap (forced GC), `false`: raw heap, `undefined`: buffered count only. */
  body: (checkpoint: (live?: boolean) => void) => Promise<number>,
): Promise<MemoryResult> {
  const heap = new HeapWatch();
  let peakBuffered = 0;
  const checkpoint = (): void => {
    peakBuffered = Math.max(peakBuffered, buffered());
  };
  const timer = setInterval(() => {
    checkpoint();
    heap.sample(true);
  }, 50);
  const start = nowNs();
  let count: number;
  try {
    count = await body((live) => {
      checkpoint();
      if (live !== undefined) heap.sample(live);
    });
  } finally {
    clearInterval(timer);
  }
  const seconds = Number(nowNs() - start) / 1e9;
  heap.sample(true);
  if (count !== n) throw new Error(`${id}: expected ${n} elements, got ${count}`);
  return {
    id,
    label,
    n,
    seconds,
    peakBuffered,
    peakLiveGrowth: heap.peakLive,
    peakRawGrowth: heap.peakRaw,
    retainedGrowth: heap.retained(),
    samples: heap.samples,
  };
}

function countAll(source: Observable<unknown>): Promise<number> {
  return new Promise((resolve, reject) => {
    let count = 0;
    source.subscribe({ next: () => void count++, error: reject, complete: () => resolve(count) });
  });
}

export async function sluiceMemory(n: number): Promise<MemoryResult> {
  const fast = new StageStats();
  const slow = new StageStats();
  const peak = { fast: 0, slow: 0 };
  const held = (): number => {
    const inFast = fast.buffered + fast.inFlight;
    const inSlow = slow.buffered + slow.inFlight;
    peak.fast = Math.max(peak.fast, inFast);
    peak.slow = Math.max(peak.slow, inSlow);
    return inFast + inSlow;
  };
  const liveEvery = Math.max(1024, Math.floor(n / 10));
  const result = await watch('sluice-memory', 'sluice `fromIterable(gen) → stage(x => x) → stage(slow)`', n, held, (checkpoint) =>
    countAll(
      fromIterable(requests(n)).pipe(
        stage((request: Request) => request, { name: 'fast', stats: fast }),
        stage(
          (request: Request) => {
            checkpointFor(request.id, liveEvery, checkpoint);
            return slowly(request);
          },
          { name: 'slow', stats: slow },
        ),
      ) as Observable<Traced<Request>>,
    ),
  );
  if (fast.received !== n || slow.delivered !== n) throw new Error(`sluice-memory: stats do not account for ${n} elements`);
  return { ...result, detail: `peak per stage (buffered + inFlight; capacity 16 + concurrency 1 each): fast ${peak.fast}, slow ${peak.slow}` };
}

export async function rxjsMemory(n: number): Promise<MemoryResult> {
  let emitted = 0;
  let started = 0;
  const liveEvery = Math.max(1024, Math.floor(n / 10));
  return watch('rxjs-memory', 'RxJS `from(gen) → mergeMap(slow, 4)`', n, () => emitted - started, async (checkpoint) => {
    const done = countAll(
      from(requests(n)).pipe(
        tap(() => void emitted++),
        mergeMap((request: Request) => {
          started++;
          checkpointFor(request.id, liveEvery, checkpoint);
          const result = slowly(request);
          return result instanceof Promise ? result : of(result);
        }, 4),
      ),
    );
    checkpoint(true); // the synchronous source has emitted everything by now
    return done;
  });
}
