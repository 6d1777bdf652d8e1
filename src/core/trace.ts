/**
 * Trace metadata that rides beside every element, never inside it: a `Traced<T>`
 * envelope holds the payload by reference and a `TraceContext` shared by every
 * output derived from the same input element.
 *
 * Ids are always on and cost nothing until read (formatted lazily). Timing is
 * sampled: a clock read costs more than a whole RxJS `map` (docs/internals/stage-hot-path.md), so only
 * sampled elements carry per-stage records.
 */
import { randomBytes } from 'node:crypto';
import type { Settlement } from './settlement.js';
import type { ShedReason } from './vocabulary.js';

/** What one stage did to one element (only for sampled elements). Times in ms. */
export interface StageRecord {
  readonly stage: string;
  /** Time spent waiting in the stage's buffer before work started. */
  queueWait: number;
  /** Time spent in the work function (until its last output). */
  service: number;
  /** Time results waited for downstream demand (backpressure). */
  paused: number;
  /** Attempts beyond the first (retry operators). */
  retries: number;
  /** Inputs merged into this element by the `conflate` policy. */
  conflated: number;
  /** Set when the element was shed at this stage: why. */
  shed?: ShedReason;
}

const ORIGIN = randomBytes(8).toString('hex');
/** 30 bits, so a context keeps its span's number as a small integer (a larger one would be a heap number of its own). */
let spanCounter = Number.parseInt(randomBytes(4).toString('hex'), 16) & 0x3fffffff;
/** Odd, near 2^30 / φ: the counter visits every 30-bit value before it repeats, and consecutive ones differ widely. */
const SPAN_STEP = 0x278dde6d;
/** Trace ids are the process's random origin and a process-wide count: unique across every pipeline and request of the process. */
let traceCounter = 0;

function hex16(n: number): string {
  return n.toString(16).padStart(16, '0').slice(-16);
}

/** `"<stage>.<key>"` strings, made once per pair rather than once per note (bounded: names come from code). */
const noteKeys = new Map<string, Map<string, string>>();

function noteKey(stage: string, key: string): string {
  let byKey = noteKeys.get(stage);
  if (byKey === undefined) {
    byKey = new Map();
    if (noteKeys.size < 1024) noteKeys.set(stage, byKey);
  }
  let full = byKey.get(key);
  if (full === undefined) {
    full = `${stage}.${key}`;
    if (byKey.size < 64) byKey.set(key, full);
  }
  return full;
}

/** The trace of one element through a pipeline: its id, the stage records when sampled, and the notes stages made about it. */
export class TraceContext {
  /** Sequence number of the element at the point its trace began. */
  readonly seq: number;
  /** Whether per-stage timing is recorded for this element. */
  readonly sampled: boolean;
  /** The newest record (sampled elements only); each links the one before, so a stage adds one without an array to grow. */
  private newest: Kept | undefined = undefined;
  /** `records` as last read: extended in place by later records, so a reader's array stays current. */
  private built: StageRecord[] | undefined = undefined;
  /**
   * The parent's trace id, or this context's trace number once `traceId` was read. Numbers, not the
   * strings made from them: a string cached into a context that has been promoted is promoted with it.
   */
  private parentTraceId: string | number | undefined;
  private parentSpanId: string | undefined;
  /** This context's span number once `spanId` was read (a small integer; the id string is made on each read). */
  private span: number | undefined;
  /** Clock reading when the element last left a stage: lets the next stage read the clock once per hop. @internal */
  lastExit = 0;
  /**
   * Decisions stages made about this element, always on (not sampled): `"<stage>.<key>"`
   * → value, e.g. `{ "cache.hit": true, "route.variant": "b" }`. Allocated on first note.
   */
  notes: Record<string, string | number | boolean> | undefined;
  /** What the element's source is owed when the pipeline is done with it (a link message's acknowledgement), if anything. @internal */
  settlement: Settlement | undefined = undefined;

  constructor(seq: number, sampled: boolean, parent?: { traceId: string; spanId: string }) {
    this.seq = seq;
    this.sampled = sampled;
    this.parentTraceId = parent?.traceId;
    this.parentSpanId = parent?.spanId;
  }

  /** W3C trace-id: 32 lowercase hex digits. Inherited from a parent traceparent when one was given. */
  get traceId(): string {
    const parent = this.parentTraceId;
    if (typeof parent === 'string') return parent;
    return ORIGIN + hex16(parent ?? (this.parentTraceId = ++traceCounter));
  }

  /** W3C parent-id of this element's span: 16 lowercase hex digits. */
  get spanId(): string {
    const span = this.span ?? (this.span = spanCounter = (spanCounter + SPAN_STEP) & 0x3fffffff);
    return hex16(span * 0x100000 + (this.seq & 0xfffff) + 1);
  }

  /** The span this element's trace continues, when it was started from a traceparent. */
  get parentSpan(): string | undefined {
    return this.parentSpanId;
  }

  /** `00-<trace-id>-<span-id>-<flags>`, ready for an HTTP header or a message field. */
  get traceparent(): string {
    return `00-${this.traceId}-${this.spanId}-${this.sampled ? '01' : '00'}`;
  }

  /** Notes a decision `stage` made about this element (`"<stage>.<key>"`). */
  note(stage: string, key: string, value: string | number | boolean): void {
    (this.notes ??= {})[noteKey(stage, key)] = value;
  }

  /** The record of `stage`, if this element was sampled and passed it. */
  record(stage: string): StageRecord | undefined {
    return this.records?.find((r) => r.stage === stage);
  }

  /**
   * Per-stage records, in stage order: undefined unless the element is sampled. The array is
   * made on first read and grows as later stages add records; to add one, call `addRecord`.
   */
  get records(): readonly StageRecord[] | undefined {
    if (!this.sampled) return undefined;
    if (this.built === undefined) {
      const built: StageRecord[] = [];
      for (let kept = this.newest; kept !== undefined; kept = kept.before) built.push(kept.toRecord());
      this.built = built.reverse();
    }
    return this.built;
  }

  /** Adds what a stage did to this element, if it is sampled (a custom stage's timing, say). */
  addRecord(record: StageRecord): void {
    if (this.sampled) this.keep(record.stage, record.queueWait, record.service, record.paused, record.retries, record.conflated, record.shed);
  }

  /** `addRecord` from its fields, for a caller that knows the element is sampled; returns the record as kept. @internal */
  keep(stage: string, queueWait: number, service: number, paused: number, retries: number, conflated: number, shed: ShedReason | undefined): Kept {
    const kept = new Kept(stage, queueWait, service, paused, retries, conflated, shed, this.newest);
    this.newest = kept;
    if (this.built !== undefined) this.built.push(kept.toRecord());
    return kept;
  }

  /**
   * Completes a record kept before its stage was done with the element: a stage whose work
   * streams places its record when its first output leaves (so it stays in stage order ahead
   * of the records its outputs collect downstream) and completes it when the stream ends. @internal
   */
  amend(kept: Kept, service: number, paused: number, retries: number, shed?: ShedReason): void {
    kept.service = service;
    kept.paused = paused;
    kept.retries = retries;
    if (shed !== undefined) kept.shed = shed;
    const built = this.built;
    if (built === undefined) return;
    let index = built.length - 1; // `built` mirrors the chain: count back from the newest
    for (let k = this.newest; k !== kept && k !== undefined; k = k.before) index--;
    built[index] = kept.toRecord();
  }
}

/** A record as a context keeps it: newest first, each holding the one before. @internal */
export class Kept {
  constructor(
    readonly stage: string,
    readonly queueWait: number,
    public service: number,
    public paused: number,
    public retries: number,
    readonly conflated: number,
    public shed: ShedReason | undefined,
    readonly before: Kept | undefined,
  ) {}

  toRecord(): StageRecord {
    const { stage, queueWait, service, paused, retries, conflated, shed } = this;
    return shed === undefined ? { stage, queueWait, service, paused, retries, conflated } : { stage, queueWait, service, paused, retries, conflated, shed };
  }
}

/**
 * A trace as linked stages hand it on: a `TraceContext`, or a bare `seq`. A context a stage
 * begins unsampled holds nothing but its seq until something reads it (its ids and notes
 * come on first use), so until the element meets a reader a number stands for it: the
 * reader is an envelope, the work's context, a shed or failure report, or work with many
 * outputs (which must share one context). Each makes the context once and passes that on.
 *
 * A number costs nothing to store: a fresh context is a young object, and writing one into
 * a long-lived task calls V8's write barrier.
 * `Outlet.nextTraced` takes either; the envelope a consumer receives always holds a context.
 */
export type TraceRef = TraceContext | number;

/** The context a `TraceRef` stands for, made now if it is a number. @internal */
export function traceOf(ref: TraceRef): TraceContext {
  return typeof ref === 'number' ? new TraceContext(ref, false) : ref;
}

/** The settlement a `TraceRef` carries (a number carries none). @internal */
export function settlementOf(ref: TraceRef): Settlement | undefined {
  return typeof ref === 'number' ? undefined : ref.settlement;
}

/** Whether per-stage timing is recorded for the element (a number never is). @internal */
export function isSampled(ref: TraceRef): ref is TraceContext {
  // A number reads `sampled` as undefined: one property load either way, no test of the type
  // (its bytecode counts against V8's inlining budget on every stage's hop).
  return (ref as TraceContext).sampled === true;
}

/** An element with its trace. The payload is held by reference, never copied. */
export class Traced<T> {
  constructor(
    readonly value: T,
    readonly trace: TraceContext,
  ) {}
}

/**
 * An operator's input as a traced element: a `Traced` input passes as it is, a plain
 * value starts its trace here (with `seq`, sampled or not).
 */
export function toTraced<T>(input: T | Traced<T>, seq: number, sampled: boolean): Traced<T> {
  return input instanceof Traced ? (input as Traced<T>) : new Traced(input, new TraceContext(seq, sampled));
}

const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;

/** Parses a W3C `traceparent`; returns undefined when it is malformed or all-zero. */
export function parseTraceparent(header: string): { traceId: string; spanId: string; sampled: boolean } | undefined {
  const match = TRACEPARENT.exec(header.trim());
  if (!match) return undefined;
  const [, traceId, spanId, flags] = match as unknown as [string, string, string, string];
  if (/^0+$/.test(traceId) || /^0+$/.test(spanId)) return undefined;
  return { traceId, spanId, sampled: (Number.parseInt(flags, 16) & 1) === 1 };
}

/**
 * Starts a trace for a value: `traced(prompt, { traceparent })` makes every element
 * derived from it carry the caller's trace id.
 */
export function traced<T>(value: T, options: { seq?: number; sampled?: boolean; traceparent?: string } = {}): Traced<T> {
  const parent = options.traceparent === undefined ? undefined : parseTraceparent(options.traceparent);
  return new Traced(value, new TraceContext(options.seq ?? 0, options.sampled ?? parent?.sampled ?? false, parent));
}

/**
 * `sampler(rate)` for a caller whose `seq` only grows (a stage's arrival order): the
 * same decisions, `seq % n === 0`, without a division and a closure call per element.
 * @internal
 */
export class SeqSampler {
  /** 0: never. */
  private readonly every: number;
  /** The next sequence number to sample. */
  private next = 0;

  constructor(rate: number) {
    this.every = rate >= 1 ? 1 : rate <= 0 ? 0 : Math.round(1 / rate);
  }

  at(seq: number): boolean {
    if (this.every === 0 || seq < this.next) return false;
    if (seq > this.next) this.next = seq + ((this.every - (seq % this.every)) % this.every); // skipped ahead: the first multiple ≥ seq
    if (seq !== this.next) return false;
    this.next += this.every;
    return true;
  }
}

/** Every `n`-th element is sampled, deterministically (rate 1 = all, 0 = none). @internal */
export function sampler(rate: number): (seq: number) => boolean {
  if (rate >= 1) return () => true;
  if (rate <= 0) return () => false;
  const every = Math.round(1 / rate);
  return (seq) => seq % every === 0;
}
