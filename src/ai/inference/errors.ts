/**
 * Errors raised by model workers. Each carries a stable `code` and says what to do,
 * like every `SluiceError`.
 */
import { SluiceError } from '../../core/errors.js';

/**
 * The model server answered with an HTTP error status. `body` holds the start of its
 * answer (servers explain themselves there).
 *
 * ## Example
 * ```ts
 * if (err instanceof HttpStatusError && err.status >= 500) retryLater();
 * ```
 */
export class HttpStatusError extends SluiceError {
  constructor(
    readonly status: number,
    readonly body: string,
    details: { code?: string; hint?: string; message?: string } = {},
  ) {
    super(details.code ?? 'HTTP_STATUS', details.message ?? `The model server answered HTTP ${status}${body ? `: ${body}` : '.'}`, {
      hint: details.hint ?? (status >= 500 ? 'The server failed; retrying may help.' : 'Check the request, the model name and the API key.'),
    });
  }
}

/**
 * HTTP 429: the server asks the client to slow down. `retryAfter` is how long it asked
 * to wait, in milliseconds (from `retry-after-ms` or `retry-after`), when it said.
 *
 * ## Example
 * ```ts
 * catch (err) { if (err instanceof RateLimitedError) await sleep(err.retryAfter ?? 1000); }
 * ```
 */
export class RateLimitedError extends HttpStatusError {
  constructor(
    body: string,
    readonly retryAfter: number | undefined,
  ) {
    super(429, body, {
      code: 'RATE_LIMITED',
      hint: retryAfter === undefined ? 'Retry later with backoff.' : `Retry after ${retryAfter} ms.`,
    });
  }
}

/**
 * A streamed answer that breaks the server-sent-events protocol or the chat-completions
 * chunk shape: a `data:` payload that is not JSON, a chunk without `choices`, a stream
 * that ends before `[DONE]`, a wrong content type.
 *
 * ## Example
 * ```ts
 * if (err instanceof MalformedEventError) console.error(err.event); // the offending payload
 * ```
 */
export class MalformedEventError extends SluiceError {
  constructor(
    reason: string,
    readonly event: string | undefined = undefined,
  ) {
    super(
      'MALFORMED_EVENT',
      `Malformed event from the model server: ${reason}${event === undefined ? '' : ` (event: ${JSON.stringify(event.slice(0, 200))})`}.`,
      {
        hint: 'Check that the server speaks the OpenAI chat-completions streaming protocol.',
      },
    );
  }
}

/**
 * The server sent an error inside a stream that had started well: OpenAI's `data: {"error": {...}}`,
 * vLLM's `data: {"object": "error", "message", "code": 400}`, or an SSE `event: error`. It is an
 * `HttpStatusError` with the status the error stands for (its numeric code, else its `code` or
 * `type` read as OpenAI's names them, else 500), so it is classified as that HTTP answer would be;
 * `body` is the error as OpenAI shapes it (`{"error": {message, type, param, code}}`).
 *
 * ## Example
 * ```ts
 * if (err instanceof ProviderError) console.error(err.status, err.type, err.message);
 * ```
 */
export class ProviderError extends HttpStatusError {
  constructor(
    status: number,
    readonly type: string | undefined,
    readonly detail: string,
    body: string,
  ) {
    super(status, body, { code: 'PROVIDER_ERROR', message: `The model server reported an error mid-stream (as HTTP ${status}): ${detail}` });
  }
}

/**
 * The prompt does not fit the model's context, or the prompt and the `max_tokens` asked for do not:
 * found before any token is decoded, worded as OpenAI's `context_length_exceeded`. `param` is the
 * request field to shorten (`messages` or `prompt`); `completionTokens` is the `max_tokens` asked,
 * undefined when the prompt alone is too long.
 *
 * ## Example
 * ```ts
 * if (err instanceof ContextLengthExceededError) console.error(err.contextLength, err.promptTokens);
 * ```
 */
export class ContextLengthExceededError extends SluiceError {
  constructor(
    readonly model: string,
    readonly contextLength: number,
    readonly promptTokens: number,
    readonly completionTokens: number | undefined,
    readonly param: 'messages' | 'prompt' = 'messages',
  ) {
    const what = param === 'prompt' ? 'prompt' : 'messages';
    super(
      'CONTEXT_LENGTH_EXCEEDED',
      completionTokens === undefined
        ? `This model's maximum context length is ${contextLength} tokens. However, your ${what} resulted in ${promptTokens} tokens. Please reduce the length of the ${what}.`
        : `This model's maximum context length is ${contextLength} tokens. However, you requested ${promptTokens + completionTokens} tokens (${promptTokens} in the ${what}, ${completionTokens} in the completion). Please reduce the length of the ${what} or completion.`,
    );
  }
}

/** One class for every empty prompt, wherever it is found. */
export { EmptyPromptError } from '../../core/errors.js';
