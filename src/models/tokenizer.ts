import { fnv1a } from './random.js';

/** A batch ready for an ONNX text model: row-major `[batch, seq]` int64 tensors, right-padded with the pad id. */
export interface EncodedBatch {
  readonly inputIds: BigInt64Array;
  readonly attentionMask: BigInt64Array;
  /** All zeros: single-segment input, for BERT-style exports that require `token_type_ids`. */
  readonly tokenTypeIds: BigInt64Array;
  readonly shape: readonly [batch: number, seq: number];
}

/** What the embedding and classifier adapters need from a tokenizer, whichever kind it is. */
export interface Tokenizer {
  /** Ids the model's embedding table is indexed by; never longer than `maxLength`. */
  encode(text: string): number[];
  encodeBatch(texts: readonly string[]): EncodedBatch;
  readonly vocabSize: number;
  readonly maxLength: number;
  readonly padId: number;
}

/** Pads `sequences` to the longest one (at least 1, so an empty text still makes a valid tensor). */
export function padBatch(sequences: readonly (readonly number[])[], padId: number): EncodedBatch {
  const seq = Math.max(1, ...sequences.map((s) => s.length));
  const inputIds = new BigInt64Array(sequences.length * seq).fill(BigInt(padId));
  const attentionMask = new BigInt64Array(sequences.length * seq);
  sequences.forEach((ids, row) => {
    ids.forEach((id, i) => {
      inputIds[row * seq + i] = BigInt(id);
      attentionMask[row * seq + i] = 1n;
    });
  });
  return { inputIds, attentionMask, tokenTypeIds: new BigInt64Array(sequences.length * seq), shape: [sequences.length, seq] };
}

/** The configuration a hashed tokenizer is rebuilt from; written next to the model it feeds. */
export interface HashTokenizerConfig {
  readonly type: 'sluice-hash';
  /** Size of the model's embedding table; id 0 is padding, features hash into 1..buckets-1. */
  readonly buckets: number;
  readonly seed: number;
  readonly maxLength: number;
  /** Character n-gram length, taken over each word wrapped in `<` `>`. */
  readonly charNgram: number;
}

export const DEFAULT_HASH_TOKENIZER: HashTokenizerConfig = { type: 'sluice-hash', buckets: 4096, seed: 0x51c3, maxLength: 256, charNgram: 3 };

/**
 * Text → hashed feature ids: each word, each pair of adjacent words, and each character n-gram of each word
 * hashes into a bucket of the embedding table. No vocabulary to ship; similar spellings share n-grams, so
 * "instruction" and "instructions" land close together.
 */
export class HashTokenizer implements Tokenizer {
  readonly padId = 0;
  readonly vocabSize: number;
  readonly maxLength: number;

  constructor(readonly config: HashTokenizerConfig = DEFAULT_HASH_TOKENIZER) {
    this.vocabSize = config.buckets;
    this.maxLength = config.maxLength;
  }

  /** Lower-cased, accent-stripped runs of letters and digits. */
  static words(text: string): string[] {
    return text.normalize('NFKD').replace(/\p{M}/gu, '').toLowerCase().match(/[\p{L}\p{N}]+/gu) ?? [];
  }

  features(text: string): string[] {
    const words = HashTokenizer.words(text);
    const features: string[] = [];
    const n = this.config.charNgram;
    words.forEach((word, i) => {
      features.push(`w:${word}`);
      const padded = `<${word}>`;
      for (let j = 0; j + n <= padded.length; j++) features.push(`c:${padded.slice(j, j + n)}`);
      const next = words[i + 1];
      if (next !== undefined) features.push(`b:${word} ${next}`);
    });
    return features;
  }

  encode(text: string): number[] {
    return this.features(text)
      .slice(0, this.maxLength)
      .map((feature) => 1 + (fnv1a(feature, this.config.seed) % (this.config.buckets - 1)));
  }

  encodeBatch(texts: readonly string[]): EncodedBatch {
    return padBatch(texts.map((text) => this.encode(text)), this.padId);
  }
}
