/**
 * The HTTP API of a sluice server, as a `(req, res)` handler for `node:http`: its routes —
 * OpenAI-compatible chat and text completions (streamed as server-sent events, or whole),
 * embeddings, models, passages — Prometheus metrics, and health and readiness probes. The
 * options are in http-options.ts, the wire formats in openai-wire.ts and completions-wire.ts.
 *
 * Streaming honours the client's pace end to end: a token is asked of the worker only
 * after the previous one was accepted by the socket (`res.write` returned true, or
 * `drain` fired), so a slow reader pauses decoding instead of filling memory. A client
 * that disconnects aborts the generation: the worker's `AbortSignal` fires and no
 * further step runs.
 */
import type * as z from 'zod';
import { type TokenLimit, limitTokens } from './token-limit.js';
import { randomUUID } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { parseOptions } from '../flow/options.js';
import { AbortedError, SluiceError } from '../core/errors.js';
import type { GenerateRequest, GenerationDone, ModelWorker } from '../ai/inference/worker.js';
import { jsonWorker, type JsonFormat } from '../ai/inference/json-worker.js';

import { pathOf } from './protocol.js';
import { RequestTelemetry } from './telemetry.js';
import {
  ApiError,
  base64Vector,
  chatSchema,
  embeddingsSchema,
  type EmbeddingModel,
  mergeDelta,
  openAiFinish,
  passthroughChatSchema,
  bodyError,
  toApiError,
  toGenerateRequest,
  type ChatWorker,
} from './openai-wire.js';
import { headerValue, readJson, sendError, sendJson } from './http-io.js';
import { streamCompletion } from './sse.js';
import { chatFraming, type Framing } from './framing.js';
import { completionsSchema, passthroughCompletionsSchema, promptOf, textFraming, toCompletionRequest } from './completions-wire.js';
import type { StageStats } from '../flow/stats.js';
import { errorField, round } from './request-log.js';

export type { ChatWorker } from './openai-wire.js';
export type { HttpHandlerOptions } from './http-options.js';
import { optionsSchema, type HttpHandlerOptions } from './http-options.js';

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

const ROUTES = new Set(['/v1/chat/completions', '/v1/completions', '/v1/embeddings', '/v1/models', '/v1/passages', '/metrics', '/healthz', '/readyz']);
/** `/v1/models/{id}`: one route (and one metrics label) for every id. */
const MODEL_ROUTE = '/v1/models/{id}';
/** A completion's id is its request's (`x-request-id`), prefixed as OpenAI's are; other requests' ids are `req-…`. */
const ID_PREFIXES: Readonly<Record<string, string>> = { '/v1/chat/completions': 'chatcmpl-', '/v1/completions': 'cmpl-' };
/** What a framed answer needs of its body. */
interface AnswerShape {
  readonly model: string;
  readonly stream?: boolean | null | undefined;
  readonly stream_options?: { readonly include_usage?: boolean | undefined } | null | undefined;
}
const MODEL_PREFIX = '/v1/models/';

/** The methods each route answers; any other gets 405 with `Allow`. */
function allowed(route: string): string {
  return route === '/v1/chat/completions' || route === '/v1/completions' || route === '/v1/embeddings' ? 'POST' : 'GET, HEAD';
}

/** What a request refused by a drain is told: retry soon, the next attempt will reach another instance. */
const DRAIN_RETRY_AFTER = { 'retry-after': '1' } as const;

/** JSON bodies only: `text/plain` and form posts are what a cross-site page can send without a preflight. */
const JSON_TYPE = /^application\/(?:[\w.+-]+\+)?json\s*(?:;|$)/i;

/**
 * Builds the request listener. Routes: `POST /v1/chat/completions`, `POST /v1/embeddings`,
 * `GET /v1/models`, `GET /v1/models/{id}`, `GET /v1/passages?source=` (with `passages`),
 * `GET /metrics`, `GET /healthz` (the process is up), `GET /readyz` (models loaded and
 * not draining, else 503).
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
  const config = parseOptions(optionsSchema(), options, 'HTTP handler options');
  const workers = new Map<string, ChatWorker>(Object.entries(config.workers ?? {}));
  if (config.worker !== undefined && !workers.has(config.worker.name)) workers.set(config.worker.name, config.worker);
  const telemetry = new RequestTelemetry({
    tracer: config.tracer,
    metrics: config.metrics,
    sampleRate: config.sampleRate,
    requestLog: config.requestLog,
    requests: config.requests,
    graph: config.graph,
  });
  let draining = false;
  let inFlight = 0;
  let idle: (() => void) | undefined;
  /** Ends a completion in flight with a shutdown error, by the drain's deadline. */
  const interrupts = new Set<() => void>();

  const embedders = new Map<string, EmbeddingModel>(Object.entries(config.embeddings ?? {}));

  /** A POST's JSON body: 415 for another content type (what a cross-site form can send), 503 while draining. */
  const readBody = (req: IncomingMessage): Promise<unknown> => {
    if (!JSON_TYPE.test(req.headers['content-type'] ?? '')) {
      throw new ApiError(415, 'The request body must be JSON (content-type: application/json).', 'invalid_request_error', 'unsupported_media_type');
    }
    if (draining)
      throw new ApiError(503, 'The server is shutting down; retry on another instance.', 'server_error', 'server_shutting_down', null, DRAIN_RETRY_AFTER);
    return readJson(req, config.maxBodyBytes);
  };

  /** Takes a slot of the request's tenant (429 `tenant_quota` when it has none left); the returned function gives it back. */
  const admitTenant = (tenant: string | undefined): (() => void) => {
    const quotas = tenant === undefined ? undefined : config.tenantQuotas;
    if (quotas === undefined) return () => {};
    const refused = quotas.acquire(tenant!);
    if (refused !== undefined) {
      const headers: Record<string, string> =
        refused.retryAfter === undefined ? {} : { 'retry-after': String(Math.max(1, Math.ceil(refused.retryAfter / 1000))) };
      throw new ApiError(429, `Tenant quota: ${refused.message}.`, 'requests', 'tenant_quota', null, headers);
    }
    return () => quotas.release(tenant!);
  };

  const embeddings = async (req: IncomingMessage, res: ServerResponse, requestId: string): Promise<void> => {
    const raw = await readBody(req);
    const named =
      typeof raw === 'object' && raw !== null && typeof (raw as { model?: unknown }).model === 'string' ? (raw as { model: string }).model : undefined;
    // An upstream's model gets the body as it is: its token ids, dimensions and vendor fields are its business.
    if (named !== undefined && !embedders.has(named) && config.upstreamEmbeddings !== undefined) {
      const controller = new AbortController();
      const leave = () => {
        if (!res.writableFinished) controller.abort(new AbortedError('embeddings', 'the client disconnected'));
      };
      res.on('close', leave);
      const tenant = config.tenant?.(req);
      const release = admitTenant(tenant);
      const startedAt = performance.now();
      try {
        const forwarded = config.upstreamEmbeddings(named, raw as Record<string, unknown>, controller.signal);
        if (forwarded !== undefined) {
          const answer = await forwarded;
          sendJson(res, 200, answer);
          const usage = (answer as { usage?: { prompt_tokens?: unknown } } | null)?.usage?.prompt_tokens;
          config.requestLog?.({
            transport: 'http',
            id: requestId,
            ...(tenant !== undefined && { tenant }),
            model: named,
            outcome: 'completed',
            status: 200,
            ...(typeof usage === 'number' && { inputTokens: usage }),
            durationMs: round(performance.now() - startedAt),
          });
          return;
        }
      } finally {
        res.off('close', leave);
        release();
      }
    }
    const parsed = embeddingsSchema().safeParse(raw);
    if (!parsed.success) throw bodyError(parsed.error.issues[0]!);
    const body = parsed.data;
    const model = embedders.get(body.model);
    if (model === undefined)
      throw new ApiError(404, `The model \`${body.model}\` does not exist or does not embed.`, 'invalid_request_error', 'model_not_found', 'model');
    const texts = typeof body.input === 'string' ? [body.input] : body.input;
    const tenant = config.tenant?.(req);
    const release = admitTenant(tenant);
    const startedAt = performance.now();
    let result: Awaited<ReturnType<EmbeddingModel['embed']>>;
    try {
      result = await model.embed(texts);
    } finally {
      release();
    }
    const { vectors, tokens } = result;
    const size = vectors[0]?.length ?? 0;
    if (body.dimensions != null && body.dimensions !== size)
      throw new ApiError(400, `dimensions must be ${size} for ${body.model} (it cannot be shortened)`, 'invalid_request_error', 'invalid_value', 'dimensions');
    const base64 = body.encoding_format === 'base64';
    sendJson(res, 200, {
      object: 'list',
      data: vectors.map((vector, index) => ({ object: 'embedding', index, embedding: base64 ? base64Vector(vector) : Array.from(vector) })),
      model: body.model,
      usage: { prompt_tokens: tokens, total_tokens: tokens },
    });
    config.requestLog?.({
      transport: 'http',
      id: requestId,
      ...(tenant !== undefined && { tenant }),
      model: body.model,
      outcome: 'completed',
      status: 200,
      inputTokens: tokens,
      durationMs: round(performance.now() - startedAt),
    });
  };

  const chat = async (req: IncomingMessage, res: ServerResponse, arrivedAt: number, id: string): Promise<void> => {
    // An upstream's model takes the fields sluice does not know (tools, response_format...) and forwards them.
    const { body: chatBody, forwarded, served } = await modelBody(req, chatSchema(), passthroughChatSchema());
    const passthrough = forwarded !== undefined;
    // An upstream checks its own formats; a model here is told the format and its answer validated.
    const format = passthrough || !('response_format' in chatBody) ? undefined : (chatBody.response_format as JsonFormat | { type: 'text' } | null | undefined);
    const worker = format == null || format.type === 'text' ? served : jsonAnswers(served, format);
    const request = toGenerateRequest(chatBody, config.maxTokens, forwarded);
    await admitted(req, (tenant) => generate(req, res, arrivedAt, id, chatBody, worker, request, tenant, chatFraming));
  };

  /** `POST /v1/completions`: a prompt continued as it is (no chat template), framed as `text_completion`. */
  const completions = async (req: IncomingMessage, res: ServerResponse, arrivedAt: number, id: string): Promise<void> => {
    const { body: completionBody, forwarded, served } = await modelBody(req, completionsSchema(), passthroughCompletionsSchema());
    const passthrough = forwarded !== undefined;
    const request = toCompletionRequest(completionBody, config.maxTokens, forwarded);
    // An upstream echoes its own prompt; here the echo is the prompt's text.
    const framing = textFraming(completionBody.echo === true && !passthrough ? promptOf(completionBody) : undefined);
    await admitted(req, (tenant) => generate(req, res, arrivedAt, id, completionBody, served, request, tenant, framing));
  };

  /**
   * A POST body checked by the schema of the model it names — an upstream's (`forwarded`: the body as
   * sent, for the upstream) or one served here — and that model's worker; 404 for no such model.
   */
  const modelBody = async <L extends z.ZodType<{ readonly model: string }>, U extends z.ZodType<{ readonly model: string }>>(
    req: IncomingMessage,
    local: L,
    upstream: U,
  ): Promise<{ body: z.output<L> | z.output<U>; forwarded: Record<string, unknown> | undefined; served: ChatWorker }> => {
    const raw = await readBody(req);
    const named =
      typeof raw === 'object' && raw !== null && typeof (raw as { model?: unknown }).model === 'string' ? (raw as { model: string }).model : undefined;
    const passthrough = named !== undefined && workers.get(named)?.passthrough === true;
    const parsed = (passthrough ? upstream : local).safeParse(raw);
    if (!parsed.success) throw bodyError(parsed.error.issues[0]!);
    const body = parsed.data as z.output<L> | z.output<U>;
    const served = workers.get(body.model);
    if (served === undefined) throw new ApiError(404, `The model \`${body.model}\` does not exist.`, 'invalid_request_error', 'model_not_found', 'model');
    return { body, forwarded: passthrough ? (raw as Record<string, unknown>) : undefined, served };
  };

  /** Runs `work` holding a slot of the request's tenant, counted as in flight for the drain. */
  const admitted = async (req: IncomingMessage, work: (tenant: string | undefined) => Promise<void>): Promise<void> => {
    const tenant = config.tenant?.(req);
    const release = admitTenant(tenant);
    inFlight++;
    try {
      await work(tenant);
    } finally {
      release();
      if (--inFlight === 0) idle?.();
    }
  };

  const generate = (
    req: IncomingMessage,
    res: ServerResponse,
    arrivedAt: number,
    id: string,
    body: AnswerShape,
    worker: ChatWorker,
    request: GenerateRequest,
    tenant: string | undefined,
    framing: Framing,
  ): Promise<void> => {
    const arrivedEpoch = Date.now() - (performance.now() - arrivedAt);
    const incoming = headerValue(req.headers.traceparent);
    const requestTrace = telemetry.begin({ model: body.model, request, traceparent: incoming, startTime: arrivedEpoch, transport: 'http', tenant, logId: id });
    const trace = requestTrace.trace;
    const created = Math.floor(Date.now() / 1000);
    const controller = new AbortController();
    let interrupted: SluiceError | undefined;
    let cancelled: ApiError | undefined;
    const interrupt = () => {
      interrupted = new SluiceError('SHUTDOWN', 'The server shut down before this completion finished; retry on another instance.');
      controller.abort(interrupted);
    };
    interrupts.add(interrupt);
    // An operator's cancel (the inspector): the model stops as for a client that left, and the client is told so.
    requestTrace.cancelWith(() => {
      // 409 alone is retried by the OpenAI SDKs (a lock timeout to them): the header says this one is final.
      cancelled ??= new ApiError(409, 'The request was cancelled by an operator.', 'invalid_request_error', 'request_cancelled', null, {
        'x-should-retry': 'false',
      });
      controller.abort(new AbortedError(config.stage, 'cancelled by an operator'));
    });
    const onClose = () => {
      // `close` after `finish` is the normal end; before it, the client left.
      if (!res.writableFinished) controller.abort(new AbortedError(config.stage, 'the client disconnected'));
    };
    res.on('close', onClose);
    res.setHeader('traceparent', requestTrace.traceparent);

    let done: GenerationDone | undefined;
    let paused = 0;
    const startedAt = performance.now();

    const finish = (error: unknown): void => {
      interrupts.delete(interrupt);
      res.off('close', onClose);
      const endedAt = performance.now();
      // A pipeline (sluice-rag, a guarded model) counted the request in its own stages, a blocked one in its guard only: once per element.
      if (worker.stages === undefined && trace.record(config.stage) === undefined) {
        countEdgeStage(config.stageStats, error, controller.signal.aborted && interrupted === undefined);
        trace.addRecord({
          stage: config.stage,
          queueWait: startedAt - arrivedAt,
          service: Math.max(0, endedAt - startedAt - paused),
          paused,
          retries: 0,
          conflated: 0,
        });
      }
      requestTrace.end({ responseId: id, done, error: error ?? (controller.signal.aborted ? controller.signal.reason : undefined), status: res.statusCode });
    };

    return new Promise<void>((resolve) => {
      const end = (error: unknown) => {
        finish(error);
        resolve();
      };
      let limit: TokenLimit;
      try {
        const generated = worker.generate(request, {
          signal: controller.signal,
          trace,
          stage: config.stage,
          onDone: (d) => (done = d),
          ...(tenant !== undefined && { tenant }),
        });
        limit = limitTokens(generated, request.max_tokens ?? config.maxTokens);
      } catch (err) {
        sendError(res, toApiError(err));
        return end(err);
      }
      const flow = limit.tokens;
      const reported = () => (done = limit.done(done));
      if (body.stream === true) {
        streamCompletion(res, flow, {
          id,
          created,
          model: body.model,
          framing,
          includeUsage: body.stream_options?.include_usage === true,
          getDone: reported,
          onPaused: (ms) => (paused += ms),
          onToken: (token) => requestTrace.token(token.text),
          end,
          interrupted: () => interrupted ?? cancelled,
          cancelled: () => cancelled,
        });
      } else {
        let text = '';
        const extra: Record<string, unknown> = {};
        flow.subscribe({
          next: (token) => {
            requestTrace.token(token.text);
            text += token.text;
            if (token.delta !== undefined) mergeDelta(extra, token.delta);
          },
          error: (err: unknown) => {
            if (interrupted !== undefined) sendError(res, toApiError(interrupted));
            else if (cancelled !== undefined) sendError(res, cancelled);
            else if (!controller.signal.aborted) sendError(res, toApiError(err));
            end(controller.signal.aborted && interrupted === undefined ? undefined : (interrupted ?? err));
          },
          complete: () => {
            if (cancelled !== undefined) {
              sendError(res, cancelled);
              return end(undefined);
            }
            reported();
            const usage = done?.usage ?? { inputTokens: 0, outputTokens: 0 };
            sendJson(res, 200, {
              id,
              object: framing.wholeObject,
              created,
              model: body.model,
              choices: [framing.whole(text, extra, openAiFinish(done))],
              usage: { prompt_tokens: usage.inputTokens, completion_tokens: usage.outputTokens, total_tokens: usage.inputTokens + usage.outputTokens },
            });
            end(undefined);
          },
        });
      }
    });
  };

  const handler = (req: IncomingMessage, res: ServerResponse): void => {
    const arrivedAt = performance.now();
    const path = pathOf(req.url);
    const route = ROUTES.has(path) ? path : path.startsWith(MODEL_PREFIX) && path.length > MODEL_PREFIX.length ? MODEL_ROUTE : 'other';
    // Every API answer names its request, as OpenAI's do: the id a client quotes is the id of its log line (a completion's is its own id).
    const requestId = `${ID_PREFIXES[path] ?? 'req-'}${randomUUID()}`;
    if (path.startsWith('/v1/')) res.setHeader('x-request-id', requestId);
    res.on('close', () => {
      // A client that left mid-stream still got a 200 status line: the class records what was sent.
      config.metrics?.observeRequest({ route, status: res.statusCode, seconds: (performance.now() - arrivedAt) / 1000 });
    });
    serve(req, res, route, arrivedAt, requestId).catch((err: unknown) => {
      const error = toApiError(err);
      sendError(res, error);
      if (err instanceof ApiError && err.status === 413) req.resume();
      if (route.startsWith('/v1/'))
        config.requestLog?.({
          transport: 'http',
          id: requestId,
          ...(config.tenant !== undefined && { tenant: config.tenant(req) }),
          outcome: error.status >= 500 ? 'failed' : 'refused',
          status: error.status,
          durationMs: round(performance.now() - arrivedAt),
          // The client's message, and what caused it when it is not the client's (a 500's real error).
          error: { code: error.code ?? error.type, message: error.message, ...(err !== error && { cause: errorField(err)?.message ?? String(err) }) },
        });
    });
  };

  const serve = async (req: IncomingMessage, res: ServerResponse, route: string, arrivedAt: number, requestId: string): Promise<void> => {
    const origin = req.headers.origin;
    const corsOrigin = origin !== undefined && config.cors?.includes(origin) === true ? origin : undefined;
    if (corsOrigin !== undefined) {
      res.setHeader('access-control-allow-origin', corsOrigin);
      res.setHeader('access-control-expose-headers', 'traceparent, retry-after, x-request-id');
    }
    if (config.cors !== undefined) res.setHeader('vary', 'Origin');
    // A preflight carries no credentials: it is answered before auth, for the listed origins only.
    if (req.method === 'OPTIONS' && route.startsWith('/v1/')) {
      if (corsOrigin === undefined) throw new ApiError(403, 'This origin may not call the API from a browser.', 'invalid_request_error', 'origin_not_allowed');
      res.writeHead(204, {
        'access-control-allow-methods': `${allowed(route)}, OPTIONS`,
        'access-control-allow-headers': req.headers['access-control-request-headers'] ?? 'authorization, content-type',
        'access-control-max-age': '600',
      });
      res.end();
      return;
    }
    if (route.startsWith('/v1/') && config.auth !== undefined && !(await config.auth(req))) {
      throw new ApiError(401, 'Invalid or missing API key.', 'invalid_request_error', 'invalid_api_key');
    }
    if (route !== 'other') {
      const allow = allowed(route);
      if (!allow.split(', ').includes(req.method ?? 'GET')) {
        throw new ApiError(405, `Use ${allow.replace(', ', ' or ')} for ${route}.`, 'invalid_request_error', 'method_not_allowed', null, { allow });
      }
    }
    switch (route) {
      case '/v1/chat/completions':
        return chat(req, res, arrivedAt, requestId);
      case '/v1/completions':
        return completions(req, res, arrivedAt, requestId);
      case '/v1/embeddings':
        return embeddings(req, res, requestId);
      case '/v1/models':
        return sendJson(res, 200, { object: 'list', data: [...workers.keys(), ...embedders.keys()].map(modelObject) });
      case '/v1/passages': {
        if (config.passages === undefined) throw new ApiError(404, 'This server has no corpus.', 'invalid_request_error', 'not_found');
        const source = new URL(req.url ?? '/', 'http://x').searchParams.get('source');
        if (source === null || source === '')
          throw new ApiError(400, 'Give the cited source: ?source=<file › heading>.', 'invalid_request_error', 'missing_source', 'source');
        const found = config.passages(source);
        if (found.length === 0) throw new ApiError(404, `No passage has the source \`${source}\`.`, 'invalid_request_error', 'passage_not_found', 'source');
        return sendJson(res, 200, { object: 'list', data: found.map((p) => ({ object: 'passage', id: p.id, source: p.source, text: p.text })) });
      }
      case MODEL_ROUTE: {
        const id = decodeURIComponent(pathOf(req.url).slice(MODEL_PREFIX.length));
        if (!workers.has(id) && !embedders.has(id))
          throw new ApiError(404, `The model \`${id}\` does not exist.`, 'invalid_request_error', 'model_not_found', 'model');
        return sendJson(res, 200, modelObject(id));
      }
      case '/metrics': {
        if (config.metrics === undefined) throw new ApiError(404, 'Metrics are not enabled.', 'invalid_request_error', 'not_found');
        const { contentType, body } = await config.metrics.scrape(headerValue(req.headers.accept));
        res.writeHead(200, { 'content-type': contentType });
        res.end(body);
        return;
      }
      case '/healthz':
        return sendJson(res, 200, { status: 'ok' });
      case '/readyz': {
        const ready = !draining && (config.ready?.() ?? true);
        return sendJson(res, ready ? 200 : 503, { status: ready ? 'ready' : draining ? 'draining' : 'loading' });
      }
      default:
        throw new ApiError(404, `No route for ${req.method ?? 'GET'} ${req.url ?? '/'}.`, 'invalid_request_error', 'not_found');
    }
  };

  return Object.defineProperties(handler, {
    draining: { get: () => draining, enumerable: true },
    inFlight: { get: () => inFlight, enumerable: true },
    drain: {
      value: async (deadline?: number): Promise<HttpDrainReport> => {
        draining = true;
        const running = inFlight;
        const settled = () =>
          inFlight === 0
            ? Promise.resolve()
            : new Promise<void>((resolve) => {
                const previous = idle;
                idle = () => {
                  previous?.();
                  resolve();
                };
              });
        if (deadline === undefined) {
          await settled();
          return { running, interrupted: 0 };
        }
        let timer: NodeJS.Timeout | undefined;
        await Promise.race([settled(), new Promise<void>((resolve) => (timer = setTimeout(resolve, deadline)))]);
        clearTimeout(timer);
        const interrupted = interrupts.size;
        for (const interrupt of [...interrupts]) interrupt();
        await settled();
        return { running, interrupted };
      },
    },
  }) as HttpHandler;
}

function modelObject(id: string): { id: string; object: 'model'; created: number; owned_by: string } {
  return { id, object: 'model', created: 0, owned_by: 'sluice' };
}

/** A request the handler observed as its stage: entered, then delivered, given back (the client left) or failed. */
function countEdgeStage(stats: StageStats | undefined, error: unknown, cancelled: boolean): void {
  if (stats === undefined) return;
  stats.receivedCount++;
  if (cancelled) stats.shed.cancelled++;
  else if (error !== undefined) stats.failed++;
  else {
    stats.deliveredCount++;
    stats.emittedCount++;
  }
}

/** `served` answering in `format` (an invalid JSON Schema is the client's 400). */
function jsonAnswers(served: ChatWorker, format: JsonFormat): ChatWorker {
  try {
    return jsonWorker(served as ModelWorker, format);
  } catch (err) {
    throw toApiError(err);
  }
}
