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
import { findUp } from '../core/package-files.js';
import { parseOptions } from '../flow/options.js';
import { StageStats } from '../flow/stats.js';
import type { ModelWorker } from '../ai/inference/worker.js';
import { guardedWorker } from '../ai/pipelines/guarded-worker.js';
import { redactedWorker } from '../ai/pipelines/redacted-worker.js';
import type { PiiKind } from '../ai/stages/pii-detectors.js';
import { RedactStats } from '../ai/stages/redact-options.js';
import type { InferencePoolStats } from '../ai/pool/pool.js';
import { BUNDLED_CORPUS, documentsIn } from '../ai/rag/corpus.js';
import { type Backend, embeddedBackend, gatewayBackend } from './backends.js';
import { createHttpHandler } from './http.js';
import { sendError } from './http-io.js';
import { ApiError } from './openai-wire.js';
import { SluiceMetrics } from './metrics.js';
import { pathOf } from './protocol.js';
import { serveOptionsSchema, type ServeOptions } from './serve-options.js';
import { accessOf } from './access.js';
import { attachTokenSocket, type TokenSocketEvent, type TokenSocketLimits, type TokenSocketStats } from './ws-server.js';
import { DEFAULT_LIMITS } from './ws/options.js';
import type { StepBatcherStats } from '../ai/inference/step-batcher.js';
import type { DecodeBatchView } from './inspect/snapshot.js';
import { TenantQuotas } from './tenant-quotas.js';
import { Intake } from '../ai/pipelines/intake.js';
import { servedPipelines, type ServedPipelines } from './served-pipelines.js';
import { loopbackHost } from './loopback.js';
import { PipelineGraph } from './inspect/pipeline-graph.js';
import { RequestRegistry } from './inspect/requests.js';
import { INSPECT_PAGE } from './inspect/inspector.js';
import { inspectRoutes, type InspectRoutes } from './inspect/routes.js';

export { isLoopback } from './loopback.js';
export type { ServeOptions } from './serve-options.js';

/** Where the WebSocket protocol is served. */
export const WS_PATH = '/v1/ws';

/** The chat page, from source or from `dist/`. */
const CHAT_PAGE = findUp(import.meta.url, 'examples/chat.html');

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
  const config = parseOptions(serveOptionsSchema(), options, 'serve options');
  const log = config.log ?? (() => {});
  // A missing or empty corpus folder fails the start before any model is generated.
  if (options.corpus !== undefined) await documentsIn(options.corpus, { ignore: config.corpusIgnore ?? [] });
  const intake = new Intake({
    maxQueue: config.maxQueue,
    ...(config.maxQueueWait !== undefined && { maxWait: config.maxQueueWait }),
    ...(config.tenantPriorities !== undefined && { tenants: config.tenantPriorities }),
  });
  const backend = await openBackend(options, config, intake, log);
  const metrics = new SluiceMetrics();
  // One graph and one request list for the server's life: started once it listens, stopped at shutdown.
  const graph = config.inspect ? new PipelineGraph() : undefined;
  const requests = config.inspect ? new RequestRegistry({ content: config.inspectContent }) : undefined;
  let inspect: InspectRoutes | undefined;
  let piped: ServedPipelines | undefined;
  try {
    const policed = withPolicies(backend, config.guard, config.redact);
    // Every model behind the one door: sluice-rag's own stages, a `stream` stage for the others.
    piped = servedPipelines(policed.workers, { maxQueue: config.maxQueue, streams: config.streams }, backend.guarded, intake);
    const workers = piped.workers;
    const generateStats = registerMetrics(metrics, backend, { ...piped.stages, ...policed.stages });
    const access = accessOf(config.tokens, config.inspectTokens);
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
      tenant: access.tenantOf,
      workers,
      metrics,
      // One max_tokens limit for both transports: the WebSocket server's (default 4096).
      ...(typeof config.limits?.maxTokens === 'number' && { maxTokens: config.limits.maxTokens }),
      ...(!access.open && { auth: access.authorized }),
      ...(requests !== undefined && { requests }),
      ...(graph !== undefined && { graph }),
    });
    if (graph !== undefined)
      inspect = inspectRoutes({
        sources: {
          graph,
          requests,
          sockets: () => sockets.clients(),
          ...(backend.upstreams !== undefined && { upstreams: () => backend.upstreams!() }),
          ...(backend.batchers !== undefined && { batches: () => batchViews(backend.batchers!) }),
        },
        page: INSPECT_PAGE === undefined ? undefined : await readFile(INSPECT_PAGE),
        ...(!access.open && { authorize: access.viewerOf }),
        ...(config.origins !== undefined && { origins: config.origins }),
        interval: 500,
        limits: { nodes: 200, rows: 50 },
      });
    // An open server trusts whoever reaches it, so it must be reachable only from this machine: a
    // Host that is not a loopback name is a DNS-rebinding page relaying a browser (refused), and a
    // browser WebSocket must come from the server's own origin (any site could open one otherwise).
    const guardHost = access.open && !config.insecure;
    const server = createServer(requestListener(guardHost, page, inspect, api));
    const sockets = attachTokenSocket(server, {
      workers,
      tenantQuotas,
      ...(config.requestLog !== undefined && { requestLog: config.requestLog }),
      path: WS_PATH,
      metrics,
      ...(requests !== undefined && { requests }),
      ...(graph !== undefined && { graph }),
      ...(!access.open && { authenticate: access.authenticate }),
      ...(config.origins !== undefined
        ? { origins: config.origins }
        : access.open && {
            origins: (origin: string, req: IncomingMessage) => (!guardHost || loopbackHost(req.headers.host)) && sameOrigin(origin, req.headers.host),
          }),
      ...(config.limits !== undefined && { limits: config.limits as Partial<TokenSocketLimits> }),
      onEvent: (event) => logEvent(log, event),
    });
    refuseOtherUpgrades(server);
    const url = await listen(server, config.port, config.host);
    graph?.start();
    const served = piped;
    const shutdown = once((deadline: number = config.shutdownTimeout) =>
      stopServer(deadline, log, { intake, sockets, api, inspect, graph, server, piped: served, backend, metrics }),
    );
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

type ServeConfig = ReturnType<ReturnType<typeof serveOptionsSchema>['parse']>;

/** The models behind the server: a gateway's upstreams (with the embedded RAG parts it is given), or the embedded models. */
function openBackend(options: ServeOptions, config: ServeConfig, intake: Intake, log: (line: string) => void): Promise<Backend> {
  const shared = {
    intake,
    streams: config.streams,
    capacity: config.stageCapacity,
    maxBatch: config.maxBatch,
    stepTokens: config.stepTokens,
    lengthBucket: config.lengthBucket,
    kvCacheBytes: config.kvCacheMb * 2 ** 20,
  };
  const retrieval = {
    ...(config.retrieval !== undefined && { retrieval: config.retrieval }),
    ...(config.corpusIgnore !== undefined && { corpusIgnore: config.corpusIgnore }),
    ...(config.corpusMaxFileBytes !== undefined && { corpusMaxFileBytes: config.corpusMaxFileBytes }),
  };
  if (options.upstreams !== undefined)
    return gatewayBackend(
      options.upstreams,
      options.gateway ?? {},
      // The bundled corpus is the embedded models' default; a gateway retrieves only from a corpus it is given.
      {
        models: config.models,
        poolSize: config.poolSize,
        poolNiceness: config.poolNiceness,
        corpus: config.corpus,
        ragModel: config.ragModel,
        guard: config.guard,
        shared,
        embedModel: config.embedModel,
        ...retrieval,
      },
      log,
    );
  return embeddedBackend({
    models: config.models,
    corpus: config.corpus ?? BUNDLED_CORPUS,
    poolSize: config.poolSize,
    poolNiceness: config.poolNiceness,
    languageModel: config.languageModel,
    shared,
    ...retrieval,
    ...(config.localModels !== undefined && { localModels: config.localModels }),
    ...(config.embedModel !== undefined && { embedModel: config.embedModel }),
    log,
  });
}

/** Registers the stages, caches, breakers and pool on `/metrics`; returns the stats the HTTP edge counts plain models' requests in. */
function registerMetrics(metrics: SluiceMetrics, backend: Backend, stages: Record<string, StageStats>): StageStats {
  // The HTTP edge counts requests to plain models in the generate stage, beside a pipeline's own generate stage.
  const generateStats = stages.generate ?? new StageStats();
  for (const [name, s] of Object.entries({ ...stages, generate: generateStats })) metrics.registerStage(name, s);
  for (const [name, s] of Object.entries(backend.caches ?? {})) metrics.registerCache(name, s);
  for (const breaker of backend.breakers ?? []) metrics.registerBreaker(breaker);
  const pool = backend.pool;
  if (pool !== undefined) metrics.registerPool('serve', () => pool.stats);
  for (const [model, stats] of Object.entries(backend.batchers ?? {})) metrics.registerBatcher(model, stats);
  return generateStats;
}

/** What `stopServer` ends, in its order. */
interface ServerParts {
  readonly intake: Intake;
  readonly sockets: { drain(deadline: number): Promise<ShutdownReport['ws']> };
  readonly api: { drain(deadline: number): Promise<{ running: number; interrupted: number }> };
  readonly inspect: InspectRoutes | undefined;
  readonly graph: PipelineGraph | undefined;
  readonly server: Server;
  readonly piped: ServedPipelines;
  readonly backend: Backend;
  readonly metrics: SluiceMetrics;
}

/** Graceful shutdown: refuse new work, let running requests finish for `deadline` ms, then close everything. */
async function stopServer(deadline: number, log: (line: string) => void, parts: ServerParts): Promise<ShutdownReport> {
  log(`shutting down: running requests have ${deadline} ms to finish`);
  parts.intake.drain();
  // Keep listening while draining, so a load balancer sees /readyz 503 and late clients a 503 with Retry-After, not a refused connection.
  const [ws, http] = await Promise.all([parts.sockets.drain(deadline), parts.api.drain(deadline)]);
  // The inspector's feeds are long-lived responses: ended here, with its sampler, so nothing outlives the server.
  parts.inspect?.close();
  parts.graph?.stop();
  const closed = new Promise<void>((resolve) => parts.server.close(() => resolve()));
  parts.server.closeAllConnections();
  await closed;
  parts.piped.close();
  await parts.backend.release();
  parts.metrics.close();
  log(
    `stopped: WebSocket ${ws.finished} finished, ${ws.interrupted} interrupted; HTTP ${http.running - http.interrupted} finished, ${http.interrupted} interrupted`,
  );
  return { ws, http: { running: http.running, interrupted: http.interrupted } };
}

/** `fn` called once; later calls return the first call's promise (a second shutdown waits for the first). */
function once<A extends unknown[], R>(fn: (...args: A) => Promise<R>): (...args: A) => Promise<R> {
  let first: Promise<R> | undefined;
  return (...args) => (first ??= fn(...args));
}

/** Each model that batches its decode steps now, as the inspector lists it. */
function batchViews(batchers: Readonly<Record<string, () => StepBatcherStats | undefined>>): DecodeBatchView[] {
  const views: DecodeBatchView[] = [];
  for (const [model, read] of Object.entries(batchers)) {
    const stats = read();
    if (stats !== undefined) views.push({ model, ...stats });
  }
  return views;
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
