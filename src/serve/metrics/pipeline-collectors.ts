/**
 * The pipeline's gauges and counters, read at scrape time from the objects sluice already keeps
 * (`StageStats`, `CacheStats`, breakers, pools): nothing is copied on the hot path, and a scraped
 * value is never stale. Each source is a map the server registers names in.
 */
import type { Counter, Gauge, Registry, RegistryContentType } from 'prom-client';
import { promClient } from '../../core/peers.js';
import type { StageStats } from '../../flow/stats.js';
import type { ShedReason } from '../../flow/options.js';
import { CacheStats } from '../../cache/stats.js';
import type { CircuitBreaker, CircuitState } from '../../resilience/breaker.js';

const prom = promClient();

/** Where a collector registers: the metrics' registry. */
export type Registers = Registry<RegistryContentType>[];

/** `closed` 0, `half-open` 1, `open` 2: higher is worse, so `max()` over breakers reads naturally. */
export const BREAKER_STATE_VALUES: Readonly<Record<CircuitState, number>> = { closed: 0, 'half-open': 1, open: 2 };

/** An inference pool at scrape time. */
export interface PoolCounters {
  readonly queued: number;
  readonly running: number;
  readonly threads: number;
}

const SHED_REASONS: readonly ShedReason[] = ['buffer-full', 'evicted', 'lagging', 'cancelled'];

/** A counter re-stated at each scrape from monotonic source counters, one series per registered name. */
function restated<S, L extends string>(
  name: string,
  help: string,
  labelNames: readonly L[],
  sources: ReadonlyMap<string, S>,
  fill: (counter: Counter<L>, key: string, source: S) => void,
  registers: Registers,
): void {
  const counter: Counter<L> = new prom.Counter({
    name,
    help,
    labelNames,
    registers,
    collect: () => {
      // The source counters are monotonic, so re-stating them at each scrape is a valid counter.
      counter.reset();
      for (const [key, source] of sources) fill(counter, key, source);
    },
  });
}

/** A gauge set at each scrape, one series per registered name. */
function readGauge<S, L extends string>(
  name: string,
  help: string,
  label: L,
  sources: ReadonlyMap<string, S>,
  read: (source: S) => number,
  registers: Registers,
): void {
  const gauge: Gauge<L> = new prom.Gauge({
    name,
    help,
    labelNames: [label],
    registers,
    collect: () => {
      for (const [key, source] of sources) gauge.set({ [label]: key } as Partial<Record<L, string>>, read(source));
    },
  });
}

/** `<prefix>stage_*`: buffered and in flight now, received, delivered, emitted, failed, pauses, late arrivals, shed by reason. */
export function collectStages(stages: ReadonlyMap<string, StageStats>, prefix: string, registers: Registers): void {
  const gauge = (name: string, help: string, read: (stats: StageStats) => number) =>
    readGauge(`${prefix}stage_${name}`, help, 'stage', stages, read, registers);
  gauge('buffered', 'Elements waiting in the stage buffers now.', (s) => s.buffered);
  gauge('in_flight', 'Work started and not yet fully delivered, now.', (s) => s.inFlight);
  const counter = (name: string, help: string, read: (stats: StageStats) => number) =>
    restated(`${prefix}stage_${name}_total`, help, ['stage'], stages, (c, stage, stats) => c.inc({ stage }, read(stats)), registers);
  counter('received', 'Elements that entered the stage.', (s) => s.received);
  counter('delivered', 'Inputs whose outputs all went downstream.', (s) => s.delivered);
  counter('emitted', 'Outputs emitted downstream.', (s) => s.emitted);
  counter('failed', 'Inputs whose work failed.', (s) => s.failed);
  counter('pauses', 'Times the stage stopped its producers because it was full.', (s) => s.pauses);
  counter(
    'late_arrivals',
    'Elements its link gave up on that arrived after all (a deferring operator held them longer than the link waited).',
    (s) => s.lateArrivals,
  );
  restated(
    `${prefix}stage_shed_total`,
    'Elements shed by a stage, by reason.',
    ['stage', 'reason'],
    stages,
    (c, stage, stats) => {
      for (const reason of SHED_REASONS) c.inc({ stage, reason }, stats.shed[reason]);
    },
    registers,
  );
}

/** Every metric `CacheStats` declares, per cache, and the hit ratio. */
export function collectCaches(caches: ReadonlyMap<string, CacheStats>, prefix: string, registers: Registers): void {
  for (const metric of CacheStats.metrics) {
    const name = metric.name.replace(/^sluice_/, prefix);
    if (metric.type === 'counter') restated(name, metric.help, ['cache'], caches, (c, cache, stats) => c.inc({ cache }, stats[metric.field]), registers);
    else readGauge(name, metric.help, 'cache', caches, (stats) => stats[metric.field], registers);
  }
  readGauge(
    `${prefix}cache_hit_ratio`,
    'Share of cache requests answered from a cache (exact or semantic) since start; prefer rate() over the counters for recent behaviour.',
    'cache',
    caches,
    (stats) => (stats.requests === 0 ? 0 : (stats.hits + stats.semanticHits) / stats.requests),
    registers,
  );
}

/** A breaker's state and its failures, opens and rejected calls. */
export function collectBreakers(breakers: ReadonlyMap<string, CircuitBreaker>, prefix: string, registers: Registers): void {
  readGauge(
    `${prefix}circuit_breaker_state`,
    'Circuit breaker state: 0 closed, 1 half-open, 2 open.',
    'breaker',
    breakers,
    (breaker) => BREAKER_STATE_VALUES[breaker.state],
    registers,
  );
  for (const [field, help] of [
    ['failures', 'Failures a circuit breaker counted against its worker (the client’s own errors are not).'],
    ['opens', 'Times a circuit breaker opened.'],
    ['rejected', 'Calls a circuit breaker refused while open (or half-open with every probe taken).'],
  ] as const) {
    restated(
      `${prefix}circuit_breaker_${field}_total`,
      help,
      ['breaker'],
      breakers,
      (c, name, breaker) => c.inc({ breaker: name }, breaker.counts[field]),
      registers,
    );
  }
}

/** An inference pool's queued and running jobs and its threads. */
export function collectPools(pools: ReadonlyMap<string, () => PoolCounters>, prefix: string, registers: Registers): void {
  for (const [field, help] of [
    ['queued', 'Inference jobs waiting for a worker thread now: requests waiting for the pool show here.'],
    ['running', 'Inference jobs running on worker threads now.'],
    ['threads', 'Live worker threads.'],
  ] as const) {
    const gauge: Gauge<'pool'> = new prom.Gauge({
      name: `${prefix}pool_${field === 'threads' ? 'threads' : `${field}_jobs`}`,
      help,
      labelNames: ['pool'],
      registers,
      collect() {
        gauge.reset();
        for (const [pool, read] of pools) gauge.set({ pool }, read()[field]);
      },
    });
  }
}

/** A model's batched decode steps at scrape time (`StepBatcherStats`). */
export interface BatchCounters {
  readonly calls: number;
  readonly steps: number;
  readonly largest: number;
  readonly waiting: number;
  readonly running: number;
}

/** Decode batching by model: calls and steps (their ratio is the mean batch), the largest batch, steps waiting and calls running now. */
export function collectBatchers(batchers: ReadonlyMap<string, () => BatchCounters | undefined>, prefix: string, registers: Registers): void {
  for (const [field, help] of [
    ['calls', 'Batched model calls of decode steps: rate(steps) / rate(calls) is the mean batch.'],
    ['steps', 'Decode steps run in batched model calls, one per sequence per call.'],
  ] as const) {
    restated(
      `${prefix}decode_batch_${field}_total`,
      help,
      ['model'],
      batchers,
      (counter, model, read) => {
        const stats = read();
        if (stats !== undefined) counter.inc({ model }, stats[field]);
      },
      registers,
    );
  }
  for (const [field, name, help] of [
    ['largest', 'decode_batch_largest_steps', 'The most decode steps one model call has run.'],
    ['waiting', 'decode_batch_waiting_steps', 'Decode steps asked and waiting for a model call now.'],
    ['running', 'decode_batch_running_calls', 'Batched decode calls running now.'],
  ] as const) {
    const gauge: Gauge<'model'> = new prom.Gauge({
      name: `${prefix}${name}`,
      help,
      labelNames: ['model'],
      registers,
      collect() {
        gauge.reset();
        for (const [model, read] of batchers) {
          const stats = read();
          if (stats !== undefined) gauge.set({ model }, stats[field]);
        }
      },
    });
  }
}
