/**
 * The KV caches a pool worker thread keeps for the sequences whose steps it ran: a batched step
 * names its sequences and new tokens, the thread stacks their caches (the last call's output as it
 * is when the group is unchanged), runs the decoder, keeps the new caches and answers the logits
 * alone, so no cache crosses threads. A sequence's rows of a call's output stay shared with the
 * other rows until they step apart; a row left behind is copied out so released rows free memory.
 */
import type * as ort from 'onnxruntime-node';
import { float32, ownCache, presentAsPast, rowLogits, stepFeeds, type KvShape, type StackedCache, type StackedRow } from './kv-stack.js';

/** One row of a step over resident caches: the sequence, the tokens it is fed, and the first one's position (0: a new sequence). */
export interface ResidentRow {
  readonly sequence: number;
  readonly ids: readonly number[];
  readonly position: number;
}

/** A batched step over the caches one worker thread holds: every row is fed the same number of tokens. */
export interface ResidentStep {
  readonly shape: KvShape;
  readonly rows: readonly ResidentRow[];
}

/** What a worker thread holds: sequences and the bytes of their caches. */
export interface ResidentHeld {
  readonly sequences: number;
  readonly bytes: number;
}

/** One call's output cache and which sequence each of its rows still belongs to. */
interface Held {
  readonly stacked: StackedCache;
  readonly shape: KvShape;
  readonly sequences: (number | undefined)[];
  live: number;
}

interface Entry {
  readonly held: Held;
  readonly row: number;
  readonly pad: number;
}

/** The resident caches of one worker thread, by sequence id. */
export class ResidentCaches {
  private readonly entries = new Map<number, Entry>();
  /** Outputs some of whose rows moved on or were released: the rest are copied out at the next `compact`. */
  private readonly partial = new Set<Held>();

  /** Runs `step` on `session` over the caches held, keeps the new ones, and gives each row's last logits as `[rows, vocab]`. */
  async step(session: ort.InferenceSession, step: ResidentStep): Promise<ort.Tensor> {
    const { shape, rows } = step;
    const { feeds, length } = stepFeeds(
      rows.map((r) => ({ past: this.cacheOf(r), ids: r.ids, position: r.position })),
      shape,
    );
    const out = await session.run(feeds);
    const held: Held = {
      stacked: { tensors: presentAsPast(out, shape.layers), size: rows.length, length: length + rows[0]!.ids.length },
      shape,
      sequences: rows.map((r) => r.sequence),
      live: rows.length,
    };
    rows.forEach((r, i) => {
      this.leave(r.sequence);
      this.entries.set(r.sequence, { held, row: i, pad: length - r.position });
    });
    this.compact();
    const vocab = out.logits!.dims[2]!;
    const logits = new Float32Array(rows.length * vocab);
    for (let i = 0; i < rows.length; i++) logits.set(rowLogits(out.logits!, i), i * vocab);
    return float32(logits, [rows.length, vocab]);
  }

  /** Drops the caches of `sequences` (ended, evicted); unknown ones are ignored. Returns whether rows were left behind to copy out. */
  release(sequences: readonly number[]): boolean {
    for (const sequence of sequences) this.leave(sequence);
    return this.partial.size > 0;
  }

  /** Copies the rows still held of partly abandoned outputs into their own caches, so the rest of each output can be freed. */
  compact(): void {
    for (const held of this.partial) {
      held.sequences.forEach((sequence, row) => {
        if (sequence === undefined) return;
        const entry = this.entries.get(sequence)!;
        const own = ownCache({ stacked: held.stacked, row, pad: entry.pad }, held.shape);
        const length = held.stacked.length - entry.pad;
        this.entries.set(sequence, { held: { stacked: { tensors: own, size: 1, length }, shape: held.shape, sequences: [sequence], live: 1 }, row: 0, pad: 0 });
      });
    }
    this.partial.clear();
  }

  /** Sequences held and the bytes of the outputs holding them. */
  get held(): ResidentHeld {
    const outputs = new Set<Held>();
    for (const entry of this.entries.values()) outputs.add(entry.held);
    let bytes = 0;
    for (const held of outputs) for (const tensor of Object.values(held.stacked.tensors)) bytes += (tensor.data as Float32Array).byteLength;
    return { sequences: this.entries.size, bytes };
  }

  /** The cache `row` steps over: none for a new sequence; a sequence that should have one and does not is an error, never a silent restart. */
  private cacheOf(row: ResidentRow): StackedRow | undefined {
    const entry = this.entries.get(row.sequence);
    if (row.position === 0) return undefined;
    const length = entry === undefined ? 0 : entry.held.stacked.length - entry.pad;
    if (entry === undefined || length !== row.position)
      throw new Error(`sequence ${row.sequence} has ${length} positions cached in this thread, not ${row.position}`);
    return { stacked: entry.held.stacked, row: entry.row, pad: entry.pad };
  }

  /** `sequence` no longer uses its row: the output holding it is freed once no row uses it. */
  private leave(sequence: number): void {
    const entry = this.entries.get(sequence);
    if (entry === undefined) return;
    this.entries.delete(sequence);
    const held = entry.held;
    held.sequences[entry.row] = undefined;
    held.live--;
    if (held.live === 0) this.partial.delete(held);
    else this.partial.add(held);
  }
}
