/**
 * A Hugging Face `tokenizer.json` (BPE, WordPiece or Unigram, with its normalizer,
 * pre-tokenizer, post-processor and decoder) run by `@huggingface/tokenizers`, the
 * maintained JavaScript port, instead of code of our own: an optional peer of
 * `sluice/ai`, loaded only when such a file is loaded.
 */
import type * as HfTokenizers from '@huggingface/tokenizers';
import { hfTokenizers } from '../../core/peers.js';
import { lazySchema } from '../../core/zod.js';
import { parseOptions, positiveInt } from '../../flow/options.js';
import { padBatch, type EncodedBatch, type FeedBuffers, type Tokenizer } from './tokenizer.js';

/** Options of `HfTokenizer`. */
export interface HfTokenizerOptions {
  /** `tokenizer_config.json`, parsed (special tokens, `clean_up_tokenization_spaces`...). Default `{}`. */
  readonly config?: Readonly<Record<string, unknown>>;
  /** Longest `encode` result, special tokens included. Default: the file's truncation length, else 512. */
  readonly maxLength?: number;
}

const optionsSchema = lazySchema((z) =>
  z.strictObject({
    config: z.record(z.string(), z.unknown(), { error: 'config must be an object (tokenizer_config.json, parsed)' }).optional(),
    maxLength: positiveInt('maxLength').optional(),
  }),
);

/**
 * A Hugging Face tokenizer behind sluice's `Tokenizer` interface (embedding and classifier
 * adapters), with what a language model needs beside: encoding without the post-processor's
 * special tokens, decoding, and token lookups.
 */
export class HfTokenizer implements Tokenizer {
  readonly vocabSize: number;
  readonly maxLength: number;
  readonly padId: number;
  /** What the post-processor puts before and after a single sequence (`[CLS]` … `[SEP]`, a BOS...). */
  private readonly prefix: readonly number[];
  private readonly suffix: readonly number[];

  constructor(
    private readonly inner: HfTokenizers.Tokenizer,
    json: { readonly truncation?: { readonly max_length?: number } | null; readonly padding?: { readonly pad_id?: number } | null },
    options: HfTokenizerOptions = {},
  ) {
    parseOptions(optionsSchema(), options, 'HfTokenizer options');
    const vocab = inner.get_vocab(true);
    let highest = -1;
    for (const id of vocab.values()) if (id > highest) highest = id;
    this.vocabSize = highest + 1;
    // BERT's position table is 512 long; the truncation setting, when present, is the export's own limit.
    this.maxLength = options.maxLength ?? json.truncation?.max_length ?? 512;
    const padToken = options.config?.pad_token;
    this.padId = json.padding?.pad_id ?? (typeof padToken === 'string' ? inner.token_to_id(padToken) : undefined) ?? 0;
    // The special tokens around a sequence, found once from a probe, so truncation can keep them as HF does.
    const plain = inner.encode('a', { add_special_tokens: false }).ids;
    const full = inner.encode('a').ids;
    const at = indexOf(full, plain);
    this.prefix = at < 0 ? [] : full.slice(0, at);
    this.suffix = at < 0 ? [] : full.slice(at + plain.length);
  }

  /** Ids with the post-processor's special tokens, the text truncated so the whole is at most `maxLength`. */
  encode(text: string): number[] {
    const budget = Math.max(0, this.maxLength - this.prefix.length - this.suffix.length);
    return [...this.prefix, ...this.inner.encode(text, { add_special_tokens: false }).ids.slice(0, budget), ...this.suffix];
  }

  encodeBatch(texts: readonly string[], buffers?: FeedBuffers): EncodedBatch {
    return padBatch(
      texts.map((text) => this.encode(text)),
      this.padId,
      buffers,
    );
  }

  /** Ids of `text` as it is (no special tokens added, no truncation): what a rendered chat template is encoded with. */
  encodePlain(text: string): number[] {
    return this.inner.encode(text, { add_special_tokens: false }).ids;
  }

  /** Tokens of `text` as the model would see it without special tokens: an exact count for token budgets. */
  countTokens(text: string): number {
    return this.inner.encode(text, { add_special_tokens: false }).ids.length;
  }

  /** Text of `ids`; special tokens (end of turn, padding...) are left out unless `skipSpecialTokens` is false. */
  decode(ids: readonly number[], options: { readonly skipSpecialTokens?: boolean } = {}): string {
    return this.inner.decode([...ids], { skip_special_tokens: options.skipSpecialTokens ?? true });
  }

  /** The id of a token string (`<|im_end|>`), or undefined when the vocabulary has none. */
  tokenId(token: string): number | undefined {
    return this.inner.token_to_id(token);
  }

  /** The string of a token id, or undefined. */
  token(id: number): string | undefined {
    return this.inner.id_to_token(id);
  }

  /**
   * Builds one from a parsed `tokenizer.json` (and `tokenizer_config.json`). Throws what the
   * library throws for a pipeline step it does not know; `loadTokenizer` turns that into
   * `UnsupportedTokenizerError` naming the file.
   */
  static fromJson(json: Readonly<Record<string, unknown>>, options: HfTokenizerOptions = {}): HfTokenizer {
    parseOptions(optionsSchema(), options, 'HfTokenizer options');
    const { Tokenizer } = hfTokenizers();
    return new HfTokenizer(new Tokenizer(json, options.config ?? {}), json as ConstructorParameters<typeof HfTokenizer>[1], options);
  }
}

function indexOf(haystack: readonly number[], needle: readonly number[]): number {
  for (let i = 0; i + needle.length <= haystack.length; i++) if (needle.every((id, j) => haystack[i + j] === id)) return i;
  return -1;
}
