/**
 * `inspector()`: the pipeline inspector for a library user's own pipelines — the page and its live
 * feed (routes.ts) on a `node:http` server of its own, bound to 127.0.0.1 unless told otherwise.
 * It sees every pipeline of the process through a `PipelineGraph` (its own, or the one given).
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { findUp } from '../../core/package-files.js';
import { lazySchema } from '../../core/zod.js';
import { functionSchema, parseOptions, positiveInt } from '../../flow/options.js';
import { bearerOf } from '../protocol.js';
import { isLoopback, loopbackHost } from '../loopback.js';
import type { SocketClient } from '../socket-stats.js';
import type { UpstreamView } from '../../ai/inference/upstream-stats.js';
import type { DecodeBatchView } from './snapshot.js';
import type { FeedStats } from './feed.js';
import { PipelineGraph } from './pipeline-graph.js';
import { RequestRegistry } from './requests.js';
import { INSPECT_PATH, inspectRoutes } from './routes.js';
import { OPERATOR, type InspectViewer } from './snapshot.js';
import { listenFields } from '../transport-options.js';

/** The inspector page, from source or from `dist/`. */
export const INSPECT_PAGE = findUp(import.meta.url, 'examples/inspect.html');

/** Options of `inspector`: where it listens, who may look and what it shows. */
export interface InspectorOptions {
  /** Port; 0 picks a free one (see `url`). Default 0. */
  readonly port?: number;
  /** Interface to listen on. Default `127.0.0.1`: the page shows what runs in this process. */
  readonly host?: string;
  /** The operator's bearer token: it sees and cancels everything (at least 8 characters). Without it or `tenantTokens` the inspector is open, allowed only on a loopback host. */
  readonly token?: string;
  /**
   * Tenants' tokens, token → tenant: each sees the stages and only its own tenant's requests,
   * clients and traces (the `tenant` given to the registry, `createHttpHandler` and
   * `attachTokenSocket`), and cancels only those. At least 8 characters each.
   */
  readonly tenantTokens?: Readonly<Record<string, string>>;
  /** The graph to show (started here if it is not running, and then stopped by `close()`). Default: one of its own, started now. */
  readonly graph?: PipelineGraph;
  /** Running requests to list and cancel (give the same registry to `createHttpHandler` and `attachTokenSocket`). Default: no list. */
  readonly requests?: RequestRegistry;
  /** WebSocket clients to list, e.g. `() => tokenSocket.clients()`. Default: no list. */
  readonly sockets?: () => readonly SocketClient[];
  /** A gateway's upstreams to list, e.g. `() => gateway.upstreams()`. Default: no list. */
  readonly upstreams?: () => readonly UpstreamView[];
  /** Decoders' continuous batching to list, one row per model. Default: no list. */
  readonly batches?: () => readonly DecodeBatchView[];
  /** Origins of other sites whose pages may read the feed (CORS). Default: none. */
  readonly origins?: readonly string[];
  /** ms between two snapshots of the feed. Default 500. */
  readonly interval?: number;
  /** Most stages sent per snapshot (the busiest; the rest are counted). Default 200. */
  readonly maxNodes?: number;
  /** Most requests and WebSocket clients listed per snapshot (the rest are counted). Default 50. */
  readonly maxRows?: number;
}

/** A running inspector: its URL, the graph it shows and how to close it. */
export interface Inspector {
  /** `http://host:port/inspect`: open it in a browser. */
  readonly url: string;
  readonly graph: PipelineGraph;
  readonly server: Server;
  /** The live feed's readers now. */
  feedStats(): FeedStats;
  /** Ends the feeds, closes the server, and stops the graph if the inspector started it: no timer or hook is left. */
  close(): Promise<void>;
}

const optionsSchema = lazySchema((z) =>
  z
    .object({
      ...listenFields(z, 0),
      token: z.string({ error: 'token must be a string' }).min(8, { error: 'token must have at least 8 characters' }).optional(),
      // Checked as a whole, so an error never quotes a token (a record's key would be in the path).
      tenantTokens: z
        .custom<Record<string, string>>(
          (v) => typeof v === 'object' && v !== null && !Array.isArray(v) && Object.values(v).every((tenant) => typeof tenant === 'string' && tenant !== ''),
          { error: 'tenantTokens must map tokens to tenant names' },
        )
        .refine((tokens) => Object.keys(tokens).every((token) => token.length >= 8), { error: 'a tenant token must have at least 8 characters' })
        .optional(),
      graph: z.instanceof(PipelineGraph, { error: 'graph must be a PipelineGraph' }).optional(),
      requests: z.instanceof(RequestRegistry, { error: 'requests must be a RequestRegistry' }).optional(),
      sockets: functionSchema<() => readonly SocketClient[]>().optional(),
      upstreams: functionSchema<() => readonly UpstreamView[]>().optional(),
      batches: functionSchema<() => readonly DecodeBatchView[]>().optional(),
      origins: z.array(z.string().url({ error: 'an origin must be a URL like https://app.example.com' })).optional(),
      interval: z
        .number({ error: 'interval must be a number of ms' })
        .int({ error: 'interval must be an integer' })
        .min(50, { error: 'interval must be ≥ 50 ms' })
        .default(500),
      maxNodes: positiveInt('maxNodes').default(200),
      maxRows: positiveInt('maxRows').default(50),
    })
    .strict()
    .refine((o) => o.token !== undefined || o.tenantTokens !== undefined || isLoopback(o.host), {
      error: 'an inspector without a token may only listen on a loopback host: give a token',
      path: ['token'],
    })
    // Checked as a whole, so an error never quotes a token.
    .refine((o) => o.token === undefined || o.tenantTokens === undefined || !Object.hasOwn(o.tenantTokens, o.token), {
      error: "the operator's token must not also be a tenant's",
      path: ['tenantTokens'],
    }),
);

/**
 * Serves the inspector page for this process's pipelines. Bad options throw `InvalidOptionsError`
 * at once, naming the field; the promise resolves once the server listens.
 *
 * ## Example
 * ```ts
 * const inspecting = await inspector({ port: 9400 });
 * console.log(inspecting.url); // http://127.0.0.1:9400/inspect
 * // ... run pipelines ...
 * await inspecting.close();
 * ```
 */
export function inspector(options: InspectorOptions = {}): Promise<Inspector> {
  const config = parseOptions(optionsSchema(), options, 'inspector options');
  return listen(config);
}

async function listen(config: ReturnType<ReturnType<typeof optionsSchema>['parse']>): Promise<Inspector> {
  const page = INSPECT_PAGE === undefined ? undefined : await readFile(INSPECT_PAGE);
  const graph = config.graph ?? new PipelineGraph();
  const startedHere = !graph.running;
  if (startedHere) graph.start();
  const expected = config.token === undefined ? undefined : digest(config.token);
  const tenants = Object.entries(config.tenantTokens ?? {}).map(([token, tenant]) => ({ digest: digest(token), viewer: { role: 'tenant', tenant } as const }));
  const open = expected === undefined && tenants.length === 0;
  const routes = inspectRoutes({
    sources: { graph, requests: config.requests, sockets: config.sockets, upstreams: config.upstreams, batches: config.batches },
    page,
    origins: config.origins,
    interval: config.interval,
    limits: { nodes: config.maxNodes, rows: config.maxRows },
    ...(!open && {
      authorize: (req: IncomingMessage): InspectViewer | undefined => {
        const token = bearerOf(req.headers.authorization);
        if (token === undefined) return undefined;
        const given = digest(token);
        if (expected !== undefined && timingSafeEqual(given, expected)) return OPERATOR;
        return tenants.find((tenant) => timingSafeEqual(given, tenant.digest))?.viewer;
      },
    }),
  });
  const server = createServer((req, res) => {
    // Open on loopback: a Host that is not a loopback name is a DNS-rebinding page relaying a browser.
    if (open && !loopbackHost(req.headers.host)) return void res.writeHead(403, { 'content-type': 'text/plain' }).end('forbidden host');
    if (req.url === '/' && (req.method === 'GET' || req.method === 'HEAD')) return void res.writeHead(302, { location: INSPECT_PATH }).end();
    if (!routes.handle(req, res)) res.writeHead(404, { 'content-type': 'text/plain' }).end('not found');
  });
  try {
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(config.port, config.host, () => {
        server.off('error', reject);
        resolve();
      });
    });
  } catch (err) {
    if (startedHere) graph.stop();
    throw err;
  }
  const address = server.address() as AddressInfo;
  const host = address.family === 'IPv6' ? `[${address.address}]` : address.address;
  let closing: Promise<void> | undefined;
  return {
    url: `http://${host}:${address.port}${INSPECT_PATH}`,
    graph,
    server,
    feedStats: () => routes.feedStats(),
    close: () =>
      (closing ??= new Promise<void>((resolve) => {
        routes.close();
        if (startedHere) graph.stop();
        server.close(() => resolve());
        server.closeAllConnections();
      })),
  };
}

/** Equal-length digests, so the comparison takes the same time whatever the token's length. */
function digest(token: string): Buffer {
  return createHash('sha256').update(token).digest();
}
