import { leased } from './leases.js';
import { fnv1aFrom, fnv1aStep } from './random.js';

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
 * loop pause: typed-array memory lives outside the JS heap, and V8 answers a fast
 * stream of it with a full mark-compact (2–9 ms measured here) about every second.
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
  return padRows(flat, stride, sequences.map((ids) => ids.length), padId, buffers);
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

  /** Writes at most `maxLength` ids from `at`; returns how many. */
  private encodeInto(text: string, out: Int32Array, at: number): number {
    const { seed, buckets, charNgram: n } = this.config;
    const start = 0x811c9dc5 ^ seed;
    const end = at + this.maxLength;
    const words = HashTokenizer.words(text);
    let next = at;
    const add = (hash: number): boolean => {
      out[next++] = 1 + ((hash >>> 0) % (buckets - 1));
      return next < end;
    };
    for (let i = 0; i < words.length; i++) {
      const word = words[i]!;
      if (!add(fnv1aFrom(fnv1aStep(fnv1aStep(start, W), COLON), word))) break;
      // The n-grams of `<word>` without building it: position 0 is `<`, position length + 1 is `>`.
      const padded = word.length + 2;
      let full = false;
      for (let j = 0; j + n <= padded && !full; j++) {
        let hash = fnv1aStep(fnv1aStep(start, C), COLON);
        for (let k = j; k < j + n; k++) hash = fnv1aStep(hash, k === 0 ? LT : k === padded - 1 ? GT : word.charCodeAt(k - 1));
        full = !add(hash);
      }
      if (full) break;
      const following = words[i + 1];
      if (following !== undefined && !add(fnv1aFrom(fnv1aStep(fnv1aFrom(fnv1aStep(fnv1aStep(start, B), COLON), word), SPACE), following))) break;
    }
    return next - at;
  }
}
