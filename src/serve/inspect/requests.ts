/**
 * The requests running now, across transports: what the inspector lists and can cancel. The HTTP
 * handler and the WebSocket server register each request through their `RequestTelemetry`; the
 * registry holds only figures (model, tenant, times, token count), never a prompt or a token's text
 * unless it was made with `content: true` (an operator's explicit choice, `--inspect-content`).
 */
import { performance } from 'node:perf_hooks';
import { lazySchema } from '../../core/zod.js';
import { parseOptions } from '../../flow/options.js';

/** What a transport tells the registry about a request when it starts. */
export interface RequestInfo {
  readonly transport: 'http' | 'ws';
  readonly model: string;
  readonly tenant?: string | undefined;
  /** The transport's own id (the log's): `chatcmpl-…`, or `<connection>:<id>` on WebSocket. */
  readonly ref?: string | undefined;
  /** What was asked (the last user message, or the prompt): kept only by a registry made with `content: true`. */
  readonly prompt?: string | undefined;
}

/** Options of `RequestRegistry`: whether it keeps what each request asked (`content`). */
export interface RequestRegistryOptions {
  /**
   * Keep each request's prompt and the end of its answer so far, for the inspector. Off by
   * default: prompts and tokens are the users' data, shown only when an operator asks.
   */
  readonly content?: boolean;
}

const optionsSchema = lazySchema((z) => z.strictObject({ content: z.boolean({ error: 'content must be a boolean' }).optional() }));

/** How much of a prompt (its start) and of an answer (its end) the registry keeps, in characters. */
export const CONTENT_CHARS = 400;

/** One running request, as the inspector shows it. */
export interface RequestView {
  /** The registry's id: what `cancel(id)` takes. */
  readonly id: string;
  readonly transport: 'http' | 'ws';
  readonly model: string;
  readonly tenant: string | null;
  readonly ref: string | null;
  /** When it started, epoch ms. */
  readonly startedAt: number;
  readonly ageMs: number;
  /** Time to first token, ms; null before it. */
  readonly ttftMs: number | null;
  readonly tokens: number;
  /** Tokens per second since the first token; null before the second. */
  readonly tokensPerSecond: number | null;
  /** False for a request whose transport gave no way to end it. */
  readonly cancellable: boolean;
  /** With `content`: the start of what was asked, and the end of the answer so far; else null. */
  readonly prompt: string | null;
  readonly output: string | null;
}

/** A page of the running requests: the oldest `limit`, and counts of all of them. */
export interface RequestsPage {
  readonly total: number;
  readonly shown: readonly RequestView[];
  /** Running requests per model, all of them. */
  readonly byModel: Readonly<Record<string, number>>;
  /** Running requests per tenant: the 20 with the most, the rest under `(others)`. */
  readonly byTenant: Readonly<Record<string, number>>;
}

/** A registered request: the transport reports its tokens and its end. */
export interface RequestHandle {
  readonly id: string;
  /** A token went to the client (its text is kept, the last `CONTENT_CHARS`, only with `content`). */
  token(text?: string): void;
  /** How the inspector's cancel ends it: as the client's own cancel would. */
  cancelWith(cancel: () => void): void;
  /** It ended, however it ended; called more than once is harmless. */
  end(): void;
}

interface Entry {
  readonly id: string;
  readonly info: RequestInfo;
  readonly startedAt: number;
  readonly startedEpoch: number;
  firstTokenAt: number | undefined;
  lastTokenAt: number | undefined;
  tokens: number;
  cancel: (() => void) | undefined;
  readonly prompt: string | undefined;
  output: string | undefined;
}

const TOP_TENANTS = 20;

/** The requests a server is running, for the inspector: each added when it starts and removed when it ends. */
export class RequestRegistry {
  /** Insertion order is start order: the first entries are the oldest. */
  private readonly running = new Map<string, Entry>();
  private seq = 0;
  /** Whether prompts and answers are kept (see `RequestRegistryOptions.content`). */
  readonly content: boolean;

  constructor(options: RequestRegistryOptions = {}) {
    parseOptions(optionsSchema(), options, 'RequestRegistry options');
    this.content = options.content === true;
  }

  /** Requests running now. */
  get size(): number {
    return this.running.size;
  }

  /** Registers a running request; the handle updates and ends it. */
  add(info: RequestInfo): RequestHandle {
    const entry: Entry = {
      id: `r${++this.seq}`,
      info,
      startedAt: performance.now(),
      startedEpoch: Date.now(),
      firstTokenAt: undefined,
      lastTokenAt: undefined,
      tokens: 0,
      cancel: undefined,
      prompt: this.content && info.prompt !== undefined ? info.prompt.slice(0, CONTENT_CHARS) : undefined,
      output: this.content ? '' : undefined,
    };
    this.running.set(entry.id, entry);
    const running = this.running;
    return {
      id: entry.id,
      token(text) {
        const now = performance.now();
        entry.firstTokenAt ??= now;
        entry.lastTokenAt = now;
        entry.tokens++;
        if (entry.output !== undefined && text !== undefined) entry.output = (entry.output + text).slice(-CONTENT_CHARS);
      },
      cancelWith(cancel) {
        entry.cancel = cancel;
      },
      end() {
        running.delete(entry.id);
      },
    };
  }

  /**
   * Ends a running request as its client's cancel would; false when no such request runs, it
   * cannot be cancelled, or `tenant` is given and it is another tenant's (told apart from none at all by nothing).
   */
  cancel(id: string, tenant?: string): boolean {
    const entry = this.running.get(id);
    if (entry?.cancel === undefined || (tenant !== undefined && entry.info.tenant !== tenant)) return false;
    entry.cancel();
    return true;
  }

  /** The oldest `limit` running requests, and counts of all; only `only`'s (a tenant) when it is given. */
  page(limit: number, only?: string): RequestsPage {
    const now = performance.now();
    const shown: RequestView[] = [];
    const byModel: Record<string, number> = {};
    const tenants = new Map<string, number>();
    let total = 0;
    for (const entry of this.running.values()) {
      if (only !== undefined && entry.info.tenant !== only) continue;
      total++;
      if (shown.length < limit) shown.push(view(entry, now));
      byModel[entry.info.model] = (byModel[entry.info.model] ?? 0) + 1;
      const tenant = entry.info.tenant ?? '(none)';
      tenants.set(tenant, (tenants.get(tenant) ?? 0) + 1);
    }
    const ranked = [...tenants].sort((a, b) => b[1] - a[1]);
    const byTenant: Record<string, number> = Object.fromEntries(ranked.slice(0, TOP_TENANTS));
    const others = ranked.slice(TOP_TENANTS).reduce((sum, [, n]) => sum + n, 0);
    if (others > 0) byTenant['(others)'] = others;
    return { total, shown, byModel, byTenant };
  }
}

function view(entry: Entry, now: number): RequestView {
  const { firstTokenAt, lastTokenAt, tokens } = entry;
  const streaming = firstTokenAt !== undefined && lastTokenAt !== undefined && tokens > 1 && lastTokenAt > firstTokenAt;
  return {
    id: entry.id,
    transport: entry.info.transport,
    model: entry.info.model,
    tenant: entry.info.tenant ?? null,
    ref: entry.info.ref ?? null,
    startedAt: entry.startedEpoch,
    ageMs: Math.round(now - entry.startedAt),
    ttftMs: firstTokenAt === undefined ? null : Math.round(firstTokenAt - entry.startedAt),
    tokens,
    // Over the time since the first token: the decode rate, not diluted by the wait for the first.
    tokensPerSecond: streaming ? Math.round(((tokens - 1) / (now - firstTokenAt)) * 10_000) / 10 : null,
    cancellable: entry.cancel !== undefined,
    prompt: entry.prompt ?? null,
    output: entry.output ?? null,
  };
}
