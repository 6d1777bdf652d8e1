import { open, readFile, rename, rm } from 'node:fs/promises';
import type * as z from 'zod';
import { InvalidOptionsError } from '../../core/errors.js';
import { DuplicateIdError, IndexFormatError, InvalidVectorError } from './errors.js';
import { LANES, createMemory, scalarKernel, simdKernel, type ScoreKernel, type WasmMemory } from './kernel.js';

/** Options of a `VectorIndex` search: how many hits, the minimum score and a metadata filter. */
export interface SearchOptions<M> {
  /** How many hits at most. A positive integer. */
  k: number;
  /** Hits scoring below this cosine similarity are left out. */
  minScore?: number;
  /**
   * Keeps only rows whose metadata passes. Must be pure: it is asked only about rows
   * that score high enough to enter the current top k, not about every row.
   */
  filter?: (metadata: M, id: string) => boolean;
}

/** One search result: the id, its score and its metadata. */
export interface SearchHit<M> {
  readonly id: string;
  /** Cosine similarity with the query, in [-1, 1] up to float32 rounding. */
  readonly score: number;
  readonly metadata: M;
}

/** File layout, little-endian: magic, version, dim, count, metadata bytes, then rows, then metadata JSON. */
const MAGIC = 0x49564c53; // "SLVI" read as a little-endian u32
const VERSION = 1;
const HEADER_BYTES = 20;
const PAGE = 65536;
/** A saved row whose norm strays further than this from 1 was not written by `save`. */
const NORM_TOLERANCE = 1e-3;

/**
 * Exact cosine top-k search over vectors kept in one contiguous `Float32Array`.
 *
 * Rows are normalised on insert, so cosine similarity is a dot product; a query is
 * scored against every row by a WebAssembly SIMD kernel (memory-bandwidth bound;
 * figures in docs/ai.md) and the top k are kept in a bounded min-heap,
 * O(n log k) instead of sorting n scores. Ties are broken by id (ascending), so a
 * search returns the same hits whatever order the rows were added or removed in.
 *
 * `remove` is O(1): the last row is moved into the hole. Ids and metadata live in
 * arrays beside the rows; `save`/`load` write a small binary format validated on load.
 *
 * ## Example
 * ```ts
 * const index = new VectorIndex<{ text: string }>(384);
 * index.add('doc-1#0', vector, { text: 'Backpressure is...' });
 * const hits = index.search(query, { k: 5, minScore: 0.2 });
 * await index.save('corpus.slvi');
 * const again = await VectorIndex.load<{ text: string }>('corpus.slvi');
 * ```
 */
export class VectorIndex<M = unknown> {
  readonly dim: number;
  /** Floats per stored row: `dim` padded with zeros to a multiple of the kernel's lanes. */
  private readonly stride: number;
  private readonly memory: WasmMemory;
  private floats: Float32Array;
  private readonly kernel: ScoreKernel;
  private capacity: number;
  private count = 0;
  private readonly ids: string[] = [];
  private readonly metadata: M[] = [];
  private readonly rowOf = new Map<string, number>();
  // Byte offsets in the memory: the query, then the rows, then one score per row.
  private readonly queryOffset = 0;
  private readonly rowsOffset: number;
  private heapScores: Float64Array = new Float64Array(0);
  private heapRows: Int32Array = new Int32Array(0);
  /** Bumped by every change of the rows: scores computed before it are stale. */
  private version = 0;
  /** The normalised query whose scores the scores area holds, and the rows' version they were computed at. */
  private readonly scoredQuery: Float32Array;
  private scoredVersion = -1;

  constructor(dim: number, options: { capacity?: number } = {}) {
    if (!Number.isInteger(dim) || dim < 1 || dim > 65536) {
      throw new InvalidOptionsError('vector index options', [{ path: 'dim', message: `dim must be an integer in [1, 65536], got ${String(dim)}` }]);
    }
    const capacity = options.capacity ?? 1024;
    if (!Number.isInteger(capacity) || capacity < 1) {
      throw new InvalidOptionsError('vector index options', [{ path: 'capacity', message: `capacity must be a positive integer, got ${String(capacity)}` }]);
    }
    this.dim = dim;
    this.stride = Math.ceil(dim / LANES) * LANES;
    this.rowsOffset = Math.ceil((this.stride * 4) / 64) * 64;
    this.capacity = capacity;
    this.memory = createMemory(Math.ceil(this.bytesFor(capacity) / PAGE));
    this.floats = new Float32Array(this.memory.buffer);
    this.kernel = simdKernel(this.memory) ?? scalarKernel(() => this.floats);
    this.scoredQuery = new Float32Array(dim);
  }

  /** Vectors held. */
  get size(): number {
    return this.count;
  }

  /** True when a vector with this id is indexed. */
  has(id: string): boolean {
    return this.rowOf.has(id);
  }

  /** The metadata stored with `id`, or undefined. */
  get(id: string): M | undefined {
    const row = this.rowOf.get(id);
    return row === undefined ? undefined : this.metadata[row];
  }

  /** Adds a vector (normalised here; it is copied, not kept). Throws `DuplicateIdError` or `InvalidVectorError`. */
  add(id: string, vector: ArrayLike<number>, metadata: M): void {
    if (typeof id !== 'string' || id.length === 0)
      throw new InvalidOptionsError('vector index add', [{ path: 'id', message: 'id must be a non-empty string' }]);
    if (this.rowOf.has(id)) throw new DuplicateIdError(id);
    const scale = this.inverseNorm('vector', vector);
    if (this.count === this.capacity) this.grow(this.capacity * 2);
    this.writeRow(this.count, vector, scale);
    this.ids.push(id);
    this.metadata.push(metadata);
    this.rowOf.set(id, this.count++);
    this.version++;
  }

  /** Removes `id` in O(1) by moving the last row into its place. Returns whether it was there. */
  remove(id: string): boolean {
    const row = this.rowOf.get(id);
    if (row === undefined) return false;
    const last = this.count - 1;
    if (row !== last) {
      const base = this.rowsOffset >>> 2;
      this.floats.copyWithin(base + row * this.stride, base + last * this.stride, base + (last + 1) * this.stride);
      const moved = this.ids[last]!;
      this.ids[row] = moved;
      this.metadata[row] = this.metadata[last]!;
      this.rowOf.set(moved, row);
    }
    this.ids.pop();
    this.metadata.pop();
    this.rowOf.delete(id);
    this.count = last;
    this.version++;
    return true;
  }

  /** The `k` rows most similar to `query`, best first (ties: smaller id first). */
  search(query: ArrayLike<number>, options: SearchOptions<M>): SearchHit<M>[] {
    const { k, minScore = -Infinity, filter } = options;
    const issues: { path: string; message: string }[] = [];
    if (!Number.isInteger(k) || k < 1) issues.push({ path: 'k', message: `k must be a positive integer, got ${String(k)}` });
    if (typeof minScore !== 'number' || Number.isNaN(minScore)) issues.push({ path: 'minScore', message: 'minScore must be a number' });
    if (filter !== undefined && typeof filter !== 'function') issues.push({ path: 'filter', message: 'filter must be a function' });
    if (issues.length > 0) throw new InvalidOptionsError('search options', issues);
    const scores = this.score(query);
    if (this.heapScores.length < k) {
      this.heapScores = new Float64Array(k);
      this.heapRows = new Int32Array(k);
    }
    const heapScores = this.heapScores;
    const heapRows = this.heapRows;
    const ids = this.ids;
    let size = 0;
    for (let row = 0; row < this.count; row++) {
      const score = scores[row]!;
      if (score < minScore) continue;
      if (size === k && (score < heapScores[0]! || (score === heapScores[0]! && ids[row]! > ids[heapRows[0]!]!))) continue;
      if (filter !== undefined && !filter(this.metadata[row]!, ids[row]!)) continue;
      if (size < k) siftUp(heapScores, heapRows, ids, size++, score, row);
      else siftDown(heapScores, heapRows, ids, size, score, row);
    }
    const hits: SearchHit<M>[] = [];
    for (let i = 0; i < size; i++) hits.push({ id: ids[heapRows[i]!]!, score: heapScores[i]!, metadata: this.metadata[heapRows[i]!]! });
    return hits.sort((a, b) => b.score - a.score || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  }

  /**
   * Every row's score against `query`, unsorted: the exhaustive answer `search`
   * selects from (for diagnostics, and to check search against a full sort).
   */
  scoreAll(query: ArrayLike<number>): { id: string; score: number }[] {
    const scores = this.score(query);
    return this.ids.map((id, row) => ({ id, score: scores[row]! }));
  }

  /**
   * The mean and standard deviation of every row's score against `query`: the background a
   * best score is measured against (how far above what any passage scores for this query).
   */
  scoreMoments(query: ArrayLike<number>): { readonly mean: number; readonly std: number } {
    const scores = this.score(query);
    let sum = 0;
    let squares = 0;
    for (let row = 0; row < this.count; row++) {
      sum += scores[row]!;
      squares += scores[row]! * scores[row]!;
    }
    const mean = this.count === 0 ? 0 : sum / this.count;
    return { mean, std: this.count === 0 ? 0 : Math.sqrt(Math.max(0, squares / this.count - mean * mean)) };
  }

  /** Every id with its metadata, in row order (e.g. to build a `LexicalIndex` beside this one). */
  *entries(): IterableIterator<{ readonly id: string; readonly metadata: M }> {
    for (let row = 0; row < this.count; row++) yield { id: this.ids[row]!, metadata: this.metadata[row]! };
  }

  /** Writes the index to `path` (through a temporary file, so a crash never leaves half a file). */
  async save(path: string): Promise<void> {
    const meta = Buffer.from(JSON.stringify({ ids: this.ids, metadata: this.metadata }), 'utf8');
    const header = Buffer.alloc(HEADER_BYTES);
    header.writeUInt32LE(MAGIC, 0);
    header.writeUInt32LE(VERSION, 4);
    header.writeUInt32LE(this.dim, 8);
    header.writeUInt32LE(this.count, 12);
    header.writeUInt32LE(meta.length, 16);
    const rows = new Float32Array(this.count * this.dim);
    const base = this.rowsOffset >>> 2;
    for (let row = 0; row < this.count; row++) {
      const from = base + row * this.stride;
      rows.set(this.floats.subarray(from, from + this.dim), row * this.dim);
    }
    const temporary = `${path}.${process.pid}.tmp`;
    const file = await open(temporary, 'w');
    try {
      await file.write(header);
      await file.write(new Uint8Array(rows.buffer, rows.byteOffset, rows.byteLength));
      await file.write(meta);
      await file.sync();
    } catch (error) {
      await file.close();
      await rm(temporary, { force: true });
      throw error;
    }
    await file.close();
    await rename(temporary, path);
  }

  /**
   * Reads an index written by `save`, validating header, lengths, every row (finite,
   * unit norm) and the ids. Throws `IndexFormatError` naming the part that is wrong.
   * Pass `schema` to check each metadata value too.
   */
  static async load<M = unknown>(path: string, options: { schema?: z.ZodType<M> } = {}): Promise<VectorIndex<M>> {
    const bytes = await readFile(path);
    const fail = (field: string, problem: string): never => {
      throw new IndexFormatError(path, field, problem);
    };
    if (bytes.length < HEADER_BYTES) fail('length', `${bytes.length} bytes is shorter than the ${HEADER_BYTES}-byte header`);
    if (bytes.readUInt32LE(0) !== MAGIC) fail('magic', 'not a sluice vector index (expected "SLVI")');
    const version = bytes.readUInt32LE(4);
    if (version !== VERSION) fail('version', `version ${version} is not supported (this build reads version ${VERSION})`);
    const dim = bytes.readUInt32LE(8);
    if (dim < 1 || dim > 65536) fail('dim', `dim ${dim} is outside [1, 65536]`);
    const count = bytes.readUInt32LE(12);
    const metaBytes = bytes.readUInt32LE(16);
    const expected = HEADER_BYTES + count * dim * 4 + metaBytes;
    if (bytes.length !== expected)
      fail('length', `${bytes.length} bytes, but the header (dim ${dim}, count ${count}, ${metaBytes} metadata bytes) says ${expected}`);
    let meta: unknown;
    try {
      meta = JSON.parse(bytes.toString('utf8', HEADER_BYTES + count * dim * 4));
    } catch (error) {
      fail('metadata', `not valid JSON (${(error as Error).message})`);
    }
    const { ids, metadata } = (meta ?? {}) as { ids?: unknown; metadata?: unknown };
    if (!Array.isArray(ids) || ids.length !== count || !ids.every((id) => typeof id === 'string' && id.length > 0)) {
      fail('metadata', `expected ${count} non-empty string ids`);
    }
    if (!Array.isArray(metadata) || metadata.length !== count) fail('metadata', `expected ${count} metadata values`);
    const checked = (metadata as unknown[]).map((value, i) => {
      if (options.schema === undefined) return value as M;
      const result = options.schema.safeParse(value);
      return result.success
        ? result.data
        : fail(`metadata[${i}]`, result.error.issues.map((issue) => `${issue.path.join('.') || '(root)'}: ${issue.message}`).join('; '));
    });
    // Copy out of the (possibly unaligned, pooled) file buffer before viewing it as floats; Buffer#slice would not copy.
    const rows = new Float32Array(new Uint8Array(bytes.subarray(HEADER_BYTES, HEADER_BYTES + count * dim * 4)).buffer);
    const index = new VectorIndex<M>(dim, { capacity: Math.max(1, count) });
    for (let row = 0; row < count; row++) {
      const vector = rows.subarray(row * dim, (row + 1) * dim);
      let norm = 0;
      for (let j = 0; j < dim; j++) norm += vector[j]! * vector[j]!;
      if (!Number.isFinite(norm) || Math.abs(Math.sqrt(norm) - 1) > NORM_TOLERANCE)
        fail('vectors', `row ${row} is not a finite unit vector (norm ${Math.sqrt(norm)})`);
      const id = (ids as string[])[row]!;
      if (index.has(id)) fail('metadata', `id "${id}" appears twice`);
      index.add(id, vector, checked[row]!);
    }
    return index;
  }

  /** Writes the normalised query into the memory and runs the kernel; returns the scores view. */
  private score(query: ArrayLike<number>): Float32Array {
    const scale = this.inverseNorm('query', query);
    const q = this.queryOffset >>> 2;
    const floats = this.floats;
    const last = this.scoredQuery;
    let same = this.scoredVersion === this.version;
    for (let j = 0; j < this.dim; j++) {
      // Compared as stored: a float32, as the kernel reads it.
      const value = Math.fround(query[j]! * scale);
      floats[q + j] = value;
      if (value !== last[j]) same = false;
    }
    const scoresOffset = this.rowsOffset + this.capacity * this.stride * 4;
    const scores = floats.subarray(scoresOffset >>> 2, (scoresOffset >>> 2) + this.count);
    // The same query over the same rows (retrieval searches, then weighs the evidence by the score moments): one pass, not two.
    if (same) return scores;
    this.kernel(this.queryOffset, this.rowsOffset, this.count, this.stride, scoresOffset);
    last.set(floats.subarray(q, q + this.dim));
    this.scoredVersion = this.version;
    return scores;
  }

  /** 1 / |vector|, after checking dimension, finiteness and direction. */
  private inverseNorm(field: string, vector: ArrayLike<number>): number {
    if (vector === null || typeof vector !== 'object' || typeof vector.length !== 'number') throw new InvalidVectorError(field, 'is not an array of numbers');
    if (vector.length !== this.dim) throw new InvalidVectorError(field, `has ${vector.length} components, expected dim ${this.dim}`);
    let sum = 0;
    for (let j = 0; j < this.dim; j++) {
      const x = vector[j]!;
      if (typeof x !== 'number' || !Number.isFinite(x)) throw new InvalidVectorError(field, `component ${j} is ${String(x)}, not a finite number`);
      sum += x * x;
    }
    if (sum === 0) throw new InvalidVectorError(field, 'is all zeros');
    return 1 / Math.sqrt(sum);
  }

  private writeRow(row: number, vector: ArrayLike<number>, scale: number): void {
    const at = (this.rowsOffset >>> 2) + row * this.stride;
    for (let j = 0; j < this.dim; j++) this.floats[at + j] = vector[j]! * scale;
    // A slot may hold a removed row's stale floats; the kernel reads the padding too.
    this.floats.fill(0, at + this.dim, at + this.stride);
  }

  private bytesFor(capacity: number): number {
    return this.rowsOffset + capacity * this.stride * 4 + capacity * 4;
  }

  private grow(capacity: number): void {
    const pages = Math.ceil(this.bytesFor(capacity) / PAGE) - this.memory.buffer.byteLength / PAGE;
    if (pages > 0) this.memory.grow(pages);
    // Growing detaches the old buffer: every view must be taken again.
    this.floats = new Float32Array(this.memory.buffer);
    this.capacity = capacity;
  }
}

/** Heap order: the root is the worst kept hit (lowest score; among equal scores, the largest id). */
function worse(scoreA: number, idA: string, scoreB: number, idB: string): boolean {
  return scoreA < scoreB || (scoreA === scoreB && idA > idB);
}

function siftUp(scores: Float64Array, rows: Int32Array, ids: readonly string[], at: number, score: number, row: number): void {
  while (at > 0) {
    const parent = (at - 1) >> 1;
    if (!worse(score, ids[row]!, scores[parent]!, ids[rows[parent]!]!)) break;
    scores[at] = scores[parent]!;
    rows[at] = rows[parent]!;
    at = parent;
  }
  scores[at] = score;
  rows[at] = row;
}

/** Replaces the root with (score, row) and restores heap order. */
function siftDown(scores: Float64Array, rows: Int32Array, ids: readonly string[], size: number, score: number, row: number): void {
  let at = 0;
  for (;;) {
    let child = 2 * at + 1;
    if (child >= size) break;
    if (child + 1 < size && worse(scores[child + 1]!, ids[rows[child + 1]!]!, scores[child]!, ids[rows[child]!]!)) child++;
    if (!worse(scores[child]!, ids[rows[child]!]!, score, ids[row]!)) break;
    scores[at] = scores[child]!;
    rows[at] = rows[child]!;
    at = child;
  }
  scores[at] = score;
  rows[at] = row;
}
