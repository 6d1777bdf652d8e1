/**
 * The HTTP API of a sluice server, as a `(req, res)` handler for `node:http`: its routes —
 * OpenAI-compatible chat and text completions (streamed as server-sent events, or whole),
 * embeddings, models, passages — Prometheus metrics, and health and readiness probes.
 *
 * Each route is one declaration of http/routes.ts; this file checks a request against its
 * route as a flat list of guards (CORS, preflight, auth, method) and sends every refusal as
 * one `ApiError`. The options are in http-options.ts, the wire formats in openai-wire.ts and
 * completions-wire.ts, generation in http/generate.ts.
 */
import { randomUUID } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { parseOptions } from '../flow/options.js';
import { pathOf } from './protocol.js';
import { ApiError, toApiError } from './openai-wire.js';
import { sendError } from './http-io.js';
import { errorField } from './request-log.js';
import { optionsSchema, type HttpHandlerOptions } from './http-options.js';
import { RequestContext } from './http/context.js';
import { type EdgeConfig, HttpEdge } from './http/edge.js';
import { allowOf, type Route, routeMatcher } from './http/route.js';
import { routeTable } from './http/routes.js';

export type { ChatWorker } from './openai-wire.js';
export type { HttpHandlerOptions } from './http-options.js';

/** A `node:http` request listener with a drain switch for graceful shutdown. */
export interface HttpHandler {
  (req: IncomingMessage, res: ServerResponse): void;
  /** True once `drain()` was called: `/readyz` answers 503 and new completions are refused with 503. */
  readonly draining: boolean;
  /** Completions being answered now. */
  readonly inFlight: number;
  /**
   * Stops accepting completions; resolves when the ones in flight have ended. With a
   * `deadline` (ms), completions still running then are ended with a `server_shutdown`
   * error (an SSE error event, or a 503), never cut silently.
   */
  drain(deadline?: number): Promise<HttpDrainReport>;
}

/** What `HttpHandler.drain` reports. */
export interface HttpDrainReport {
  /** Completions in flight when the drain began. */
  readonly running: number;
  /** Of those, how many were ended by the deadline. */
  readonly interrupted: number;
}

/**
 * Builds the request listener. Routes: `POST /v1/chat/completions`, `POST /v1/completions`,
 * `POST /v1/embeddings`, `GET /v1/models`, `GET /v1/models/{id}`, `GET /v1/passages?source=`
 * (with `passages`), `GET /metrics`, `GET /healthz` (the process is up), `GET /readyz` (models
 * loaded and not draining, else 503). Another method gets 405 with `Allow`.
 *
 * An incoming `traceparent` header becomes the trace of the request's element (and the
 * parent of its OpenTelemetry span); the response carries the request's own
 * `traceparent`.
 *
 * ## Example
 * ```ts
 * import { createServer } from 'node:http';
 * const metrics = new SluiceMetrics();
 * const handler = createHttpHandler({ workers: { charlm: await CharLmWorker.load('models/charlm.onnx') }, metrics });
 * const server = createServer(handler).listen(8000, '127.0.0.1');
 * process.on('SIGTERM', async () => { await handler.drain(); server.close(); });
 * // new OpenAIWorker({ baseUrl: 'http://127.0.0.1:8000/v1', model: 'charlm' }) now talks to it
 * ```
 */
export function createHttpHandler(options: HttpHandlerOptions): HttpHandler {
  const edge = new HttpEdge(parseOptions(optionsSchema(), options, 'HTTP handler options'));
  const { config } = edge;
  const match = routeMatcher(routeTable(edge));

  const handler = (req: IncomingMessage, res: ServerResponse): void => {
    const path = pathOf(req.url);
    const route = match(path);
    // Every API answer names its request, as OpenAI's do: the id a client quotes is the id of its log line.
    const ctx = new RequestContext(req, res, path, route, `${route?.idPrefix ?? 'req-'}${randomUUID()}`, config.tenant, config.requestLog);
    if (path.startsWith('/v1/')) res.setHeader('x-request-id', ctx.id);
    res.on('close', () => {
      // A client that left mid-stream still got a 200 status line: the class records what was sent.
      config.metrics?.observeRequest({ route: ctx.label, status: res.statusCode, seconds: (performance.now() - ctx.arrivedAt) / 1000 });
    });
    serve(config, ctx, route).catch((err: unknown) => refuse(ctx, err));
  };

  return Object.defineProperties(handler, {
    draining: { get: () => edge.draining, enumerable: true },
    inFlight: { get: () => edge.inFlight, enumerable: true },
    drain: { value: (deadline?: number): Promise<HttpDrainReport> => edge.drain(deadline) },
  }) as HttpHandler;
}

/** The guards every request passes, in order, then its route's handler. */
async function serve(config: EdgeConfig, ctx: RequestContext, route: Route | undefined): Promise<void> {
  const { req, res } = ctx;
  const corsOrigin = corsHeaders(config.cors, req, res);
  // A preflight carries no credentials: it is answered before auth, for the listed origins only.
  if (req.method === 'OPTIONS' && route?.api === true) return preflight(ctx, route, corsOrigin);
  if (route?.api === true && config.auth !== undefined && !(await config.auth(req)))
    throw new ApiError(401, 'Invalid or missing API key.', 'invalid_request_error', 'invalid_api_key');
  if (route === undefined) throw new ApiError(404, `No route for ${req.method ?? 'GET'} ${req.url ?? '/'}.`, 'invalid_request_error', 'not_found');
  const allow = allowOf(route);
  if (!allow.split(', ').includes(req.method ?? 'GET'))
    throw new ApiError(405, `Use ${allow.replace(', ', ' or ')} for ${route.path}.`, 'invalid_request_error', 'method_not_allowed', null, { allow });
  return route.handle(ctx);
}

/** Sets the CORS headers of a listed origin; returns that origin, or undefined for any other. */
function corsHeaders(cors: readonly string[] | undefined, req: IncomingMessage, res: ServerResponse): string | undefined {
  const origin = req.headers.origin;
  const allowed = origin !== undefined && cors?.includes(origin) === true ? origin : undefined;
  if (allowed !== undefined) {
    res.setHeader('access-control-allow-origin', allowed);
    res.setHeader('access-control-expose-headers', 'traceparent, retry-after, x-request-id');
  }
  if (cors !== undefined) res.setHeader('vary', 'Origin');
  return allowed;
}

function preflight(ctx: RequestContext, route: Route, corsOrigin: string | undefined): void {
  if (corsOrigin === undefined) throw new ApiError(403, 'This origin may not call the API from a browser.', 'invalid_request_error', 'origin_not_allowed');
  ctx.res.writeHead(204, {
    'access-control-allow-methods': `${allowOf(route)}, OPTIONS`,
    'access-control-allow-headers': ctx.req.headers['access-control-request-headers'] ?? 'authorization, content-type',
    'access-control-max-age': '600',
  });
  ctx.res.end();
}

/** Sends a failed request its error, and logs a refused `/v1` one. */
function refuse(ctx: RequestContext, err: unknown): void {
  const error = toApiError(err);
  sendError(ctx.res, error);
  if (err instanceof ApiError && err.status === 413) ctx.req.resume();
  if (ctx.route?.api !== true) return;
  ctx.log({
    outcome: error.status >= 500 ? 'failed' : 'refused',
    status: error.status,
    // The client's message, and what caused it when it is not the client's (a 500's real error).
    error: { code: error.code ?? error.type, message: error.message, ...(err !== error && { cause: errorField(err)?.message ?? String(err) }) },
  });
}
