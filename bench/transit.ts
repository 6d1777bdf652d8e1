/**
 * Transit: plain RxJS operators that defer (`delay`, `mergeMap` over Promises) between two
 * sluice stages, with real timers. The downstream stage's link counts elements that left
 * the upstream stage and have not arrived as *in transit* against its room, so the segment
 * stays bounded; when a `filter` after the deferral drops some, the link has to give up
 * waiting for them. Every run is one pipeline,
 *
 *     fromIterable(count(n)) → stage(x => x, { capacity: 4 }) → middle → stage(x => x, { capacity: 4 })
 *
 * reading both stages' `StageStats` while it runs:
 *   - `transit-delay`, `transit-delay-filter` (n = BENCH_TRANSIT_N, default 3,000): wall time with
 *     `delay(20)` alone and with `filter(v => v.value % 10 === 0)` after it; the ratio
 *     filtered/alone is judged against ≤ 3×. The filtered run pays a fixed start-up cost (the link
 *     gives up slowly until it has timed 8 transits), so at a few hundred elements the ratio is higher;
 *   - `transit-delay-buffered` (n = 300): `delay(50)`, peak of the downstream stage's `buffered`
 *     against capacity + 16 (the slack a link allows before it has seen a deferral). Here the
 *     downstream work takes 1 ms (a timer): with `x => x` an element is worked on as it arrives
 *     and the buffer stays empty whatever the link lets through;
 *   - `transit-merge-map` (n = 500): `mergeMap` over Promises resolving after 10–100 ms (a fixed
 *     pseudo-random time per element, so elements overtake each other): peak of the elements
 *     between the stages (upstream delivered − downstream received + downstream buffered) against
 *     capacity + concurrency + 16, and wall time against n × mean delay / (capacity + concurrency),
 *     the time a segment holding exactly its room would take.
 * The peaks are sampled as each element enters the downstream stage's work and every
 * millisecond by a timer.
 */
import { delay, filter, mergeMap, type Observable, type OperatorFunction } from 'rxjs';
import { StageStats, fromIterable, stage, type Traced } from 'sluice';

/** Both stages' capacity; their concurrency is the default, 1. */
export const TRANSIT_CAPACITY = 4;
const CONCURRENCY = 1;
/** Elements a link lets go missing beyond its room before it has seen a deferral (src/flow/inlet.ts). */
export const TRANSIT_SLACK = 16;

export interface TransitScenario {
  readonly id: string;
  readonly label: string;
  readonly n: number;
  readonly middle: () => OperatorFunction<Traced<number>, Traced<number>>;
  /** Elements expected out of the downstream stage. */
  readonly expected: number;
  /** The downstream stage's work waits this long per element (a timer); 0: `x => x`. */
  readonly workMs: number;
}

export interface TransitResult {
  readonly id: string;
  readonly label: string;
  readonly n: number;
  /** Elements that came out of the downstream stage. */
  readonly count: number;
  readonly workMs: number;
  readonly ms: number;
  /** Peak of the downstream stage's `buffered`. */
  readonly peakBuffered: number;
  /**
   * Peak of upstream delivered − downstream received + downstream buffered. With a `filter`
   * in the segment this counts the dropped elements too, so it is not reported there.
   */
  readonly peakBetween: number;
}

function* count(n: number): Generator<number> {
  for (let i = 0; i < n; i++) yield i;
}

/** 10..100 ms, fixed per element (a multiplicative hash of its value), so every run waits the same. */
export function transitDelayOf(value: number): number {
  return 10 + ((Math.imul(value + 1, 0x9e3779b1) >>> 0) % 91);
}

/** Mean of `transitDelayOf` over the first `n` elements (ms). */
export function meanTransitDelay(n: number): number {
  let sum = 0;
  for (let i = 0; i < n; i++) sum += transitDelayOf(i);
  return sum / n;
}

/** The room of the downstream stage: what a segment holds once the link has seen a deferral. */
export const TRANSIT_ROOM = TRANSIT_CAPACITY + CONCURRENCY;

const after = <T>(ms: number, value: T): Promise<T> => new Promise((resolve) => setTimeout(resolve, ms, value));

export function transitScenarios(delayN: number): TransitScenario[] {
  const keepOneInTen = filter((v: Traced<number>) => v.value % 10 === 0);
  return [
    { id: 'transit-delay', label: '`delay(20)`', n: delayN, expected: delayN, workMs: 0, middle: () => delay(20) },
    {
      id: 'transit-delay-filter',
      label: '`delay(20)`, `filter(v => v.value % 10 === 0)`',
      n: delayN,
      expected: Math.ceil(delayN / 10),
      workMs: 0,
      middle: () => (source: Observable<Traced<number>>) => source.pipe(delay(20), keepOneInTen),
    },
    { id: 'transit-short-delay', label: '`delay(1)`', n: 1_000, expected: 1_000, workMs: 0, middle: () => delay(1) },
    {
      id: 'transit-short-delay-filter',
      label: '`delay(1)`, `filter(v => v.value % 100 === 0)`',
      n: 1_000,
      expected: 10,
      workMs: 0,
      middle: () => (source: Observable<Traced<number>>) =>
        source.pipe(
          delay(1),
          filter((v: Traced<number>) => v.value % 100 === 0),
        ),
    },
    { id: 'transit-delay-buffered', label: '`delay(50)`, downstream work 1 ms', n: 300, expected: 300, workMs: 1, middle: () => delay(50) },
    {
      id: 'transit-merge-map',
      label: '`mergeMap(x => Promise after 10–100 ms)`',
      n: 500,
      expected: 500,
      workMs: 0,
      middle: () => mergeMap((v: Traced<number>) => after(transitDelayOf(v.value), v)),
    },
  ];
}

export async function measureTransit(scenario: TransitScenario): Promise<TransitResult> {
  const upstream = new StageStats();
  const downstream = new StageStats();
  let peakBuffered = 0;
  let peakBetween = 0;
  const sample = (): void => {
    const buffered = downstream.buffered;
    peakBuffered = Math.max(peakBuffered, buffered);
    peakBetween = Math.max(peakBetween, upstream.delivered - downstream.received + buffered);
  };
  const { workMs } = scenario;
  const work = (x: number): number | Promise<number> => {
    sample();
    return workMs === 0 ? x : after(workMs, x);
  };
  const timer = setInterval(sample, 1);
  const start = performance.now();
  let outputs = 0;
  try {
    await new Promise<void>((resolve, reject) => {
      fromIterable(count(scenario.n))
        .pipe(
          stage((x: number) => x, { name: 'upstream', capacity: TRANSIT_CAPACITY, stats: upstream }),
          scenario.middle(),
          stage(work, { name: 'downstream', capacity: TRANSIT_CAPACITY, stats: downstream }),
        )
        .subscribe({ next: () => void outputs++, error: reject, complete: resolve });
    });
  } finally {
    clearInterval(timer);
  }
  const ms = performance.now() - start;
  if (outputs !== scenario.expected) throw new Error(`${scenario.id}: expected ${scenario.expected} elements out, got ${outputs}`);
  return { id: scenario.id, label: scenario.label, n: scenario.n, count: outputs, workMs, ms, peakBuffered, peakBetween };
}
