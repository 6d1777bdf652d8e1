/**
 * Exact token counts for OpenAI models, with the model's own BPE encoding (o200k_base
 * for GPT-4o, GPT-4.1, GPT-5 and the o-series; cl100k_base for GPT-4 and GPT-3.5) from
 * `js-tiktoken`, an optional peer of `sluice/ai` loaded on first use. The ranks ship
 * inside the package: nothing is downloaded.
 */
import type { Tiktoken } from 'js-tiktoken/lite';
import { jsTiktoken, tiktokenRanks } from '../../core/peers.js';
import type { PromptTokenizer } from '../models/prompt-tokenizer.js';
import type { ChatMessage } from './worker.js';

/** Tokens OpenAI's chat format adds per message (`<|start|>role…<|end|>`) and to prime the reply. */
const PER_MESSAGE = 3;
const REPLY_PRIMING = 3;

/** Encodings by model family, for names the library's table does not list yet (dated snapshots, new minis). */
const FAMILIES: readonly [RegExp, string][] = [
  [/^(gpt-4o|gpt-4\.1|gpt-4\.5|gpt-5|o1|o3|o4|chatgpt-4o|gpt-oss)/, 'o200k_base'],
  [/^(gpt-4|gpt-3\.5|gpt-35|text-embedding-3|text-embedding-ada-002)/, 'cl100k_base'],
];

const encoders = new Map<string, Tiktoken>();

/** The encoding name of an OpenAI model (`provider/` prefixes ignored), or undefined for a model that is not OpenAI's. */
export function openAiEncodingOf(model: string): string | undefined {
  const name = model.slice(model.lastIndexOf('/') + 1).toLowerCase();
  try {
    return jsTiktoken().getEncodingNameForModel(name as Parameters<ReturnType<typeof jsTiktoken>['getEncodingNameForModel']>[0]);
  } catch (err) {
    if ((err as { code?: unknown }).code === 'MISSING_PEER') throw err;
    return FAMILIES.find(([pattern]) => pattern.test(name))?.[1];
  }
}

/**
 * A `PromptTokenizer` for an OpenAI model: `countTokens` is the encoding's exact count,
 * `countPromptTokens` adds the chat format's tokens per message and for the reply, as
 * OpenAI bills `prompt_tokens`. Throws `RangeError` for a model with no known encoding
 * (not OpenAI's: count with its own tokenizer), `MissingPeerError` without `js-tiktoken`.
 *
 * ## Example
 * ```ts
 * assemble({ template, schema, budget: 8000, tokenizer: openAiTokenCounter('gpt-4o-mini') });
 * ```
 */
export function openAiTokenCounter(model: string): PromptTokenizer & { readonly encoding: string } {
  const encoding = openAiEncodingOf(model);
  if (encoding === undefined) throw new RangeError(`no OpenAI encoding is known for the model "${model}"`);
  let encoder = encoders.get(encoding);
  if (encoder === undefined) {
    encoder = new (jsTiktoken().Tiktoken)(tiktokenRanks(encoding));
    encoders.set(encoding, encoder);
  }
  const tiktoken = encoder;
  // Special-token text in a prompt is counted as plain text, as the API treats user content.
  const countTokens = (text: string) => tiktoken.encode(text, [], []).length;
  return {
    encoding,
    countTokens,
    countPromptTokens: (messages: readonly ChatMessage[]) =>
      messages.reduce((sum, m) => sum + PER_MESSAGE + countTokens(m.role) + countTokens(m.content), REPLY_PRIMING),
  };
}
