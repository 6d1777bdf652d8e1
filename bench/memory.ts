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
 *
 * Per source kind (`memory-source-*`): the same small request objects from each kind of
 * sluice source, every one through the same bounded pipeline,
 * `source → stage(async x => x, { capacity: 2 })` (one async hop per element, so the
 * source is paused and resumed all the time), against the target heap growth < 10 MB:
 *   - `fromIterable(generator)`;
 *   - `fromAsyncIterable(async generator)`;
 *   - `fromReadable(objectMode Readable whose read() pushes synchronously)`;
 *   - `fromPush(Subject, { capacity: 64, policy: 'shed-incoming' })`, fed in bursts of 1,024
 *     from `setImmediate`: it cannot be paused, so it sheds; every element is delivered or shed.
 * `fromIterable(array)` has no row: at 10M elements the array is the memory (the source
 * holds every element before the run starts), so heap growth would measure the array.
 * Peak held is read at the sink every 1,024 elements: the stage's buffer and work in flight, and
 * fromPush's buffer (the Readable's own buffer is reported apart).
 */
import { Readable } from 'node:stream';
import { Subject, from, mergeMap, of, tap, type Observable } from 'rxjs';
import { StageStats, fromAsyncIterable, fromIterable, fromPush, fromReadable, stage, type Traced } from 'sluice';
import { collect, formatCount, nowNs } from './harness.js';

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
  /** Elements shed on the way (a source that cannot be paused). */
  readonly shed?: number;
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
  return watch(
    'rxjs-memory',
    'RxJS `from(gen) → mergeMap(slow, 4)`',
    n,
    () => emitted - started,
    async (checkpoint) => {
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
    },
  );
}

// ---------------------------------------------------------------- per source kind

/** A source kind's run at `n` elements. */
export interface SourceKindScenario {
  readonly id: string;
  readonly label: string;
  readonly run: (n: number) => Promise<MemoryResult>;
}

/** The one pipeline every source kind goes through: a single async hop per element, bounded at 2 (+1 in flight). */
const BOUNDED_CAPACITY = 2;
function bounded(source: Observable<Request>, stats: StageStats): Observable<Traced<Request>> {
  return source.pipe(stage(async (request: Request) => request, { name: 'bounded', capacity: BOUNDED_CAPACITY, stats })) as Observable<Traced<Request>>;
}

/**
 * Counts what reaches the sink, taking the checkpoints there (the stage's work is left as the bare
 * identity): held elements every 1,024 arrivals, the live heap every n/100 (a push source delivers
 * only part of n; the 50 ms timer samples it too, as it yields to the event loop).
 */
function drain(source: Observable<unknown>, n: number, checkpoint: (live?: boolean) => void): Promise<number> {
  const liveEvery = Math.max(1024, Math.floor(n / 100));
  return new Promise((resolve, reject) => {
    let count = 0;
    source.subscribe({
      next: () => checkpointFor(count++, liveEvery, checkpoint),
      error: reject,
      complete: () => resolve(count),
    });
  });
}

async function* requestsLater(n: number): AsyncGenerator<Request> {
  for (let id = 0; id < n; id++) yield { id, prompt: 'summarise this' };
}

/** Elements the push producer sends per `setImmediate` turn; the pipeline drains between turns. */
const PUSH_BURST = 1024;
const PUSH_CAPACITY = 64;

/** One source kind's run, opened before the heap baseline is taken and drained inside `watch`. */
interface KindRun {
  /** Elements held by sluice now (the stage's buffer and work in flight, and a push source's buffer). */
  readonly held: () => number;
  /** Subscribes, starts any producer, resolves with the elements accounted for (must be `n`). */
  readonly drained: (checkpoint: (live?: boolean) => void) => Promise<number>;
  readonly after?: () => Pick<MemoryResult, 'detail' | 'shed'>;
}

function sourceKind(id: string, label: string, open: (n: number) => KindRun): SourceKindScenario {
  return {
    id,
    label,
    run: async (n) => {
      const kind = open(n);
      const result = await watch(id, label, n, kind.held, kind.drained);
      return { ...result, ...kind.after?.() };
    },
  };
}

export const sourceKindScenarios: readonly SourceKindScenario[] = [
  sourceKind('memory-source-generator', '`fromIterable(generator)`', (n) => {
    const stats = new StageStats();
    return {
      held: () => stats.buffered + stats.inFlight,
      drained: (checkpoint) => drain(bounded(fromIterable(requests(n)), stats), n, checkpoint),
    };
  }),
  sourceKind('memory-source-async-iterable', '`fromAsyncIterable(async generator)`', (n) => {
    const stats = new StageStats();
    return {
      held: () => stats.buffered + stats.inFlight,
      drained: (checkpoint) => drain(bounded(fromAsyncIterable(requestsLater(n)), stats), n, checkpoint),
    };
  }),
  sourceKind('memory-source-readable', '`fromReadable(Readable)`, objectMode, read() pushes synchronously', (n) => {
    const stats = new StageStats();
    let id = 0;
    const readable = new Readable({
      objectMode: true,
      read() {
        this.push(id < n ? { id: id++, prompt: 'summarise this' } : null);
      },
    });
    let peakReadable = 0;
    return {
      held: () => {
        peakReadable = Math.max(peakReadable, readable.readableLength);
        return stats.buffered + stats.inFlight;
      },
      drained: (checkpoint) => drain(bounded(fromReadable<Request>(readable), stats), n, checkpoint),
      after: () => ({ detail: `the Readable's own buffer peaked at ${peakReadable} objects (highWaterMark ${readable.readableHighWaterMark})` }),
    };
  }),
  sourceKind(
    'memory-source-push',
    `\`fromPush(Subject, { capacity: ${PUSH_CAPACITY}, policy: 'shed-incoming' })\`, bursts of ${PUSH_BURST} from setImmediate`,
    (n) => {
      const stats = new StageStats();
      const push = new StageStats();
      const subject = new Subject<Request>();
      let id = 0;
      const burst = (): void => {
        const end = Math.min(n, id + PUSH_BURST);
        while (id < end) subject.next({ id: id++, prompt: 'summarise this' });
        if (id < n) setImmediate(burst);
        else subject.complete();
      };
      return {
        held: () => push.buffered + stats.buffered + stats.inFlight,
        drained: async (checkpoint) => {
          const delivered = drain(
            bounded(fromPush(subject, { name: 'push', capacity: PUSH_CAPACITY, policy: 'shed-incoming', stats: push }), stats),
            n,
            checkpoint,
          );
          setImmediate(burst);
          // It cannot be paused: every element pushed is delivered or shed.
          return (await delivered) + push.shedTotal;
        },
        after: () => {
          const shed = push.shedTotal;
          return {
            shed,
            detail: `${formatCount(n - shed)} delivered, ${formatCount(shed)} shed (${((100 * shed) / n).toFixed(1)}%, all buffer-full: ${push.shed['buffer-full'] === shed})`,
          };
        },
      };
    },
  ),
];
