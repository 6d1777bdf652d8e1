/**
 * Properties of the stage operator over random sources, capacities, policies,
 * concurrency, ordering, work shapes, consumer speeds and a random `filter` between
 * two stages: source → A → filter → (expand) → (defer) → B → consumer, where *defer*
 * is a plain deferring operator (`delay`, `observeOn`, `mergeMap`/`concatMap` over
 * Promises, or the dropping `debounceTime`/`auditTime`), and the work or a hook may
 * re-enter the pipeline (unsubscribe, request, kill switch) at a random element.
 *
 * `fc.scheduler()` decides the order in which asynchronous work completes (every
 * async work function waits on `s.schedule(...)`), and when a `demand` consumer's
 * requests arrive, so each run explores one interleaving. A `VirtualTimeScheduler`
 * holds every timer the stages start (timeouts, in-transit waits): the tests advance
 * it by hand and can see that no timer is left behind.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import {
  Observable,
  VirtualTimeScheduler,
  Subject,
  Subscriber,
  auditTime,
  concatMap,
  debounceTime,
  delay,
  filter,
  from,
  map,
  mergeMap,
  observeOn,
  take,
  tap,
  type MonoTypeOperatorFunction,
  type Subscription,
} from 'rxjs';
import { Readable } from 'node:stream';
import { fromAsyncIterable, fromIterable, fromReadable } from '../../src/flow/sources.js';
import { fromPush } from '../../src/flow/push.js';
import { subscribeWithDemand, type DemandSubscription } from '../../src/flow/demand.js';
import { KillSwitch } from '../../src/flow/kill-switch.js';
import { stage, type ShedEvent, type StageContext, type StageOptions, type WorkResult } from '../../operators/stage.js';
import { setFastPaths } from '../../operators/stage/fast-paths.js';
import { StageStats } from '../../src/flow/stats.js';
import { Ring } from '../../src/flow/ring.js';
import type { Policy } from '../../src/flow/options.js';
import { SeqSampler, sampler, type TraceContext, type Traced } from '../../src/core/trace.js';

type Scheduler = fc.Scheduler;

// ---- what a run is made of ----

/**
 * `array`/`generator`: `fromIterable`; `async`: `fromAsyncIterable` over scheduled steps;
 * `readable`: `fromReadable` over an object-mode Readable; `push`: `fromPush` over a
 * Subject fed by scheduled steps (it sheds what does not fit); `plain`: RxJS `from`
 * (cannot be paused).
 */
type SourceKind = 'array' | 'generator' | 'async' | 'readable' | 'push' | 'plain';

/**
 * A plain operator between the stages that holds elements past their emit: by frames
 * of virtual time (`delay`, `observeOn`), by scheduled Promises (`mergeMap`,
 * `concatMap`), or holding and dropping (`debounceTime`, `auditTime`).
 */
type DeferKind = 'delay' | 'observeOn' | 'mergeMap' | 'concatMap' | 'debounceTime' | 'auditTime';
const DEFER_KINDS: readonly DeferKind[] = ['delay', 'observeOn', 'mergeMap', 'concatMap', 'debounceTime', 'auditTime'];
const dropsElements = (kind: DeferKind | undefined): boolean => kind === 'debounceTime' || kind === 'auditTime';

/** Something the work of a stage, or its `onShed` hook, does to the pipeline when it handles its `at`-th element. */
interface Reentry {
  stage: 'A' | 'B';
  from: 'work' | 'onShed';
  at: number;
  action: 'unsubscribe' | 'request' | 'shutdown' | 'abort';
}

/**
 * How the work answers: `sync` a value, `promise` a scheduled Promise, `mixed` one or
 * the other by element, `observable` an Observable of one scheduled value, `tokens`
 * an async generator of two values, each after a scheduled wait (a token stream),
 * `flow` a synchronous Flow of two values (paused while its output waits for demand),
 * `async` an `async` function awaiting a scheduled Promise (the stage's own path for them).
 */
type WorkKind = 'sync' | 'promise' | 'mixed' | 'observable' | 'tokens' | 'flow' | 'async' | 'async-now' | 'promise-now';
const outputsPerInput = (kind: WorkKind): number => (kind === 'tokens' || kind === 'flow' ? 2 : 1);

interface StagePlan {
  capacity: number;
  concurrency: number;
  ordered: boolean;
  policy: Policy;
  work: WorkKind;
  errorPolicy: 'fail' | 'skip';
  /** Give the stage a 1000-frame `timeout`. */
  timeout: boolean;
  /** Give the stage a 500-frame `drainTimeout`. */
  drainTimeout: boolean;
  /** Record per-stage timing of every element (`sampleRate: 1`) or of none. */
  sampled: boolean;
}

interface Plan {
  input: number[];
  source: SourceKind;
  a: StagePlan;
  /** Keeps an element between the stages when it returns true; `undefined`: no filter. */
  keep: ((value: number) => boolean) | undefined;
  /** After the filter, `concatMap` each element to an inner Flow of two copies (linked to B like its outer source). */
  expand: boolean;
  /** Then hold each element past its emit: elements in transit. */
  defer: DeferKind | undefined;
  /** A linked straight to B, nothing between (then no filter, expand or defer): A borrows B's room as credit. */
  direct: boolean;
  b: StagePlan;
  /**
   * `stage`: B's output is subscribed plainly. `demand`: it is read with
   * `subscribeWithDemand`, these request sizes arriving as scheduled tasks, and with
   * `inNext` one more requested from inside every `next` (re-entrant demand).
   */
  consumer: { kind: 'stage' } | { kind: 'demand'; requests: number[]; inNext: boolean };
  /** The consumer takes this many elements, then unsubscribes from inside `next` (`take`). */
  take: number | undefined;
  /** Work on these values throws (sync) or rejects (async). */
  failing: ((value: number) => boolean) | undefined;
  /** A call back into the pipeline from inside work or a hook. */
  reentry: Reentry | undefined;
  /** A plain `map(x => x)` right after the source (once, a fused source read differently without one). */
  hop?: boolean;
}

interface PlanOptions {
  policies: readonly Policy[];
  sources: readonly SourceKind[];
  consumerPolicies?: readonly Policy[];
  /** Allow failing work, `skip` error policies and timeouts. */
  failures?: boolean;
  /** Deferring operators that may sit between the stages (default: those that drop nothing). */
  defers?: readonly DeferKind[];
  /** Allow calls back into the pipeline from inside work and hooks. */
  reentrant?: boolean;
  /** Work kinds to draw from (default: all). */
  works?: readonly WorkKind[];
}

const WORK_KINDS: readonly WorkKind[] = ['sync', 'promise', 'mixed', 'observable', 'tokens', 'flow', 'async'];
const ALL_POLICIES: readonly Policy[] = ['pause', 'shed-incoming', 'shed-oldest', 'fail', 'conflate'];

const stagePlan = (policies: readonly Policy[], failures: boolean, works: readonly WorkKind[] = WORK_KINDS): fc.Arbitrary<StagePlan> =>
  fc.record({
    capacity: fc.integer({ min: 1, max: 8 }),
    concurrency: fc.integer({ min: 1, max: 4 }),
    ordered: fc.boolean(),
    policy: fc.constantFrom(...policies),
    work: fc.constantFrom(...works),
    errorPolicy: failures ? fc.constantFrom<'fail' | 'skip'>('fail', 'skip') : fc.constant<'fail'>('fail'),
    timeout: failures ? fc.boolean() : fc.constant(false),
    drainTimeout: failures ? fc.boolean() : fc.constant(false),
    sampled: fc.boolean(),
  });

/** A predicate true for about one value in `n` (n = 1: always). */
const oneIn = (n: number): fc.Arbitrary<(value: number) => boolean> =>
  fc.func(fc.integer({ min: 0, max: n - 1 })).map((f) => (value: number) => f(value) === 0);

/**
 * A filter keeping about one element in 2, in 8, or none: runs of drops longer than
 * the consumer's room are common, which is where demand designs leak.
 */
const keepArbitrary = fc.option(
  fc.oneof({ arbitrary: oneIn(2), weight: 2 }, { arbitrary: oneIn(8), weight: 1 }, { arbitrary: fc.constant(() => false), weight: 1 }),
  { nil: undefined, freq: 2 },
);

const consumerArbitrary: fc.Arbitrary<Plan['consumer']> = fc.oneof(
  fc.constant({ kind: 'stage' as const }),
  fc.record({
    kind: fc.constant('demand' as const),
    requests: fc.array(fc.integer({ min: 1, max: 5 }), { minLength: 1, maxLength: 12 }),
    inNext: fc.boolean(),
  }),
);

function planArbitrary(options: PlanOptions): fc.Arbitrary<Plan> {
  const failures = options.failures ?? false;
  return fc
    .record({
      input: fc.array(fc.integer({ min: 0, max: 1000 }), { maxLength: 60, size: 'max' }),
      source: fc.constantFrom(...options.sources),
      a: stagePlan(options.policies, failures, options.works),
      keep: keepArbitrary,
      expand: fc.boolean(),
      defer: fc.option(fc.constantFrom(...(options.defers ?? DEFER_KINDS.filter((kind) => !dropsElements(kind)))), { nil: undefined, freq: 2 }),
      direct: fc.boolean(),
      b: stagePlan(options.consumerPolicies ?? ['pause'], failures, options.works),
      consumer: consumerArbitrary,
      take: fc.option(fc.integer({ min: 1, max: 20 }), { nil: undefined, freq: 3 }),
      failing: failures ? fc.option(oneIn(8), { nil: undefined }) : fc.constant(undefined),
      reentry: options.reentrant
        ? fc.option(
            fc.record({
              stage: fc.constantFrom<'A' | 'B'>('A', 'B'),
              from: fc.constantFrom<'work' | 'onShed'>('work', 'onShed'),
              at: fc.integer({ min: 0, max: 12 }),
              action: fc.constantFrom<Reentry['action']>('unsubscribe', 'request', 'shutdown', 'abort'),
            }),
            { nil: undefined, freq: 2 },
          )
        : fc.constant(undefined),
    })
    .map((plan) => (plan.direct ? { ...plan, keep: undefined, expand: false, defer: undefined } : plan));
}

/** What happens between starting a run and letting it settle. */
type Step = 'work' | 'time' | 'shutdown' | 'abort' | 'unsubscribe';
const stepsArbitrary = (steps: readonly Step[]): fc.Arbitrary<Step[]> => fc.array(fc.constantFrom(...steps), { maxLength: 40 });

// ---- running a plan ----

const mapA = (x: number): number => x * 2;
const mapB = (x: number): number => x + 1;
const sum = (a: number, b: number): number => a + b;

interface StageProbe {
  readonly stats: StageStats;
  readonly plan: StagePlan;
  /** Every signal handed to the work, and whether its work finished. */
  readonly calls: { signal: AbortSignal; finished: boolean }[];
}

interface Run {
  readonly plan: Plan;
  readonly a: StageProbe;
  readonly b: StageProbe;
  readonly timers: VirtualTimeScheduler;
  readonly killSwitch: KillSwitch;
  /** Elements the source handed out. */
  pulled: number;
  /** Elements that reached the consumer. */
  readonly output: number[];
  /** Their traces, in the same order. */
  readonly traces: TraceContext[];
  /** Every element either stage shed. */
  readonly sheds: ShedEvent<number>[];
  completed: boolean;
  error: unknown;
  unsubscribed: boolean;
  /** Signals the consumer saw after it unsubscribed or after a terminal signal (§1.7). */
  late: number;
  /** Elements the filter dropped. */
  dropped: number;
  /** Sum of the request sizes granted so far (`demand` consumer). */
  requested: number;
  /** Invariants broken along the way, recorded rather than thrown into the pipeline. */
  readonly violations: string[];
  /** The consumer got a terminal signal. */
  ended: boolean;
  /** Shed events seen per stage (to find the `at`-th for a re-entry from `onShed`). */
  readonly shedCalls: { A: number; B: number };
  unsubscribe(): void;
  /** `demand` consumer: asks for `n` more. */
  request(n: number): void;
}

/** The invariants that must hold at every step. */
function checkBounds(run: Run, where: string): void {
  for (const [name, probe] of [['A', run.a] as const, ['B', run.b] as const]) {
    const { stats, plan } = probe;
    // Behind a deferring operator, B's segment holds at most its room (capacity + concurrency) and the documented slack (16, ×4 after a
    // filter dropped a run longer than that and the link waited it out; see Inlet), all of which may arrive while no work runs, and one
    // more for each element the link gave up on that arrived after all (Promises whose latencies vary without limit, as fast-check
    // schedules them, are where the link gives up too soon).
    if (name === 'B' && run.plan.defer !== undefined) {
      const bound = plan.capacity + plan.concurrency + stats.transitSlack + stats.lateArrivals;
      if (stats.buffered + stats.inFlight > bound)
        run.violations.push(
          `${where}: stage B buffered ${stats.buffered} + in flight ${stats.inFlight} > room + slack ${stats.transitSlack} + late arrivals = ${bound}`,
        );
    } else if (stats.buffered > plan.capacity) run.violations.push(`${where}: stage ${name} buffered ${stats.buffered} > capacity ${plan.capacity}`);
    if (stats.inFlight > plan.concurrency) run.violations.push(`${where}: stage ${name} in flight ${stats.inFlight} > concurrency ${plan.concurrency}`);
    if (stats.buffered < 0 || stats.inFlight < 0) run.violations.push(`${where}: stage ${name} gauges went negative`);
  }
  if (run.output.length > run.requested) run.violations.push(`${where}: consumer got ${run.output.length} elements, requested ${run.requested} (§1.1)`);
}

/** Elements that entered a stage and left it (delivered, shed or failed). */
const accounted = (stats: StageStats): number => stats.delivered + stats.shedTotal + stats.failed;

/**
 * Between steps (no call of the pipeline on the stack: synchronous work in progress is
 * neither buffered nor in flight): every element a stage received is delivered, shed,
 * failed, buffered or in flight. Conflate is left out: a merged element stays
 * unaccounted until the element it joined leaves.
 */
function checkHeld(run: Run, where: string): void {
  for (const [name, { stats, plan }] of [['A', run.a] as const, ['B', run.b] as const]) {
    const held = accounted(stats) + stats.buffered + stats.inFlight;
    if (plan.policy !== 'conflate' && stats.received !== held)
      run.violations.push(`${where}: stage ${name} received ${stats.received} ≠ delivered + shed + failed + buffered + in flight ${held}`);
  }
}

/** Flags `next` re-entered while a previous `next` is still running (§1.3). */
function serial<T>(run: Run, where: string): MonoTypeOperatorFunction<T> {
  return (source) =>
    new Observable<T>((subscriber) => {
      let inside = false;
      // Linked before subscribing, as RxJS's own operators are: a consumer leaving during a synchronous subscribe reaches the source at once.
      const inner = new Subscriber<T>({
        next: (value) => {
          // debounceTime flushes its pending value on complete: when B, taking an element, asks A for more and A completes, that flush
          // reaches B while B's next is on the stack (plain RxJS does the same for any consumer feeding its source); B takes it.
          if (inside && !(where === 'into B' && run.plan.defer === 'debounceTime')) run.violations.push(`${where}: next re-entered (§1.3)`);
          inside = true;
          try {
            subscriber.next(value);
          } finally {
            inside = false;
          }
        },
        error: (error: unknown) => subscriber.error(error),
        complete: () => subscriber.complete(),
      });
      subscriber.add(inner);
      source.subscribe(inner);
    });
}

/** Does what a re-entry asks, from inside the pipeline. */
function reenter(run: Run, action: Reentry['action']): void {
  switch (action) {
    case 'unsubscribe':
      run.unsubscribe();
      break;
    case 'request':
      run.request(2);
      break;
    case 'shutdown':
      run.killSwitch.shutdown();
      break;
    case 'abort':
      run.killSwitch.abort();
      break;
  }
}

function makeWork(s: Scheduler, run: () => Run, probe: StageProbe, name: 'A' | 'B', fn: (x: number) => number) {
  const kind = probe.plan.work;
  const begin = (x: number, context: StageContext) => {
    const current = run();
    // No work starts once the consumer left, the kill switch aborted or the run ended (a shutdown drains what was taken).
    if (current.unsubscribed || current.ended || current.killSwitch.state === 'aborted') current.violations.push(`work(${x}) at ${name} started after cancel`);
    const call = { signal: context.signal, finished: false };
    probe.calls.push(call);
    checkBounds(current, `work(${x})`);
    const reentry = current.plan.reentry;
    if (reentry?.from === 'work' && reentry.stage === name && reentry.at === probe.calls.length - 1) reenter(current, reentry.action);
    const fails = run().plan.failing?.(x) ?? false;
    const compute = (value: number): number => {
      if (fails) throw new Error(`work(${value}) failed`);
      return fn(value);
    };
    const later = (): Promise<number> => s.schedule(Promise.resolve(x), `work(${x})`);
    return { call, compute, later };
  };
  // Settled at once, so a run is the same every time (the fast paths off and on can be compared): an `async` function, and a plain one returning a Promise.
  if (kind === 'async-now') {
    return async (x: number, context: StageContext): Promise<number> => {
      const { call, compute } = begin(x, context);
      try {
        return compute(x);
      } finally {
        call.finished = true;
      }
    };
  }
  if (kind === 'promise-now') {
    return (x: number, context: StageContext): Promise<number> => {
      const { call, compute } = begin(x, context);
      call.finished = true;
      return Promise.resolve(compute(x));
    };
  }
  if (kind === 'async') {
    return async (x: number, context: StageContext): Promise<number> => {
      const { call, compute, later } = begin(x, context);
      try {
        return compute(await later());
      } finally {
        call.finished = true;
      }
    };
  }
  return (x: number, context: StageContext): WorkResult<number> => {
    const { call, compute, later } = begin(x, context);
    switch (kind === 'mixed' ? (x % 2 === 0 ? 'sync' : 'promise') : kind) {
      case 'sync':
        call.finished = true;
        return compute(x);
      case 'promise':
        return later().then((value) => {
          call.finished = true;
          return compute(value);
        });
      case 'flow':
        call.finished = true;
        return fromIterable([x, x]).pipe(map(compute));
      case 'observable':
        return from(later()).pipe(map(compute), tap({ complete: () => (call.finished = true), error: () => (call.finished = true) }));
      default:
        return (async function* tokens(): AsyncGenerator<number> {
          try {
            const first = compute(await later());
            yield first;
            await later();
            yield first;
          } finally {
            call.finished = true;
          }
        })();
    }
  };
}

function stageOptions(plan: StagePlan, name: 'A' | 'B', stats: StageStats, run: Run): StageOptions<number> {
  return {
    name,
    capacity: plan.capacity,
    concurrency: plan.concurrency,
    ordered: plan.ordered,
    policy: plan.policy,
    ...(plan.policy === 'conflate' ? { conflate: sum } : {}),
    errorPolicy: plan.errorPolicy,
    ...(plan.timeout ? { timeout: 1000 } : {}),
    ...(plan.drainTimeout ? { drainTimeout: 500 } : {}),
    sampleRate: plan.sampled ? 1 : 0,
    // Longer than the steps of a run: a deferral never outlasts it, so only a filter's long drop run (waited out while settling) grows the slack.
    transitTimeout: 100_000,
    killSwitch: run.killSwitch,
    stats,
    scheduler: run.timers,
    onShed: (event) => {
      run.sheds.push(event);
      const reentry = run.plan.reentry;
      if (reentry?.from === 'onShed' && reentry.stage === name && reentry.at === run.shedCalls[name]++) reenter(run, reentry.action);
    },
  };
}

/** Builds source → A → filter → B → consumer, and subscribes. */
function start(s: Scheduler, plan: Plan): Run {
  let subscription: Subscription | undefined;
  let demand: DemandSubscription | undefined;
  let terminated = false;
  let cancelWhenSubscribed = false;
  const run: Run = {
    plan,
    a: { stats: new StageStats(), plan: plan.a, calls: [] },
    b: { stats: new StageStats(), plan: plan.b, calls: [] },
    timers: new VirtualTimeScheduler(),
    killSwitch: new KillSwitch(),
    pulled: 0,
    output: [],
    traces: [],
    sheds: [],
    completed: false,
    error: undefined,
    unsubscribed: false,
    late: 0,
    dropped: 0,
    requested: plan.consumer.kind === 'stage' ? Infinity : 0,
    violations: [],
    ended: false,
    shedCalls: { A: 0, B: 0 },
    unsubscribe: () => {
      // subscribeWithDemand hands out its handle when it returns: a cancel asked for before then is made then.
      if (plan.consumer.kind === 'demand' && demand === undefined) {
        cancelWhenSubscribed = true;
        return;
      }
      run.unsubscribed = true;
      subscription?.unsubscribe();
      demand?.cancel();
    },
    request: (n) => {
      if (demand === undefined || run.unsubscribed) return;
      run.requested += n;
      demand.request(n);
    },
  };
  const { a, b } = run;

  let source: Observable<number>;
  if (plan.source === 'generator') {
    source = fromIterable(
      (function* () {
        for (const x of plan.input) {
          run.pulled++;
          // Demand sent upstream never exceeds free capacity. With pause, what A took and has not let go fits in it,
          // this element included; the other policies keep asking (this element may be shed), but never hold more.
          // Conflate is left out: a merged element stays unaccounted until the element it joined leaves.
          const holding = run.pulled - accounted(a.stats) - (plan.a.policy === 'pause' ? 0 : 1);
          const bound = plan.a.capacity + plan.a.concurrency;
          if (plan.a.policy !== 'conflate' && holding > bound) run.violations.push(`pull #${run.pulled}: A holds ${holding} > capacity + concurrency ${bound}`);
          yield x;
        }
      })(),
    );
  } else if (plan.source === 'async') {
    source = fromAsyncIterable(
      (async function* () {
        for (const x of plan.input) {
          await s.schedule(Promise.resolve(), `source(${x})`);
          yield x;
        }
      })(),
    ).pipe(tap(() => run.pulled++)); // counted when handed out: a next() already pending at cancel resolves into the void
  } else if (plan.source === 'readable') {
    let next = 0;
    const readable = new Readable({
      objectMode: true,
      read() {
        this.push(next < plan.input.length ? plan.input[next++] : null);
      },
    });
    source = fromReadable<number>(readable).pipe(tap(() => run.pulled++));
  } else if (plan.source === 'push') {
    const pushed = new Subject<number>();
    void (async () => {
      for (const x of plan.input) {
        await s.schedule(Promise.resolve(), `push(${x})`);
        pushed.next(x);
      }
      pushed.complete();
    })();
    source = fromPush(pushed, { capacity: plan.a.capacity, policy: 'shed-oldest' }).pipe(tap(() => run.pulled++));
  } else {
    source = (plan.source === 'array' ? fromIterable(plan.input) : from(plan.input)).pipe(tap(() => run.pulled++));
  }

  if (plan.hop === true) source = source.pipe(map((x) => x));
  const keep = plan.keep;
  const afterA = source.pipe(
    stage(
      makeWork(s, () => run, a, 'A', mapA),
      stageOptions(plan.a, 'A', a.stats, run),
    ),
  );
  const intoB = plan.direct
    ? afterA
    : afterA.pipe(
        tap(() => checkBounds(run, 'after A emitted')),
        filter((t: Traced<number>) => {
          if (keep === undefined || keep(t.value)) return true;
          run.dropped++;
          return false;
        }),
        plan.expand ? concatMap((t: Traced<number>) => fromIterable([t, t])) : (flow: Observable<Traced<number>>) => flow,
        deferring(s, run, plan.defer),
        serial(run, 'into B'),
      );
  const pipeline = intoB.pipe(
    stage(
      makeWork(s, () => run, b, 'B', mapB),
      stageOptions(plan.b, 'B', b.stats, run),
    ),
    plan.take === undefined ? (flow: Observable<Traced<number>>) => flow : take(plan.take),
    serial(run, 'consumer'),
  );

  const observer = {
    next: (t: Traced<number>) => {
      if (run.unsubscribed || terminated) run.late++;
      run.output.push(t.value);
      run.traces.push(t.trace);
      checkBounds(run, 'consumer');
      if (plan.consumer.kind === 'demand' && plan.consumer.inNext) run.request(1);
    },
    error: (error: unknown) => {
      if (run.unsubscribed || terminated) run.late++;
      terminated = true;
      run.ended = true;
      run.error = error;
    },
    complete: () => {
      if (run.unsubscribed || terminated) run.late++;
      terminated = true;
      run.ended = true;
      run.completed = true;
    },
  };
  if (plan.consumer.kind === 'stage') {
    // A Subscriber, held before subscribing: work that unsubscribes during the synchronous subscribe reaches it.
    const consumer = new Subscriber<Traced<number>>(observer);
    subscription = consumer;
    pipeline.subscribe(consumer);
  } else {
    demand = subscribeWithDemand(pipeline, observer);
    if (cancelWhenSubscribed) run.unsubscribe();
    for (const n of plan.consumer.requests) void s.schedule(Promise.resolve(n), `request(${n})`).then((size) => run.request(size));
  }
  return run;
}

/** The deferring operator of a plan, its timers on the run's virtual clock and its Promises scheduled by fast-check. */
function deferring(s: Scheduler, run: Run, kind: DeferKind | undefined): MonoTypeOperatorFunction<Traced<number>> {
  const later = (t: Traced<number>): Promise<Traced<number>> => s.schedule(Promise.resolve(t), `defer(${t.value})`);
  switch (kind) {
    case undefined:
      return (flow) => flow;
    case 'delay':
      return delay(1 + (run.plan.input.length % 3), run.timers);
    case 'observeOn':
      return observeOn(run.timers);
    case 'mergeMap':
      return mergeMap(later);
    case 'concatMap':
      return concatMap(later);
    case 'debounceTime':
      return debounceTime(1, run.timers);
    case 'auditTime':
      return auditTime(2, run.timers);
  }
}

/** Advances virtual time by `frames`, firing the timers due. */
function advance(run: Run, frames: number): void {
  const { timers } = run;
  const until = timers.frame + frames;
  timers.maxFrames = until;
  timers.flush();
  timers.frame = until; // flush only moves the clock to the last timer it ran
  timers.maxFrames = Infinity;
}

async function perform(s: Scheduler, run: Run, steps: readonly Step[]): Promise<void> {
  for (const [i, step] of steps.entries()) {
    checkHeld(run, `before step ${i} (${step})`);
    checkBounds(run, `before step ${i} (${step})`);
    if (run.unsubscribed) return;
    switch (step) {
      case 'work':
        if (s.count() > 0) await s.waitNext(1);
        break;
      case 'time':
        advance(run, 400);
        break;
      case 'shutdown':
        run.killSwitch.shutdown();
        break;
      case 'abort':
        run.killSwitch.abort();
        break;
      case 'unsubscribe':
        run.unsubscribe();
        break;
    }
  }
}

/** Runs scheduled work and timers until nothing is left to do. */
async function settle(s: Scheduler, run: Run): Promise<void> {
  for (let round = 0; round < 10_000; round++) {
    await s.waitIdle();
    await new Promise((resolve) => setImmediate(resolve)); // a Readable works in process.nextTick
    checkHeld(run, `settling, round ${round}`);
    if (run.timers.actions.length === 0 && s.count() === 0) return;
    run.timers.flush();
  }
  throw new Error('the run did not settle');
}

/** Settles; a `demand` consumer whose requests ran out then asks for the rest, so every run can end. */
async function settleToEnd(s: Scheduler, run: Run): Promise<void> {
  await settle(s, run);
  if (run.plan.consumer.kind === 'demand' && !run.completed && run.error === undefined) {
    run.request(Number.MAX_SAFE_INTEGER);
    await settle(s, run);
  }
}

function assertNoViolations(run: Run): void {
  assert.deepEqual(run.violations.slice(0, 5), [], 'invariants broken along the way');
}

function assertAccounted(probe: StageProbe, name: string): void {
  const { stats } = probe;
  const breakdown = `received ${stats.received}, delivered ${stats.delivered}, shed ${stats.shedTotal} ${JSON.stringify(stats.shed)}, failed ${stats.failed}`;
  assert.equal(stats.received, accounted(stats), `stage ${name}: every element leaves exactly once (${breakdown})`);
  assert.equal(stats.buffered, 0, `stage ${name}: still buffered (${breakdown})`);
  assert.equal(stats.inFlight, 0, `stage ${name}: still in flight (${breakdown})`);
}

const repeat = (value: number, times: number): number[] => Array.from({ length: times }, () => value);

function expectedOutput(plan: Plan): number[] {
  return plan.input
    .flatMap((x) => repeat(mapA(x), outputsPerInput(plan.a.work)))
    .filter((x) => plan.keep === undefined || plan.keep(x))
    .flatMap((x) => repeat(x, plan.expand ? 2 : 1))
    .flatMap((x) => repeat(mapB(x), outputsPerInput(plan.b.work)));
}

const sorted = (values: number[]): number[] => [...values].sort((x, y) => x - y);

// SLUICE_PROPERTY_RUNS raises the count for a longer local hunt; SLUICE_SEED and SLUICE_PATH replay a reported failure.
const numRuns = Number(process.env.SLUICE_PROPERTY_RUNS ?? 200);
const replay = process.env.SLUICE_SEED === undefined ? {} : { seed: Number(process.env.SLUICE_SEED), path: process.env.SLUICE_PATH, endOnFailure: true };

describe('stage: properties', () => {
  it('pause loses nothing and keeps order when ordered (output = input mapped), whatever the speeds and the filter between', async () => {
    await fc.assert(
      fc.asyncProperty(fc.scheduler(), planArbitrary({ policies: ['pause'], sources: ['array', 'generator', 'async', 'readable'] }), async (s, plan) => {
        const run = start(s, plan);
        await settleToEnd(s, run);
        assertNoViolations(run);
        assert.equal(run.error, undefined, String(run.error));
        assert.equal(run.completed, true, 'the pipeline completed (no stall)');
        const expected = expectedOutput(plan);
        const inOrder = plan.a.ordered && plan.b.ordered && plan.defer !== 'mergeMap'; // mergeMap passes on what resolves first
        if (plan.take === undefined || plan.take > expected.length) {
          if (inOrder) assert.deepEqual(run.output, expected);
          else assert.deepEqual(sorted(run.output), sorted(expected));
          assert.equal(run.a.stats.shedTotal + run.a.stats.failed + run.b.stats.shedTotal + run.b.stats.failed, 0, 'nothing shed or failed');
        } else {
          // The consumer took the first `take` and left: what was still held (work whose last output went out
          // included, if the work had not finished) is shed as cancelled, never lost.
          if (inOrder) assert.deepEqual(run.output, expected.slice(0, plan.take));
          else assert.equal(run.output.length, plan.take);
          assert.equal(run.a.stats.failed + run.b.stats.failed, 0, 'nothing failed');
        }
        assertAccounted(run.a, 'A');
        assertAccounted(run.b, 'B');
        assert.equal(run.late, 0);
      }),
      { numRuns, ...replay },
    );
  });

  it('accounts for every element exactly (received = delivered + shed + failed), for every policy, with failures, timeouts, kill switches and unsubscribing at a random point', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.scheduler(),
        planArbitrary({
          policies: ALL_POLICIES,
          sources: ['array', 'generator', 'async', 'readable', 'push', 'plain'],
          consumerPolicies: ALL_POLICIES,
          failures: true,
          defers: DEFER_KINDS,
          reentrant: true,
        }),
        stepsArbitrary(['work', 'work', 'work', 'work', 'time', 'time', 'shutdown', 'abort', 'unsubscribe']),
        async (s, plan, steps) => {
          const run = start(s, plan);
          await perform(s, run, steps);
          await settleToEnd(s, run);
          assertNoViolations(run);
          assertAccounted(run.a, 'A');
          assertAccounted(run.b, 'B');
          assert.equal(run.a.stats.received, run.pulled, 'A received what the source handed out');
          // Every output of A reached B unless the filter dropped it (a conflated group is one output).
          const kept = run.a.stats.emitted - run.dropped;
          // Elements the plain operators between the stages still held when the run ended are theirs to lose.
          if (plan.expand || plan.defer !== undefined)
            assert.ok(run.b.stats.received <= (plan.expand ? 2 : 1) * kept, 'B received at most what A emitted and the filter kept');
          else assert.equal(run.b.stats.received, kept, 'B received what A emitted and the filter kept');
          assert.equal(run.b.stats.emitted, run.output.length, 'the consumer got what B emitted');
          if (!run.unsubscribed) assert.ok(run.completed || run.error !== undefined, 'the run ended');
          assert.equal(run.late, 0, 'nothing after a terminal signal or unsubscribe (§1.7)');
        },
      ),
      { numRuns, ...replay },
    );
  });

  it('a trace sampled at its first stage records A, then B each time one of its elements passes B, a shed naming stage and reason; unsampled ones record nothing', async () => {
    const checkRecords = (trace: TraceContext, sampled: boolean, where: string): readonly { stage: string; shed?: string }[] => {
      const records = trace.records;
      if (!sampled) {
        assert.equal(records, undefined, `${where}: an unsampled trace has no records`);
        return [];
      }
      assert.ok(records !== undefined && records.length > 0, `${where}: a sampled trace has records`);
      assert.equal(records[0]!.stage, 'A', `${where}: the first record is A's`);
      assert.ok(
        records.slice(1).every((r) => r.stage === 'B'),
        `${where}: then only B's (${records.map((r) => r.stage).join(',')})`,
      );
      for (const r of records) {
        for (const field of [r.queueWait, r.service, r.paused, r.retries, r.conflated])
          assert.ok(Number.isFinite(field) && field >= 0, `${where}: ${JSON.stringify(r)}`);
      }
      return records;
    };
    await fc.assert(
      fc.asyncProperty(
        fc.scheduler(),
        planArbitrary({ policies: ALL_POLICIES, sources: ['array', 'generator', 'async', 'plain'], consumerPolicies: ALL_POLICIES }),
        stepsArbitrary(['work', 'work', 'work', 'time']),
        async (s, plan, steps) => {
          const run = start(s, plan);
          await perform(s, run, steps);
          await settleToEnd(s, run);
          for (const [i, trace] of run.traces.entries()) {
            const records = checkRecords(trace, plan.a.sampled, `output #${i}`);
            if (plan.a.sampled) {
              // A stage whose work streams may be cancelled after some outputs left: its record then says so.
              assert.ok(records[0]!.shed === undefined || records[0]!.shed === 'cancelled', `output #${i}: it passed A`);
              assert.ok(
                records.some((r) => r.stage === 'B' && (r.shed === undefined || r.shed === 'cancelled')),
                `output #${i}: it passed B`,
              );
            }
          }
          for (const event of run.sheds) {
            const records = checkRecords(event.trace, plan.a.sampled, `shed at ${event.stage}`);
            if (plan.a.sampled)
              assert.ok(
                records.some((r) => r.stage === event.stage && r.shed === event.reason),
                `shed at ${event.stage}: recorded with its reason`,
              );
          }
          const reported = run.sheds.reduce((total, event) => total + event.count, 0);
          assert.equal(reported, run.a.stats.shedTotal + run.b.stats.shedTotal, 'every shed input was reported (a conflated element counts its merged inputs)');
          for (const event of run.sheds)
            assert.ok(
              event.count >= 1 && (event.count === 1 || [plan.a, plan.b][event.stage === 'A' ? 0 : 1]!.policy === 'conflate'),
              `a shed at ${event.stage} stands for ${event.count} inputs`,
            );
        },
      ),
      { numRuns, ...replay },
    );
  });

  const boundsHold = async (s: Scheduler, plan: Plan, steps: Step[]): Promise<void> => {
    const run = start(s, plan);
    await perform(s, run, steps);
    await settleToEnd(s, run);
    assertNoViolations(run); // checked in every work call, after every emission of A and B, in the consumer and between steps
    assertAccounted(run.a, 'A');
    assertAccounted(run.b, 'B');
  };

  const boundsCases: [string, PlanOptions][] = [
    [
      'pausing, over every source kind and deferring operator, with re-entrant calls',
      { policies: ['pause'], sources: ['array', 'generator', 'async', 'readable', 'push'], defers: DEFER_KINDS, reentrant: true },
    ],
    [
      'for the shedding, failing and conflating policies',
      {
        policies: ['shed-incoming', 'shed-oldest', 'fail', 'conflate'],
        sources: ['plain', 'generator', 'push'],
        consumerPolicies: ALL_POLICIES,
        failures: true,
        defers: DEFER_KINDS,
      },
    ],
  ];
  for (const [what, options] of boundsCases) {
    it(`buffered ≤ capacity and in flight ≤ concurrency at every step, ${what}`, async () => {
      await fc.assert(fc.asyncProperty(fc.scheduler(), planArbitrary(options), stepsArbitrary(['work', 'work', 'work', 'time']), boundsHold), {
        numRuns,
        ...replay,
      });
    });
  }

  it('demand sent upstream never exceeds free capacity: pulled − (delivered + shed + failed) ≤ capacity + concurrency at every pull', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.scheduler(),
        planArbitrary({ policies: ['pause', 'shed-incoming', 'shed-oldest', 'fail'], sources: ['generator'], failures: true }),
        stepsArbitrary(['work', 'work', 'work', 'time', 'unsubscribe']),
        async (s, plan, steps) => {
          const run = start(s, plan);
          await perform(s, run, steps);
          await settleToEnd(s, run);
          assertNoViolations(run); // the generator checks the bound at every pull
          if (plan.a.policy === 'pause' && plan.take === undefined && !run.unsubscribed && run.error === undefined) assert.equal(run.pulled, plan.input.length);
        },
      ),
      { numRuns, ...replay },
    );
  });

  /** Plans whose runs are the same every time: sync sources and work, timers in virtual time, a plain consumer. */
  const repeatablePlans = (works: readonly WorkKind[]) =>
    planArbitrary({
      policies: ALL_POLICIES,
      sources: ['array', 'generator'],
      consumerPolicies: ALL_POLICIES,
      failures: true,
      defers: ['delay', 'observeOn', 'debounceTime', 'auditTime'],
      works,
    }).map((plan) => ({ ...plan, consumer: { kind: 'stage' as const } }));

  /** What two runs of one plan must agree on; `sortUnordered`: an unordered stage may deliver in another order. */
  const summary = (run: Run, sortUnordered: boolean) => {
    assertNoViolations(run);
    const stats = ({ stats: st, calls }: StageProbe) => ({
      received: st.received,
      delivered: st.delivered,
      emitted: st.emitted,
      shed: { ...st.shed },
      failed: st.failed,
      calls: calls.length,
    });
    const records = run.traces.map((t) => (t.records ?? []).map((r) => `${r.stage}${r.shed === undefined ? '' : `:${r.shed}`}`).join(','));
    const sort = sortUnordered && !(run.plan.a.ordered && run.plan.b.ordered);
    return {
      output: sort ? sorted(run.output) : run.output,
      records: sort ? [...records].sort() : records,
      error: run.error instanceof Error ? `${run.error.name}: ${run.error.message}` : run.error,
      completed: run.completed,
      pulled: run.pulled,
      a: stats(run.a),
      b: stats(run.b),
      sheds: run.sheds.map((e) => `${e.stage}:${e.reason}`).sort(),
    };
  };

  it('a source read straight by a stage or through a plain map gives the same outputs, errors, accounting and completion (sources are never fused)', async () => {
    await fc.assert(
      fc.asyncProperty(fc.scheduler(), repeatablePlans(['sync', 'flow']), async (s, plan) => {
        const outcome = async (hop: boolean) => {
          const run = start(s, { ...plan, hop });
          await settleToEnd(s, run);
          return summary(run, false);
        };
        assert.deepEqual(await outcome(true), await outcome(false));
      }),
      { numRuns, ...replay },
    );
  });

  it('the fast paths give what the general path gives: outputs, errors, accounting, completion and trace records', async () => {
    await fc.assert(
      fc.asyncProperty(fc.scheduler(), repeatablePlans(['sync', 'flow', 'async-now', 'promise-now']), async (s, plan) => {
        const outcome = async (fast: boolean) => {
          setFastPaths(fast);
          let run: Run;
          try {
            run = start(s, plan);
          } finally {
            setFastPaths(true);
          }
          await settleToEnd(s, run);
          return summary(run, true);
        };
        assert.deepEqual(await outcome(false), await outcome(true));
      }),
      { numRuns, ...replay },
    );
  });

  it('unsubscribing at any point leaves no active work: every signal aborted or its work finished, gauges back to 0, no timers left (timeouts, drain deadlines, in-transit waits)', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.scheduler(),
        planArbitrary({
          policies: ALL_POLICIES,
          sources: ['array', 'generator', 'async', 'plain'],
          consumerPolicies: ['pause', 'shed-oldest', 'conflate'],
        }).map((plan) => ({
          ...plan,
          a: { ...plan.a, timeout: true, drainTimeout: true },
          b: { ...plan.b, timeout: true, drainTimeout: true },
        })),
        stepsArbitrary(['work', 'work', 'work', 'work', 'time', 'shutdown']),
        async (s, plan, steps) => {
          const run = start(s, plan);
          await perform(s, run, steps);
          run.unsubscribe();
          for (const [name, probe] of [['A', run.a] as const, ['B', run.b] as const]) {
            probe.calls.forEach((call, i) => assert.ok(call.signal.aborted || call.finished, `stage ${name}: work #${i} neither aborted nor finished`));
            assert.equal(probe.stats.inFlight, 0, `stage ${name}: in flight after unsubscribe`);
            assert.equal(probe.stats.buffered, 0, `stage ${name}: buffered after unsubscribe`);
          }
          assert.deepEqual(
            run.timers.actions.map((action) => action.delay),
            [],
            'no timer (timeout, in-transit wait) is left scheduled',
          );
          const seen = run.output.length;
          await settle(s, run); // work still scheduled completes now: nothing may come of it
          assert.equal(run.output.length, seen);
          assert.equal(run.late, 0);
          assertAccounted(run.a, 'A');
          assertAccounted(run.b, 'B');
          assertNoViolations(run);
        },
      ),
      { numRuns, ...replay },
    );
  });
});

describe('ring buffer: properties', () => {
  type Op = { op: 'push'; value: number } | { op: 'shift' } | { op: 'pop' } | { op: 'replaceLast'; value: number } | { op: 'drain' };
  const opArbitrary: fc.Arbitrary<Op> = fc.oneof(
    { arbitrary: fc.record({ op: fc.constant('push' as const), value: fc.integer() }), weight: 5 },
    { arbitrary: fc.constant({ op: 'shift' as const }), weight: 3 },
    { arbitrary: fc.constant({ op: 'pop' as const }), weight: 1 },
    { arbitrary: fc.record({ op: fc.constant('replaceLast' as const), value: fc.integer() }), weight: 1 },
    { arbitrary: fc.constant({ op: 'drain' as const }), weight: 1 },
  );

  it('behaves like an array used as a FIFO queue, across wrap-around and growth', () => {
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 8 }), fc.array(opArbitrary, { maxLength: 200 }), (initialCapacity, ops) => {
        const ring = new Ring<number>(initialCapacity);
        const model: number[] = [];
        for (const step of ops) {
          switch (step.op) {
            case 'push':
              ring.push(step.value);
              model.push(step.value);
              break;
            case 'shift':
              assert.equal(ring.shift(), model.shift());
              break;
            case 'pop':
              assert.equal(ring.pop(), model.pop());
              break;
            case 'replaceLast':
              if (model.length === 0) assert.throws(() => ring.replaceLast(step.value), RangeError);
              else {
                ring.replaceLast(step.value);
                model[model.length - 1] = step.value;
              }
              break;
            case 'drain':
              assert.deepEqual(ring.drain(), model.splice(0));
              break;
          }
          assert.equal(ring.length, model.length);
          assert.equal(ring.peek(), model[0]);
          assert.equal(ring.peekLast(), model[model.length - 1]);
          for (let i = -1; i <= model.length; i++) assert.equal(ring.at(i), model[i]);
        }
      }),
      { numRuns: numRuns * 2 },
    );
  });

  it('a stage samples exactly the elements sampler(rate) picks, without dividing per element, whatever the gaps in seq', () => {
    fc.assert(
      fc.property(
        fc.oneof(fc.constantFrom(0, 1, 0.5, 0.01), fc.double({ min: 0, max: 1, noNaN: true })),
        fc.array(fc.integer({ min: 1, max: 300 }), { maxLength: 200 }),
        (rate, steps) => {
          const reference = sampler(rate);
          const seqSampler = new SeqSampler(rate);
          let seq = 0;
          for (const step of steps) {
            assert.equal(seqSampler.at(seq), reference(seq), `rate ${rate}, seq ${seq}`);
            seq += step % 3 === 0 ? step : 1; // mostly one by one; sometimes skipping (traced inputs take no decision)
          }
        },
      ),
      { numRuns: numRuns * 2 },
    );
  });
});
