/**
 * The inspector's HTTP routes, for `sluice serve` and for `inspector()`'s own server:
 *
 * - `GET /inspect` — the page (examples/inspect.html): no data in it, so no auth; strict CSP;
 * - `GET /inspect/events` — the live feed (server-sent events, conflated per reader);
 * - `POST /inspect/requests/{id}/cancel` — ends a running request as its client's cancel would.
 *
 * The feed and the action are guarded as the API is: a foreign `Origin` (not this host, not in
 * `origins`) gets 403 before anything else — a cross-site page must not read the feed, nor fire a
 * cancel with a simple POST — then a missing or wrong bearer token 401. Listed origins get CORS
 * headers and their preflights answered. The token says who reads (`InspectViewer`): a tenant's
 * feed holds only its own requests, and cancelling another tenant's request is 404 as for one
 * that does not exist.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { ApiError } from '../openai-wire.js';
import { sendError, sendJson } from '../http-io.js';
import { pathOf } from '../protocol.js';
import { SnapshotFeed, type FeedStats } from './feed.js';
import type { GraphSnapshot } from './pipeline-graph.js';
import { buildSnapshot, OPERATOR, scopeOf, viewerOf, type InspectSources, type InspectViewer, type SnapshotLimits } from './snapshot.js';

/** Where the page is served; the feed and the actions live under it. */
export const INSPECT_PATH = '/inspect';
const EVENTS_PATH = `${INSPECT_PATH}/events`;
const CANCEL_ROUTE = /^\/inspect\/requests\/([A-Za-z0-9_-]{1,64})\/cancel$/;

/** The page's policy: its own inline script and style, fetches to its own origin, nothing else. */
export const PAGE_CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'";

export interface InspectRoutesOptions {
  readonly sources: InspectSources;
  /** The page's HTML; undefined when the file is not installed (the page is then 404, the feed still served). */
  readonly page: Buffer | undefined;
  /**
   * Who the request's credentials name: an operator, or a tenant (who sees only its own requests);
   * undefined → 401. Without it, anyone who passed the origin check reads as an operator.
   */
  readonly authorize?: ((req: IncomingMessage) => InspectViewer | undefined | Promise<InspectViewer | undefined>) | undefined;
  /** Origins of other sites whose pages may read the feed and cancel (CORS). */
  readonly origins?: readonly string[] | undefined;
  /** ms between two snapshots. */
  readonly interval: number;
  readonly limits: SnapshotLimits;
}

export interface InspectRoutes {
  /** Answers a request under `/inspect`; false for any other path (left to the caller). */
  handle(req: IncomingMessage, res: ServerResponse): boolean;
  feedStats(): FeedStats;
  /** Ends every feed and its timer. */
  close(): void;
}

export function inspectRoutes(options: InspectRoutesOptions): InspectRoutes {
  let seq = 0;
  let graphNow: GraphSnapshot | undefined;
  // The graph is sampled once per tick, whatever the number of scopes read: the tick is synchronous, the cache ends with it.
  const graph = (): GraphSnapshot => {
    if (graphNow === undefined) {
      graphNow = options.sources.graph.snapshot();
      queueMicrotask(() => (graphNow = undefined));
    }
    return graphNow;
  };
  const feed = new SnapshotFeed(options.interval, (scope) => JSON.stringify(buildSnapshot(options.sources, ++seq, options.limits, viewerOf(scope), graph())));

  const guarded = async (req: IncomingMessage, res: ServerResponse, path: string): Promise<void> => {
    const origin = req.headers.origin;
    const listed = origin !== undefined && options.origins?.includes(origin) === true;
    if (origin !== undefined && !listed && !sameOrigin(origin, req.headers.host))
      throw new ApiError(403, 'This origin may not read the inspector.', 'invalid_request_error', 'origin_not_allowed');
    if (listed) {
      res.setHeader('access-control-allow-origin', origin!);
      res.setHeader('vary', 'Origin');
    }
    // A preflight carries no credentials: answered before auth, for the listed origins only.
    if (req.method === 'OPTIONS') {
      if (!listed) throw new ApiError(403, 'This origin may not read the inspector.', 'invalid_request_error', 'origin_not_allowed');
      res.writeHead(204, {
        'access-control-allow-methods': 'GET, POST, OPTIONS',
        'access-control-allow-headers': 'authorization',
        'access-control-max-age': '600',
      });
      return void res.end();
    }
    const viewer = options.authorize === undefined ? OPERATOR : await options.authorize(req);
    if (viewer === undefined)
      throw new ApiError(401, 'Invalid or missing API key.', 'invalid_request_error', 'invalid_api_key', null, { 'www-authenticate': 'Bearer' });
    if (path === EVENTS_PATH) {
      if (req.method !== 'GET') throw methodNotAllowed('GET');
      return feed.add(res, scopeOf(viewer));
    }
    const cancel = CANCEL_ROUTE.exec(path);
    if (cancel === null) throw new ApiError(404, `No route for ${req.method ?? 'GET'} ${path}.`, 'invalid_request_error', 'not_found');
    if (req.method !== 'POST') throw methodNotAllowed('POST');
    const id = cancel[1]!;
    // Another tenant's request is answered as one that does not exist: its existence is not this tenant's to know.
    if (options.sources.requests?.cancel(id, viewer.role === 'tenant' ? viewer.tenant : undefined) !== true)
      throw new ApiError(404, `No running request has the id \`${id}\` (it may have ended).`, 'invalid_request_error', 'request_not_found');
    sendJson(res, 202, { id, cancelled: true });
  };

  return {
    handle(req, res) {
      const path = pathOf(req.url);
      if (path !== INSPECT_PATH && !path.startsWith(`${INSPECT_PATH}/`)) return false;
      if (path === INSPECT_PATH || path === `${INSPECT_PATH}/`) {
        if (req.method !== 'GET' && req.method !== 'HEAD') sendError(res, methodNotAllowed('GET, HEAD'));
        else if (options.page === undefined) sendError(res, new ApiError(404, 'The inspector page is not installed.', 'invalid_request_error', 'not_found'));
        else sendPage(res, options.page, req.method === 'HEAD');
        return true;
      }
      guarded(req, res, path).catch((err: unknown) =>
        sendError(res, err instanceof ApiError ? err : new ApiError(500, 'The inspector failed.', 'server_error', null)),
      );
      return true;
    },
    feedStats: () => feed.stats(),
    close: () => feed.close(),
  };
}

function methodNotAllowed(allow: string): ApiError {
  return new ApiError(405, `Use ${allow} here.`, 'invalid_request_error', 'method_not_allowed', null, { allow });
}

export function sendPage(res: ServerResponse, page: Buffer, head: boolean): void {
  res.writeHead(200, {
    'content-type': 'text/html; charset=utf-8',
    'content-length': page.length,
    'cache-control': 'no-cache',
    'x-content-type-options': 'nosniff',
    'content-security-policy': PAGE_CSP,
  });
  res.end(head ? undefined : page);
}

/** True when the browser's `Origin` is this server's own (same host and port). */
export function sameOrigin(origin: string, host: string | undefined): boolean {
  try {
    return host !== undefined && new URL(origin).host === host.toLowerCase();
  } catch {
    return false;
  }
}
