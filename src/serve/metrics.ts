/**
 * Prometheus metrics for a sluice process, on a registry of its own (never only the
 * global one, so two servers or a host application's metrics never collide).
 *
 * Gauges and counters that sluice already keeps (`StageStats`, `CacheStats`, a
 * breaker's state) are read at scrape time through `collect()` callbacks: nothing is
 * copied on the hot path, and a scraped value is never stale. Per-stage latencies come
 * from the trace records of sampled elements (`observeTrace`); generation timings from
 * a worker's `GenerationDone` (`observeGeneration`).
 *
 * Labels are bounded by construction: stage, cache, breaker and model names come from
 * configuration, routes from a fixed list, status as a class (`2xx`). Never a request
 * id or a prompt.
 *
 * The latency histograms carry exemplars: the trace id (`trace_id`) of a sampled request
 * that fell in each bucket. Exemplars exist only in the OpenMetrics format, so `scrape()`
 * serves OpenMetrics to a scraper whose `Accept` header asks for it (Prometheus does) and
 * the classic text format to everyone else.
 */
import { lazySchema } from '../core/zod.js';
import { monitorEventLoopDelay, type IntervalHistogram } from 'node:perf_hooks';
import type { Counter, Gauge, Histogram, LabelValues, Registry, RegistryContentType } from 'prom-client';
import { promClient } from '../core/peers.js';
import { parseOptions } from '../flow/options.js';
import type { StageStats } from '../flow/stats.js';
import type { ShedReason } from '../flow/options.js';
import { CacheStats } from '../cache/stats.js';
import type { CircuitBreaker, CircuitState } from '../resilience/breaker.js';
import type { TraceContext } from '../core/trace.js';
import type { GenerationDone } from '../ai/inference/worker.js';
import type { TokenSocketStats } from './socket-stats.js';

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

/** `closed` 0, `half-open` 1, `open` 2: higher is worse, so `max()` over breakers reads naturally. */
export const BREAKER_STATE_VALUES: Readonly<Record<CircuitState, number>> = { closed: 0, 'half-open': 1, open: 2 };

/** What a WebSocket token server reports at scrape time (`TokenSocket.stats()` fits). */
export type SocketCounters = Pick<
  TokenSocketStats,
  'connections' | 'activeRequests' | 'buffered' | 'started' | 'completed' | 'cancelled' | 'failed' | 'interrupted' | 'badFrames' | 'upgradesRejected'
>;

const SOCKET_OUTCOMES = ['completed', 'cancelled', 'failed', 'interrupted'] as const;
const REFUSAL_STATUSES = [400, 401, 403, 503] as const;

/** What the HTTP API reports for one finished request. */
export interface RequestObservation {
  /** A route from a fixed set (`/v1/chat/completions`, `/metrics`, ..., `other`). */
  readonly route: string;
  readonly status: number;
  readonly seconds: number;
}

const LATENCY_BUCKETS = [0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];
const TOKEN_BUCKETS = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144];
const PER_TOKEN_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5];
const SHED_REASONS: readonly ShedReason[] = ['buffer-full', 'evicted', 'lagging', 'cancelled'];
const LOOP_STATS = [
  ['p50', (h: IntervalHistogram) => h.percentile(50)],
  ['p90', (h: IntervalHistogram) => h.percentile(90)],
  ['p99', (h: IntervalHistogram) => h.percentile(99)],
  ['max', (h: IntervalHistogram) => h.max],
  ['mean', (h: IntervalHistogram) => h.mean],
] as const;

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
  private readonly loop: IntervalHistogram;
  private readonly requests: Counter<'route' | 'code'>;
  private readonly requestDuration: Histogram<'route'>;
  private readonly queueWait: Histogram<'stage'>;
  private readonly service: Histogram<'stage'>;
  private readonly paused: Counter<'stage'>;
  private readonly timeToFirstToken: Histogram<'gen_ai_operation_name' | 'gen_ai_request_model'>;
  private readonly timePerOutputToken: Histogram<'gen_ai_operation_name' | 'gen_ai_request_model'>;
  private readonly generationDuration: Histogram<'gen_ai_operation_name' | 'gen_ai_request_model' | 'error_type'>;
  private readonly tokenUsage: Histogram<'gen_ai_operation_name' | 'gen_ai_request_model' | 'gen_ai_token_type'>;
  private readonly generatedTokens: Counter<'gen_ai_request_model'>;
  private readonly pools = new Map<string, () => PoolCounters>();
  /** Serving metrics as vLLM names them, measured at the edge from a request's arrival. */
  private readonly serving: ServingMetrics;
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

    this.requests = new prom.Counter({
      name: `${prefix}http_requests_total`,
      help: 'HTTP requests answered, by route and status class.',
      labelNames: ['route', 'code'],
      registers,
    });
    this.requestDuration = new prom.Histogram({
      name: `${prefix}http_request_duration_seconds`,
      help: 'HTTP request duration, until the last byte was written or the client left.',
      labelNames: ['route'],
      buckets: LATENCY_BUCKETS,
      registers,
    });
    this.queueWait = new prom.Histogram({
      name: `${prefix}stage_queue_wait_seconds`,
      help: 'Time sampled elements waited in a stage buffer before work started.',
      labelNames: ['stage'],
      buckets: LATENCY_BUCKETS,
      registers,
      enableExemplars: true,
    });
    this.service = new prom.Histogram({
      name: `${prefix}stage_service_seconds`,
      help: 'Time sampled elements spent in a stage work function.',
      labelNames: ['stage'],
      buckets: LATENCY_BUCKETS,
      registers,
      enableExemplars: true,
    });
    this.paused = new prom.Counter({
      name: `${prefix}stage_paused_seconds_total`,
      help: 'Time results of sampled elements waited for downstream demand (backpressure).',
      labelNames: ['stage'],
      registers,
    });

    const stageGauge = (name: string, help: string, read: (stats: StageStats) => number) => {
      const gauge: Gauge<'stage'> = new prom.Gauge({
        name: `${prefix}stage_${name}`,
        help,
        labelNames: ['stage'],
        registers,
        collect: () => {
          for (const [stage, stats] of this.stages) gauge.set({ stage }, read(stats));
        },
      });
    };
    stageGauge('buffered', 'Elements waiting in the stage buffers now.', (s) => s.buffered);
    stageGauge('in_flight', 'Work started and not yet fully delivered, now.', (s) => s.inFlight);

    const stageCounter = (name: string, help: string, read: (stats: StageStats) => number) => {
      const counter: Counter<'stage'> = new prom.Counter({
        name: `${prefix}stage_${name}_total`,
        help,
        labelNames: ['stage'],
        registers,
        collect: () => {
          // The source counters are monotonic, so re-stating them at each scrape is a valid counter.
          counter.reset();
          for (const [stage, stats] of this.stages) counter.inc({ stage }, read(stats));
        },
      });
    };
    stageCounter('received', 'Elements that entered the stage.', (s) => s.received);
    stageCounter('delivered', 'Inputs whose outputs all went downstream.', (s) => s.delivered);
    stageCounter('emitted', 'Outputs emitted downstream.', (s) => s.emitted);
    stageCounter('failed', 'Inputs whose work failed.', (s) => s.failed);
    stageCounter('pauses', 'Times the stage stopped its producers because it was full.', (s) => s.pauses);
    stageCounter(
      'late_arrivals',
      'Elements its link gave up on that arrived after all (a deferring operator held them longer than the link waited).',
      (s) => s.lateArrivals,
    );
    const shed: Counter<'stage' | 'reason'> = new prom.Counter({
      name: `${prefix}stage_shed_total`,
      help: 'Elements shed by a stage, by reason.',
      labelNames: ['stage', 'reason'],
      registers,
      collect: () => {
        shed.reset();
        for (const [stage, stats] of this.stages) for (const reason of SHED_REASONS) shed.inc({ stage, reason }, stats.shed[reason]);
      },
    });

    for (const metric of CacheStats.metrics) {
      const name = metric.name.replace(/^sluice_/, prefix);
      const help = metric.help;
      if (metric.type === 'counter') {
        const counter: Counter<'cache'> = new prom.Counter({
          name,
          help,
          labelNames: ['cache'],
          registers,
          collect: () => {
            counter.reset();
            for (const [cache, stats] of this.caches) counter.inc({ cache }, stats[metric.field]);
          },
        });
      } else {
        const cacheGauge: Gauge<'cache'> = new prom.Gauge({
          name,
          help,
          labelNames: ['cache'],
          registers,
          collect: () => {
            for (const [cache, stats] of this.caches) cacheGauge.set({ cache }, stats[metric.field]);
          },
        });
      }
    }
    const hitRatio: Gauge<'cache'> = new prom.Gauge({
      name: `${prefix}cache_hit_ratio`,
      help: 'Share of cache requests answered from a cache (exact or semantic) since start; prefer rate() over the counters for recent behaviour.',
      labelNames: ['cache'],
      registers,
      collect: () => {
        for (const [cache, stats] of this.caches) hitRatio.set({ cache }, stats.requests === 0 ? 0 : (stats.hits + stats.semanticHits) / stats.requests);
      },
    });

    const breakerState: Gauge<'breaker'> = new prom.Gauge({
      name: `${prefix}circuit_breaker_state`,
      help: 'Circuit breaker state: 0 closed, 1 half-open, 2 open.',
      labelNames: ['breaker'],
      registers,
      collect: () => {
        for (const [name, breaker] of this.breakers) breakerState.set({ breaker: name }, BREAKER_STATE_VALUES[breaker.state]);
      },
    });
    for (const [field, help] of [
      ['failures', 'Failures a circuit breaker counted against its worker (the client’s own errors are not).'],
      ['opens', 'Times a circuit breaker opened.'],
      ['rejected', 'Calls a circuit breaker refused while open (or half-open with every probe taken).'],
    ] as const) {
      const counter: Counter<'breaker'> = new prom.Counter({
        name: `${prefix}circuit_breaker_${field}_total`,
        help,
        labelNames: ['breaker'],
        registers,
        collect: () => {
          counter.reset();
          for (const [name, breaker] of this.breakers) counter.inc({ breaker: name }, breaker.counts[field]);
        },
      });
    }

    const socketGauge = (name: string, help: string, read: (c: SocketCounters) => number) => {
      const gauge: Gauge<'server'> = new prom.Gauge({
        name: `${prefix}ws_${name}`,
        help,
        labelNames: ['server'],
        registers,
        collect: () => {
          for (const [server, stats] of this.sockets) gauge.set({ server }, read(stats()));
        },
      });
    };
    socketGauge('connections', 'Open WebSocket connections.', (c) => c.connections);
    socketGauge('active_requests', 'WebSocket requests generating now.', (c) => c.activeRequests);
    socketGauge('buffered_bytes', 'Bytes waiting in the WebSocket send buffers now, all connections together.', (c) => c.buffered);
    type SocketLabel = 'server' | 'outcome' | 'status';
    const socketCounter = (
      name: string,
      help: string,
      labelNames: readonly SocketLabel[],
      fill: (counter: Counter<SocketLabel>, server: string, c: SocketCounters) => void,
    ) => {
      const counter: Counter<SocketLabel> = new prom.Counter({
        name: `${prefix}ws_${name}_total`,
        help,
        labelNames: [...labelNames],
        registers,
        collect: () => {
          counter.reset();
          for (const [server, stats] of this.sockets) fill(counter, server, stats());
        },
      });
    };
    socketCounter('requests_started', 'WebSocket requests accepted and started.', ['server'], (counter, server, c) => counter.inc({ server }, c.started));
    socketCounter('requests_ended', 'WebSocket requests ended, by outcome (interrupted: cut off by shutdown).', ['server', 'outcome'], (counter, server, c) => {
      for (const outcome of SOCKET_OUTCOMES) counter.inc({ server, outcome }, c[outcome]);
    });
    socketCounter('bad_frames', 'Frames the WebSocket server could not understand.', ['server'], (counter, server, c) => counter.inc({ server }, c.badFrames));
    socketCounter(
      'upgrades_rejected',
      'WebSocket upgrades refused, by HTTP status (a browser refused with close 4401 or 1013 counts as 401 or 503).',
      ['server', 'status'],
      (counter, server, c) => {
        for (const status of REFUSAL_STATUSES) counter.inc({ server, status: String(status) }, c.upgradesRejected[status]);
      },
    );

    this.loop = monitorEventLoopDelay({ resolution: eventLoopResolution });
    this.loop.enable();
    const loopDelay: Gauge<'stat'> = new prom.Gauge({
      name: `${prefix}event_loop_delay_seconds`,
      help: 'Event-loop delay since the previous scrape (perf_hooks.monitorEventLoopDelay), by statistic.',
      labelNames: ['stat'],
      registers,
      collect: () => {
        const histogram = this.loop;
        // With no sample yet the histogram reports NaN or huge sentinels: report 0 instead.
        const ready = histogram.count > 0;
        for (const [stat, read] of LOOP_STATS) loopDelay.set({ stat }, ready ? read(histogram) / 1e9 : 0);
        histogram.reset();
      },
    });

    const genAi = ['gen_ai_operation_name', 'gen_ai_request_model'] as const;
    this.timeToFirstToken = new prom.Histogram({
      name: 'gen_ai_server_time_to_first_token_seconds',
      help: 'Time from the start of a generation to its first token (gen_ai.server.time_to_first_token).',
      labelNames: genAi,
      buckets: LATENCY_BUCKETS,
      registers,
      enableExemplars: true,
    });
    this.timePerOutputToken = new prom.Histogram({
      name: 'gen_ai_server_time_per_output_token_seconds',
      help: 'Time per output token after the first (gen_ai.server.time_per_output_token).',
      labelNames: genAi,
      buckets: PER_TOKEN_BUCKETS,
      registers,
    });
    this.generationDuration = new prom.Histogram({
      name: 'gen_ai_server_request_duration_seconds',
      help: 'Generation request duration (gen_ai.server.request.duration).',
      labelNames: [...genAi, 'error_type'],
      buckets: LATENCY_BUCKETS,
      registers,
      enableExemplars: true,
    });
    this.tokenUsage = new prom.Histogram({
      name: 'gen_ai_client_token_usage',
      help: 'Tokens per generation, input or output (gen_ai.client.token.usage).',
      labelNames: [...genAi, 'gen_ai_token_type'],
      buckets: TOKEN_BUCKETS,
      registers,
    });
    this.generatedTokens = new prom.Counter({
      name: `${prefix}generated_tokens_total`,
      help: 'Output tokens generated; rate() of it is tokens per second.',
      labelNames: ['gen_ai_request_model'],
      registers,
    });

    const pools = this.pools;
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

    const model = ['model_name'] as const;
    this.serving = {
      timeToFirstToken: new prom.Histogram({
        name: `${prefix}time_to_first_token_seconds`,
        help: 'From the arrival of a request to its first token sent to the client (queue time included).',
        labelNames: model,
        buckets: LATENCY_BUCKETS,
        registers,
        enableExemplars: true,
      }),
      interTokenLatency: new prom.Histogram({
        name: `${prefix}inter_token_latency_seconds`,
        help: 'Between two tokens sent to the client of one request.',
        labelNames: model,
        buckets: PER_TOKEN_BUCKETS,
        registers,
      }),
      e2eLatency: new prom.Histogram({
        name: `${prefix}e2e_request_latency_seconds`,
        help: 'From the arrival of a request to its end, however it ended.',
        labelNames: model,
        buckets: LATENCY_BUCKETS,
        registers,
        enableExemplars: true,
      }),
      queueTime: new prom.Histogram({
        name: `${prefix}request_queue_time_seconds`,
        help: 'From the arrival of a request until its model began to generate (stages before the model included).',
        labelNames: model,
        buckets: LATENCY_BUCKETS,
        registers,
        enableExemplars: true,
      }),
      running: new prom.Gauge({ name: `${prefix}num_requests_running`, help: 'Requests streaming tokens now.', labelNames: model, registers }),
      waiting: new prom.Gauge({
        name: `${prefix}num_requests_waiting`,
        help: 'Requests admitted and waiting for their first token now.',
        labelNames: model,
        registers,
      }),
      promptTokens: new prom.Counter({ name: `${prefix}prompt_tokens_total`, help: 'Prompt tokens of finished requests.', labelNames: model, registers }),
    };
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
    for (const record of records) {
      const labels = { stage: record.stage };
      observe(this.queueWait, labels, record.queueWait / 1000, trace);
      observe(this.service, labels, record.service / 1000, trace);
      if (record.paused > 0) this.paused.inc(labels, record.paused / 1000);
    }
  }

  /**
   * Records a generation: time to first token, time per output token, token usage and
   * duration (`errorType` set when it failed, e.g. `AbortedError`). A sampled `trace` is the
   * exemplar of its latencies.
   */
  observeGeneration(model: string, done: GenerationDone, seconds: number, errorType?: string, trace?: TraceContext): void {
    const labels = { gen_ai_operation_name: 'chat', gen_ai_request_model: model };
    if (done.timeToFirstToken !== undefined) observe(this.timeToFirstToken, labels, done.timeToFirstToken / 1000, trace);
    if (done.tokensPerSecond !== undefined && done.tokensPerSecond > 0) this.timePerOutputToken.observe(labels, 1 / done.tokensPerSecond);
    // Literals, not spreads of `labels`: V8 (Node 20) makes every `{ ...object, key }` in the old generation, garbage a scavenge cannot free.
    this.tokenUsage.observe({ gen_ai_operation_name: 'chat', gen_ai_request_model: model, gen_ai_token_type: 'input' }, done.usage.inputTokens);
    this.tokenUsage.observe({ gen_ai_operation_name: 'chat', gen_ai_request_model: model, gen_ai_token_type: 'output' }, done.usage.outputTokens);
    this.generatedTokens.inc({ gen_ai_request_model: model }, done.usage.outputTokens);
    observe(this.generationDuration, { gen_ai_operation_name: 'chat', gen_ai_request_model: model, error_type: errorType ?? '' }, seconds, trace);
  }

  /** Records one answered HTTP request. */
  observeRequest({ route, status, seconds }: RequestObservation): void {
    this.requests.inc({ route, code: `${Math.floor(status / 100)}xx` });
    this.requestDuration.observe({ route }, seconds);
  }

  /**
   * The exposition text and its content type, for a `/metrics` response: OpenMetrics (with
   * exemplars) when `accept` (the scraper's `Accept` header) prefers it, else the classic text format.
   */
  scrape(accept?: string): Promise<{ readonly contentType: string; readonly body: string }> {
    const openMetrics = prefersOpenMetrics(accept);
    const rendered = this.rendering.then(() => this.render(openMetrics));
    this.rendering = rendered.catch(() => {});
    return rendered;
  }

  private async render(openMetrics: boolean): Promise<{ readonly contentType: string; readonly body: string }> {
    const registry = this.registry;
    // prom-client renames counters for OpenMetrics (drops `_total` from the family name) and keeps the rename: put the names back after.
    const names = registry.getMetricsAsArray().map((metric) => [metric, metric.name] as const);
    registry.setContentType(openMetrics ? prom.Registry.OPENMETRICS_CONTENT_TYPE : prom.Registry.PROMETHEUS_CONTENT_TYPE);
    try {
      return { contentType: registry.contentType, body: await registry.metrics() };
    } finally {
      for (const [metric, name] of names) metric.name = name;
      registry.setContentType(prom.Registry.PROMETHEUS_CONTENT_TYPE);
    }
  }

  /** Stops the event-loop monitor. The registry stays readable. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.loop.disable();
  }
}

interface PoolCounters {
  readonly queued: number;
  readonly running: number;
  readonly threads: number;
}

interface ServingMetrics {
  readonly timeToFirstToken: Histogram<'model_name'>;
  readonly interTokenLatency: Histogram<'model_name'>;
  readonly e2eLatency: Histogram<'model_name'>;
  readonly queueTime: Histogram<'model_name'>;
  readonly running: Gauge<'model_name'>;
  readonly waiting: Gauge<'model_name'>;
  readonly promptTokens: Counter<'model_name'>;
}

/**
 * One request between its arrival and its end, as the serving metrics see it: waiting until
 * its first token, running after; the gap before each token. `end()` is idempotent.
 */
export class RequestMeter {
  private readonly labels: { model_name: string };
  private readonly arrivedAt = performance.now();
  private firstTokenAt: number | undefined;
  private lastTokenAt: number | undefined;
  private ended = false;

  constructor(
    private readonly metrics: ServingMetrics,
    model: string,
    /** The request's trace: when sampled, the exemplar of its latencies. */
    private readonly trace?: TraceContext,
  ) {
    this.labels = { model_name: model };
    metrics.waiting.inc(this.labels);
  }

  /** A token went to the client. */
  token(): void {
    if (this.ended) return;
    const now = performance.now();
    if (this.lastTokenAt === undefined) {
      this.firstTokenAt = now;
      observe(this.metrics.timeToFirstToken, this.labels, (now - this.arrivedAt) / 1000, this.trace);
      this.metrics.waiting.dec(this.labels);
      this.metrics.running.inc(this.labels);
    } else this.metrics.interTokenLatency.observe(this.labels, (now - this.lastTokenAt) / 1000);
    this.lastTokenAt = now;
  }

  /** The request ended; `done` is the worker's report when it gave one. */
  end(done: GenerationDone | undefined): void {
    if (this.ended) return;
    this.ended = true;
    const now = performance.now();
    if (this.lastTokenAt === undefined) this.metrics.waiting.dec(this.labels);
    else this.metrics.running.dec(this.labels);
    observe(this.metrics.e2eLatency, this.labels, (now - this.arrivedAt) / 1000, this.trace);
    if (done !== undefined) {
      this.metrics.promptTokens.inc(this.labels, done.usage.inputTokens);
      // The model's own time to its first token, taken from the edge's: what came before it (stages, queues).
      const firstAt = this.firstTokenAt;
      if (firstAt !== undefined && done.timeToFirstToken !== undefined)
        observe(this.metrics.queueTime, this.labels, Math.max(0, firstAt - this.arrivedAt - done.timeToFirstToken) / 1000, this.trace);
    }
  }
}

/**
 * An observation of a histogram made with exemplars: a sampled trace (one a tracing backend
 * keeps) becomes the exemplar of the bucket, as `trace_id`.
 */
function observe<T extends string>(histogram: Histogram<T>, labels: LabelValues<T>, value: number, trace: TraceContext | undefined): void {
  histogram.observe(trace?.sampled === true ? { labels, value, exemplarLabels: { trace_id: trace.traceId } as LabelValues<T> } : { labels, value });
}

/**
 * Whether an `Accept` header prefers OpenMetrics to the classic text format: listed with a
 * weight above 0 and no lower than `text/plain`'s (Prometheus asks for OpenMetrics first).
 */
export function prefersOpenMetrics(accept: string | undefined): boolean {
  if (accept === undefined) return false;
  let openMetrics = -1;
  let text = -1;
  for (const range of accept.split(',')) {
    const [type = '', ...params] = range.split(';').map((part) => part.trim().toLowerCase());
    const q = params.find((p) => p.startsWith('q='));
    const weight = q === undefined ? 1 : Number(q.slice(2));
    if (!Number.isFinite(weight)) continue;
    if (type === 'application/openmetrics-text') openMetrics = Math.max(openMetrics, weight);
    else if (type === 'text/plain') text = Math.max(text, weight);
  }
  return openMetrics > 0 && openMetrics >= text;
}
