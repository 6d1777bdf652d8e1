/**
 * OpenAI's legacy text-completions wire format (`POST /v1/completions`, which vLLM, llama.cpp and
 * Ollama serve too): a prompt continued as it is, with no chat template. The body accepted, how it
 * becomes a generation, and how the answer is framed.
 */
import type * as z from 'zod';
import { lazySchema } from '../core/zod.js';
import { generateRequest, type GenerateRequest } from '../ai/inference/worker.js';
import { ApiError, modelField, samplingFields, samplingOf, toApiError, unsupportedParameter } from './openai-wire.js';
import type { Framing } from './framing.js';

/** OpenAI's default for this API (vLLM's too): a completion without `max_tokens` is 16 tokens long. */
export const DEFAULT_COMPLETION_TOKENS = 16;

/** @internal The text-completions body. One prompt, one choice; fields that ask for what these models cannot do are refused by name. */
export const completionsSchema = lazySchema((z) =>
  z
    .object({
      model: modelField(),
      prompt: z.union(
        [
          z.string({ error: 'prompt must be a string' }),
          z.tuple([z.string({ error: 'prompt must be a string' })], { error: 'prompt takes one string here (one choice per request)' }),
        ],
        { error: "prompt must be a string (token ids are not supported: they are another tokenizer's)" },
      ),
      suffix: z
        .string({ error: 'suffix must be a string' })
        .refine((suffix) => suffix === '', unsupportedParameter('suffix'))
        .nullish(),
      ...samplingFields(),
      best_of: z.literal(1, { error: 'only best_of = 1 is supported' }).nullish(),
      logprobs: z
        .number({ error: 'logprobs must be a number' })
        .int({ error: 'logprobs must be an integer' })
        .min(0, { error: 'logprobs must be in [0, 5]' })
        .max(5, { error: 'logprobs must be in [0, 5]' })
        .refine((n) => n === 0, unsupportedParameter('logprobs'))
        .nullish(),
      echo: z.boolean({ error: 'echo must be a boolean' }).nullish(),
    })
    .strict(),
);

/** @internal A text-completions body as parsed. */
export type CompletionsBody = z.output<ReturnType<typeof completionsSchema>>;

/** @internal For an upstream model: the fields sluice reads are checked, the rest (logprobs, suffix, vendor fields) is the upstream's. */
export const passthroughCompletionsSchema = lazySchema((z) =>
  completionsSchema()
    .omit({ suffix: true, logprobs: true, logit_bias: true, best_of: true })
    .extend({
      // An upstream has its own tokenizer: token-id prompts are its business.
      prompt: z.union([z.string(), z.array(z.unknown()).length(1, { error: 'prompt takes one prompt here (one choice per request)' })], {
        error: 'prompt must be a string or an array of one prompt',
      }),
    })
    .loose(),
);

/** The prompt's text: the string, or the one string of an array (undefined for token ids, which only an upstream reads). */
export function promptOf(body: { readonly prompt: unknown }): string | undefined {
  const prompt = Array.isArray(body.prompt) ? body.prompt[0] : body.prompt;
  return typeof prompt === 'string' ? prompt : undefined;
}

/** @internal A parsed completions body as a generation request, its token budget checked against `limit`. */
export function toCompletionRequest(
  body: Omit<CompletionsBody, 'prompt'> & { readonly prompt: unknown },
  limit: number,
  passthrough?: Readonly<Record<string, unknown>>,
): GenerateRequest {
  const maxTokens = body.max_tokens ?? DEFAULT_COMPLETION_TOKENS;
  if (maxTokens > limit) throw new ApiError(400, `max_tokens must be at most ${limit} on this server`, 'invalid_request_error', 'invalid_value', 'max_tokens');
  try {
    return generateRequest({
      // A token-id prompt (upstream only) is carried by the passthrough body; the request names it for logs and budgets.
      prompt: promptOf(body) ?? '(token ids)',
      ...samplingOf(body),
      max_tokens: maxTokens,
      ...(passthrough !== undefined && { passthrough }),
    });
  } catch (err) {
    const error = toApiError(err);
    // An empty prompt is the prompt's fault here, not the messages'.
    throw error.code === 'empty_prompt' ? new ApiError(400, error.message, error.type, error.code, 'prompt') : error;
  }
}

/** `text_completion` objects; with `echo`, the prompt comes first (a stream's first chunk, a whole answer's start). */
export function textFraming(echoed: string | undefined): Framing {
  return {
    chunkObject: 'text_completion',
    wholeObject: 'text_completion',
    choice: (text, finishReason) => ({ index: 0, text, logprobs: null, finish_reason: finishReason }),
    opening: echoed === undefined || echoed === '' ? undefined : echoed,
    token: (token) => token.text,
    closing: '',
    whole: (text, _extra, finishReason) => ({ index: 0, text: (echoed ?? '') + text, logprobs: null, finish_reason: finishReason }),
  };
}
