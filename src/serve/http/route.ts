/** What a route of the HTTP edge declares: method, path, whether it is the guarded API, and its handler. */
import type { RequestContext, RouteName } from './context.js';

export interface Route extends RouteName {
  /** `GET` routes answer `HEAD` too. */
  readonly method: 'GET' | 'POST';
  /** Exact, or ending in `/{id}` for any rest of the path. */
  readonly path: string;
  /** Part of the `/v1` API: CORS preflights, `auth`, a request-log line when refused. */
  readonly api: boolean;
  /** A completion's id prefix (its `x-request-id`), as OpenAI's are; other requests' ids are `req-…`. */
  readonly idPrefix?: string;
  readonly handle: (ctx: RequestContext) => void | Promise<void>;
}

/** The methods a route answers, as an `Allow` header. */
export function allowOf(route: Route): string {
  return route.method === 'GET' ? 'GET, HEAD' : 'POST';
}

/** Finds the route of a path: exact paths first, then `/{id}` patterns. */
export function routeMatcher(routes: readonly Route[]): (path: string) => Route | undefined {
  const exact = new Map<string, Route>();
  const patterns: { prefix: string; route: Route }[] = [];
  for (const route of routes) {
    if (route.path.endsWith('/{id}')) patterns.push({ prefix: route.path.slice(0, -'{id}'.length), route });
    else exact.set(route.path, route);
  }
  return (path) => exact.get(path) ?? patterns.find(({ prefix }) => path.startsWith(prefix) && path.length > prefix.length)?.route;
}
