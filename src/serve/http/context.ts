/** One HTTP request as the edge's handlers see it: its route, id, arrival, tenant, and the request-log entry it ends with. */
import { performance } from 'node:perf_hooks';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { type RequestLog, type RequestLogEntry, round } from '../request-log.js';

/** The fields a handler gives the request log; the context adds transport, id, tenant and duration. */
export type LogFields = Omit<RequestLogEntry, 'transport' | 'id' | 'tenant' | 'durationMs'>;

/** What the context needs of its route (a `Route` is one). */
export interface RouteName {
  readonly path: string;
  readonly api: boolean;
}

export class RequestContext {
  /** `performance.now()` when the request arrived. */
  readonly arrivedAt = performance.now();
  private tenantRead = false;
  private tenantValue: string | undefined;

  constructor(
    readonly req: IncomingMessage,
    readonly res: ServerResponse,
    /** The path without its query. */
    readonly path: string,
    /** The route it matched; undefined for none (a 404 unless a method check or a preflight answers first). */
    readonly route: RouteName | undefined,
    /** The response's `x-request-id`, and the id of its log line. */
    readonly id: string,
    private readonly tenantOf: ((req: IncomingMessage) => string | undefined) | undefined,
    private readonly requestLog: RequestLog | undefined,
  ) {}

  /** Who the request is for; asked of the `tenant` option once. */
  get tenant(): string | undefined {
    if (!this.tenantRead) {
      this.tenantRead = true;
      this.tenantValue = this.tenantOf?.(this.req);
    }
    return this.tenantValue;
  }

  /** The route's metrics label: its path pattern, `other` for none. */
  get label(): string {
    return this.route?.path ?? 'other';
  }

  /** Writes the request's log entry, timed from `since` (default its arrival). */
  log(fields: LogFields, since = this.arrivedAt): void {
    if (this.requestLog === undefined) return;
    const tenant = this.tenant;
    this.requestLog({
      transport: 'http',
      id: this.id,
      ...(tenant !== undefined && { tenant }),
      ...fields,
      durationMs: round(performance.now() - since),
    });
  }
}
