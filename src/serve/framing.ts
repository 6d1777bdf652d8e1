/** How a generation's tokens are framed in an OpenAI-style answer: chat deltas, or a text completion's text. */
import type { Token } from '../ai/inference/worker.js';
import { finalToolCalls } from './openai-wire.js';

/**
 * A framing's choices are object literals of one shape each, built per token without a spread:
 * V8 (Node 20) makes every `{ ...object, key }` in the old generation.
 */
export interface Framing {
  /** `object` of a streamed chunk, and of a whole answer. */
  readonly chunkObject: string;
  readonly wholeObject: string;
  /** A streamed chunk's choice around `content` (the chat's `delta`, a completion's `text`). */
  choice(content: unknown, finishReason: string | null): Readonly<Record<string, unknown>>;
  /** A stream's first content, before any token (the chat's role), if any. */
  readonly opening: unknown;
  /** A token's content. */
  token(token: Token): unknown;
  /** The last chunk's content, beside its `finish_reason`. */
  readonly closing: unknown;
  /** A whole answer's choice, from its text and what else the deltas carried (`tool_calls`). */
  whole(text: string, extra: Readonly<Record<string, unknown>>, finishReason: string): Readonly<Record<string, unknown>>;
}

/** `chat.completion.chunk` deltas, and a whole `chat.completion` message. */
export const chatFraming: Framing = {
  chunkObject: 'chat.completion.chunk',
  wholeObject: 'chat.completion',
  choice: (delta, finishReason) => ({ index: 0, delta, logprobs: null, finish_reason: finishReason }),
  // As OpenAI's first chunk: the role, empty content, no refusal.
  opening: { role: 'assistant', content: '', refusal: null },
  token: (token) =>
    token.delta === undefined ? { content: token.text } : token.text === '' ? token.delta : Object.assign({}, token.delta, { content: token.text }),
  closing: {},
  whole: (text, extra, finishReason) => {
    const toolCalls = finalToolCalls(extra.tool_calls);
    const refused = typeof extra.refusal === 'string';
    // OpenAI's spec requires `refusal` on every message, null when the model did not refuse; an upstream's refusal is kept.
    const message = Object.assign(
      { role: 'assistant', content: text === '' && (toolCalls !== undefined || refused) ? null : text, refusal: null },
      extra,
      toolCalls && { tool_calls: toolCalls },
    );
    return { index: 0, message, logprobs: null, finish_reason: finishReason };
  },
};
