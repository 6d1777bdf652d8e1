/**
 * The limits a client is held to over time, kept apart from the sockets they guard:
 * frames per connection, and requests per tenant (running at once, started per second)
 * across all of the tenant's connections (and its HTTP requests, when the quotas are shared).
 */
import { TokenBucket } from '../../core/token-bucket.js';
import type { TokenSocketLimits } from './options.js';
import { TenantQuotas } from '../tenant-quotas.js';

export class Quotas {
  /** Requests per tenant: the server's own, or one shared with its HTTP handler. */
  readonly tenants: TenantQuotas;

  constructor(
    private readonly limits: Pick<TokenSocketLimits, 'rate' | 'tenantConcurrent' | 'tenantRate'>,
    shared?: TenantQuotas,
    private readonly now: () => number = () => performance.now(),
  ) {
    this.tenants = shared ?? new TenantQuotas(limits, now);
  }

  /** A new connection's frame bucket: the connection keeps it (it goes when the connection does) and spends one per frame. */
  frameBucket(): TokenBucket {
    return new TokenBucket(this.limits.rate.perSecond, this.limits.rate.burst, this.now);
  }

  /** Takes a slot for one request of `tenant`, or returns why not (the `TENANT_QUOTA` message). */
  acquire(tenant: string): string | undefined {
    return this.tenants.acquire(tenant)?.message;
  }

  /** Gives back the slot of a request of `tenant` that ended. */
  release(tenant: string): void {
    this.tenants.release(tenant);
  }
}
