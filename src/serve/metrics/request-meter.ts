/**
 * The serving metrics as vLLM names them, measured at the edge from a request's arrival: time to
 * first token, inter-token latency, end-to-end latency, queue time, running and waiting requests.
 */
import type { Counter, Gauge, Histogram } from 'prom-client';
import { promClient } from '../../core/peers.js';
import type { TraceContext } from '../../core/trace.js';
import type { GenerationDone } from '../../ai/inference/worker.js';
import { LATENCY_BUCKETS, PER_TOKEN_BUCKETS } from './buckets.js';
import { observe } from './exposition.js';
import type { Registers } from './pipeline-collectors.js';

const prom = promClient();

export interface ServingSeries {
  readonly timeToFirstToken: Histogram<'model_name'>;
  readonly interTokenLatency: Histogram<'model_name'>;
  readonly e2eLatency: Histogram<'model_name'>;
  readonly queueTime: Histogram<'model_name'>;
  readonly running: Gauge<'model_name'>;
  readonly waiting: Gauge<'model_name'>;
  readonly promptTokens: Counter<'model_name'>;
}

export function servingSeries(prefix: string, registers: Registers): ServingSeries {
  const model = ['model_name'] as const;
  return {
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
    private readonly metrics: ServingSeries,
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
