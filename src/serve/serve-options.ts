/** The options of `startServer` and their schema: each field's check and the rules across fields. */
import { availableParallelism } from 'node:os';
import { lazySchema } from '../core/zod.js';
import { PRIORITY_CLASSES, type PriorityClass } from '../core/vocabulary.js';
import { positiveInt } from '../flow/options.js';
import type { GatewayOptions, UpstreamOptions } from '../ai/inference/gateway.js';
import type { ModelWorker } from '../ai/inference/worker.js';
import { PII_KINDS, type PiiKind } from '../ai/stages/pii-detectors.js';
import { RETRIEVAL_MODES, type RetrievalMode } from '../ai/rag/retriever.js';
import type { LocalModelSpec } from './backends.js';
import { isLoopback } from './loopback.js';
import type { RequestLog } from './request-log.js';
import { ruleViolations } from './serve-rules.js';
import { defaultMaxQueue } from './served-pipelines.js';
import { listenFields } from './transport-options.js';
import type { TokenSocketLimits } from './ws-server.js';

/** Options of `startServer`: the models, the port, the limits and the optional features. */
export interface ServeOptions {
  /** Interface to listen on. Default `127.0.0.1`. */
  readonly host?: string;
  /** Port; 0 picks a free one. Default 8787. */
  readonly port?: number;
  /**
   * Bearer tokens accepted, each with its tenant (`{ token: tenant }`). Without any, the
   * server is open — allowed only on a loopback host unless `insecure` is set.
   */
  readonly tokens?: Readonly<Record<string, string>>;
  /** Serve without tokens on a non-loopback host. Default false. */
  readonly insecure?: boolean;
  /** Origins browsers may connect from (WebSocket 403 otherwise). Default: any. */
  readonly origins?: readonly string[];
  /** Folder of the model files; missing ones are generated there. Default `models`. */
  readonly models?: string;
  /** Folder of markdown documents to answer from. Default: the bundled corpus, except in gateway mode (no retrieval without one). */
  readonly corpus?: string;
  /**
   * Documents of `corpus` to leave out, in `.gitignore` syntax (`internals/`, `drafts/*.md`),
   * beside the patterns of the folder's own `.sluiceignore`. Needs `corpus`.
   */
  readonly corpusIgnore?: readonly string[];
  /** Files of `corpus` larger than this many bytes are skipped and counted (`too-large`). Default 8 MiB. Needs `corpus`. */
  readonly corpusMaxFileBytes?: number;
  /**
   * Decoders the user exported (`model.onnx` or `onnx/model.onnx`, `tokenizer.json`,
   * `tokenizer_config.json`), each served under its directory's name (or `name`), the first
   * as the default model; sluice-rag then answers with the first. Checked before serving:
   * a bad one fails the start with `LocalModelError` naming the file. Needs the optional
   * peers `@huggingface/tokenizers` and `@huggingface/jinja`.
   */
  readonly localModels?: readonly LocalModelSpec[];
  /**
   * Your own sentence-embedding model's directory (sentence-transformers / Optimum ONNX layout:
   * `model.onnx` or `onnx/model.onnx`, `tokenizer.json`, `1_Pooling/config.json`, `modules.json`),
   * in place of the generated one: it embeds the corpus, the questions and `/v1/embeddings`. Checked
   * before serving; a bad one fails the start with `EmbeddingDirError` naming the file. Needs the
   * optional peer `@huggingface/tokenizers`.
   */
  readonly embedModel?: string;
  /** Inference worker threads. Default `min(cores, 2)`. */
  readonly poolSize?: number;
  /** How far below the server's priority its inference threads run, in `nice` steps (0–19, Linux): above 0 the event loop wins a core a busy model shares. Default 10. */
  readonly poolNiceness?: number;
  /** How long, ms, running requests may go on after SIGTERM before they are ended. Default 10 000. */
  readonly shutdownTimeout?: number;
  /** WebSocket limits (`attachTokenSocket`). */
  readonly limits?: Partial<TokenSocketLimits>;
  /** Log lines (start-up, refusals, shutdown). Never given a token or a prompt. Default: none. */
  readonly log?: (line: string) => void;
  /**
   * The language model to serve instead of loading the generated one in this process: e.g. a
   * `remoteModel` of `sluice/nats`, whose generations run in worker processes. The edge
   * (sockets, HTTP, admission, caches), the guard, embedding and retrieval stay here.
   */
  readonly languageModel?: ModelWorker;
  /**
   * Gateway mode: serve the models of these OpenAI-compatible servers (tried in order, or
   * first by weight) instead of the embedded ones. Nothing is generated or loaded here.
   */
  readonly upstreams?: readonly UpstreamOptions[];
  /** Retries, timeouts and breakers of gateway mode (`Gateway.start`); needs `upstreams`. */
  readonly gateway?: Omit<GatewayOptions, 'upstreams'>;
  /**
   * Gateway mode with a `corpus`: the upstream model that writes `sluice-rag`'s answers from
   * the passages retrieved here. Default: the first model the upstreams list.
   */
  readonly ragModel?: string;
  /** How `sluice-rag` ranks passages: `hybrid` (BM25 and the embedding, fused), `dense` or `lexical`. Default `hybrid`. */
  readonly retrieval?: RetrievalMode;
  /** Classify every prompt for injection with the embedded guard model, for every model (`sluice-rag` always does). Default false. */
  readonly guard?: boolean;
  /** Redact personal data from every answer as it streams: true for every kind, or the kinds to redact. Default: none. */
  readonly redact?: boolean | readonly PiiKind[];
  /** One entry per request, HTTP and WebSocket: id, tenant, model, outcome, tokens, time to first token, duration, error and cause. Never a prompt, token or key. */
  readonly requestLog?: RequestLog;
  /** Serve the pipeline inspector on `/inspect` (its feed and cancel need a token, as the API does). Default true. */
  readonly inspect?: boolean;
  /**
   * Operators' tokens: they open the inspector on every tenant's requests (an API token shows
   * only its own tenant's). Accepted by `/inspect` only, not by the API. Needs `tokens`: an open
   * server's inspector is open to whoever reaches it.
   */
  readonly inspectTokens?: readonly string[];
  /**
   * Show each running request's prompt (the last user message, its first 400 characters) and
   * the last 400 characters of its answer on the inspector, to whoever may see that request
   * (its tenant, an operator). Default false: the inspector shows figures, never users' text.
   */
  readonly inspectContent?: boolean;
  /**
   * Requests waiting at the server's door, across models and transports; past it the lowest class
   * is refused at once (429 with `Retry-After`). Default 64 per core, at least 64.
   */
  readonly maxQueue?: number;
  /** The longest a request should wait at the door, ms: the queue holds no more than drains in that time (see `IntakeOptions.maxWait`). Default: only `maxQueue`. */
  readonly maxQueueWait?: number;
  /** While the event loop runs later than this (ms), HTTP completions are refused at the door (429, the intake's `lagging` shed); `priority` ones still enter. Default: no such bound. */
  readonly maxLoopLag?: number;
  /** Generations streaming at once, per model. Default 64. */
  readonly streams?: number;
  /** Requests each shared stage buffers. Default 16. */
  readonly stageCapacity?: number;
  /** Decode steps of concurrent generations run as one model call (continuous batching), at most. 1 runs each alone. Default 16. */
  readonly maxBatch?: number;
  /** Tokens one batched call of a `--model` decoder feeds at most, prefills included. Default 2048. */
  readonly stepTokens?: number;
  /** Decode steps of a `--model` decoder share a call when their contexts fall in one window of this many positions (left-padded, masked). 1 only equal lengths. Default 4096. */
  readonly lengthBucket?: number;
  /** MiB the KV caches of a `--model` decoder's generations may hold together between steps; past it the idlest are dropped and rebuilt when they resume. Default 1024. */
  readonly kvCacheMb?: number;
  /** Each tenant's priority class (`low`, `default`, `high`) when a request names none (`service_tier`). */
  readonly tenantPriorities?: Readonly<Record<string, PriorityClass>>;
}

/** The schema `startServer` checks its options with; cross-field rules live here once. @internal */
export const serveOptionsSchema = lazySchema((z) =>
  z
    .object({
      ...listenFields(z, 8787),
      // Checked as a whole, so an error never names a token (a record key would be in its path).
      tokens: z
        .custom<Record<string, string>>((v) => typeof v === 'object' && v !== null && Object.values(v).every((t) => typeof t === 'string'), {
          error: 'tokens must map each token to its tenant name',
        })
        .refine((t) => Object.keys(t).every((token) => token.length >= 8), { error: 'a token must have at least 8 characters' })
        .refine((t) => Object.values(t).every((tenant) => tenant.length > 0), { error: 'a tenant must not be empty' })
        .default({}),
      insecure: z.boolean().default(false),
      origins: z.array(z.string().url({ error: 'an origin must be a URL like https://app.example.com' })).optional(),
      models: z.string().min(1).default('models'),
      corpus: z.string().min(1).optional(),
      corpusIgnore: z.array(z.string().min(1, { error: 'a corpus ignore pattern must not be empty' })).optional(),
      corpusMaxFileBytes: z.number().int().positive().optional(),
      localModels: z
        .array(
          z.union([z.string().min(1), z.object({ dir: z.string().min(1), name: z.string().min(1).optional() }).strict()], {
            error: 'a local model is a directory path or { dir, name }',
          }),
        )
        .optional(),
      embedModel: z.string().min(1, { error: 'embedModel must not be empty' }).optional(),
      poolSize: positiveInt('poolSize').default(Math.min(availableParallelism(), 2)),
      poolNiceness: z
        .number({ error: 'poolNiceness must be a number' })
        .int({ error: 'poolNiceness must be an integer' })
        .min(0, { error: 'poolNiceness must be ≥ 0' })
        .max(19, { error: 'poolNiceness must be ≤ 19' })
        .default(10),
      shutdownTimeout: z.number({ error: 'shutdownTimeout must be a number of ms' }).int().min(0, { error: 'shutdownTimeout must be ≥ 0' }).default(10_000),
      limits: z.record(z.string(), z.unknown()).optional(),
      log: z.custom<(line: string) => void>((v) => typeof v === 'function', { error: 'log must be a function' }).optional(),
      languageModel: z
        .custom<ModelWorker>((v) => typeof (v as ModelWorker | undefined)?.generate === 'function' && typeof (v as ModelWorker).name === 'string', {
          error: 'languageModel must be a ModelWorker (name, generate, infer)',
        })
        .optional(),
      // Checked by Gateway.start, which names the bad field under "gateway options".
      upstreams: z.array(z.record(z.string(), z.unknown()), { error: 'upstreams must be an array of { baseUrl, ... }' }).min(1).optional(),
      gateway: z.record(z.string(), z.unknown()).optional(),
      ragModel: z.string().min(1, { error: 'ragModel must not be empty' }).optional(),
      retrieval: z.enum(RETRIEVAL_MODES, { error: `retrieval must be one of ${RETRIEVAL_MODES.join(', ')}` }).optional(),
      guard: z.boolean({ error: 'guard must be true or false' }).default(false),
      redact: z
        .union([z.boolean(), z.array(z.enum(PII_KINDS)).min(1, { error: 'redact: name at least one kind' })], {
          error: `redact must be true or a list of ${PII_KINDS.join(', ')}`,
        })
        .default(false),
      requestLog: z.custom<RequestLog>((v) => typeof v === 'function', { error: 'requestLog must be a function' }).optional(),
      inspect: z.boolean({ error: 'inspect must be true or false' }).default(true),
      // Checked as a whole, so an error never quotes a token.
      inspectTokens: z
        .custom<string[]>((v) => Array.isArray(v) && v.every((t) => typeof t === 'string'), { error: 'inspectTokens must be a list of tokens' })
        .refine((t) => t.every((token) => token.length >= 8), { error: 'an inspect token must have at least 8 characters' })
        .default([]),
      inspectContent: z.boolean({ error: 'inspectContent must be true or false' }).default(false),
      maxQueue: z
        .number({ error: 'maxQueue must be a number' })
        .int({ error: 'maxQueue must be an integer' })
        .min(0, { error: 'maxQueue must be ≥ 0' })
        .default(defaultMaxQueue(availableParallelism())),
      maxQueueWait: positiveInt('maxQueueWait').optional(),
      maxLoopLag: positiveInt('maxLoopLag').optional(),
      streams: positiveInt('streams').default(64),
      stageCapacity: positiveInt('stageCapacity').default(16),
      maxBatch: positiveInt('maxBatch').default(16),
      stepTokens: positiveInt('stepTokens').default(2048),
      lengthBucket: positiveInt('lengthBucket').default(4096),
      kvCacheMb: positiveInt('kvCacheMb').default(1024),
      tenantPriorities: z.record(z.string(), z.enum(PRIORITY_CLASSES, { error: `a priority is one of ${PRIORITY_CLASSES.join(', ')}` })).optional(),
    })
    .strict()
    .refine((o) => !o.inspectContent || o.inspect, {
      error: 'inspectContent shows text on the inspector, which inspect: false turns off',
      path: ['inspectContent'],
    })
    .refine((o) => o.inspectTokens.length === 0 || Object.keys(o.tokens).length > 0, {
      error: "inspectTokens guard the inspector of a server with tokens: give tokens too (an open server's inspector is open)",
      path: ['inspectTokens'],
    })
    .refine((o) => o.inspectTokens.every((token) => !Object.hasOwn(o.tokens, token)), {
      error: "an inspect token must not also be an API token: a tenant's token sees only its own requests",
      path: ['inspectTokens'],
    })
    .refine((o) => o.inspectTokens.length === 0 || o.inspect, {
      error: 'inspectTokens open the inspector, which inspect: false turns off',
      path: ['inspectTokens'],
    })
    .superRefine((o, ctx) => {
      for (const { field, message } of ruleViolations(o)) ctx.addIssue({ code: 'custom', message, path: [field] });
    })
    .refine((o) => Object.keys(o.tokens).length > 0 || o.insecure || isLoopback(o.host), {
      error: 'an open server (no tokens) may only listen on a loopback host: give tokens, or set insecure',
      path: ['tokens'],
    }),
);
