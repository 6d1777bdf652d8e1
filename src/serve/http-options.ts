/** What `createHttpHandler` takes, and how it is checked (a bad field fails at construction, named). */
import type { IncomingMessage } from 'node:http';
import type { Tracer } from '@opentelemetry/api';
import { lazySchema } from '../core/zod.js';
import { functionSchema } from '../flow/options.js';
import { StageStats } from '../flow/stats.js';
import { Intake } from '../ai/pipelines/intake.js';
import type { SluiceMetrics } from './metrics.js';
import type { ChatWorker, EmbeddingModel } from './openai-wire.js';
import type { TenantQuotas } from './tenant-quotas.js';
import type { RequestLog } from './request-log.js';
import type { RequestRegistry } from './inspect/requests.js';
import { transportFields } from './transport-options.js';
import type { TraceObserver } from './telemetry.js';

/** Options of `createHttpHandler`: the models, the limits, the log, quotas and telemetry. */
export interface HttpHandlerOptions {
  /** Models served, by the name clients put in `model`. */
  readonly workers?: Readonly<Record<string, ChatWorker>>;
  /** Models `POST /v1/embeddings` serves, by name (e.g. a `BatchedEmbedder`). */
  readonly embeddings?: Readonly<Record<string, EmbeddingModel>>;
  /** Embeddings of models served elsewhere (a gateway's upstreams): the body forwarded, the answer as it came; undefined for a model not served there. */
  readonly upstreamEmbeddings?: (model: string, body: Readonly<Record<string, unknown>>, signal: AbortSignal) => Promise<unknown> | undefined;
  /** The passages cited under a source (`file › heading`): `GET /v1/passages?source=` answers with them. Without it that route is 404. */
  readonly passages?: (source: string) => readonly { readonly id: string; readonly source: string; readonly text: string }[];
  /** A single model, served under its `name`. Combined with `workers` if both are given. */
  readonly worker?: ChatWorker;
  /** Where request, generation and stage metrics go; `GET /metrics` serves its registry. Without it `/metrics` is 404. */
  readonly metrics?: SluiceMetrics;
  /** Guards `/v1/*` (not the probes nor `/metrics`): false → 401. E.g. compare the `authorization` header. */
  readonly auth?: (req: IncomingMessage) => boolean | Promise<boolean>;
  /** Largest request body accepted, bytes; larger → 413. Default 1 MiB. */
  readonly maxBodyBytes?: number;
  /** The largest `max_tokens` (or `max_completion_tokens`) a request may ask for; more → 400 `invalid_request_error`. Default 4096, as the WebSocket server's. */
  readonly maxTokens?: number;
  /** Whether the models are loaded; `/readyz` answers 503 while false. Default: always ready. */
  readonly ready?: () => boolean;
  /** The OpenTelemetry tracer. Default: the global provider's (a no-op unless an SDK is registered). */
  readonly tracer?: Tracer;
  /** Share of requests whose timing is recorded in their trace (and so in stage metrics and spans). Default 1. */
  readonly sampleRate?: number;
  /** The name of the generation stage in trace records, notes and metrics. Default `generate`. */
  readonly stage?: string;
  /**
   * Counters of that stage for the requests whose worker records no stage of that name
   * itself (a plain model, not a pipeline): give the `StageStats` of the pipeline's stage of
   * the same name, so `received_total` and the histograms count the same requests.
   */
  readonly stageStats?: StageStats;
  /**
   * Origins of browser pages on other sites that may call the API (CORS): their preflights are
   * answered and their responses readable. Any other origin gets no CORS header (a preflight
   * 403). Default: none.
   */
  readonly cors?: readonly string[];
  /** Gets one entry per completion when it ends, and one per refused `/v1` request (status, code, cause; the door's refusals at most 10 a second); never a prompt or a token. */
  readonly requestLog?: RequestLog;
  /** Who a request is for, for `tenantQuotas` and the request log (e.g. the tenant of its bearer token). */
  readonly tenant?: (req: IncomingMessage) => string | undefined;
  /** Requests per tenant, running and started per second; over them a completion gets 429 `tenant_quota`. Share one with `attachTokenSocket`. */
  readonly tenantQuotas?: TenantQuotas;
  /** Lists each completion while it runs, for the inspector (which can cancel it: a stream ends with a `request_cancelled` error event). */
  readonly requests?: RequestRegistry;
  /** Gets each finished completion's trace (a `PipelineGraph`'s service times and waterfall). */
  readonly graph?: TraceObserver;
  /**
   * The door every model's pipeline takes its requests from: while it would refuse a completion of
   * the tenant's class whichever model it names, the completion is answered 429 `server_busy` before
   * its body is parsed (counted as the intake's `buffer-full` shed). Give it only when every worker is on it.
   */
  readonly intake?: Intake;
  /**
   * With `intake`: while the event loop runs later than this (ms), every completion but a
   * `priority` one is refused 429 `server_busy` at the door (counted as the intake's `lagging`
   * shed), so requests do not pile up unseen in front of it. Default: no such bound.
   */
  readonly maxLoopLag?: number;
}

const workerSchema = lazySchema((z) =>
  z.custom<ChatWorker>(
    (v) => typeof v === 'object' && v !== null && typeof (v as ChatWorker).generate === 'function' && typeof (v as ChatWorker).name === 'string',
    { error: 'must be a ModelWorker (with name and generate())' },
  ),
);

/** @internal */
export const optionsSchema = lazySchema((z) =>
  z
    .object({
      ...transportFields(z),
      workers: z.record(z.string().min(1, { error: 'a model name must not be empty' }), workerSchema()).optional(),
      embeddings: z
        .record(
          z.string().min(1, { error: 'a model name must not be empty' }),
          z.custom<EmbeddingModel>((v) => typeof (v as EmbeddingModel | undefined)?.embed === 'function', { error: 'must have embed(texts)' }),
        )
        .optional(),
      worker: workerSchema().optional(),
      auth: functionSchema<(req: IncomingMessage) => boolean | Promise<boolean>>().optional(),
      maxBodyBytes: z
        .number({ error: 'maxBodyBytes must be a number' })
        .int({ error: 'maxBodyBytes must be an integer' })
        .positive({ error: 'maxBodyBytes must be ≥ 1' })
        .default(1 << 20),
      maxTokens: z
        .number({ error: 'maxTokens must be a number' })
        .int({ error: 'maxTokens must be an integer' })
        .positive({ error: 'maxTokens must be ≥ 1' })
        .default(4096),
      ready: functionSchema<() => boolean>().optional(),
      stage: z.string().min(1, { error: 'stage must not be empty' }).default('generate'),
      tenant: functionSchema<(req: IncomingMessage) => string | undefined>().optional(),
      stageStats: z.instanceof(StageStats, { error: 'stageStats must be a StageStats' }).optional(),
      upstreamEmbeddings:
        functionSchema<(model: string, body: Readonly<Record<string, unknown>>, signal: AbortSignal) => Promise<unknown> | undefined>().optional(),
      passages: functionSchema<(source: string) => readonly { id: string; source: string; text: string }[]>().optional(),
      cors: z.array(z.string().url({ error: 'a CORS origin must be a URL like https://app.example.com' })).optional(),
      intake: z.instanceof(Intake, { error: 'intake must be an Intake' }).optional(),
      maxLoopLag: z.number({ error: 'maxLoopLag must be a number' }).positive({ error: 'maxLoopLag must be > 0' }).optional(),
    })
    .strict()
    .refine((o) => o.worker !== undefined || (o.workers !== undefined && Object.keys(o.workers).length > 0), {
      error: 'give worker or workers (at least one model)',
      path: ['workers'],
    }),
);
