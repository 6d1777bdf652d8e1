/** The OpenAI chat-completions wire format: the request body sluice accepts, how it becomes a generation, and OpenAI-style errors. */
import type * as z from 'zod';
import { lazySchema } from '../core/zod.js';
import { AdmissionRejectedError, InvalidOptionsError, SluiceError, StageError } from '../core/errors.js';
import type { PriorityClass } from '../core/vocabulary.js';
import { generateRequest, type GenerateRequest, type GenerationDone, type GenerationParams, type ModelWorker } from '../ai/inference/worker.js';
import { ContextLengthExceededError, EmptyPromptError, HttpStatusError, MalformedEventError, ProviderError } from '../ai/inference/errors.js';
import { classifyUpstreamFailure } from '../ai/inference/upstream-failure.js';
import { samplingRules } from '../ai/inference/sampling-rules.js';
import { retryAfterOf } from '../resilience/retry.js';
import { OutputInvalidError } from '../ai/stages/json-output.js';
import { CircuitOpenError, FallbackExhaustedError, StreamTimeoutError } from '../resilience/errors.js';

/** A worker that can chat: anything implementing `ModelWorker.generate`. */
export type ChatWorker = Pick<ModelWorker<never, unknown>, 'name' | 'generate' | 'passthrough' | 'stages'>;

const contentPart = lazySchema((z) => z.looseObject({ type: z.string(), text: z.string().optional() }));
/** @internal A chat message: a role and text content (unknown fields kept). */
export const messageSchema = lazySchema((z) =>
  z.looseObject({
    role: z.enum(['system', 'developer', 'user', 'assistant', 'tool'], { error: 'role must be one of system, developer, user, assistant, tool' }),
    content: z.union([z.string(), z.array(contentPart()), z.null()], { error: 'content must be a string or an array of text parts' }).optional(),
    name: z.string().optional(),
  }),
);

/** @internal A body's `model`. */
export const modelField = lazySchema((z) =>
  z.string({ error: (issue) => (issue.input === undefined ? 'model is required' : 'model must be a string') }).min(1, { error: 'model must not be empty' }),
);

/** @internal The fields the chat and the text completions share: the length, sampling and stopping (vLLM's `top_k` and `repetition_penalty` too). */
export const samplingFields = lazySchema((z) => ({
  max_tokens: samplingRules().max_tokens.nullish(),
  temperature: samplingRules().temperature.max(2, { error: 'temperature must be in [0, 2]' }).nullish(),
  top_p: samplingRules().top_p.nullish(),
  top_k: samplingRules().top_k.nullish(),
  stop: z
    .union([z.string().min(1), z.array(z.string().min(1)).max(4, { error: 'stop takes at most 4 sequences' })], {
      error: 'stop must be a string or an array of up to 4 non-empty strings',
    })
    .nullish(),
  stream: z.boolean({ error: 'stream must be a boolean' }).nullish(),
  stream_options: z.object({ include_usage: z.boolean().optional() }).nullish(),
  seed: samplingRules().seed.nullish(),
  repetition_penalty: samplingRules().repetition_penalty.nullish(),
  presence_penalty: samplingRules().presence_penalty.nullish(),
  frequency_penalty: samplingRules().frequency_penalty.nullish(),
  // Token ids differ between tokenizers: a bias meant for OpenAI's would land on other tokens here.
  logit_bias: z
    .record(z.string(), z.number(), { error: 'logit_bias must map token ids to numbers' })
    .refine((bias) => Object.keys(bias).length === 0, { error: "logit_bias is not supported: this server's models do not use OpenAI's token ids" })
    .nullish(),
  n: z.literal(1, { error: 'only n = 1 is supported' }).nullish(),
  user: z.string().nullish(),
}));

type Sampling = z.output<z.ZodObject<ReturnType<typeof samplingFields>>>;

/** @internal The sampling fields of a body as `generateRequest` takes them (penalties of 0, the default, left out). */
export function samplingOf(body: Sampling): GenerationParams {
  return {
    ...(body.temperature != null && { temperature: body.temperature }),
    ...(body.top_p != null && { top_p: body.top_p }),
    ...(body.top_k != null && { top_k: body.top_k }),
    ...(body.stop != null && { stop: typeof body.stop === 'string' ? [body.stop] : body.stop }),
    ...(body.seed != null && { seed: body.seed }),
    ...(body.repetition_penalty != null && { repetition_penalty: body.repetition_penalty }),
    ...(body.presence_penalty ? { presence_penalty: body.presence_penalty } : {}),
    ...(body.frequency_penalty ? { frequency_penalty: body.frequency_penalty } : {}),
  };
}

/** OpenAI's words for a field whose value asks for something the model cannot do. */
export const unsupportedParameter = (name: string) => ({
  error: `Unsupported parameter: '${name}' is not supported with this model.`,
  params: { code: 'unsupported_parameter' },
});
const unsupportedValue = (name: string, value: string) => ({
  error: `Unsupported value: '${name}' does not support ${value} with this model.`,
  params: { code: 'unsupported_value' },
});

/**
 * OpenAI fields the models served here do not use. Clients send them with their defaults
 * (`logprobs: false`, `tool_choice: "none"`, `store`, `metadata`...): those are accepted and
 * change nothing; a value that asks for something these models cannot do is refused by name.
 * Upstream models get them as sent (`passthroughChatSchema`).
 */
const unusedOpenAiFields = lazySchema((z) => ({
  logprobs: z
    .boolean({ error: 'logprobs must be a boolean' })
    .refine((on) => !on, unsupportedParameter('logprobs'))
    .nullish(),
  top_logprobs: z
    .number({ error: 'top_logprobs must be a number' })
    .int({ error: 'top_logprobs must be an integer' })
    .min(0, { error: 'top_logprobs must be in [0, 20]' })
    .max(20, { error: 'top_logprobs must be in [0, 20]' })
    .refine((n) => n === 0, unsupportedParameter('top_logprobs'))
    .nullish(),
  tools: z
    .array(z.unknown(), { error: 'tools must be an array' })
    .refine((tools) => tools.length === 0, unsupportedParameter('tools'))
    .nullish(),
  // With no tools, "none" and "auto" both mean an answer in text.
  tool_choice: z
    .unknown()
    .refine((choice) => choice === 'none' || choice === 'auto', unsupportedValue('tool_choice', 'a required or named tool'))
    .nullish(),
  parallel_tool_calls: z.boolean({ error: 'parallel_tool_calls must be a boolean' }).nullish(),
  functions: z
    .array(z.unknown(), { error: 'functions must be an array' })
    .refine((functions) => functions.length === 0, unsupportedParameter('functions'))
    .nullish(),
  function_call: z
    .unknown()
    .refine((call) => call === 'none' || call === 'auto', unsupportedValue('function_call', 'a named function'))
    .nullish(),
  // Nothing is stored or billed by tier here; a cache key and a safety identifier have nothing to key.
  store: z.boolean({ error: 'store must be a boolean' }).nullish(),
  metadata: z.record(z.string(), z.string(), { error: 'metadata must map strings to strings' }).nullish(),
  service_tier: z.enum(['auto', 'default', 'flex', 'scale', 'priority'], { error: 'service_tier must be auto, default, flex, scale or priority' }).nullish(),
  prompt_cache_key: z.string({ error: 'prompt_cache_key must be a string' }).nullish(),
  safety_identifier: z.string({ error: 'safety_identifier must be a string' }).nullish(),
  // Hints about how much to write or think: a model served here writes as it does.
  reasoning_effort: z.enum(['none', 'minimal', 'low', 'medium', 'high'], { error: 'reasoning_effort must be none, minimal, low, medium or high' }).nullish(),
  verbosity: z.enum(['low', 'medium', 'high'], { error: 'verbosity must be low, medium or high' }).nullish(),
  // A predicted output only speeds a model up when it matches: ignoring it changes no answer.
  prediction: z.looseObject({ type: z.literal('content', { error: 'prediction.type must be "content"' }) }).nullish(),
  modalities: z
    .array(z.enum(['text', 'audio'], { error: 'modalities must list "text" or "audio"' }), { error: 'modalities must be an array' })
    .refine((modalities) => !modalities.includes('audio'), unsupportedValue('modalities', '"audio"'))
    .nullish(),
  audio: z
    .unknown()
    .refine((audio) => audio === null, unsupportedParameter('audio'))
    .optional(),
  web_search_options: z
    .unknown()
    .refine((options) => options === null, unsupportedParameter('web_search_options'))
    .optional(),
}));

/** @internal The chat-completions body sluice understands. Unknown fields are refused, as OpenAI does, rather than silently ignored. */
export const chatSchema = lazySchema((z) =>
  z
    .object({
      ...unusedOpenAiFields(),
      model: modelField(),
      messages: z.array(messageSchema(), { error: 'messages must be an array' }).min(1, { error: 'messages must not be empty' }),
      ...samplingFields(),
      max_completion_tokens: z
        .number({ error: 'max_completion_tokens must be a number' })
        .int({ error: 'max_completion_tokens must be an integer' })
        .min(1, { error: 'max_completion_tokens must be ≥ 1' })
        .nullish(),
      // Checked here; the model's answer is validated against it (`jsonWorker`).
      response_format: z
        .discriminatedUnion(
          'type',
          [
            z.object({ type: z.literal('text') }).strict(),
            z.object({ type: z.literal('json_object') }).strict(),
            z
              .object({
                type: z.literal('json_schema'),
                json_schema: z
                  .object({
                    name: z
                      .string({ error: 'json_schema.name is required' })
                      .regex(/^[\w-]{1,64}$/, { error: 'json_schema.name: letters, digits, _ and -, at most 64' }),
                    description: z.string().optional(),
                    schema: z.record(z.string(), z.unknown(), { error: 'json_schema.schema must be a JSON Schema object' }).optional(),
                    strict: z.boolean().nullish(),
                  })
                  .strict(),
              })
              .strict(),
          ],
          { error: 'response_format.type must be "text", "json_object" or "json_schema"' },
        )
        .nullish(),
    })
    .strict(),
);

/** @internal A chat-completions body as parsed. */
export type ChatBody = z.output<ReturnType<typeof chatSchema>>;

/** @internal The embeddings body: text inputs only (token-id arrays belong to OpenAI's tokenizer). */
export const embeddingsSchema = lazySchema((z) =>
  z
    .object({
      model: modelField(),
      input: z.union(
        [
          z.string().min(1, { error: 'input must not be empty' }),
          z
            .array(z.string().min(1, { error: 'an input must not be empty' }), { error: 'input must be a string or an array of strings' })
            .min(1, { error: 'input must not be empty' })
            .max(2048, { error: 'input takes at most 2048 texts' }),
        ],
        { error: "input must be a string or an array of strings (token ids are not supported: they are another tokenizer's)" },
      ),
      encoding_format: z.enum(['float', 'base64'], { error: 'encoding_format must be "float" or "base64"' }).nullish(),
      dimensions: z.number({ error: 'dimensions must be a number' }).int().positive().nullish(),
      user: z.string().nullish(),
    })
    .strict(),
);

/** @internal An embeddings body as parsed. */
export type EmbeddingsBody = z.output<ReturnType<typeof embeddingsSchema>>;

/** A model `/v1/embeddings` serves. */
export interface EmbeddingModel {
  /** Embeds `texts`, returning one vector per text and the tokens used. */
  embed(texts: readonly string[]): Promise<{ readonly vectors: readonly Float32Array[]; readonly tokens: number }>;
}

/** A vector as OpenAI's `base64` encoding has it: the float32 values, little-endian, in base64. */
export function base64Vector(vector: Float32Array): string {
  const bytes = Buffer.alloc(vector.length * 4);
  for (let i = 0; i < vector.length; i++) bytes.writeFloatLE(vector[i]!, i * 4);
  return bytes.toString('base64');
}

/**
 * @internal
 * The body a passthrough worker (an upstream server) gets: the fields sluice reads are
 * checked as for any model, every other field is kept for the upstream, and `logit_bias`
 * is the upstream's business (its token ids are its own).
 */
export const passthroughChatSchema = lazySchema((z) =>
  chatSchema()
    // The upstream checks its own formats (vendors add types and fields) and decides what it supports: kept as unknown fields.
    .omit({ response_format: true, ...Object.fromEntries(Object.keys(unusedOpenAiFields()).map((key) => [key, true as const])) })
    .extend({ logit_bias: z.record(z.string(), z.number(), { error: 'logit_bias must map token ids to numbers' }).nullish() })
    .loose(),
);

/** An OpenAI-style error response. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly type: string,
    readonly code: string | null,
    readonly param: string | null = null,
    /** Headers the response carries beside the error (`Allow` on a 405). */
    readonly headers: Readonly<Record<string, string>> = {},
  ) {
    super(message);
  }
  body(): string {
    return JSON.stringify({ error: { message: this.message, type: this.type, param: this.param, code: this.code } });
  }
}

export type OpenAiFinish = 'stop' | 'length' | 'tool_calls' | 'content_filter';

export function openAiFinish(done: GenerationDone | undefined): OpenAiFinish {
  const reason = done?.finishReason;
  return reason === 'length' || reason === 'tool_calls' || reason === 'content_filter' ? reason : 'stop';
}

/**
 * Folds a streamed `delta` into what a whole message holds: text pieces are
 * concatenated, objects merged, and lists whose items carry an `index` (`tool_calls`)
 * merged item by item, as OpenAI's streams split a tool call's `arguments`.
 */
export function mergeDelta(into: Record<string, unknown>, delta: Readonly<Record<string, unknown>>): Record<string, unknown> {
  for (const [key, value] of Object.entries(delta)) {
    const current = into[key];
    if (value === null || value === undefined) continue;
    if (typeof value === 'string') into[key] = typeof current === 'string' ? current + value : value;
    else if (Array.isArray(value)) {
      const list = Array.isArray(current) ? current : [];
      for (const item of value) {
        const index = isRecord(item) && typeof item.index === 'number' ? item.index : undefined;
        const at = index === undefined ? -1 : list.findIndex((x) => isRecord(x) && x.index === index);
        if (at >= 0 && isRecord(item)) mergeDelta(list[at] as Record<string, unknown>, item);
        else list.push(isRecord(item) ? mergeDelta({}, item) : item);
      }
      into[key] = list;
    } else if (isRecord(value)) into[key] = mergeDelta(isRecord(current) ? current : {}, value);
    else into[key] = value;
  }
  return into;
}

/** A whole message's `tool_calls`: the streamed ones without their `index`. */
export function finalToolCalls(calls: unknown): unknown[] | undefined {
  if (!Array.isArray(calls) || calls.length === 0) return undefined;
  return calls.map((call) => {
    if (!isRecord(call)) return call;
    const { index: _index, ...rest } = call;
    return rest;
  });
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** @internal A parsed chat body as a generation request, its token budget checked against `limit`. */
export function toGenerateRequest(body: ChatBody, limit: number, passthrough?: Readonly<Record<string, unknown>>): GenerateRequest {
  const messages = body.messages.map((m) => ({
    role: m.role,
    content: typeof m.content === 'string' ? m.content : (m.content ?? []).map((part) => (part.type === 'text' ? (part.text ?? '') : '')).join(''),
  }));
  const maxTokens = body.max_completion_tokens ?? body.max_tokens;
  if (maxTokens != null && maxTokens > limit) {
    const param = body.max_completion_tokens != null ? 'max_completion_tokens' : 'max_tokens';
    throw new ApiError(400, `${param} must be at most ${limit} on this server`, 'invalid_request_error', 'invalid_value', param);
  }
  try {
    return generateRequest({
      messages,
      ...samplingOf(body),
      ...(maxTokens != null && { max_tokens: maxTokens }),
      ...(passthrough !== undefined && { passthrough }),
    });
  } catch (err) {
    throw toApiError(err);
  }
}

/** A request's class at the server's door from its `service_tier`; none for `auto`/`default` (the tenant's class then). */
export function tierClass(tier: string | null | undefined): PriorityClass | undefined {
  return tier === 'priority' ? 'high' : tier === 'flex' ? 'low' : undefined;
}

/** The 429 `server_busy` of a request the server's door refused, told to retry after `retryAfter` ms. */
export function serverBusy(retryAfter: number, reason: 'queue-full' | 'evicted' | 'lagging'): ApiError {
  const seconds = Math.max(1, Math.ceil(retryAfter / 1000));
  const why = reason === 'evicted' ? "a request of a higher priority took this one's place" : reason === 'lagging' ? 'it is behind' : 'its queue is full';
  return new ApiError(429, `The server is busy: ${why}. Retry after ${seconds} s.`, 'requests', 'server_busy', null, { 'retry-after': String(seconds) });
}

export function toApiError(err: unknown): ApiError {
  if (err instanceof ApiError) return err;
  const upstream = upstreamApiError(err);
  if (upstream !== undefined) return upstream;
  if (err instanceof EmptyPromptError) return new ApiError(400, err.message, 'invalid_request_error', 'empty_prompt', 'messages');
  if (err instanceof ContextLengthExceededError) return new ApiError(400, err.message, 'invalid_request_error', 'context_length_exceeded', err.param);
  if (err instanceof InvalidOptionsError) return new ApiError(400, err.message, 'invalid_request_error', 'invalid_value', err.issues[0]?.path ?? null);
  if (err instanceof AdmissionRejectedError) return serverBusy(err.retryAfter, err.reason);
  if (err instanceof SluiceError) {
    if (err instanceof OutputInvalidError)
      return new ApiError(
        422,
        `The model's answer did not match response_format after one repair attempt: ${err.issues.map((i) => `${i.path || '(root)'}: ${i.message}`).join('; ')}.`,
        'invalid_response_error',
        'output_invalid',
        'response_format',
      );
    if (err.code === 'SHUTDOWN') return new ApiError(503, err.message, 'server_error', 'server_shutdown');
    // The guard's score and thresholds are the operator's business, not the client's.
    if (err.code === 'GUARD_BLOCKED')
      return new ApiError(400, 'The request was blocked by the content policy.', 'invalid_request_error', 'content_policy_violation', 'messages');
    return new ApiError(500, err.message, 'server_error', err.code);
  }
  // Only sluice's own messages are passed on: anything else may carry internals (paths, hosts, keys). A code is safe.
  const code = typeof err === 'object' && err !== null && typeof (err as { code?: unknown }).code === 'string' ? (err as { code: string }).code : null;
  return new ApiError(500, 'The server failed to generate.', 'server_error', code);
}

/**
 * How an upstream's failure reads to the client of a gateway, judged by `classifyUpstreamFailure`
 * whether an HTTP status or an error inside the stream said it: the request's fault is the
 * upstream's own 4xx with its message, type, code and param; every upstream rate limited a 429
 * and every circuit open a 503, with `Retry-After`; upstreams that refuse this gateway (401/403:
 * its key, the operator's to fix, never passed on to a client whose own key is fine) a 502
 * `upstream_misconfigured`; every upstream silent a 504; a broken or failing one a 502. Bodies
 * of upstream 5xx are not passed on. Undefined when `err` is no upstream's failure. The HTTP
 * answers and the WebSocket `error` frames both read it, so the two transports judge alike.
 */
export function upstreamApiError(err: unknown): ApiError | undefined {
  // A stage wraps a failure that is not a SluiceError (fetch's TypeError): judge the cause.
  if (err instanceof StageError && !(err.cause instanceof SluiceError)) return upstreamApiError(err.cause);
  if (err instanceof FallbackExhaustedError) {
    const errors = err.failures.map((f) => f.error);
    const refused = errors.find((e) => e instanceof HttpStatusError && classifyUpstreamFailure(e) === 'request');
    if (refused !== undefined) return upstreamApiError(refused);
    if (errors.every((e) => rateLimited(e) || e instanceof CircuitOpenError)) {
      const waits = errors.map(retryAfterOf).filter((w): w is number => w !== undefined);
      return waitError(errors.some(rateLimited), waits.length > 0 ? Math.min(...waits) : undefined);
    }
    // The upstreams that were asked: an open circuit asked nobody.
    const asked = errors.filter((e) => !(e instanceof CircuitOpenError));
    if (asked.every((e) => e instanceof StreamTimeoutError)) return silentError(asked as StreamTimeoutError[]);
    const reasons = err.failures.map((f) => `${f.worker}: ${shortReason(f.error)}`).join('; ');
    if (asked.every((e) => classifyUpstreamFailure(e) === 'configuration')) return misconfigured(reasons);
    return new ApiError(502, `No upstream could answer (${reasons}).`, 'server_error', 'upstream_error');
  }
  if (rateLimited(err)) return waitError(true, retryAfterOf(err));
  if (err instanceof CircuitOpenError) return waitError(false, err.retryAfter);
  if (err instanceof HttpStatusError) {
    const kind = classifyUpstreamFailure(err);
    if (kind === 'request') {
      const body = parseErrorBody(err.body);
      return new ApiError(
        err.status,
        body?.message ?? `The upstream refused the request (HTTP ${err.status}).`,
        body?.type ?? 'invalid_request_error',
        body?.code ?? null,
        body?.param ?? null,
      );
    }
    if (kind === 'configuration') return misconfigured(shortReason(err));
    return new ApiError(502, `The upstream model server failed (${shortReason(err)}).`, 'server_error', 'upstream_error');
  }
  if (err instanceof StreamTimeoutError) return silentError([err]);
  if (err instanceof MalformedEventError)
    return new ApiError(502, `The upstream model server broke its stream (${shortReason(err)}).`, 'server_error', 'upstream_error');
  // fetch's words for a connection refused before the answer, and one cut during it.
  if (err instanceof TypeError && err.message === 'fetch failed')
    return new ApiError(502, 'The upstream model server could not be reached.', 'server_error', 'upstream_unreachable');
  if (err instanceof TypeError && err.message === 'terminated')
    return new ApiError(502, 'The upstream model server closed the connection mid-answer.', 'server_error', 'upstream_error');
  return undefined;
}

function rateLimited(error: unknown): boolean {
  return error instanceof HttpStatusError && error.status === 429;
}

function silentError(timeouts: readonly StreamTimeoutError[]): ApiError {
  const ms = [...new Set(timeouts.map((t) => t.timeout))].join(', ');
  return new ApiError(
    504,
    `The upstream model server went silent (${ms} ms${timeouts.length > 1 ? `, ${timeouts.length} upstreams` : ''}).`,
    'server_error',
    'upstream_timeout',
  );
}

/** The upstream refused this gateway's credentials or access: the operator's to fix, so the client's status says the gateway failed. */
function misconfigured(reasons: string): ApiError {
  return new ApiError(
    502,
    `The upstream model server refused this gateway (${reasons}): its key or access must be fixed by the gateway's operator.`,
    'server_error',
    'upstream_misconfigured',
  );
}

/** An upstream that limits the rate without saying how long to wait: the client is told to wait this long. */
const UNSAID_RETRY_AFTER = 1_000;

/** 429 when an upstream limited the rate, else 503 (circuits open); `Retry-After` in whole seconds, always. */
function waitError(limited: boolean, retryAfter: number | undefined): ApiError {
  const headers = { 'retry-after': String(Math.max(1, Math.ceil((retryAfter ?? UNSAID_RETRY_AFTER) / 1000))) };
  return limited
    ? new ApiError(429, 'The upstream model servers are rate limiting; retry later.', 'requests', 'rate_limit_exceeded', null, headers)
    : new ApiError(503, 'Every upstream model server is unavailable for now; retry later.', 'server_error', 'upstream_unavailable', null, headers);
}

/** A failure in a few words, without bodies (an upstream's 5xx body may carry its internals). */
function shortReason(error: unknown): string {
  if (error instanceof ProviderError) return `error in stream, as HTTP ${error.status}`;
  if (error instanceof HttpStatusError) return `HTTP ${error.status}`;
  if (error instanceof CircuitOpenError) return 'circuit open';
  if (error instanceof StreamTimeoutError) return `silent for ${error.timeout} ms`;
  if (error instanceof MalformedEventError) return 'malformed stream';
  if (error instanceof TypeError) return 'unreachable';
  return error instanceof SluiceError ? error.code : 'failed';
}

function parseErrorBody(body: string): { message?: string; type?: string; code?: string; param?: string } | undefined {
  try {
    const parsed = JSON.parse(body) as { error?: unknown };
    const error = parsed?.error;
    if (typeof error === 'string') return { message: error };
    if (typeof error !== 'object' || error === null) return undefined;
    const e = error as Record<string, unknown>;
    const text = (v: unknown) => (typeof v === 'string' ? v : undefined);
    const out: { message?: string; type?: string; code?: string; param?: string } = {};
    if (text(e.message) !== undefined) out.message = text(e.message)!;
    if (text(e.type) !== undefined) out.type = text(e.type)!;
    if (text(e.code) !== undefined) out.code = text(e.code)!;
    if (text(e.param) !== undefined) out.param = text(e.param)!;
    return out;
  } catch {
    return undefined;
  }
}

/** The first problem zod found in a body, as OpenAI words it: an unknown field, or a bad value with its path (and its code, when the schema names one). */
export function bodyError(issue: {
  readonly code: string;
  readonly path: readonly PropertyKey[];
  readonly message: string;
  readonly keys?: readonly string[];
  readonly params?: Readonly<Record<string, unknown>>;
}): ApiError {
  if (issue.code === 'unrecognized_keys') {
    const keys = issue.keys ?? [];
    return new ApiError(400, `Unrecognized request argument supplied: ${keys.join(', ')}`, 'invalid_request_error', 'unrecognized_argument', keys[0] ?? null);
  }
  const code = typeof issue.params?.code === 'string' ? issue.params.code : 'invalid_value';
  return new ApiError(400, issue.message, 'invalid_request_error', code, issue.path.map(String).join('.') || null);
}
