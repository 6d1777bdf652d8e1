/**
 * Requests per tenant, running at once and started per second, counted across every
 * transport: one instance is shared by the WebSocket server and the HTTP handler of a
 * server, so a tenant cannot double its share by using both.
 */
import { TokenBuckets } from '../core/token-bucket.js';

/** The limits of one tenant. */
export interface TenantLimits {
  /** Requests a tenant may have running at once. */
  readonly tenantConcurrent: number;
  /** Requests a tenant may start per second, with a burst. */
  readonly tenantRate: { readonly perSecond: number; readonly burst: number };
}

/** Why a request was refused: the message, and when a retry may pass (ms) if the rate said no. */
export interface QuotaRefusal {
  readonly message: string;
  readonly retryAfter?: number;
}

/** Per-tenant limits on concurrent requests and on the request rate, shared by the HTTP and WebSocket edges. */
export class TenantQuotas {
  /** Requests running per tenant; a tenant with none has no entry. */
  private readonly running = new Map<string, number>();
  private readonly starts: TokenBuckets;

  constructor(
    readonly limits: TenantLimits,
    now: () => number = () => performance.now(),
  ) {
    this.starts = new TokenBuckets(limits.tenantRate.perSecond, limits.tenantRate.burst, now);
  }

  /** Takes a slot for one request of `tenant`, or says why not. */
  acquire(tenant: string): QuotaRefusal | undefined {
    const running = this.running.get(tenant) ?? 0;
    if (running >= this.limits.tenantConcurrent) return { message: `tenant has ${this.limits.tenantConcurrent} requests running, its limit` };
    if (!this.starts.take(tenant)) {
      const { perSecond, burst } = this.limits.tenantRate;
      const retryAfter = this.starts.timeUntil(tenant, 1);
      return { message: `tenant started more than ${perSecond} requests per second (burst ${burst}); retry in ${retryAfter} ms`, retryAfter };
    }
    this.running.set(tenant, running + 1);
    return undefined;
  }

  /** Gives back the slot of a request of `tenant` that ended. */
  release(tenant: string): void {
    const running = (this.running.get(tenant) ?? 1) - 1;
    if (running <= 0) this.running.delete(tenant);
    else this.running.set(tenant, running);
  }

  /** Requests running per tenant now. */
  tenants(): Record<string, number> {
    return Object.fromEntries(this.running);
  }
}
