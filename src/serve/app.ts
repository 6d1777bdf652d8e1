/**
 * The sluice server, assembled: what `sluice serve` runs. One `node:http` server carries
 *
 * - `GET /` — the chat page (examples/chat.html): streams tokens over WebSocket, can cancel;
 * - `/v1/ws` — the WebSocket token protocol `sluice.v1` (`attachTokenSocket`);
 * - `POST /v1/chat/completions`, `GET /v1/models` — the OpenAI-compatible API;
 * - `GET /metrics`, `/healthz`, `/readyz`;
 * - `GET /inspect` — the pipeline inspector (examples/inspect.html), its feed `/inspect/events`
 *   and `POST /inspect/requests/{id}/cancel`, guarded as the API is (docs/inspect.md).
 *
 * On embedded defaults it needs nothing outside the package: the models are generated
 * from code into `models` on first start, the corpus is the bundled one. The models
 * served are `sluice-rag` (guard → embed → retrieve → assemble → character LM) and
 * `charlm` (the language model alone). Every ONNX session lives in a worker-thread
 * pool, so inference never blocks the event loop.
 */
import { readFile } from 'node:fs/promises';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { availableParallelism } from 'node:os';
import { findUp } from '../core/package-files.js';
import { lazySchema } from '../core/zod.js';
import { parseOptions, positiveInt } from '../flow/options.js';
import { listenFields } from './transport-options.js';
import { StageStats } from '../flow/stats.js';
import type { GatewayOptions, UpstreamOptions } from '../ai/inference/gateway.js';
import type { ModelWorker } from '../ai/inference/worker.js';
import { guardedWorker } from '../ai/pipelines/guarded-worker.js';
import { redactedWorker } from '../ai/pipelines/redacted-worker.js';
import { PII_KINDS, type PiiKind } from '../ai/stages/pii-detectors.js';
import { RedactStats } from '../ai/stages/redact-options.js';
import type { InferencePoolStats } from '../ai/pool/pool.js';
import { BUNDLED_CORPUS, documentsIn } from '../ai/rag/corpus.js';
import { RETRIEVAL_MODES, type RetrievalMode } from '../ai/rag/retriever.js';
import { type Backend, type LocalModelSpec, embeddedBackend, gatewayBackend } from './backends.js';
import { createHttpHandler } from './http.js';
import { sendError } from './http-io.js';
import { ApiError } from './openai-wire.js';
import { SluiceMetrics } from './metrics.js';
import { bearerOf, pathOf } from './protocol.js';
import { attachTokenSocket, type TokenSocketEvent, type TokenSocketLimits, type TokenSocketStats } from './ws-server.js';
import { DEFAULT_LIMITS } from './ws/options.js';
import { TenantQuotas } from './tenant-quotas.js';
import { Intake } from '../ai/pipelines/intake.js';
import { PRIORITY_CLASSES, type PriorityClass } from '../core/vocabulary.js';
import { defaultMaxQueue, servedPipelines, type ServedPipelines } from './served-pipelines.js';
import type { RequestLog } from './request-log.js';
import { isLoopback, loopbackHost } from './loopback.js';
import { ruleViolations } from './serve-rules.js';
import { PipelineGraph } from './inspect/pipeline-graph.js';
import { RequestRegistry } from './inspect/requests.js';
import { INSPECT_PAGE } from './inspect/inspector.js';
import { inspectRoutes, type InspectRoutes } from './inspect/routes.js';
import { OPERATOR, type InspectViewer } from './inspect/snapshot.js';

export { isLoopback } from './loopback.js';

/** Where the WebSocket protocol is served. */
export const WS_PATH = '/v1/ws';

/** The chat page, from source or from `dist/`. */
const CHAT_PAGE = findUp(import.meta.url, 'examples/chat.html');

/** Options of `startServer`: the models, the port, the limits and the optional features. */
export interface ServeOptions {
  /** Interface to listen on. Default `127.0.0.1`. */
  readonly host?: string;
  /** Port; 0 picks a free one. Default 8787. */
  readonly port?: number;
  /**
   * Bearer tokens accepted, each with its tenant (`{ token: tenant }`). Without any, the
   * server is open — allowed only on a loopback host unless `insecure` is set.
   */
  readonly tokens?: Readonly<Record<string, string>>;
  /** Serve without tokens on a non-loopback host. Default false. */
  readonly insecure?: boolean;
  /** Origins browsers may connect from (WebSocket 403 otherwise). Default: any. */
  readonly origins?: readonly string[];
  /** Folder of the model files; missing ones are generated there. Default `models`. */
  readonly models?: string;
  /** Folder of markdown documents to answer from. Default: the bundled corpus, except in gateway mode (no retrieval without one). */
  readonly corpus?: string;
  /**
   * Decoders the user exported (`model.onnx` or `onnx/model.onnx`, `tokenizer.json`,
   * `tokenizer_config.json`), each served under its directory's name (or `name`), the first
   * as the default model; sluice-rag then answers with the first. Checked before serving:
   * a bad one fails the start with `LocalModelError` naming the file. Needs the optional
   * peers `@huggingface/tokenizers` and `@huggingface/jinja`.
   */
  readonly localModels?: readonly LocalModelSpec[];
  /**
   * Your own sentence-embedding model's directory (sentence-transformers / Optimum ONNX layout:
   * `model.onnx` or `onnx/model.onnx`, `tokenizer.json`, `1_Pooling/config.json`, `modules.json`),
   * in place of the generated one: it embeds the corpus, the questions and `/v1/embeddings`. Checked
   * before serving; a bad one fails the start with `EmbeddingDirError` naming the file. Needs the
   * optional peer `@huggingface/tokenizers`.
   */
  readonly embedModel?: string;
  /** Inference worker threads. Default `min(cores, 2)`. */
  readonly poolSize?: number;
  /** How long, ms, running requests may go on after SIGTERM before they are ended. Default 10 000. */
  readonly shutdownTimeout?: number;
  /** WebSocket limits (`attachTokenSocket`). */
  readonly limits?: Partial<TokenSocketLimits>;
  /** Log lines (start-up, refusals, shutdown). Never given a token or a prompt. Default: none. */
  readonly log?: (line: string) => void;
  /**
   * The language model to serve instead of loading the generated one in this process: e.g. a
   * `remoteModel` of `sluice/nats`, whose generations run in worker processes. The edge
   * (sockets, HTTP, admission, caches), the guard, embedding and retrieval stay here.
   */
  readonly languageModel?: ModelWorker;
  /**
   * Gateway mode: serve the models of these OpenAI-compatible servers (tried in order, or
   * first by weight) instead of the embedded ones. Nothing is generated or loaded here.
   */
  readonly upstreams?: readonly UpstreamOptions[];
  /** Retries, timeouts and breakers of gateway mode (`Gateway.start`); needs `upstreams`. */
  readonly gateway?: Omit<GatewayOptions, 'upstreams'>;
  /**
   * Gateway mode with a `corpus`: the upstream model that writes `sluice-rag`'s answers from
   * the passages retrieved here. Default: the first model the upstreams list.
   */
  readonly ragModel?: string;
  /** How `sluice-rag` ranks passages: `hybrid` (BM25 and the embedding, fused), `dense` or `lexical`. Default `hybrid`. */
  readonly retrieval?: RetrievalMode;
  /** Classify every prompt for injection with the embedded guard model, for every model (`sluice-rag` always does). Default false. */
  readonly guard?: boolean;
  /** Redact personal data from every answer as it streams: true for every kind, or the kinds to redact. Default: none. */
  readonly redact?: boolean | readonly PiiKind[];
  /** One entry per request, HTTP and WebSocket: id, tenant, model, outcome, tokens, time to first token, duration, error and cause. Never a prompt, token or key. */
  readonly requestLog?: RequestLog;
  /** Serve the pipeline inspector on `/inspect` (its feed and cancel need a token, as the API does). Default true. */
  readonly inspect?: boolean;
  /**
   * Operators' tokens: they open the inspector on every tenant's requests (an API token shows
   * only its own tenant's). Accepted by `/inspect` only, not by the API. Needs `tokens`: an open
   * server's inspector is open to whoever reaches it.
   */
  readonly inspectTokens?: readonly string[];
  /**
   * Show each running request's prompt (the last user message, its first 400 characters) and
   * the last 400 characters of its answer on the inspector, to whoever may see that request
   * (its tenant, an operator). Default false: the inspector shows figures, never users' text.
   */
  readonly inspectContent?: boolean;
  /**
   * Requests waiting at the server's door, across models and transports; past it the lowest class
   * is refused at once (429 with `Retry-After`). Default 64 per core, at least 64.
   */
  readonly maxQueue?: number;
  /** The longest a request should wait at the door, ms: the queue holds no more than drains in that time (see `IntakeOptions.maxWait`). Default: only `maxQueue`. */
  readonly maxQueueWait?: number;
  /** While the event loop runs later than this (ms), HTTP completions are refused at the door (429, the intake's `lagging` shed); `priority` ones still enter. Default: no such bound. */
  readonly maxLoopLag?: number;
  /** Generations streaming at once, per model. Default 64. */
  readonly streams?: number;
  /** Requests each shared stage buffers. Default 16. */
  readonly stageCapacity?: number;
  /** Decode steps of concurrent generations run as one model call (continuous batching), at most. 1 runs each alone. Default 16. */
  readonly maxBatch?: number;
  /** Tokens one batched call of a `--model` decoder feeds at most, prefills included. Default 2048. */
  readonly stepTokens?: number;
  /** MiB the KV caches of a `--model` decoder's generations may hold together between steps; past it the idlest are dropped and rebuilt when they resume. Default 1024. */
  readonly kvCacheMb?: number;
  /** Each tenant's priority class (`low`, `default`, `high`) when a request names none (`service_tier`). */
  readonly tenantPriorities?: Readonly<Record<string, PriorityClass>>;
}

const optionsSchema = lazySchema((z) =>
  z
    .object({
      ...listenFields(z, 8787),
      // Checked as a whole, so an error never names a token (a record key would be in its path).
      tokens: z
        .custom<Record<string, string>>((v) => typeof v === 'object' && v !== null && Object.values(v).every((t) => typeof t === 'string'), {
          error: 'tokens must map each token to its tenant name',
        })
        .refine((t) => Object.keys(t).every((token) => token.length >= 8), { error: 'a token must have at least 8 characters' })
        .refine((t) => Object.values(t).every((tenant) => tenant.length > 0), { error: 'a tenant must not be empty' })
        .default({}),
      insecure: z.boolean().default(false),
      origins: z.array(z.string().url({ error: 'an origin must be a URL like https://app.example.com' })).optional(),
      models: z.string().min(1).default('models'),
      corpus: z.string().min(1).optional(),
      localModels: z
        .array(
          z.union([z.string().min(1), z.object({ dir: z.string().min(1), name: z.string().min(1).optional() }).strict()], {
            error: 'a local model is a directory path or { dir, name }',
          }),
        )
        .optional(),
      embedModel: z.string().min(1, { error: 'embedModel must not be empty' }).optional(),
      poolSize: positiveInt('poolSize').default(Math.min(availableParallelism(), 2)),
      shutdownTimeout: z.number({ error: 'shutdownTimeout must be a number of ms' }).int().min(0, { error: 'shutdownTimeout must be ≥ 0' }).default(10_000),
      limits: z.record(z.string(), z.unknown()).optional(),
      log: z.custom<(line: string) => void>((v) => typeof v === 'function', { error: 'log must be a function' }).optional(),
      languageModel: z
        .custom<ModelWorker>((v) => typeof (v as ModelWorker | undefined)?.generate === 'function' && typeof (v as ModelWorker).name === 'string', {
          error: 'languageModel must be a ModelWorker (name, generate, infer)',
        })
        .optional(),
      // Checked by Gateway.start, which names the bad field under "gateway options".
      upstreams: z.array(z.record(z.string(), z.unknown()), { error: 'upstreams must be an array of { baseUrl, ... }' }).min(1).optional(),
      gateway: z.record(z.string(), z.unknown()).optional(),
      ragModel: z.string().min(1, { error: 'ragModel must not be empty' }).optional(),
      retrieval: z.enum(RETRIEVAL_MODES, { error: `retrieval must be one of ${RETRIEVAL_MODES.join(', ')}` }).optional(),
      guard: z.boolean({ error: 'guard must be true or false' }).default(false),
      redact: z
        .union([z.boolean(), z.array(z.enum(PII_KINDS)).min(1, { error: 'redact: name at least one kind' })], {
          error: `redact must be true or a list of ${PII_KINDS.join(', ')}`,
        })
        .default(false),
      requestLog: z.custom<RequestLog>((v) => typeof v === 'function', { error: 'requestLog must be a function' }).optional(),
      inspect: z.boolean({ error: 'inspect must be true or false' }).default(true),
      // Checked as a whole, so an error never quotes a token.
      inspectTokens: z
        .custom<string[]>((v) => Array.isArray(v) && v.every((t) => typeof t === 'string'), { error: 'inspectTokens must be a list of tokens' })
        .refine((t) => t.every((token) => token.length >= 8), { error: 'an inspect token must have at least 8 characters' })
        .default([]),
      inspectContent: z.boolean({ error: 'inspectContent must be true or false' }).default(false),
      maxQueue: z
        .number({ error: 'maxQueue must be a number' })
        .int({ error: 'maxQueue must be an integer' })
        .min(0, { error: 'maxQueue must be ≥ 0' })
        .default(defaultMaxQueue(availableParallelism())),
      maxQueueWait: positiveInt('maxQueueWait').optional(),
      maxLoopLag: positiveInt('maxLoopLag').optional(),
      streams: positiveInt('streams').default(64),
      stageCapacity: positiveInt('stageCapacity').default(16),
      maxBatch: positiveInt('maxBatch').default(16),
      stepTokens: positiveInt('stepTokens').default(2048),
      kvCacheMb: positiveInt('kvCacheMb').default(1024),
      tenantPriorities: z.record(z.string(), z.enum(PRIORITY_CLASSES, { error: `a priority is one of ${PRIORITY_CLASSES.join(', ')}` })).optional(),
    })
    .strict()
    .refine((o) => !o.inspectContent || o.inspect, {
      error: 'inspectContent shows text on the inspector, which inspect: false turns off',
      path: ['inspectContent'],
    })
    .refine((o) => o.inspectTokens.length === 0 || Object.keys(o.tokens).length > 0, {
      error: "inspectTokens guard the inspector of a server with tokens: give tokens too (an open server's inspector is open)",
      path: ['inspectTokens'],
    })
    .refine((o) => o.inspectTokens.every((token) => !Object.hasOwn(o.tokens, token)), {
      error: "an inspect token must not also be an API token: a tenant's token sees only its own requests",
      path: ['inspectTokens'],
    })
    .refine((o) => o.inspectTokens.length === 0 || o.inspect, {
      error: 'inspectTokens open the inspector, which inspect: false turns off',
      path: ['inspectTokens'],
    })
    .superRefine((o, ctx) => {
      for (const { field, message } of ruleViolations(o)) ctx.addIssue({ code: 'custom', message, path: [field] });
    })
    .refine((o) => Object.keys(o.tokens).length > 0 || o.insecure || isLoopback(o.host), {
      error: 'an open server (no tokens) may only listen on a loopback host: give tokens, or set insecure',
      path: ['tokens'],
    }),
);

/** Counters of a running server. */
export interface ServerStats {
  /** The inference pool; undefined in gateway mode, where no model runs here. */
  readonly pool: InferencePoolStats | undefined;
  /** Each upstream's circuit (`closed`, `open`, `half-open`), in gateway mode. */
  readonly circuits?: Readonly<Record<string, string>>;
  readonly ws: TokenSocketStats;
  readonly httpInFlight: number;
}

/** What a shutdown did, for logs and tests. */
export interface ShutdownReport {
  /** WebSocket requests running at SIGTERM, finished on their own, and ended by the deadline. */
  readonly ws: { readonly running: number; readonly finished: number; readonly interrupted: number };
  /** HTTP completions running at SIGTERM, and ended by the deadline. */
  readonly http: { readonly running: number; readonly interrupted: number };
}

/** A started server: its URLs, models, metrics and stats, and how to shut it down. */
export interface RunningServer {
  /** `http://host:port` */
  readonly url: string;
  /** `ws://host:port/v1/ws` */
  readonly wsUrl: string;
  /** The model names served; the first is the default. */
  readonly models: readonly string[];
  readonly server: Server;
  readonly metrics: SluiceMetrics;
  /** What is running now: the inference pool, the WebSocket server, HTTP completions in flight. */
  stats(): ServerStats;
  /**
   * Graceful shutdown: stops accepting, lets running requests finish for up to
   * `deadline` ms (default `shutdownTimeout`), ends the rest with a `SHUTDOWN` error,
   * closes the sockets and releases the models. Calling it again returns the same promise.
   */
  shutdown(deadline?: number): Promise<ShutdownReport>;
}

/**
 * Starts a sluice server: generates missing models, loads them into an inference pool,
 * indexes the corpus, and listens. Resolves once it is listening and ready.
 *
 * ## Example
 * ```ts
 * const running = await startServer({ port: 0 });
 * console.log(running.url); // http://127.0.0.1:40123
 * process.once('SIGTERM', () => void running.shutdown().then(() => process.exit(0)));
 * ```
 */
export async function startServer(options: ServeOptions = {}): Promise<RunningServer> {
  const config = parseOptions(optionsSchema(), options, 'serve options');
  const log = config.log ?? (() => {});
  // A missing or empty corpus folder fails the start before any model is generated.
  if (options.corpus !== undefined) await documentsIn(options.corpus);
  const intake = new Intake({
    maxQueue: config.maxQueue,
    ...(config.maxQueueWait !== undefined && { maxWait: config.maxQueueWait }),
    ...(config.tenantPriorities !== undefined && { tenants: config.tenantPriorities }),
  });
  const shared = {
    intake,
    streams: config.streams,
    capacity: config.stageCapacity,
    maxBatch: config.maxBatch,
    stepTokens: config.stepTokens,
    kvCacheBytes: config.kvCacheMb * 2 ** 20,
  };
  const backend: Backend =
    options.upstreams !== undefined
      ? await gatewayBackend(
          options.upstreams,
          options.gateway ?? {},
          // The bundled corpus is the embedded models' default; a gateway retrieves only from a corpus it is given.
          {
            models: config.models,
            poolSize: config.poolSize,
            corpus: config.corpus,
            ragModel: config.ragModel,
            guard: config.guard,
            shared,
            embedModel: config.embedModel,
            ...(config.retrieval !== undefined && { retrieval: config.retrieval }),
          },
          log,
        )
      : await embeddedBackend({
          models: config.models,
          corpus: config.corpus ?? BUNDLED_CORPUS,
          poolSize: config.poolSize,
          languageModel: config.languageModel,
          shared,
          ...(config.retrieval !== undefined && { retrieval: config.retrieval }),
          ...(config.localModels !== undefined && { localModels: config.localModels }),
          ...(config.embedModel !== undefined && { embedModel: config.embedModel }),
          log,
        });
  const metrics = new SluiceMetrics();
  // One graph and one request list for the server's life: started once it listens, stopped at shutdown.
  const graph = config.inspect ? new PipelineGraph() : undefined;
  const requests = config.inspect ? new RequestRegistry({ content: config.inspectContent }) : undefined;
  let inspect: InspectRoutes | undefined;
  let piped: ServedPipelines | undefined;
  try {
    const policed = withPolicies(backend, config.guard, config.redact);
    // Every model behind the one door: sluice-rag's own stages, a `stream` stage for the others.
    piped = servedPipelines(policed.workers, { maxQueue: config.maxQueue, streams: config.streams, capacity: config.stageCapacity }, backend.guarded, intake);
    const workers = piped.workers;
    const stages = { ...piped.stages, ...policed.stages };
    // The HTTP edge counts requests to plain models in the generate stage, beside a pipeline's own generate stage.
    const generateStats = stages.generate ?? new StageStats();
    for (const [name, s] of Object.entries({ ...stages, generate: generateStats })) metrics.registerStage(name, s);
    for (const [name, s] of Object.entries(backend.caches ?? {})) metrics.registerCache(name, s);
    for (const breaker of backend.breakers ?? []) metrics.registerBreaker(breaker);
    const pool = backend.pool;
    if (pool !== undefined) metrics.registerPool('serve', () => pool.stats);

    const tenants = new Map(Object.entries(config.tokens));
    const open = tenants.size === 0;
    const operators = new Set(config.inspectTokens);
    // A tenant's token reads its own requests; an operator's, everyone's; anything else is refused.
    const viewerOf = (token: string | undefined): InspectViewer | undefined => {
      if (token === undefined) return undefined;
      if (operators.has(token)) return OPERATOR;
      const tenant = tenants.get(token);
      return tenant === undefined ? undefined : { role: 'tenant', tenant };
    };
    const page = CHAT_PAGE === undefined ? undefined : await readFile(CHAT_PAGE);
    // One count of each tenant's requests for both transports.
    const limits = config.limits as Partial<TokenSocketLimits> | undefined;
    const tenantQuotas = new TenantQuotas({
      tenantConcurrent: limits?.tenantConcurrent ?? DEFAULT_LIMITS.tenantConcurrent,
      tenantRate: limits?.tenantRate ?? DEFAULT_LIMITS.tenantRate,
    });
    const api = createHttpHandler({
      // The origins allowed to open a WebSocket may call the HTTP API from their pages too.
      ...(config.origins !== undefined && { cors: config.origins }),
      ...(backend.embeddings !== undefined && { embeddings: backend.embeddings }),
      ...(backend.passages !== undefined && { passages: backend.passages }),
      ...(backend.upstreamEmbeddings !== undefined && { upstreamEmbeddings: backend.upstreamEmbeddings }),
      tenantQuotas,
      ...(config.requestLog !== undefined && { requestLog: config.requestLog }),
      stageStats: generateStats,
      // Every served model is behind this door (servedPipelines): a full door refuses before a body is parsed.
      intake,
      ...(config.maxLoopLag !== undefined && { maxLoopLag: config.maxLoopLag }),
      // An open server knows no tenants: each peer address counts as one.
      tenant: (req: IncomingMessage) => (open ? `anonymous-${req.socket.remoteAddress ?? 'unknown'}` : tenants.get(bearerOf(req.headers.authorization) ?? '')),
      workers,
      metrics,
      // One max_tokens limit for both transports: the WebSocket server's (default 4096).
      ...(typeof config.limits?.maxTokens === 'number' && { maxTokens: config.limits.maxTokens }),
      ...(!open && { auth: (req: IncomingMessage) => tenants.has(bearerOf(req.headers.authorization) ?? '') }),
      ...(requests !== undefined && { requests }),
      ...(graph !== undefined && { graph }),
    });
    if (graph !== undefined)
      inspect = inspectRoutes({
        sources: { graph, requests, sockets: () => sockets.clients(), ...(backend.upstreams !== undefined && { upstreams: () => backend.upstreams!() }) },
        page: INSPECT_PAGE === undefined ? undefined : await readFile(INSPECT_PAGE),
        ...(!open && { authorize: (req: IncomingMessage) => viewerOf(bearerOf(req.headers.authorization)) }),
        ...(config.origins !== undefined && { origins: config.origins }),
        interval: 500,
        limits: { nodes: 200, rows: 50 },
      });
    // An open server trusts whoever reaches it, so it must be reachable only from this machine: a
    // Host that is not a loopback name is a DNS-rebinding page relaying a browser (refused), and a
    // browser WebSocket must come from the server's own origin (any site could open one otherwise).
    const guardHost = open && !config.insecure;
    const server = createServer(requestListener(guardHost, page, inspect, api));
    const sockets = attachTokenSocket(server, {
      workers,
      tenantQuotas,
      ...(config.requestLog !== undefined && { requestLog: config.requestLog }),
      path: WS_PATH,
      metrics,
      ...(requests !== undefined && { requests }),
      ...(graph !== undefined && { graph }),
      ...(!open && { authenticate: (token: string) => (tenants.has(token) ? { tenant: tenants.get(token)! } : undefined) }),
      ...(config.origins !== undefined
        ? { origins: config.origins }
        : open && {
            origins: (origin: string, req: IncomingMessage) => (!guardHost || loopbackHost(req.headers.host)) && sameOrigin(origin, req.headers.host),
          }),
      ...(config.limits !== undefined && { limits: config.limits as Partial<TokenSocketLimits> }),
      onEvent: (event) => logEvent(log, event),
    });
    refuseOtherUpgrades(server);
    const url = await listen(server, config.port, config.host);
    graph?.start();

    let stopping: Promise<ShutdownReport> | undefined;
    const shutdown = (deadline = config.shutdownTimeout): Promise<ShutdownReport> =>
      (stopping ??= (async () => {
        log(`shutting down: running requests have ${deadline} ms to finish`);
        intake.drain();
        // Keep listening while draining, so a load balancer sees /readyz 503 and late clients a 503 with Retry-After, not a refused connection.
        const [ws, http] = await Promise.all([sockets.drain(deadline), api.drain(deadline)]);
        // The inspector's feeds are long-lived responses: ended here, with its sampler, so nothing outlives the server.
        inspect?.close();
        graph?.stop();
        const closed = new Promise<void>((resolve) => server.close(() => resolve()));
        server.closeAllConnections();
        await closed;
        piped?.close();
        await backend.release();
        metrics.close();
        log(
          `stopped: WebSocket ${ws.finished} finished, ${ws.interrupted} interrupted; HTTP ${http.running - http.interrupted} finished, ${http.interrupted} interrupted`,
        );
        return { ws, http: { running: http.running, interrupted: http.interrupted } };
      })());

    const now = (): ServerStats => ({
      pool: backend.pool?.stats,
      ...(backend.circuits !== undefined && { circuits: backend.circuits() }),
      ws: sockets.stats(),
      httpInFlight: api.inFlight,
    });
    return { url, wsUrl: `${url.replace(/^http/, 'ws')}${WS_PATH}`, models: Object.keys(workers), server, metrics, stats: now, shutdown };
  } catch (err) {
    inspect?.close();
    graph?.stop();
    piped?.close();
    await backend.release();
    metrics.close();
    throw err;
  }
}

/** The server's own routes before the API: the loopback guard of an open server, the chat page, the inspector. */
function requestListener(
  guardHost: boolean,
  page: Buffer | undefined,
  inspect: InspectRoutes | undefined,
  api: (req: IncomingMessage, res: ServerResponse) => void,
): (req: IncomingMessage, res: ServerResponse) => void {
  return (req, res) => {
    if (guardHost && !loopbackHost(req.headers.host))
      return sendError(
        res,
        new ApiError(403, 'This open server answers only requests addressed to a loopback host.', 'invalid_request_error', 'forbidden_host'),
      );
    const path = pathOf(req.url);
    if ((path === '/' || path === '/index.html') && (req.method === 'GET' || req.method === 'HEAD') && page !== undefined)
      return sendPage(res, page, req.method === 'HEAD');
    if (path === '/favicon.ico') return void res.writeHead(204).end();
    if (inspect?.handle(req, res) === true) return;
    api(req, res);
  };
}

/** Upgrades to any other path than the WebSocket's are nobody's: answered and closed, never left open. */
function refuseOtherUpgrades(server: Server): void {
  server.on('upgrade', (req, socket) => {
    if (pathOf(req.url) === WS_PATH) return;
    socket.on('error', () => {});
    socket.end('HTTP/1.1 404 Not Found\r\nConnection: close\r\nContent-Length: 0\r\n\r\n');
    socket.once('finish', () => socket.destroy());
  });
}

/** Listens; resolves with the server's URL. */
async function listen(server: Server, port: number, host: string): Promise<string> {
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const address = server.address() as AddressInfo;
  return `http://${address.family === 'IPv6' ? `[${address.address}]` : address.address}:${address.port}`;
}

/** The backend's workers with the server's policies: the guard in front of those without their own, redaction behind all. */
function withPolicies(backend: Backend, guard: boolean, redact: boolean | readonly PiiKind[]) {
  const stages: Record<string, StageStats> = { ...backend.stages };
  let workers: Record<string, ModelWorker> = { ...backend.workers };
  if (guard) {
    if (backend.classify === undefined) throw new Error('guard: this backend has no guard model');
    const stats = (stages.guard ??= new StageStats());
    const generateStats = (stages.generate ??= new StageStats());
    const classify = backend.classify;
    workers = Object.fromEntries(
      Object.entries(workers).map(([name, worker]) => [name, backend.guarded?.has(name) ? worker : guardedWorker(worker, { classify, stats, generateStats })]),
    );
  }
  if (redact !== false) {
    const stats = new RedactStats();
    stages.redact = stats;
    const options = { stats, ...(redact !== true && { detect: redact }) };
    workers = Object.fromEntries(Object.entries(workers).map(([name, worker]) => [name, redactedWorker(worker, options)]));
  }
  return { workers, stages };
}

function sendPage(res: ServerResponse, page: Buffer, head: boolean): void {
  res.writeHead(200, {
    'content-type': 'text/html; charset=utf-8',
    'content-length': page.length,
    'cache-control': 'no-cache',
    'x-content-type-options': 'nosniff',
    'content-security-policy': "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'",
  });
  res.end(head ? undefined : page);
}

function logEvent(log: (line: string) => void, event: TokenSocketEvent): void {
  switch (event.kind) {
    case 'upgrade-rejected':
      return log(`ws upgrade refused: ${event.status} ${event.reason}${event.closeCode === undefined ? '' : ` (a browser: closed with ${event.closeCode})`}`);
    case 'closed':
      if (event.cause !== 'client') log(`ws connection ${event.connection} closed: ${event.code} (${event.cause})`);
      return;
    default:
      return;
  }
}

/** True when the browser's `Origin` is the page this server served (same host and port). */
function sameOrigin(origin: string, host: string | undefined): boolean {
  try {
    return host !== undefined && new URL(origin).host === host.toLowerCase();
  } catch {
    return false;
  }
}
