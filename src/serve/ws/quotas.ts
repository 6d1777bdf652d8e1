/**
 * The limits a client is held to over time, kept apart from the sockets they guard:
 * frames per connection, and requests per tenant (running at once, started per second)
 * across all of the tenant's connections (and its HTTP requests, when the quotas are shared).
 */
import { TokenBuckets } from '../../core/token-bucket.js';
import type { TokenSocketLimits } from './options.js';
import { TenantQuotas } from '../tenant-quotas.js';

export class Quotas {
  private readonly frames: TokenBuckets;
  /** Requests per tenant: the server's own, or one shared with its HTTP handler. */
  readonly tenants: TenantQuotas;

  constructor(limits: Pick<TokenSocketLimits, 'rate' | 'tenantConcurrent' | 'tenantRate'>, shared?: TenantQuotas, now: () => number = () => performance.now()) {
    this.frames = new TokenBuckets(limits.rate.perSecond, limits.rate.burst, now);
    this.tenants = shared ?? new TenantQuotas(limits, now);
  }

  /** Spends one of `connection`'s frames; false when it sent more than its rate allows. */
  frame(connection: number): boolean {
    return this.frames.take(String(connection));
  }

  /** `connection` closed: its frame bucket goes with it. */
  closed(connection: number): void {
    this.frames.forget(String(connection));
  }

  /** Frame buckets held now: one per connection that spent frames recently, none for closed ones. */
  get frameBuckets(): number {
    return this.frames.size;
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
