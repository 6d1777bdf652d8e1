/**
 * The `sluice.v1` token-streaming protocol: JSON text frames over a WebSocket, every
 * one validated with zod before anything acts on it.
 *
 * Client → server
 * - `{ type: 'generate', id, prompt | messages, parameters?, traceparent?, policy?, model? }`
 * - `{ type: 'cancel', id }`
 *
 * Server → client
 * - `{ type: 'hello', protocol, connection, tenant, models, limits }` — the first frame of every
 *   connection, sent once as soon as it is accepted, before anything else: what the client may
 *   ask for (see `HelloFrame`). A refused browser (4401, 1013) never gets one.
 * - `{ type: 'token', id, seq, text, tokens }` — `seq` counts this request's token frames from 0;
 *   `tokens` is how many model tokens the frame carries (more than 1 when `conflate` merged them)
 * - `{ type: 'done', id, finish_reason, usage: { input_tokens, output_tokens }, traceparent }`
 * - `{ type: 'error', id?, code, message }` — `id` when the frame named a request
 *
 * Requests are multiplexed by `id`: a socket carries several at once, and an `id` is
 * free again once its `done` or `error` was sent.
 *
 * ## Example
 * ```ts
 * const socket = new WebSocket('ws://127.0.0.1:8080/v1/stream', [SUBPROTOCOL, `bearer.${token}`]);
 * socket.send(JSON.stringify({ type: 'generate', id: 'a', prompt: 'The stage', parameters: { max_tokens: 32 } }));
 * ```
 */
import type * as z from 'zod';
import { lazySchema, zod, type Holds, type SchemaMatches } from '../core/zod.js';
import type { FinishReason } from '../ai/inference/worker.js';
import type { TenantLimits } from './tenant-quotas.js';

/** The subprotocol a client must offer; a future incompatible protocol gets a new version. */
export const SUBPROTOCOL = 'sluice.v1';

/** Subprotocol entries starting with this carry the bearer token (browsers cannot set `Authorization`). */
export const BEARER_PROTOCOL_PREFIX = 'bearer.';

/**
 * Close codes the server uses (1000–1015 are the RFC 6455 ones).
 *
 * | code | when |
 * |------|------|
 * | 1001 | the server is shutting down (`TokenSocket.close()`) |
 * | 1008 | `maxBadFrames` consecutive protocol errors (see `PROTOCOL_ERRORS`) |
 * | 1009 | a frame above `maxPayload` (closed by `ws` itself, no error frame) |
 * | 1013 | a browser connected while the server drains: try again later (elsewhere, with backoff) |
 * | 4008 | the client did not read: bytes stayed buffered above the high-water mark for `stallTimeout` |
 * | 4401 | a browser's bearer token is missing or invalid: do not retry with the same token |
 *
 * 1013 and 4401 are refusals of an upgrade, sent right after the handshake to clients
 * that sent an `Origin` (browsers), whose WebSocket API hides an HTTP status and reports
 * only 1006; such a socket never becomes a connection, so the close is its only frame
 * (no `hello`). 4401 follows the `4000 + HTTP status` convention of graphql-ws. Other
 * clients get the HTTP status (503, 401) instead.
 *
 * A missed heartbeat pong ends the connection with `terminate()` (no close frame: the peer is gone).
 */
export const CLOSE_CODES = {
  goingAway: 1001,
  policyViolation: 1008,
  messageTooBig: 1009,
  tryAgainLater: 1013,
  slowConsumer: 4008,
  unauthorized: 4401,
} as const;

/**
 * Codes of frames the server could not understand. Each is answered with an `error`
 * frame; `maxBadFrames` of them in a row close the connection with 1008.
 */
export const PROTOCOL_ERRORS = ['BINARY_FRAME', 'INVALID_JSON', 'INVALID_MESSAGE', 'UNKNOWN_TYPE'] as const;
/** An error about a frame itself (one of `PROTOCOL_ERRORS`). */
export type ProtocolErrorCode = (typeof PROTOCOL_ERRORS)[number];

/**
 * Codes of well-formed requests the server refuses or that failed; they never close
 * the connection.
 */
export const REQUEST_ERRORS = [
  'DUPLICATE_ID',
  'UNKNOWN_ID',
  'UNKNOWN_MODEL',
  'TOO_MANY_REQUESTS',
  'RATE_LIMITED',
  'TENANT_QUOTA',
  'INVALID_OPTIONS',
  'EMPTY_PROMPT',
  'CONTEXT_LENGTH_EXCEEDED',
  'GENERATION_FAILED',
  'SHUTTING_DOWN',
  'SHUTDOWN',
] as const;
/** An error about a request (one of `REQUEST_ERRORS`). */
export type RequestErrorCode = (typeof REQUEST_ERRORS)[number];

/** A code an `error` frame carries: a protocol or request code, or the `code` of a `SluiceError` a worker raised. */
export type ErrorCode = ProtocolErrorCode | RequestErrorCode | (string & {});

const idSchema = lazySchema((z) =>
  z.string({ error: 'id must be a string' }).min(1, { error: 'id must not be empty' }).max(128, { error: 'id must be at most 128 characters' }),
);

const TRACEPARENT = /^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$/;

/** @internal The check of a `generate` frame. */
export const generateMessageSchema = lazySchema((z) =>
  z
    .object({
      type: z.literal('generate'),
      id: idSchema(),
      prompt: z.string({ error: 'prompt must be a string' }).optional(),
      messages: z
        .array(z.object({ role: z.string({ error: 'role must be a string' }), content: z.string({ error: 'content must be a string' }) }).strict(), {
          error: 'messages must be an array of { role, content }',
        })
        .optional(),
      /** Generation parameters (`temperature`, `top_p`, `max_tokens`...), validated by `generateRequest`. */
      parameters: z.record(z.string(), z.unknown(), { error: 'parameters must be an object' }).optional(),
      traceparent: z
        .string({ error: 'traceparent must be a string' })
        .regex(TRACEPARENT, { error: 'traceparent must be a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)' })
        .optional(),
      /** What happens to tokens while the client reads slowly: `pause` decoding (default) or `conflate` them into larger frames. */
      policy: z.enum(['pause', 'conflate'], { error: 'policy must be "pause" or "conflate"' }).optional(),
      /** Which of the server's workers generates, when it has several. */
      model: z.string({ error: 'model must be a string' }).min(1, { error: 'model must not be empty' }).optional(),
    })
    .strict()
    .refine((m) => (m.prompt === undefined) !== (m.messages === undefined), { error: 'give exactly one of prompt or messages', path: ['prompt'] }),
);

/** @internal The check of a `cancel` frame. */
export const cancelMessageSchema = lazySchema((z) => z.object({ type: z.literal('cancel'), id: idSchema() }).strict());

/** A client frame asking for a generation: exactly one of `prompt` or `messages`. */
export interface GenerateMessage {
  type: 'generate';
  /** The client's id of the request (1–128 characters): every frame about it carries it. */
  id: string;
  /** The prompt, for a plain completion. */
  prompt?: string;
  /** The conversation, for a chat completion. */
  messages?: { role: string; content: string }[];
  /** Generation parameters (`temperature`, `top_p`, `max_tokens`...), validated by `generateRequest`. */
  parameters?: Record<string, unknown>;
  /** A W3C traceparent to continue the client's trace. */
  traceparent?: string;
  /** What happens to tokens while the client reads slowly: `pause` decoding (default) or `conflate` them into larger frames. */
  policy?: 'pause' | 'conflate';
  /** Which of the server's workers generates, when it has several. */
  model?: string;
}
/** A client frame cancelling a generation it asked for. */
export interface CancelMessage {
  type: 'cancel';
  /** The id of the request to cancel. */
  id: string;
}
/** @internal Fails to compile when the frame types and their schemas part ways. */
export type ClientFramesInStep = [
  Holds<SchemaMatches<GenerateMessage, z.output<ReturnType<typeof generateMessageSchema>>>>,
  Holds<SchemaMatches<CancelMessage, z.output<ReturnType<typeof cancelMessageSchema>>>>,
];
/** A frame a client sends on the token socket. */
export type ClientMessage = GenerateMessage | CancelMessage;

/**
 * The limits a client must stay within (the part of `TokenSocketLimits` the `hello` frame
 * announces); going past one is answered with the error frame or close code named here, past
 * a tenant's (`tenantConcurrent`, `tenantRate`, across its connections) with `TENANT_QUOTA`.
 */
export interface HelloLimits extends TenantLimits {
  /** The largest `parameters.max_tokens` a request may ask for (`INVALID_OPTIONS` beyond). */
  readonly maxTokens: number;
  /** Requests one connection may run at once (`TOO_MANY_REQUESTS` beyond). */
  readonly maxConcurrent: number;
  /** Frames (of any type) one connection may send: `perSecond` on average, `burst` at once (`RATE_LIMITED` beyond). */
  readonly rate: { readonly perSecond: number; readonly burst: number };
  /** The largest frame a client may send, bytes (close 1009 beyond). */
  readonly maxPayload: number;
  /** The server pings every this many ms; a peer that did not answer the previous ping is cut off. */
  readonly heartbeatInterval: number;
}

/**
 * The server's greeting, the first frame of a connection (like OpenAI Realtime's
 * `session.created` or graphql-ws's `connection_ack`): a client learns what it may ask
 * for instead of being refused. Carries no secret: the tenant is the name the token
 * maps to, never the token.
 *
 * ## Example
 * ```json
 * {"type":"hello","protocol":"sluice.v1","connection":1,"tenant":"acme","models":["sluice-rag","charlm"],
 *  "limits":{"maxTokens":4096,"maxConcurrent":8,"rate":{"perSecond":20,"burst":40},"tenantConcurrent":32,
 *            "tenantRate":{"perSecond":50,"burst":100},"maxPayload":65536,"heartbeatInterval":30000}}
 * ```
 */
export interface HelloFrame {
  readonly type: 'hello';
  readonly protocol: typeof SUBPROTOCOL;
  /** This connection's number on the server, as its `connected` and `closed` events and log lines name it. */
  readonly connection: number;
  /** The tenant the bearer token belongs to (`anonymous-<connection>` on a server without authentication: each connection its own). */
  readonly tenant: string;
  /** The names a `generate` may give as `model`; the first is the one used when it gives none. */
  readonly models: readonly string[];
  readonly limits: HelloLimits;
}

/** One generated token of a request. */
export interface TokenFrame {
  readonly type: 'token';
  readonly id: string;
  readonly seq: number;
  readonly text: string;
  readonly tokens: number;
}

/** The end of a request's generation: why it finished and the usage. */
export interface DoneFrame {
  readonly type: 'done';
  readonly id: string;
  readonly finish_reason: FinishReason;
  readonly usage: { readonly input_tokens: number; readonly output_tokens: number };
  readonly traceparent: string;
}

/** A request failed, or a frame could not be understood: a code and a message. */
export interface ErrorFrame {
  readonly type: 'error';
  readonly id?: string;
  readonly code: ErrorCode;
  readonly message: string;
  /** When the server is busy (`ADMISSION_REJECTED`): how long to wait before asking again, ms. */
  readonly retry_after_ms?: number;
}

/** A frame the server sends on the token socket. */
export type ServerFrame = HelloFrame | TokenFrame | DoneFrame | ErrorFrame;

const count = () => zod().number().int().min(1);
const rateSchema = lazySchema((z) => z.object({ perSecond: z.number().positive(), burst: z.number().min(1) }).strict());

/** Schema of server frames, for clients (and tests) that validate what they receive. @internal */
export const serverFrameSchema = lazySchema((z) =>
  z.discriminatedUnion('type', [
    z
      .object({
        type: z.literal('hello'),
        protocol: z.literal(SUBPROTOCOL),
        connection: z.number().int().min(1),
        tenant: z.string(),
        models: z.array(z.string().min(1)).min(1),
        limits: z
          .object({
            maxTokens: count(),
            maxConcurrent: count(),
            rate: rateSchema(),
            tenantConcurrent: count(),
            tenantRate: rateSchema(),
            maxPayload: count(),
            heartbeatInterval: count(),
          })
          .strict(),
      })
      .strict(),
    z.object({ type: z.literal('token'), id: idSchema(), seq: z.number().int().min(0), text: z.string(), tokens: z.number().int().min(1) }).strict(),
    z
      .object({
        type: z.literal('done'),
        id: idSchema(),
        finish_reason: z.enum(['stop', 'length', 'abort', 'tool_calls', 'content_filter']),
        usage: z.object({ input_tokens: z.number().int().min(0), output_tokens: z.number().int().min(0) }).strict(),
        traceparent: z.string().regex(TRACEPARENT),
      })
      .strict(),
    z
      .object({
        type: z.literal('error'),
        id: idSchema().optional(),
        code: z.string().min(1),
        message: z.string(),
        retry_after_ms: z.number().int().min(0).optional(),
      })
      .strict(),
  ]),
);

/** What reading one frame gave: a message to act on, or the error frame to answer with. */
export type ParsedFrame =
  | { readonly ok: true; readonly message: ClientMessage }
  | { readonly ok: false; readonly error: ErrorFrame & { readonly code: ProtocolErrorCode } };

/**
 * Reads one client frame. Never throws: anything wrong becomes a protocol error frame,
 * carrying the request `id` when the frame named one.
 *
 * ## Example
 * ```ts
 * parseClientFrame('{"type":"cancel","id":"a"}', false); // { ok: true, message: { type: 'cancel', id: 'a' } }
 * parseClientFrame('nope', false).ok;                     // false (INVALID_JSON)
 * ```
 */
export function parseClientFrame(data: string, isBinary: boolean): ParsedFrame {
  if (isBinary) return bad('BINARY_FRAME', `frames must be JSON text; binary frames are not part of ${SUBPROTOCOL}`);
  let value: unknown;
  try {
    value = JSON.parse(data);
  } catch {
    return bad('INVALID_JSON', 'the frame is not valid JSON');
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return bad('INVALID_MESSAGE', 'a message must be a JSON object with a "type"');
  const record = value as Record<string, unknown>;
  const known = idSchema().safeParse(record.id);
  const requestId = known.success ? known.data : undefined;
  const schema = record.type === 'generate' ? generateMessageSchema() : record.type === 'cancel' ? cancelMessageSchema() : undefined;
  if (schema === undefined) {
    const what = typeof record.type === 'string' ? `unknown message type ${JSON.stringify(record.type.slice(0, 40))}` : 'the message has no string "type"';
    return bad(typeof record.type === 'string' ? 'UNKNOWN_TYPE' : 'INVALID_MESSAGE', `${what}; expected "generate" or "cancel"`, requestId);
  }
  const result = schema.safeParse(value);
  if (result.success) return { ok: true, message: result.data };
  return bad('INVALID_MESSAGE', `invalid ${String(record.type)} message: ${describeIssues(result.error.issues)}`, requestId);
}

/** `path: message` for each issue, like `InvalidOptionsError`, so a client sees which field is wrong. @internal */
export function describeIssues(issues: readonly z.core.$ZodIssue[]): string {
  return issues
    .flatMap((issue) => {
      const path = issue.path.map(String);
      if (issue.code === 'unrecognized_keys') return issue.keys.map((key) => `${[...path, key.slice(0, 40)].join('.')}: unknown field`);
      return [`${path.join('.') || '(root)'}: ${issue.message}`];
    })
    .join('; ');
}

function bad(code: ProtocolErrorCode, message: string, requestId?: string): ParsedFrame {
  return { ok: false, error: requestId === undefined ? { type: 'error', code, message } : { type: 'error', id: requestId, code, message } };
}

/** The path of a request URL, without its query. */
export function pathOf(url: string | undefined): string {
  const raw = url ?? '/';
  const query = raw.indexOf('?');
  return query === -1 ? raw : raw.slice(0, query);
}

/** The token of an `Authorization: Bearer <token>` header, if that is what it holds. */
export function bearerOf(header: string | undefined): string | undefined {
  if (header === undefined) return undefined;
  return /^Bearer\s+(\S+)\s*$/i.exec(header)?.[1];
}
