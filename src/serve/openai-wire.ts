/** The OpenAI chat-completions wire format: the request body sluice accepts, how it becomes a generation, and OpenAI-style errors. */
import type * as z from 'zod';
import { lazySchema, zod } from '../core/zod.js';
import { InvalidOptionsError, SluiceError } from '../core/errors.js';
import { generateRequest, type GenerateRequest, type GenerationDone, type ModelWorker } from '../ai/inference/worker.js';
import { EmptyPromptError } from '../ai/inference/errors.js';

/** A worker that can chat: anything implementing `ModelWorker.generate`. */
export type ChatWorker = Pick<ModelWorker<never, unknown>, 'name' | 'generate'>;

const contentPart = lazySchema((z) => z.looseObject({ type: z.string(), text: z.string().optional() }));
export const messageSchema = lazySchema((z) =>
  z.looseObject({
    role: z.enum(['system', 'developer', 'user', 'assistant', 'tool'], { error: 'role must be one of system, developer, user, assistant, tool' }),
    content: z.union([z.string(), z.array(contentPart()), z.null()], { error: 'content must be a string or an array of text parts' }).optional(),
    name: z.string().optional(),
  }),
);

/** OpenAI's presence and frequency penalties: in [-2, 2], 0 (the default many clients send) changes nothing. */
function penalty(name: string) {
  return zod()
    .number({ error: `${name} must be a number` })
    .min(-2, { error: `${name} must be in [-2, 2]` })
    .max(2, { error: `${name} must be in [-2, 2]` })
    .nullish();
}

/** The chat-completions body sluice understands. Unknown fields are refused, as OpenAI does, rather than silently ignored. */
export const chatSchema = lazySchema((z) =>
  z
    .object({
      model: z
        .string({ error: (issue) => (issue.input === undefined ? 'model is required' : 'model must be a string') })
        .min(1, { error: 'model must not be empty' }),
      messages: z.array(messageSchema(), { error: 'messages must be an array' }).min(1, { error: 'messages must not be empty' }),
      temperature: z
        .number({ error: 'temperature must be a number' })
        .min(0, { error: 'temperature must be in [0, 2]' })
        .max(2, { error: 'temperature must be in [0, 2]' })
        .nullish(),
      top_p: z.number({ error: 'top_p must be a number' }).gt(0, { error: 'top_p must be in (0, 1]' }).max(1, { error: 'top_p must be in (0, 1]' }).nullish(),
      top_k: z.number({ error: 'top_k must be a number' }).int({ error: 'top_k must be an integer' }).min(0, { error: 'top_k must be ≥ 0' }).nullish(),
      max_tokens: z
        .number({ error: 'max_tokens must be a number' })
        .int({ error: 'max_tokens must be an integer' })
        .min(1, { error: 'max_tokens must be ≥ 1' })
        .nullish(),
      max_completion_tokens: z
        .number({ error: 'max_completion_tokens must be a number' })
        .int({ error: 'max_completion_tokens must be an integer' })
        .min(1, { error: 'max_completion_tokens must be ≥ 1' })
        .nullish(),
      stop: z
        .union([z.string().min(1), z.array(z.string().min(1)).max(4, { error: 'stop takes at most 4 sequences' })], {
          error: 'stop must be a string or an array of up to 4 non-empty strings',
        })
        .nullish(),
      stream: z.boolean({ error: 'stream must be a boolean' }).nullish(),
      stream_options: z.object({ include_usage: z.boolean().optional() }).nullish(),
      seed: z.number({ error: 'seed must be a number' }).int({ error: 'seed must be an integer' }).nullish(),
      repetition_penalty: z.number({ error: 'repetition_penalty must be a number' }).gt(0, { error: 'repetition_penalty must be > 0' }).nullish(),
      presence_penalty: penalty('presence_penalty'),
      frequency_penalty: penalty('frequency_penalty'),
      // Token ids differ between tokenizers: a bias meant for OpenAI's would land on other tokens here.
      logit_bias: z
        .record(z.string(), z.number(), { error: 'logit_bias must map token ids to numbers' })
        .refine((bias) => Object.keys(bias).length === 0, { error: "logit_bias is not supported: this server's models do not use OpenAI's token ids" })
        .nullish(),
      n: z.literal(1, { error: 'only n = 1 is supported' }).nullish(),
      user: z.string().nullish(),
    })
    .strict(),
);

export type ChatBody = z.output<ReturnType<typeof chatSchema>>;

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

export function openAiFinish(done: GenerationDone | undefined): 'stop' | 'length' {
  return done?.finishReason === 'length' ? 'length' : 'stop';
}

export function toGenerateRequest(body: ChatBody, limit: number): GenerateRequest {
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
      ...(body.temperature != null && { temperature: body.temperature }),
      ...(body.top_p != null && { top_p: body.top_p }),
      ...(body.top_k != null && { top_k: body.top_k }),
      ...(maxTokens != null && { max_tokens: maxTokens }),
      ...(body.stop != null && { stop: typeof body.stop === 'string' ? [body.stop] : body.stop }),
      ...(body.seed != null && { seed: body.seed }),
      ...(body.repetition_penalty != null && { repetition_penalty: body.repetition_penalty }),
      ...(body.presence_penalty ? { presence_penalty: body.presence_penalty } : {}),
      ...(body.frequency_penalty ? { frequency_penalty: body.frequency_penalty } : {}),
    });
  } catch (err) {
    throw toApiError(err);
  }
}

export function toApiError(err: unknown): ApiError {
  if (err instanceof ApiError) return err;
  if (err instanceof EmptyPromptError) return new ApiError(400, err.message, 'invalid_request_error', 'empty_prompt', 'messages');
  if (err instanceof InvalidOptionsError) return new ApiError(400, err.message, 'invalid_request_error', 'invalid_value', err.issues[0]?.path ?? null);
  if (err instanceof SluiceError) {
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
