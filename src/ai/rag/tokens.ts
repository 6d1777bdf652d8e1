/**
 * The default tokenizer of prompt assembly: a run of letters, digits or `_` is one
 * token, every other non-space character is one token, whitespace is none. It
 * counts within ~20–30 % of BPE tokenizers on English prose and needs no vocabulary;
 * pass a model's own `countTokens` where exact counts matter.
 */
const TOKEN = /[\p{L}\p{N}\p{M}_]+|[^\s\p{L}\p{N}\p{M}_]/gu;

/** Number of tokens in `text` under the default tokenizer. */
export function countTokens(text: string): number {
  let count = 0;
  TOKEN.lastIndex = 0;
  while (TOKEN.exec(text) !== null) count++;
  return count;
}

/** End offset of every token: the places a text may be cut without splitting a token. */
export function tokenEnds(text: string): number[] {
  const ends: number[] = [];
  for (const match of text.matchAll(TOKEN)) ends.push(match.index + match[0].length);
  return ends;
}

/** The tokens of `text` under the default tokenizer. */
export function tokenize(text: string): string[] {
  return text.match(TOKEN) ?? [];
}
