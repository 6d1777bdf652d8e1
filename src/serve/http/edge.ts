/**
 * What every route of the HTTP edge shares: the checked options, the models, the telemetry,
 * and admission — the JSON body reader, the tenants' quotas, the completions in flight and
 * their drain.
 */
import type * as z from 'zod';
import type { IncomingMessage } from 'node:http';
import { ApiError, type ChatWorker, type EmbeddingModel } from '../openai-wire.js';
import { parseJson, readBytes } from '../http-io.js';
import { RequestTelemetry, telemetryOptionsOf } from '../telemetry.js';
import type { optionsSchema } from '../http-options.js';
import type { RequestContext } from './context.js';
import { Door } from './door.js';
import { LoopLag } from './loop-lag.js';

export type EdgeConfig = z.output<ReturnType<typeof optionsSchema>>;

/** What `drain` reports. */
export interface DrainReport {
  readonly running: number;
  readonly interrupted: number;
}

/** What a request refused by a drain is told: retry soon, the next attempt will reach another instance. */
const DRAIN_RETRY_AFTER = { 'retry-after': '1' } as const;

/** JSON bodies only: `text/plain` and form posts are what a cross-site page can send without a preflight. */
const JSON_TYPE = /^application\/(?:[\w.+-]+\+)?json\s*(?:;|$)/i;

export class HttpEdge {
  readonly workers: ReadonlyMap<string, ChatWorker>;
  readonly embedders: ReadonlyMap<string, EmbeddingModel>;
  readonly telemetry: RequestTelemetry;
  /** Ends a completion in flight with a shutdown error, by the drain's deadline. */
  readonly interrupts = new Set<() => void>();
  /** Refuses completions the intake would refuse, before their bodies are parsed. */
  readonly door: Door | undefined;
  private readonly loopLag: LoopLag | undefined;
  draining = false;
  inFlight = 0;
  private idle: (() => void) | undefined;

  constructor(readonly config: EdgeConfig) {
    const workers = new Map<string, ChatWorker>(Object.entries(config.workers ?? {}));
    if (config.worker !== undefined && !workers.has(config.worker.name)) workers.set(config.worker.name, config.worker);
    this.workers = workers;
    this.embedders = new Map<string, EmbeddingModel>(Object.entries(config.embeddings ?? {}));
    this.telemetry = new RequestTelemetry(telemetryOptionsOf(config));
    const { intake, maxLoopLag } = config;
    this.loopLag = intake === undefined || maxLoopLag === undefined ? undefined : new LoopLag();
    const loopLag = this.loopLag;
    this.door =
      intake === undefined
        ? undefined
        : new Door(intake, (model) => this.workers.get(model)?.name, loopLag === undefined ? undefined : () => loopLag.lag > maxLoopLag!);
  }

  /** A POST's JSON body: 415 for another content type (what a cross-site form can send), 503 while draining, 400 for no JSON. */
  async readBody(req: IncomingMessage): Promise<unknown> {
    return parseJson(await this.readBytes(req));
  }

  /** A POST's body, unparsed, with `readBody`'s checks but JSON's. */
  readBytes(req: IncomingMessage): Promise<Buffer> {
    if (!JSON_TYPE.test(req.headers['content-type'] ?? '')) {
      throw new ApiError(415, 'The request body must be JSON (content-type: application/json).', 'invalid_request_error', 'unsupported_media_type');
    }
    if (this.draining)
      throw new ApiError(503, 'The server is shutting down; retry on another instance.', 'server_error', 'server_shutting_down', null, DRAIN_RETRY_AFTER);
    return readBytes(req, this.config.maxBodyBytes);
  }

  /** Takes a slot of the request's tenant (429 `tenant_quota` when it has none left); the returned function gives it back. */
  admitTenant(tenant: string | undefined): () => void {
    const quotas = tenant === undefined ? undefined : this.config.tenantQuotas;
    if (quotas === undefined || tenant === undefined) return () => {};
    const refused = quotas.acquire(tenant);
    if (refused !== undefined) {
      const headers: Record<string, string> =
        refused.retryAfter === undefined ? {} : { 'retry-after': String(Math.max(1, Math.ceil(refused.retryAfter / 1000))) };
      throw new ApiError(429, `Tenant quota: ${refused.message}.`, 'requests', 'tenant_quota', null, headers);
    }
    return () => quotas.release(tenant);
  }

  /** Runs `work` holding a slot of the request's tenant, counted as in flight for the drain. */
  async admitted(ctx: RequestContext, work: () => Promise<void>): Promise<void> {
    const release = this.admitTenant(ctx.tenant);
    this.inFlight++;
    try {
      await work();
    } finally {
      release();
      if (--this.inFlight === 0) this.idle?.();
    }
  }

  /** Stops accepting completions; resolves when those in flight ended, those still running at `deadline` (ms) interrupted. */
  async drain(deadline?: number): Promise<DrainReport> {
    this.draining = true;
    this.loopLag?.stop();
    const running = this.inFlight;
    if (deadline === undefined) {
      await this.settled();
      return { running, interrupted: 0 };
    }
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([this.settled(), new Promise<void>((resolve) => (timer = setTimeout(resolve, deadline)))]);
    clearTimeout(timer);
    const interrupted = this.interrupts.size;
    for (const interrupt of [...this.interrupts]) interrupt();
    await this.settled();
    return { running, interrupted };
  }

  private settled(): Promise<void> {
    if (this.inFlight === 0) return Promise.resolve();
    return new Promise<void>((resolve) => {
      const previous = this.idle;
      this.idle = () => {
        previous?.();
        resolve();
      };
    });
  }
}
