/** The token socket's options and limits: their types, defaults and validation, up front as `ws` does. */
import type { IncomingMessage } from 'node:http';
import type * as z from 'zod';
import { lazySchema, type Holds, type SchemaMatches } from '../../core/zod.js';
import type { TenantQuotas } from '../tenant-quotas.js';
import type { RequestLog } from '../request-log.js';
import type { Tracer } from '@opentelemetry/api';
import { functionSchema, parseOptions, positiveInt } from '../../flow/options.js';
import type { ModelWorker } from '../../ai/inference/worker.js';
import type { SluiceMetrics } from '../metrics.js';
import type { TokenSocketEvent } from './events.js';
import type { RequestRegistry } from '../inspect/requests.js';
import { transportFields } from '../transport-options.js';
import type { TraceObserver } from '../telemetry.js';
import type { HelloLimits } from '../protocol.js';

/** What the server needs of a model: its name and a token Flow. Every `ModelWorker` fits. */
export type TokenWorker = Pick<ModelWorker<never, unknown>, 'name' | 'generate'>;

/** Who a token belongs to. Quotas are kept per `tenant`. */
export interface Principal {
  readonly tenant: string;
}

/** Checks a bearer token; `undefined` (or a throw) refuses the upgrade with 401 (a browser: close 4401 after the handshake). */
export type Authenticate = (token: string, request: IncomingMessage) => Principal | undefined | Promise<Principal | undefined>;

/**
 * The server's limits: those a client must stay within (`HelloLimits`, announced to each
 * connection in its `hello` frame) and the server's own. Defaults: `maxPayload` 64 KiB,
 * `maxConcurrent` 8, `rate` 20/s burst 40, `tenantConcurrent` 32, `tenantRate` 50/s burst 100,
 * `heartbeatInterval` 30 s, `maxTokens` 4096.
 */
export interface TokenSocketLimits extends HelloLimits {
  /** Bytes buffered for a socket above which no more tokens are decoded for it. Default 64 KiB. */
  readonly highWaterMark: number;
  /** Bytes buffered for a socket beyond which it is closed at once with 4008 (error frames are not paced by demand). Default 1 MiB. */
  readonly maxBuffered: number;
  /** How long, ms, a socket may stay above the high-water mark before it is closed with 4008 (cut 1 s later if the close frame cannot get out). Default 10 s. */
  readonly stallTimeout: number;
  /** Protocol errors in a row that close the connection with 1008. Default 5. */
  readonly maxBadFrames: number;
  /** Characters a `conflate` request may hold while its client is slow; decoding pauses beyond. Default 16 Ki. */
  readonly conflateLimit: number;
}

/** Options of `attachTokenSocket`: the worker, authentication, limits and quotas. */
export interface TokenSocketOptions {
  /** The model that generates. Give this or `workers`. */
  readonly worker?: TokenWorker;
  /** Several models, chosen by the message's `model` (default: the first). */
  readonly workers?: Readonly<Record<string, TokenWorker>>;
  /**
   * Checks the bearer token of each upgrade. Without it connections are not
   * authenticated (each is a tenant of its own, `anonymous-<n>`): only for a server on loopback.
   */
  readonly authenticate?: Authenticate;
  /**
   * Origins browsers may connect from, or a check of the `Origin` header; another origin gets 403.
   * Requests without `Origin` (non-browser clients) pass. Default: any.
   */
  readonly origins?: readonly string[] | ((origin: string, request: IncomingMessage) => boolean);
  /** Only upgrades to this path are handled; others are left to other `upgrade` listeners. Default: every path. */
  readonly path?: string;
  /** Overrides of the default limits (`DEFAULT_LIMITS`), each checked. */
  readonly limits?: Partial<TokenSocketLimits>;
  /** Called with every connection and request event, for logs and metrics. */
  readonly onEvent?: (event: TokenSocketEvent) => void;
  /** Exports connection and request counters (`sluice_ws_*`) and observes each request's trace and generation. */
  readonly metrics?: SluiceMetrics;
  /** Names this server in metrics. Default `ws`. */
  readonly name?: string;
  /** The OpenTelemetry tracer for request and stage spans. Default: the global provider's (a no-op unless an SDK is registered). */
  readonly tracer?: Tracer;
  /** Share of requests whose per-stage timing is recorded (metrics, stage spans); a sampled incoming traceparent always is. Default 1. */
  readonly sampleRate?: number;
  /**
   * Requests per tenant shared with other transports (the HTTP handler of the same
   * server): their limits then replace `tenantConcurrent` and `tenantRate`. Default: the
   * server's own, from `limits`.
   */
  readonly tenantQuotas?: TenantQuotas;
  /** Gets one entry per request when it ends or is refused; never a prompt or a token. */
  readonly requestLog?: RequestLog;
  /** Lists each request while it runs, for the inspector (whose cancel ends it as the client's `cancel` would: `done` with `abort`). */
  readonly requests?: RequestRegistry;
  /** Gets each finished request's trace (a `PipelineGraph`'s service times and waterfall). */
  readonly graph?: TraceObserver;
}

/** The limits a server has unless told otherwise. */
export const DEFAULT_LIMITS: TokenSocketLimits = {
  maxPayload: 64 * 1024,
  maxConcurrent: 8,
  rate: { perSecond: 20, burst: 40 },
  tenantConcurrent: 32,
  tenantRate: { perSecond: 50, burst: 100 },
  highWaterMark: 64 * 1024,
  maxBuffered: 1024 * 1024,
  stallTimeout: 10_000,
  maxBadFrames: 5,
  heartbeatInterval: 30_000,
  maxTokens: 4096,
  conflateLimit: 16 * 1024,
};

const workerSchema = lazySchema((z) =>
  z.custom<TokenWorker>(
    (v) => typeof v === 'object' && v !== null && typeof (v as TokenWorker).generate === 'function' && typeof (v as TokenWorker).name === 'string',
    { error: 'must be a ModelWorker (with name and generate())' },
  ),
);

const rateSchema = lazySchema((z) =>
  z.object({ perSecond: z.number().positive({ error: 'perSecond must be > 0' }), burst: z.number().min(1, { error: 'burst must be ≥ 1' }) }).strict(),
);

const limitsSchema = lazySchema((z) =>
  z
    .object({
      maxPayload: positiveInt('maxPayload'),
      maxConcurrent: positiveInt('maxConcurrent'),
      rate: rateSchema(),
      tenantConcurrent: positiveInt('tenantConcurrent'),
      tenantRate: rateSchema(),
      highWaterMark: positiveInt('highWaterMark'),
      maxBuffered: positiveInt('maxBuffered'),
      stallTimeout: positiveInt('stallTimeout'),
      maxBadFrames: positiveInt('maxBadFrames'),
      heartbeatInterval: positiveInt('heartbeatInterval'),
      maxTokens: positiveInt('maxTokens'),
      conflateLimit: positiveInt('conflateLimit'),
    })
    .strict()
    .refine((l) => l.maxBuffered > l.highWaterMark, { error: 'maxBuffered must be greater than highWaterMark', path: ['maxBuffered'] }),
);

const optionsSchema = lazySchema((z) =>
  z
    .object({
      ...transportFields(z),
      worker: workerSchema().optional(),
      workers: z.record(z.string(), workerSchema()).optional(),
      authenticate: functionSchema<Authenticate>().optional(),
      origins: z
        .union(
          [
            z.array(z.string().min(1, { error: 'an origin must not be empty' })).readonly(),
            functionSchema<(origin: string, request: IncomingMessage) => boolean>(),
          ],
          {
            error: 'origins must be an array of strings or a function',
          },
        )
        .optional(),
      path: z.string().startsWith('/', { error: 'path must start with "/"' }).optional(),
      limits: z.custom<Partial<TokenSocketLimits>>().optional(),
      onEvent: functionSchema<(event: TokenSocketEvent) => void>().optional(),
      name: z.string().min(1, { error: 'name must not be empty' }).default('ws'),
    })
    .strict()
    .refine((o) => (o.worker === undefined) !== (o.workers === undefined || Object.keys(o.workers).length === 0), {
      error: 'give exactly one of worker or workers (non-empty)',
      path: ['worker'],
    }),
);

/** @internal Fails to compile when `TokenSocketOptions` and the schema's input part ways. */
export type TokenSocketOptionsInStep = Holds<SchemaMatches<TokenSocketOptions, z.input<ReturnType<typeof optionsSchema>>>>;

/** The options as parsed: `name` and `sampleRate` defaulted. What the server's parts read. */
export interface TokenSocketConfig extends TokenSocketOptions {
  readonly name: string;
  readonly sampleRate: number;
}

/** @internal Fails to compile when `TokenSocketConfig` and the schema's output part ways. */
export type TokenSocketConfigInStep = Holds<SchemaMatches<TokenSocketConfig, z.output<ReturnType<typeof optionsSchema>>>>;

/** @internal Validates the options, and the limits merged over their defaults; throws `InvalidOptionsError` naming the field. */
export function parseTokenSocketOptions(options: TokenSocketOptions): { readonly config: TokenSocketConfig; readonly limits: TokenSocketLimits } {
  const config = parseOptions(optionsSchema(), options, 'token socket options');
  const limits = parseOptions(limitsSchema(), { ...DEFAULT_LIMITS, ...(config.limits as object | undefined) }, 'token socket limits');
  return { config, limits };
}
