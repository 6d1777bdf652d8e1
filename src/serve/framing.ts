/** How a generation's tokens are framed in an OpenAI-style answer: chat deltas, or a text completion's text. */
import type { Token } from '../ai/inference/worker.js';
import { finalToolCalls } from './openai-wire.js';

export interface Framing {
  /** `object` of a streamed chunk, and of a whole answer. */
  readonly chunkObject: string;
  readonly wholeObject: string;
  /** A stream's first choice fields, before any token (the chat's role), if any. */
  readonly opening: Readonly<Record<string, unknown>> | undefined;
  /** A token's choice fields. */
  token(token: Token): Readonly<Record<string, unknown>>;
  /** The last chunk's choice fields, beside its `finish_reason`. */
  readonly closing: Readonly<Record<string, unknown>>;
  /** A whole answer's choice fields, from its text and what else the deltas carried (`tool_calls`). */
  whole(text: string, extra: Readonly<Record<string, unknown>>): Readonly<Record<string, unknown>>;
}

/** `chat.completion.chunk` deltas, and a whole `chat.completion` message. */
export const chatFraming: Framing = {
  chunkObject: 'chat.completion.chunk',
  wholeObject: 'chat.completion',
  opening: { delta: { role: 'assistant', content: '' } },
  token: (token) => ({
    delta: token.delta === undefined ? { content: token.text } : token.text === '' ? token.delta : { ...token.delta, content: token.text },
  }),
  closing: { delta: {} },
  whole: (text, extra) => {
    const toolCalls = finalToolCalls(extra.tool_calls);
    return {
      message: { role: 'assistant', content: text === '' && toolCalls !== undefined ? null : text, ...extra, ...(toolCalls && { tool_calls: toolCalls }) },
    };
  },
};
