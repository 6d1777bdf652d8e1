/**
 * Upstream OpenAI-compatible servers (vLLM, llama.cpp, Ollama, a hosted API, another
 * sluice) as `ModelWorker`s, one per model they serve. Each generation is one element
 * through an `upstream` stage whose work is, per upstream, `OpenAIWorker` → idle
 * timeout → retry (before the first token, honouring `Retry-After`) → circuit breaker,
 * and across upstreams a fallback chain in the listed order (or with the first picked
 * by weight). The client's body is forwarded as it is (`GenerateRequest.passthrough`).
 */
import { type SchedulerLike, asyncScheduler, map } from 'rxjs';
import { SluiceError } from '../../core/errors.js';
import { Traced, traced } from '../../core/trace.js';
import { lazySchema, zod } from '../../core/zod.js';
import type { Flow } from '../../flow/demand.js';
import { functionSchema, parseOptions, positiveInt, schedulerSchema } from '../../flow/options.js';
import { fromIterable } from '../../flow/sources.js';
import { StageStats } from '../../flow/stats.js';
import { type CachedAnswer, cached } from '../../cache/cached.js';
import { SingleFlight } from '../../cache/flight.js';
import { hashKey } from '../../cache/key.js';
import { LruCache } from '../../cache/lru.js';
import { CacheStats } from '../../cache/stats.js';
import { stage } from '../../../operators/stage.js';
import { asFlow } from '../../resilience/as-flow.js';
import { CircuitBreaker, type CircuitStateChange } from '../../resilience/breaker.js';
import { CircuitOpenError } from '../../resilience/errors.js';
import { fallback } from '../../resilience/fallback.js';
import type { StreamWork } from '../../resilience/relay.js';
import { retrying } from '../../resilience/retry.js';
import { withTimeouts } from '../../resilience/timeouts.js';
import { classifyUpstreamFailure, isUpstreamFault } from './upstream-failure.js';
import { OpenAIWorker } from './openai.js';
import { observed, UpstreamStats, type UpstreamView } from './upstream-stats.js';
import {
  complete,
  generateRequest,
  type Completion,
  type GenerateOptions,
  type GenerateRequest,
  type InferOptions,
  type ModelWorker,
  type Token,
} from './worker.js';

/** One upstream of a `Gateway`: an OpenAI-compatible server and its models. */
export interface UpstreamOptions {
  /** Up to and including the version, e.g. `http://127.0.0.1:8000/v1`. */
  readonly baseUrl: string;
  /** Names the upstream in logs, errors, traces and its breaker. Default: the URL's host. */
  readonly name?: string;
  /** Sent as `Authorization: Bearer <apiKey>`; never logged. */
  readonly apiKey?: string;
  /** Extra request headers. */
  readonly headers?: Readonly<Record<string, string>>;
  /** Share of the requests this upstream gets first, when any upstream has a weight. Default 1. */
  readonly weight?: number;
  /** The models it serves. Default: asked of it (`GET {baseUrl}/models`) by `Gateway.start`. */
  readonly models?: readonly string[];
}

/** Options of `Gateway`: the upstreams, retries, circuit breakers and caching. */
export interface GatewayOptions {
  /** Tried in this order when one fails before its first token (after its retries). */
  readonly upstreams: readonly UpstreamOptions[];
  /** Attempts per upstream, the first included. Default 3. */
  readonly attempts?: number;
  /** Delay before the first retry, ms; doubles each retry, with full jitter. Default 200. */
  readonly baseDelay?: number;
  /** No retry delay exceeds this, ms. Default 2 000. */
  readonly maxDelay?: number;
  /** The longest `Retry-After` honoured, ms; a longer one moves on to the next upstream. Default 30 000. */
  readonly maxRetryAfter?: number;
  /** Silence from an upstream while a token is wanted, ms, before the attempt fails (and is retried). Default 30 000. */
  readonly idleTimeout?: number;
  /** Failures within `breakerWindow` that open an upstream's circuit. Default 5. */
  readonly breakerThreshold?: number;
  /** Default 30 000 ms. */
  readonly breakerWindow?: number;
  /** How long an open circuit refuses calls before it lets a probe through, ms. Default 15 000. */
  readonly breakerCooldown?: number;
  /** How long `start` waits for an upstream's model list, ms. Default 5 000. */
  readonly discoveryTimeout?: number;
  /** Counters of the `upstream` stage, shared by every model. */
  readonly stats?: StageStats;
  /**
   * A response cache for deterministic requests (`temperature: 0`, or a `seed`): an identical
   * request (model, messages, tools, every field) of the same tenant (see `cacheScope`) is
   * answered from it without the upstream.
   */
  readonly cache?: { readonly maxBytes: number; readonly ttl?: number };
  /** Identical deterministic requests in flight at once share one upstream call. Default false. */
  readonly singleFlight?: boolean;
  /**
   * Who may share answers through the cache and single-flight: `tenant` (default), only requests
   * of the same tenant (`GenerateOptions.tenant`; requests without one share one scope), so no
   * tenant is ever answered with another's tokens nor learns from a hit what another asked;
   * `global`, every request alike.
   */
  readonly cacheScope?: 'tenant' | 'global';
  /** Hits, misses and joins of the cache and single-flight. */
  readonly cacheStats?: CacheStats;
  /** Called when an upstream's circuit breaker changes state. */
  readonly onBreakerChange?: (upstream: string, change: CircuitStateChange) => void;
  /** Numbers in [0, 1) for weights and jitter. Default `Math.random`. */
  readonly random?: () => number;
  /** Timers of retries, timeouts and breakers. Default `asyncScheduler`. */
  readonly scheduler?: SchedulerLike;
  /** The `fetch` to use. Default: the global one. */
  readonly fetch?: typeof fetch;
}

const upstreamSchema = lazySchema((z) =>
  z
    .object({
      baseUrl: z.url({ protocol: /^https?$/, error: 'baseUrl must be an http(s) URL' }),
      name: z.string().min(1, { error: 'name must not be empty' }).optional(),
      apiKey: z.string().optional(),
      headers: z.record(z.string(), z.string()).optional(),
      weight: z.number({ error: 'weight must be a number' }).min(0, { error: 'weight must be ≥ 0' }).optional(),
      models: z
        .array(z.string().min(1, { error: 'a model name must not be empty' }))
        .min(1, { error: 'models must not be empty' })
        .optional(),
    })
    .strict(),
);

const ms = (name: string) =>
  zod()
    .number({ error: `${name} must be a number of ms` })
    .positive({ error: `${name} must be > 0 ms` });

const gatewaySchema = lazySchema((z) =>
  z
    .object({
      upstreams: z.array(upstreamSchema(), { error: 'upstreams must be an array' }).min(1, { error: 'give at least one upstream' }),
      attempts: positiveInt('attempts').default(3),
      baseDelay: z.number({ error: 'baseDelay must be a number of ms' }).min(0, { error: 'baseDelay must be ≥ 0 ms' }).default(200),
      maxDelay: z.number({ error: 'maxDelay must be a number of ms' }).min(0, { error: 'maxDelay must be ≥ 0 ms' }).default(2_000),
      maxRetryAfter: z.number({ error: 'maxRetryAfter must be a number of ms' }).min(0, { error: 'maxRetryAfter must be ≥ 0 ms' }).default(30_000),
      idleTimeout: ms('idleTimeout').default(30_000),
      breakerThreshold: positiveInt('breakerThreshold').default(5),
      breakerWindow: ms('breakerWindow').default(30_000),
      breakerCooldown: ms('breakerCooldown').default(15_000),
      discoveryTimeout: ms('discoveryTimeout').default(5_000),
      stats: z.instanceof(StageStats, { error: 'stats must be a StageStats' }).optional(),
      cache: z
        .object({ maxBytes: positiveInt('cache.maxBytes'), ttl: z.number({ error: 'cache.ttl must be a number of ms' }).positive().optional() })
        .strict()
        .optional(),
      singleFlight: z.boolean({ error: 'singleFlight must be a boolean' }).default(false),
      cacheScope: z.enum(['tenant', 'global'], { error: 'cacheScope must be "tenant" or "global"' }).default('tenant'),
      cacheStats: z.instanceof(CacheStats, { error: 'cacheStats must be a CacheStats' }).optional(),
      onBreakerChange: functionSchema<(upstream: string, change: CircuitStateChange) => void>().optional(),
      random: functionSchema<() => number>().default(() => Math.random),
      scheduler: schedulerSchema().optional(),
      fetch: functionSchema<typeof fetch>().optional(),
    })
    .strict()
    .refine((o) => new Set(o.upstreams.map(upstreamName)).size === o.upstreams.length, {
      error: 'two upstreams have the same name: give each a name',
      path: ['upstreams'],
    }),
);

type GatewayConfig = ReturnType<ReturnType<typeof gatewaySchema>['parse']>;
type UpstreamConfig = GatewayConfig['upstreams'][number];

/** An upstream could not be asked for its models, or listed none. */
export class UpstreamDiscoveryError extends SluiceError {
  constructor(
    readonly upstream: string,
    reason: string,
    cause?: unknown,
  ) {
    super('UPSTREAM_DISCOVERY', `Could not list the models of upstream "${upstream}": ${reason}.`, {
      hint: 'Check its URL and key, or give its models explicitly (`models`, or `#models=a,b` on the command line) to start without asking it.',
      cause,
    });
  }
}

/**
 * Whether a failure before the first token is worth another attempt: rate limits, server
 * errors, timeouts, broken streams and the network, whether an HTTP status or an error inside
 * the stream said so. See `classifyUpstreamFailure` for the whole judgement.
 */
function isUpstreamTransient(error: unknown): boolean {
  return classifyUpstreamFailure(error) === 'transient';
}

/** Upstreams behind model names. `Gateway.start` resolves each upstream's model list first. */
export class Gateway {
  /** The `upstream` stage's counters. */
  readonly stats: StageStats;
  /** The cache's and single-flight's hits, misses and joins. */
  readonly cacheStats: CacheStats;
  private readonly responses: LruCache<CachedAnswer<Token>> | undefined;
  private readonly flight: SingleFlight<Token> | undefined;
  private readonly circuitBreakers = new Map<string, CircuitBreaker>();
  private readonly upstreamStats = new Map<string, UpstreamStats>();
  private readonly workers = new Map<string, ModelWorker<GenerateRequest, Completion>>();
  /** Per model, its upstreams' clients in the order a request tries them (the first picked by weight). */
  private readonly routes = new Map<string, () => readonly { readonly name: string; readonly client: OpenAIWorker; readonly breaker: CircuitBreaker }[]>();

  private constructor(
    private readonly config: GatewayConfig,
    served: ReadonlyMap<string, readonly UpstreamConfig[]>,
  ) {
    this.stats = config.stats ?? new StageStats();
    this.cacheStats = config.cacheStats ?? new CacheStats();
    const scheduler = config.scheduler ?? asyncScheduler;
    this.responses =
      config.cache === undefined
        ? undefined
        : new LruCache<CachedAnswer<Token>>({
            maxBytes: config.cache.maxBytes,
            ...(config.cache.ttl !== undefined && { ttl: config.cache.ttl }),
            sizeOf: (answer) => answer.items.reduce((n, token) => n + 64 + token.text.length * 2, 0),
            ...(config.scheduler !== undefined && { scheduler: config.scheduler }),
            stats: this.cacheStats,
          });
    this.flight = config.singleFlight ? new SingleFlight<Token>() : undefined;
    for (const upstream of config.upstreams) {
      const name = upstreamName(upstream);
      this.upstreamStats.set(name, new UpstreamStats());
      this.circuitBreakers.set(
        name,
        new CircuitBreaker({
          name: `upstream:${name}`,
          failureThreshold: config.breakerThreshold,
          window: config.breakerWindow,
          cooldown: config.breakerCooldown,
          // The client's own mistakes never open a circuit for every client.
          isFailure: isUpstreamFault,
          scheduler,
          ...(config.onBreakerChange !== undefined && { onStateChange: (change: CircuitStateChange) => config.onBreakerChange!(name, change) }),
        }),
      );
    }
    for (const [model, upstreams] of served) this.workers.set(model, this.modelWorker(model, upstreams));
  }

  /** Validates the options and lists the models of every upstream that did not name its own. */
  static async start(options: GatewayOptions): Promise<Gateway> {
    const config = parseOptions(gatewaySchema(), options, 'gateway options');
    const lists = await Promise.all(config.upstreams.map((u) => u.models ?? discoverModels(u, config.fetch ?? fetch, config.discoveryTimeout)));
    const served = new Map<string, UpstreamConfig[]>();
    config.upstreams.forEach((upstream, i) => {
      for (const model of lists[i]!) served.set(model, [...(served.get(model) ?? []), upstream]);
    });
    return new Gateway(config, served);
  }

  /** Each upstream's circuit breaker by upstream name, all made at start: for metrics and alerts. */
  get breakers(): ReadonlyMap<string, CircuitBreaker> {
    return this.circuitBreakers;
  }

  /** Stops the breakers' cooldown timers (at shutdown): nothing of the gateway keeps the process alive. */
  close(): void {
    for (const breaker of this.breakers.values()) breaker.close();
  }

  /** The model names served, in the order the upstreams listed them. */
  get models(): readonly string[] {
    return [...this.workers.keys()];
  }

  /** A worker per model name. */
  modelWorkers(): Record<string, ModelWorker<GenerateRequest, Completion>> {
    return Object.fromEntries(this.workers);
  }

  /**
   * Forwards an embeddings request for `model` (the client's body, as it is) to the upstreams
   * serving it, in a request's order, skipping open circuits and going on to the next after
   * a transient failure; resolves with the upstream's JSON answer. Each upstream's breaker
   * counts the outcome, as for completions. Undefined for a model no upstream serves.
   */
  embeddings(model: string, body: Readonly<Record<string, unknown>>, signal?: AbortSignal): Promise<unknown> | undefined {
    const route = this.routes.get(model);
    if (route === undefined) return undefined;
    return (async () => {
      let last: unknown;
      for (const { name, client, breaker } of route()) {
        let permit: ReturnType<CircuitBreaker['acquire']>;
        try {
          permit = breaker.acquire();
        } catch (err) {
          this.upstreamStats.get(name)!.rejected++;
          last = err;
          continue;
        }
        const stats = this.upstreamStats.get(name)!;
        stats.attempts++;
        stats.inFlight++;
        try {
          const answer = await client.embeddings(body, signal);
          permit.success();
          stats.succeeded++;
          return answer;
        } catch (err) {
          if (signal?.aborted) {
            permit.release();
            throw err;
          }
          permit.failure(err);
          stats.failed(err);
          if (!isUpstreamFault(err)) throw err;
          last = err;
        } finally {
          stats.inFlight--;
        }
      }
      throw last;
    })();
  }

  /** Each upstream's circuit: `closed`, `open` or `half-open`. */
  circuits(): Record<string, string> {
    return Object.fromEntries([...this.breakers].map(([name, breaker]) => [name, breaker.state]));
  }

  /** Each upstream's figures now: its circuit, attempts in flight, failures by code, retries, fallbacks. */
  upstreams(): UpstreamView[] {
    return [...this.breakers].map(([name, breaker]) => this.upstreamStats.get(name)!.view(name, breaker.state));
  }

  /**
   * One upstream's part of a request: its client, timed out when idle, retried, behind its breaker.
   * Counted twice: each attempt (inside the retries), and the request's outcome here (a fallback, a refusal).
   */
  private attempt(
    { name, client, breaker }: { readonly name: string; readonly client: OpenAIWorker; readonly breaker: CircuitBreaker },
    options: GenerateOptions,
    last: boolean,
    passedOn: (error: unknown) => boolean,
  ): { name: string; work: StreamWork<GenerateRequest, Token> } {
    const config = this.config;
    const scheduler = config.scheduler ?? asyncScheduler;
    const stats = this.upstreamStats.get(name)!;
    const call: StreamWork<GenerateRequest, Token> = (request, context) =>
      client.generate(request, {
        signal: options.signal === undefined ? context.signal : AbortSignal.any([context.signal, options.signal]),
        trace: context.trace,
        stage: 'upstream',
        ...(options.onDone !== undefined && { onDone: options.onDone }),
      });
    let tries = 0;
    const counted = observed(
      withTimeouts(call, { idle: config.idleTimeout, scheduler }),
      {
        started: () => {
          stats.attempts++;
          stats.inFlight++;
          if (tries++ > 0) stats.retries++;
        },
        succeeded: () => stats.succeeded++,
        failed: (error) => stats.failed(error),
        ended: () => stats.inFlight--,
      },
      scheduler,
    );
    const retried = retrying(counted, {
      attempts: config.attempts,
      baseDelay: config.baseDelay,
      maxDelay: config.maxDelay,
      jitter: 1,
      maxRetryAfter: config.maxRetryAfter,
      random: config.random,
      retryOn: isUpstreamTransient,
      scheduler,
    });
    const outcome = observed(
      breaker.wrap(retried),
      {
        started: () => {},
        succeeded: () => {},
        failed: (error) => {
          if (error instanceof CircuitOpenError) stats.rejected++;
          else if (!last && passedOn(error)) stats.fallbacks++;
        },
        ended: () => {},
      },
      scheduler,
    );
    return { name, work: outcome };
  }

  private modelWorker(model: string, upstreams: readonly UpstreamConfig[]): ModelWorker<GenerateRequest, Completion> & { readonly passthrough: true } {
    const config = this.config;
    const scheduler = config.scheduler ?? asyncScheduler;
    const clients = upstreams.map((upstream) => {
      const name = upstreamName(upstream);
      const client = new OpenAIWorker({
        baseUrl: upstream.baseUrl,
        model,
        name: `${name}:${model}`,
        ...(upstream.apiKey !== undefined && { apiKey: upstream.apiKey }),
        ...(upstream.headers !== undefined && { headers: upstream.headers }),
        ...(config.fetch !== undefined && { fetch: config.fetch }),
      });
      return { name, client, breaker: this.circuitBreakers.get(name)! };
    });
    const weights = upstreams.map((u) => u.weight ?? 1);
    const weighted = upstreams.some((u) => u.weight !== undefined);
    const pick = (): number => {
      if (!weighted) return 0;
      let r = config.random() * weights.reduce((a, b) => a + b, 0);
      for (let i = 0; i < weights.length; i++) if ((r -= weights[i]!) < 0) return i;
      return 0;
    };
    // A configuration fault is this upstream's (its key) and an open circuit too: the next may answer. The request's own fault would fail anywhere.
    const when = isUpstreamFault;
    this.routes.set(model, () => {
      const first = pick();
      return [clients[first]!, ...clients.filter((_, i) => i !== first)];
    });

    // Built per request: each attempt needs the caller's signal and onDone.
    const chainFor = (options: GenerateOptions): StreamWork<GenerateRequest, Token> => {
      // The first choice, then the others in the listed order.
      const first = pick();
      const order = [first, ...clients.map((_, i) => i).filter((i) => i !== first)];
      return fallback(
        order.map((i, position) => this.attempt(clients[i]!, options, position === order.length - 1, when)),
        { when, scheduler },
      );
    };

    const generate = (request: GenerateRequest, options: GenerateOptions = {}): Flow<Token> => {
      const valid = generateRequest(request);
      const element = options.trace === undefined ? traced(valid) : new Traced(valid, options.trace);
      const chain = chainFor(options);
      // Only a deterministic request may be answered with another's tokens.
      const shared = deterministic(valid) && (this.responses !== undefined || this.flight !== undefined);
      const scope = config.cacheScope === 'tenant' ? (options.tenant ?? null) : null;
      const work = shared
        ? cached(chain, {
            ...(this.responses !== undefined && { response: this.responses }),
            ...(this.flight !== undefined && { singleFlight: this.flight }),
            key: (r: GenerateRequest) => hashKey({ model, tenant: scope, request: r }),
            stats: this.cacheStats,
          })
        : chain;
      return asFlow(
        fromIterable([element]).pipe(
          stage(work, { name: 'upstream', stats: this.stats }),
          map((t) => t.value),
        ),
      );
    };
    return {
      name: model,
      passthrough: true,
      generate,
      infer: (request: GenerateRequest, inferOptions: InferOptions = {}) => complete((onDone) => generate(request, { ...inferOptions, onDone })),
    };
  }
}

/** `temperature: 0` or a `seed`, in the request or the body forwarded: the same request gets the same answer. */
function deterministic(request: GenerateRequest): boolean {
  const body = request.passthrough;
  const temperature = body?.temperature ?? request.temperature;
  return temperature === 0 || (body?.seed ?? request.seed) !== undefined;
}

function upstreamName(upstream: { readonly name?: string | undefined; readonly baseUrl: string }): string {
  return upstream.name ?? new URL(upstream.baseUrl).host;
}

/** `GET {baseUrl}/models`: the ids of an OpenAI-compatible server's models. */
async function discoverModels(upstream: UpstreamConfig, doFetch: typeof fetch, timeout: number): Promise<string[]> {
  const name = upstreamName(upstream);
  let response: Response;
  try {
    response = await doFetch(`${upstream.baseUrl.replace(/\/+$/, '')}/models`, {
      headers: { accept: 'application/json', ...(upstream.apiKey !== undefined && { authorization: `Bearer ${upstream.apiKey}` }), ...upstream.headers },
      signal: AbortSignal.timeout(timeout),
    });
  } catch (err) {
    throw new UpstreamDiscoveryError(
      name,
      err instanceof Error && err.name === 'TimeoutError' ? `no answer within ${timeout} ms` : 'it could not be reached',
      err,
    );
  }
  if (!response.ok) {
    await response.body?.cancel().catch(() => {});
    throw new UpstreamDiscoveryError(name, `GET /models answered HTTP ${response.status}`);
  }
  const body = (await response.json().catch(() => undefined)) as { data?: { id?: unknown }[] } | undefined;
  const ids = Array.isArray(body?.data) ? body.data.map((m) => m?.id).filter((id): id is string => typeof id === 'string' && id.length > 0) : [];
  if (ids.length === 0) throw new UpstreamDiscoveryError(name, 'GET /models listed no model');
  return ids;
}
