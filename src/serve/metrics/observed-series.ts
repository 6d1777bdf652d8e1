/**
 * The series fed as things happen rather than read at scrape time: HTTP requests, the per-stage
 * timings of sampled traces, and generations (the OpenTelemetry `gen_ai.*` names). Latency
 * histograms keep exemplars, so they register while the registry speaks OpenMetrics.
 */
import type { Counter, Histogram } from 'prom-client';
import { promClient } from '../../core/peers.js';
import { LATENCY_BUCKETS, PER_TOKEN_BUCKETS, TOKEN_BUCKETS } from './buckets.js';
import type { Registers } from './pipeline-collectors.js';

const prom = promClient();

export interface HttpSeries {
  readonly requests: Counter<'route' | 'code'>;
  readonly requestDuration: Histogram<'route'>;
}

export function httpSeries(prefix: string, registers: Registers): HttpSeries {
  return {
    requests: new prom.Counter({
      name: `${prefix}http_requests_total`,
      help: 'HTTP requests answered, by route and status class.',
      labelNames: ['route', 'code'],
      registers,
    }),
    requestDuration: new prom.Histogram({
      name: `${prefix}http_request_duration_seconds`,
      help: 'HTTP request duration, until the last byte was written or the client left.',
      labelNames: ['route'],
      buckets: LATENCY_BUCKETS,
      registers,
    }),
  };
}

export interface StageTimingSeries {
  readonly queueWait: Histogram<'stage'>;
  readonly service: Histogram<'stage'>;
  readonly paused: Counter<'stage'>;
}

export function stageTimingSeries(prefix: string, registers: Registers): StageTimingSeries {
  return {
    queueWait: new prom.Histogram({
      name: `${prefix}stage_queue_wait_seconds`,
      help: 'Time sampled elements waited in a stage buffer before work started.',
      labelNames: ['stage'],
      buckets: LATENCY_BUCKETS,
      registers,
      enableExemplars: true,
    }),
    service: new prom.Histogram({
      name: `${prefix}stage_service_seconds`,
      help: 'Time sampled elements spent in a stage work function.',
      labelNames: ['stage'],
      buckets: LATENCY_BUCKETS,
      registers,
      enableExemplars: true,
    }),
    paused: new prom.Counter({
      name: `${prefix}stage_paused_seconds_total`,
      help: 'Time results of sampled elements waited for downstream demand (backpressure).',
      labelNames: ['stage'],
      registers,
    }),
  };
}

type GenAiLabel = 'gen_ai_operation_name' | 'gen_ai_request_model';

export interface GenerationSeries {
  readonly timeToFirstToken: Histogram<GenAiLabel>;
  readonly timePerOutputToken: Histogram<GenAiLabel>;
  readonly generationDuration: Histogram<GenAiLabel | 'error_type'>;
  readonly tokenUsage: Histogram<GenAiLabel | 'gen_ai_token_type'>;
  readonly generatedTokens: Counter<'gen_ai_request_model'>;
}

/** The `gen_ai_*` histograms keep OpenTelemetry's names, unprefixed; the token counter is sluice's own. */
export function generationSeries(prefix: string, registers: Registers): GenerationSeries {
  const genAi = ['gen_ai_operation_name', 'gen_ai_request_model'] as const;
  return {
    timeToFirstToken: new prom.Histogram({
      name: 'gen_ai_server_time_to_first_token_seconds',
      help: 'Time from the start of a generation to its first token (gen_ai.server.time_to_first_token).',
      labelNames: genAi,
      buckets: LATENCY_BUCKETS,
      registers,
      enableExemplars: true,
    }),
    timePerOutputToken: new prom.Histogram({
      name: 'gen_ai_server_time_per_output_token_seconds',
      help: 'Time per output token after the first (gen_ai.server.time_per_output_token).',
      labelNames: genAi,
      buckets: PER_TOKEN_BUCKETS,
      registers,
    }),
    generationDuration: new prom.Histogram({
      name: 'gen_ai_server_request_duration_seconds',
      help: 'Generation request duration (gen_ai.server.request.duration).',
      labelNames: [...genAi, 'error_type'],
      buckets: LATENCY_BUCKETS,
      registers,
      enableExemplars: true,
    }),
    tokenUsage: new prom.Histogram({
      name: 'gen_ai_client_token_usage',
      help: 'Tokens per generation, input or output (gen_ai.client.token.usage).',
      labelNames: [...genAi, 'gen_ai_token_type'],
      buckets: TOKEN_BUCKETS,
      registers,
    }),
    generatedTokens: new prom.Counter({
      name: `${prefix}generated_tokens_total`,
      help: 'Output tokens generated; rate() of it is tokens per second.',
      labelNames: ['gen_ai_request_model'],
      registers,
    }),
  };
}
