import { leased } from './leases.js';
import { fnv1aStep } from '../../core/random.js';

const [W, C, B, COLON, SPACE, LT, GT] = [...'wcb: <>'].map((c) => c.charCodeAt(0)) as [number, number, number, number, number, number, number];

/** A batch ready for an ONNX text model: row-major `[batch, seq]` int64 tensors, right-padded with the pad id. */
export interface EncodedBatch {
  readonly inputIds: BigInt64Array;
  readonly attentionMask: BigInt64Array;
  /** All zeros: single-segment input, for BERT-style exports that require `token_type_ids` (allocated when first read). */
  readonly tokenTypeIds: BigInt64Array;
  readonly shape: readonly [batch: number, seq: number];
}

/** What the embedding and classifier adapters need from a tokenizer, whichever kind it is. */
export interface Tokenizer {
  /** Ids the model's embedding table is indexed by; never longer than `maxLength`. */
  encode(text: string): number[];
  /** With `buffers`, the tensors are views into them, valid until their next use (see `FeedBuffers`). */
  encodeBatch(texts: readonly string[], buffers?: FeedBuffers): EncodedBatch;
  readonly vocabSize: number;
  readonly maxLength: number;
  readonly padId: number;
}

/**
 * Reusable int64 buffers for the `[batch, seq]` tensors of text feeds, in shared memory:
 * a batch built into them allocates nothing, and `InferencePool.run` hands them to its
 * worker without a copy. Fresh feeds per batch are what make an inference-heavy event
 * loop pause: typed-array memory lives outside the JS heap, and a fast stream of it
 * brings full collections (docs/internals/ai-figures.md).
 *
 * The pool leases a shared buffer until its worker is done with it; `take` never hands
 * out a leased one (it makes another, keeping a few spare). They are for `InferencePool`:
 * onnxruntime itself refuses shared memory, so a session run on this thread needs
 * `textFeeds` without them. A batch built into them is
 * valid until the next batch is built into the same `FeedBuffers`: build, run, build
 * the next — the pattern of `infer`'s `toFeeds`, `embedder` and `poolClassifier`.
 *
 * ```ts
 * const buffers = new FeedBuffers();
 * infer({ pool, toFeeds: (batch) => textFeeds(tokenizer, batch.items, undefined, buffers), ... });
 * ```
 */
export class FeedBuffers {
  private readonly slots: BigInt64Array[][] = [];

  /** A view of `size` int64 elements, over a shared buffer no pool job holds; its content is stale. */
  take(slot: number, size: number): BigInt64Array {
    const buffers = (this.slots[slot] ??= []);
    let free = buffers.find((buffer) => !leased(buffer.buffer as SharedArrayBuffer));
    if (free !== undefined && free.length < size) {
      buffers.splice(buffers.indexOf(free), 1);
      free = undefined;
    }
    if (free === undefined) {
      // Grown geometrically (never shrunk), so a growing batch size reallocates a few times, not every batch.
      const largest = buffers.reduce((max, buffer) => Math.max(max, buffer.length), 0);
      free = new BigInt64Array(new SharedArrayBuffer(8 * Math.max(size, Math.min(2 * largest, 1 << 20))));
      buffers.push(free);
      // Leases outlive a queue burst: keep at most a few buffers once their jobs are done.
      if (buffers.length > MAX_SPARE) this.slots[slot] = buffers.filter((buffer) => buffer === free || leased(buffer.buffer as SharedArrayBuffer));
    }
    return free.length === size ? free : free.subarray(0, size);
  }
}

const MAX_SPARE = 4;
const IDS = 0;
const MASK = 1;
const TYPES = 2;

/** Pads `sequences` to the longest one (at least 1, so an empty text still makes a valid tensor). */
export function padBatch(sequences: readonly (readonly number[])[], padId: number, buffers?: FeedBuffers): EncodedBatch {
  const stride = Math.max(1, ...sequences.map((ids) => ids.length));
  const flat = new Int32Array(sequences.length * stride);
  sequences.forEach((ids, row) => flat.set(ids, row * stride));
  return padRows(
    flat,
    stride,
    sequences.map((ids) => ids.length),
    padId,
    buffers,
  );
}

/** Row `r` holds `lengths[r]` ids from `rows[r × stride]`: copies them into `[batch, longest]` int64 tensors, right-padded. */
function padRows(rows: Int32Array, stride: number, lengths: readonly number[], padId: number, buffers: FeedBuffers | undefined): EncodedBatch {
  let seq = 1;
  for (const length of lengths) if (length > seq) seq = length;
  const size = lengths.length * seq;
  const inputIds = buffers?.take(IDS, size) ?? new BigInt64Array(size);
  const attentionMask = buffers?.take(MASK, size) ?? new BigInt64Array(size);
  // Written through 32-bit views (`BigInt(id)` would allocate a heap BigInt per token), both halves of every element: reused buffers hold stale values.
  const ids32 = new Int32Array(inputIds.buffer, inputIds.byteOffset, size * 2);
  const mask32 = new Int32Array(attentionMask.buffer, attentionMask.byteOffset, size * 2);
  const low = LITTLE_ENDIAN ? 0 : 1;
  for (let row = 0; row < lengths.length; row++) {
    const length = lengths[row]!;
    for (let i = 0; i < seq; i++) {
      const at = 2 * (row * seq + i);
      const id = i < length ? rows[row * stride + i]! : padId;
      ids32[at + low] = id;
      ids32[at + 1 - low] = id < 0 ? -1 : 0;
      mask32[at + low] = i < length ? 1 : 0;
      mask32[at + 1 - low] = 0;
    }
  }
  const shape = [lengths.length, seq] as const;
  let tokenTypeIds: BigInt64Array | undefined;
  // Most models take no token_type_ids: made on first read only.
  return {
    inputIds,
    attentionMask,
    get tokenTypeIds() {
      return (tokenTypeIds ??= buffers?.take(TYPES, size).fill(0n) ?? new BigInt64Array(size));
    },
    shape,
  };
}

const ASCII = /^[\x00-\x7f]*$/;

/** ASCII letters and digits: the words of ASCII text (NFKD and lower-casing change nothing else there). */
function isAsciiWordCode(code: number): boolean {
  return (code >= 48 && code <= 57) || (code >= 65 && code <= 90) || (code >= 97 && code <= 122);
}

function lowerAscii(code: number): number {
  return code >= 65 && code <= 90 ? code + 32 : code;
}

/** FNV-1a over `source[from, to)`, ASCII capitals read as lower case. */
function hashRange(hash: number, source: string, from: number, to: number): number {
  for (let i = from; i < to; i++) hash = fnv1aStep(hash, lowerAscii(source.charCodeAt(i)));
  return hash;
}

/** The id of a feature hash: 1..modulus (0 is padding). */
function bucket(hash: number, modulus: number): number {
  return 1 + ((hash >>> 0) % modulus);
}

const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;

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

/** The hashed tokenizer the generated embedding model is built with. */
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
    return (
      text
        .normalize('NFKD')
        .replace(/\p{M}/gu, '')
        .toLowerCase()
        .match(/[\p{L}\p{N}]+/gu) ?? []
    );
  }

  /** The feature strings of `text` (words, word pairs, character n-grams) before hashing: for inspection and tests. */
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

  /** The ids of `features(text)`, hashed in place: no feature string is built. */
  encode(text: string): number[] {
    const scratch = this.scratchFor(1);
    return Array.from(scratch.subarray(0, this.encodeInto(text, scratch, 0)));
  }

  /** Encodes every text into one reused buffer and pads from there: no per-text id array. */
  encodeBatch(texts: readonly string[], buffers?: FeedBuffers): EncodedBatch {
    const stride = this.maxLength;
    const scratch = this.scratchFor(texts.length);
    const lengths = texts.map((text, row) => this.encodeInto(text, scratch, row * stride));
    return padRows(scratch, stride, lengths, this.padId, buffers);
  }

  private scratch = new Int32Array(0);

  private scratchFor(rows: number): Int32Array {
    if (this.scratch.length < rows * this.maxLength) this.scratch = new Int32Array(rows * this.maxLength);
    return this.scratch;
  }

  /** Word boundaries of the text being encoded: start and end of each word, in pairs. */
  private spans = new Int32Array(64);

  /**
   * Writes at most `maxLength` ids from `at`; returns how many. ASCII text (the common case) is
   * scanned in place: no normalised copy, word list or feature string is made for it.
   */
  private encodeInto(text: string, out: Int32Array, at: number): number {
    if (ASCII.test(text)) return this.hashWords(text, this.asciiWords(text), out, at);
    const words = HashTokenizer.words(text);
    return this.hashWords(words.join(' '), this.joinedWords(words), out, at);
  }

  /** Finds the runs of ASCII letters and digits; returns how many. */
  private asciiWords(text: string): number {
    let count = 0;
    for (let i = 0; i < text.length; ) {
      if (!isAsciiWordCode(text.charCodeAt(i))) {
        i++;
        continue;
      }
      const from = i;
      while (i < text.length && isAsciiWordCode(text.charCodeAt(i))) i++;
      this.span(count++, from, i);
    }
    return count;
  }

  /** The spans of `words` in `words.join(' ')`. */
  private joinedWords(words: readonly string[]): number {
    let position = 0;
    for (let i = 0; i < words.length; i++) {
      this.span(i, position, position + words[i]!.length);
      position += words[i]!.length + 1;
    }
    return words.length;
  }

  private span(index: number, from: number, to: number): void {
    if (this.spans.length < 2 * index + 2) {
      const grown = new Int32Array(this.spans.length * 2);
      grown.set(this.spans);
      this.spans = grown;
    }
    this.spans[2 * index] = from;
    this.spans[2 * index + 1] = to;
  }

  /** Hashes the features of `count` words (spans of `source`, ASCII capitals read as lower case) as `features()` lists them. */
  private hashWords(source: string, count: number, out: Int32Array, at: number): number {
    const { seed, buckets, charNgram: n } = this.config;
    const start = 0x811c9dc5 ^ seed;
    const wordPrefix = fnv1aStep(fnv1aStep(start, W), COLON);
    const ngramPrefix = fnv1aStep(fnv1aStep(start, C), COLON);
    const pairPrefix = fnv1aStep(fnv1aStep(start, B), COLON);
    const spans = this.spans;
    const limit = at + this.maxLength;
    const modulus = buckets - 1;
    let next = at;
    for (let i = 0; i < count && next < limit; i++) {
      const from = spans[2 * i]!;
      const to = spans[2 * i + 1]!;
      out[next++] = bucket(hashRange(wordPrefix, source, from, to), modulus);
      // The n-grams of `<word>` without building it: position 0 is `<`, position length + 1 is `>`.
      const padded = to - from + 2;
      for (let j = 0; j + n <= padded && next < limit; j++) {
        let hash = ngramPrefix;
        for (let k = j; k < j + n; k++) hash = fnv1aStep(hash, k === 0 ? LT : k === padded - 1 ? GT : lowerAscii(source.charCodeAt(from + k - 1)));
        out[next++] = bucket(hash, modulus);
      }
      if (i + 1 < count && next < limit) {
        const pair = fnv1aStep(hashRange(pairPrefix, source, from, to), SPACE);
        out[next++] = bucket(hashRange(pair, source, spans[2 * i + 2]!, spans[2 * i + 3]!), modulus);
      }
    }
    return next - at;
  }
}
