/**
 * Prometheus metrics for a sluice process, on a registry of its own (never only the
 * global one, so two servers or a host application's metrics never collide).
 *
 * Gauges and counters that sluice already keeps (`StageStats`, `CacheStats`, a
 * breaker's state) are read at scrape time (metrics/pipeline-collectors.ts,
 * metrics/socket-collectors.ts). Per-stage latencies come from the trace records of
 * sampled elements (`observeTrace`); generation timings from a worker's `GenerationDone`
 * (`observeGeneration`); serving timings from the edge (metrics/request-meter.ts).
 *
 * Labels are bounded by construction: stage, cache, breaker and model names come from
 * configuration, routes from a fixed list, status as a class (`2xx`). Never a request
 * id or a prompt.
 *
 * The latency histograms carry exemplars: the trace id (`trace_id`) of a sampled request
 * that fell in each bucket. Exemplars exist only in the OpenMetrics format, so `scrape()`
 * serves OpenMetrics to a scraper whose `Accept` header asks for it (Prometheus does) and
 * the classic text format to everyone else (metrics/exposition.ts).
 */
import { lazySchema } from '../core/zod.js';
import type { IntervalHistogram } from 'node:perf_hooks';
import type { Registry, RegistryContentType } from 'prom-client';
import { promClient } from '../core/peers.js';
import { parseOptions } from '../flow/options.js';
import type { StageStats } from '../flow/stats.js';
import type { CacheStats } from '../cache/stats.js';
import type { CircuitBreaker } from '../resilience/breaker.js';
import type { TraceContext } from '../core/trace.js';
import type { GenerationDone } from '../ai/inference/worker.js';
import {
  type BatchCounters,
  collectBatchers,
  collectBreakers,
  collectCaches,
  collectPools,
  collectStages,
  type PoolCounters,
} from './metrics/pipeline-collectors.js';
import { collectSockets, type SocketCounters } from './metrics/socket-collectors.js';
import { collectEventLoopDelay } from './metrics/event-loop.js';
import { generationSeries, httpSeries, stageTimingSeries, type GenerationSeries, type HttpSeries, type StageTimingSeries } from './metrics/observed-series.js';
import { RequestMeter, servingSeries, type ServingSeries } from './metrics/request-meter.js';
import { observe, prefersOpenMetrics, render, type Exposition } from './metrics/exposition.js';

export { BREAKER_STATE_VALUES } from './metrics/pipeline-collectors.js';
export type { SocketCounters } from './metrics/socket-collectors.js';
export { RequestMeter } from './metrics/request-meter.js';
export { prefersOpenMetrics } from './metrics/exposition.js';

const prom = promClient();

/** Options of `SluiceMetrics`: the metric name prefix, the default Node metrics and the event-loop sampling resolution. */
export interface SluiceMetricsOptions {
  /** Prepended to every sluice metric name (not to `gen_ai_*` nor the default Node metrics). Default `sluice_`. */
  readonly prefix?: string;
  /**
   * Registers prom-client's default process and Node.js metrics on the registry too (minus the
   * three `nodejs_active_*_total` gauges, misnamed as counters). Default true.
   */
  readonly defaultMetrics?: boolean;
  /** Resolution (ms) of the event-loop delay monitor. Default 20. */
  readonly eventLoopResolution?: number;
}

const optionsSchema = lazySchema((z) =>
  z
    .object({
      prefix: z
        .string()
        .regex(/^[a-zA-Z_:][a-zA-Z0-9_:]*$/, { error: 'prefix must be a valid Prometheus metric name prefix' })
        .default('sluice_'),
      defaultMetrics: z.boolean({ error: 'defaultMetrics must be a boolean' }).default(true),
      eventLoopResolution: z
        .number({ error: 'eventLoopResolution must be a number of ms' })
        .int({ error: 'eventLoopResolution must be an integer' })
        .min(1, { error: 'eventLoopResolution must be ≥ 1 ms' })
        .default(20),
    })
    .strict(),
);

/** What the HTTP API reports for one finished request. */
export interface RequestObservation {
  /** A route from a fixed set (`/v1/chat/completions`, `/metrics`, ..., `other`). */
  readonly route: string;
  readonly status: number;
  readonly seconds: number;
}

/**
 * Every metric sluice exports, on its own prom-client `Registry`. Register the stats
 * objects your pipeline uses, feed it traces and generations (the HTTP handler does
 * that for its requests), and serve `scrape()` on `/metrics`.
 *
 * ## Example
 * ```ts
 * const metrics = new SluiceMetrics();
 * const inferStats = new StageStats();
 * metrics.registerStage('infer', inferStats);
 * metrics.registerCache('responses', cacheStats);
 * metrics.registerBreaker(breaker);
 * const server = createServer(createHttpHandler({ workers: { charlm: worker }, metrics }));
 * // GET /metrics → sluice_stage_buffered{stage="infer"} 3 ...
 * ```
 */
export class SluiceMetrics {
  /**
   * The registry every metric here lives on. Add your own metrics to it if you like. It renders
   * the classic text format; `scrape()` switches it to OpenMetrics for one rendering when asked.
   */
  readonly registry: Registry<RegistryContentType>;
  /** The scrape being rendered: the next waits for it, as each switches the registry's format. */
  private rendering: Promise<unknown> = Promise.resolve();
  private readonly stages = new Map<string, StageStats>();
  private readonly caches = new Map<string, CacheStats>();
  private readonly breakers = new Map<string, CircuitBreaker>();
  private readonly sockets = new Map<string, () => SocketCounters>();
  private readonly pools = new Map<string, () => PoolCounters>();
  private readonly batchers = new Map<string, () => BatchCounters | undefined>();
  private readonly loop: IntervalHistogram;
  private readonly http: HttpSeries;
  private readonly stageTimings: StageTimingSeries;
  private readonly generations: GenerationSeries;
  /** Serving metrics as vLLM names them, measured at the edge from a request's arrival. */
  private readonly serving: ServingSeries;
  private closed = false;

  constructor(options: SluiceMetricsOptions = {}) {
    const { prefix, defaultMetrics, eventLoopResolution } = parseOptions(optionsSchema(), options, 'SluiceMetrics options');
    const registry = (this.registry = new prom.Registry<RegistryContentType>());
    // OpenMetrics while histograms with exemplars register (prom-client refuses them otherwise); classic again at the end.
    registry.setContentType(prom.Registry.OPENMETRICS_CONTENT_TYPE);
    const registers = [registry];
    if (defaultMetrics) {
      prom.collectDefaultMetrics({ register: registry });
      // prom-client names these gauges `_total`, which Prometheus reserves for counters (promtool
      // rejects them); the per-type gauges beside them carry the same numbers: sum() them.
      for (const name of ['nodejs_active_handles_total', 'nodejs_active_requests_total', 'nodejs_active_resources_total']) registry.removeSingleMetric(name);
    }
    this.http = httpSeries(prefix, registers);
    this.stageTimings = stageTimingSeries(prefix, registers);
    collectStages(this.stages, prefix, registers);
    collectCaches(this.caches, prefix, registers);
    collectBreakers(this.breakers, prefix, registers);
    collectSockets(this.sockets, prefix, registers);
    this.loop = collectEventLoopDelay(eventLoopResolution, prefix, registers);
    this.generations = generationSeries(prefix, registers);
    collectPools(this.pools, prefix, registers);
    collectBatchers(this.batchers, prefix, registers);
    this.serving = servingSeries(prefix, registers);
    registry.setContentType(prom.Registry.PROMETHEUS_CONTENT_TYPE);
  }

  /** Exports an inference pool's queue (`sluice_pool_queued_jobs`), running jobs and threads, read at scrape time. */
  registerPool(pool: string, stats: () => { readonly queued: number; readonly running: number; readonly workers: readonly unknown[] }): this {
    this.pools.set(pool, () => {
      const s = stats();
      return { queued: s.queued, running: s.running, threads: s.workers.length };
    });
    return this;
  }

  /** Exports a model's batched decode steps (`sluice_decode_batch_*`), read at scrape time; `undefined` while it batches nothing. */
  registerBatcher(model: string, stats: () => BatchCounters | undefined): this {
    this.batchers.set(model, stats);
    return this;
  }

  /** The edge's view of one request, for the serving metrics (`RequestTrace` drives it). */
  requestStarted(model: string, trace?: TraceContext): RequestMeter {
    return new RequestMeter(this.serving, model, trace);
  }

  /** Exports a stage's `StageStats` under `stage` (buffered, in flight, shed by reason...). Re-registering a name replaces it. */
  registerStage(stage: string, stats: StageStats): this {
    this.stages.set(stage, stats);
    return this;
  }

  /** Exports a `CacheStats` under `cache`, with its hit ratio. */
  registerCache(cache: string, stats: CacheStats): this {
    this.caches.set(cache, stats);
    return this;
  }

  /** Exports a breaker's state (0 closed, 1 half-open, 2 open) under its name. */
  registerBreaker(breaker: CircuitBreaker): this {
    this.breakers.set(breaker.name, breaker);
    return this;
  }

  /** Exports a WebSocket token server's counters (`TokenSocket.stats`) under `server`, read at scrape time. */
  registerSocket(server: string, stats: () => SocketCounters): this {
    this.sockets.set(server, stats);
    return this;
  }

  /**
   * Records the per-stage timings of a finished element: queue wait and service into
   * histograms, paused time into a counter. Unsampled traces have no records and cost nothing.
   */
  observeTrace(trace: TraceContext): void {
    const records = trace.records;
    if (records === undefined) return;
    const { queueWait, service, paused } = this.stageTimings;
    for (const record of records) {
      const labels = { stage: record.stage };
      observe(queueWait, labels, record.queueWait / 1000, trace);
      observe(service, labels, record.service / 1000, trace);
      if (record.paused > 0) paused.inc(labels, record.paused / 1000);
    }
  }

  /**
   * Records a generation: time to first token, time per output token, token usage and
   * duration (`errorType` set when it failed, e.g. `AbortedError`). A sampled `trace` is the
   * exemplar of its latencies.
   */
  observeGeneration(model: string, done: GenerationDone, seconds: number, errorType?: string, trace?: TraceContext): void {
    const series = this.generations;
    const labels = { gen_ai_operation_name: 'chat', gen_ai_request_model: model };
    if (done.timeToFirstToken !== undefined) observe(series.timeToFirstToken, labels, done.timeToFirstToken / 1000, trace);
    if (done.tokensPerSecond !== undefined && done.tokensPerSecond > 0) series.timePerOutputToken.observe(labels, 1 / done.tokensPerSecond);
    // Literals, not spreads of `labels`: V8 (Node 20) makes every `{ ...object, key }` in the old generation, garbage a scavenge cannot free.
    series.tokenUsage.observe({ gen_ai_operation_name: 'chat', gen_ai_request_model: model, gen_ai_token_type: 'input' }, done.usage.inputTokens);
    series.tokenUsage.observe({ gen_ai_operation_name: 'chat', gen_ai_request_model: model, gen_ai_token_type: 'output' }, done.usage.outputTokens);
    series.generatedTokens.inc({ gen_ai_request_model: model }, done.usage.outputTokens);
    observe(series.generationDuration, { gen_ai_operation_name: 'chat', gen_ai_request_model: model, error_type: errorType ?? '' }, seconds, trace);
  }

  /** Records one answered HTTP request. */
  observeRequest({ route, status, seconds }: RequestObservation): void {
    this.http.requests.inc({ route, code: `${Math.floor(status / 100)}xx` });
    this.http.requestDuration.observe({ route }, seconds);
  }

  /**
   * The exposition text and its content type, for a `/metrics` response: OpenMetrics (with
   * exemplars) when `accept` (the scraper's `Accept` header) prefers it, else the classic text format.
   */
  scrape(accept?: string): Promise<Exposition> {
    const openMetrics = prefersOpenMetrics(accept);
    const rendered = this.rendering.then(() => render(this.registry, openMetrics));
    this.rendering = rendered.catch(() => {});
    return rendered;
  }

  /** Stops the event-loop monitor. The registry stays readable. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.loop.disable();
  }
}
