/**
 * The options HTTP and WebSocket serving both take, checked by one set of rules: where each
 * request's telemetry goes (metrics, tracer, sampling, request log, running requests, graph) and
 * the tenant quotas the two transports share.
 */
import type { Tracer } from '@opentelemetry/api';
import type { ZodModule } from '../core/zod.js';
import { functionSchema } from '../flow/options.js';
import type { SluiceMetrics } from './metrics.js';
import { TenantQuotas } from './tenant-quotas.js';
import type { RequestLog } from './request-log.js';
import { RequestRegistry } from './inspect/requests.js';
import type { TraceObserver } from './telemetry.js';

/** @internal The zod fields, for a transport's strict options schema. */
export const transportFields = (z: ZodModule) => ({
  metrics: z
    .custom<SluiceMetrics>((v) => typeof v === 'object' && v !== null && typeof (v as SluiceMetrics).scrape === 'function', {
      error: 'metrics must be a SluiceMetrics',
    })
    .optional(),
  tracer: z
    .custom<Tracer>((v) => typeof v === 'object' && v !== null && typeof (v as Tracer).startSpan === 'function', {
      error: 'tracer must be an OpenTelemetry Tracer',
    })
    .optional(),
  sampleRate: z
    .number({ error: 'sampleRate must be a number' })
    .min(0, { error: 'sampleRate must be in [0, 1]' })
    .max(1, { error: 'sampleRate must be in [0, 1]' })
    .default(1),
  tenantQuotas: z.instanceof(TenantQuotas, { error: 'tenantQuotas must be a TenantQuotas' }).optional(),
  requestLog: functionSchema<RequestLog>().optional(),
  requests: z.instanceof(RequestRegistry, { error: 'requests must be a RequestRegistry' }).optional(),
  graph: z
    .custom<TraceObserver>((v) => typeof (v as TraceObserver | undefined)?.observeTrace === 'function', { error: 'graph must have observeTrace(trace)' })
    .optional(),
});

/** @internal Where a server listens: `host` (default loopback) and `port` (0: any free one). */
export const listenFields = (z: ZodModule, defaultPort: number) => ({
  host: z.string().min(1, { error: 'host must not be empty' }).default('127.0.0.1'),
  port: z
    .number({ error: 'port must be a number' })
    .int({ error: 'port must be an integer' })
    .min(0, { error: 'port must be in [0, 65535]' })
    .max(65535, { error: 'port must be in [0, 65535]' })
    .default(defaultPort),
});
