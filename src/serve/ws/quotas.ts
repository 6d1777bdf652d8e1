/**
 * The limits a client is held to over time, kept apart from the sockets they guard:
 * frames per connection, and requests per tenant (running at once, started per second)
 * across all of the tenant's connections.
 */
import { TokenBuckets } from '../../core/token-bucket.js';
import type { TokenSocketLimits } from './options.js';

export class Quotas {
  /** Requests running per tenant; a tenant with none has no entry. */
  private readonly running = new Map<string, number>();
  private readonly frames: TokenBuckets;
  private readonly starts: TokenBuckets;

  constructor(
    private readonly limits: Pick<TokenSocketLimits, 'rate' | 'tenantConcurrent' | 'tenantRate'>,
    now: () => number = () => performance.now(),
  ) {
    this.frames = new TokenBuckets(limits.rate.perSecond, limits.rate.burst, now);
    this.starts = new TokenBuckets(limits.tenantRate.perSecond, limits.tenantRate.burst, now);
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

  /**
   * Takes a slot for one request of `tenant`, or returns why not (the `TENANT_QUOTA`
   * message): it runs as many as it may, or started more than its rate allows.
   */
  acquire(tenant: string): string | undefined {
    const running = this.running.get(tenant) ?? 0;
    if (running >= this.limits.tenantConcurrent) return `tenant has ${this.limits.tenantConcurrent} requests running, its limit`;
    if (!this.starts.take(tenant)) {
      const { perSecond, burst } = this.limits.tenantRate;
      return `tenant started more than ${perSecond} requests per second (burst ${burst}); retry in ${this.starts.timeUntil(tenant, 1)} ms`;
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
