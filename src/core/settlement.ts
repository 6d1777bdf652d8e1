/**
 * A settlement is the promise a source made to whoever handed it an element: to say, once, how
 * the pipeline ended with it (a link message is acknowledged, given back or terminated by it).
 * It rides on the element's `TraceContext`, so it follows every output derived from the element
 * through any stage, and is settled when the last copy of the element has left the pipeline:
 *
 * - an element starts as one copy; work that streams outputs adds one per output and gives its
 *   own back when the stream ends; a fan-out adds one per extra lane;
 * - a copy leaves as delivered (a sink that ends the pipeline), shed or failed (the stage that
 *   shed or failed it says so);
 * - with no copy left, the outcome is `failed` if any copy failed, else `delivered` if any copy
 *   was delivered or its work finished, else `shed` (the first reason).
 *
 * Elements merged by `conflate` settle with the element they were merged into. Only stages and
 * sinks that know settlements settle them; a plain RxJS operator that drops an element (`filter`)
 * leaves it unsettled until its source gives up on it (a link: on cancel, or after `ackWait`).
 */
import type { ShedReason } from './vocabulary.js';

/** How the pipeline ended with an element. */
export type Settled =
  /** `forwarded`: every copy delivered went on to a next hop that stored it (a NATS link), none ended here. */
  | { readonly outcome: 'delivered'; readonly forwarded?: boolean }
  | { readonly outcome: 'shed'; readonly reason: ShedReason }
  | { readonly outcome: 'failed'; readonly error: unknown };

/** The source's side: told once how its element ended. */
export interface Settler {
  settle(settled: Settled): void;
}

const DELIVERED: Settled = { outcome: 'delivered' };
const FORWARDED: Settled = { outcome: 'delivered', forwarded: true };

export class Settlement {
  private copies = 1;
  private delivered = false;
  private deliveredHere = false;
  private shedReason: ShedReason | undefined;
  private failure: { error: unknown } | undefined;
  private absorbed: Settlement[] | undefined;
  private done = false;

  constructor(readonly settler: Settler) {}

  /** Whether the outcome was given (or the settler was settled by hand). */
  get settled(): boolean {
    return this.done;
  }

  /** One more copy of the element is in the pipeline (a streamed output, a fan-out lane). */
  hold(): void {
    if (!this.done) this.copies++;
  }

  /** A copy left the pipeline at its end, or its work finished; `forwarded`: it went on to a next hop that stored it. */
  deliver(forwarded = false): void {
    this.delivered = true;
    if (!forwarded) this.deliveredHere = true;
    this.release();
  }

  /** A copy was shed. */
  shed(reason: ShedReason): void {
    this.shedReason ??= reason;
    this.release();
  }

  /** A copy failed. */
  fail(error: unknown): void {
    this.failure ??= { error };
    this.release();
  }

  /** `other`'s element was merged into this one's: it settles as this one does. */
  absorb(other: Settlement): void {
    if (other === this) return;
    if (this.done) other.settleAs(this.outcome());
    else (this.absorbed ??= []).push(other);
  }

  /** The settler was settled by hand: later copies leaving change nothing. */
  close(): void {
    this.done = true;
  }

  private release(): void {
    if (this.done || --this.copies > 0) return;
    this.settleAs(this.outcome());
  }

  private settleAs(settled: Settled): void {
    if (this.done) return;
    this.done = true;
    this.settler.settle(settled);
    const absorbed = this.absorbed;
    this.absorbed = undefined;
    if (absorbed !== undefined) for (const other of absorbed) other.settleAs(settled);
  }

  private outcome(): Settled {
    if (this.failure !== undefined) return { outcome: 'failed', error: this.failure.error };
    if (this.delivered && !this.deliveredHere) return FORWARDED;
    if (this.delivered || this.shedReason === undefined) return DELIVERED;
    return { outcome: 'shed', reason: this.shedReason };
  }
}

/** A value that carries the traces of several elements (a `Batch`): settling it settles each. */
export interface CarriesTraces {
  readonly traces: readonly { readonly settlement: Settlement | undefined }[];
}

/**
 * The copies an element stands for: its own trace's; or, when the value is a batch, one per
 * item (a batch's own trace is its first item's, one copy for both; items may be outputs of one
 * element, each a copy of it).
 */
export function forEachSettlement(value: unknown, settlement: Settlement | undefined, act: (settlement: Settlement) => void): void {
  if (typeof value !== 'object' || value === null || !(SETTLES_ITEMS in value)) {
    if (settlement !== undefined) act(settlement);
    return;
  }
  const traces = (value as unknown as CarriesTraces).traces;
  if (settlement !== undefined && (traces.length === 0 || traces[0]!.settlement !== settlement)) act(settlement);
  for (let i = 0; i < traces.length; i++) {
    const item = traces[i]!.settlement;
    if (item !== undefined) act(item);
  }
}

/** Marks a class whose instances carry their items' traces (see `forEachSettlement`). */
export const SETTLES_ITEMS: unique symbol = Symbol('sluice.settlesItems');

/**
 * The run ended with the element inside (it failed, or its consumer left): nobody finished it.
 * It settles as shed `cancelled`, so its source may offer it again (a link message is `nak`ed).
 */
export function giveBack(value: unknown, settlement: Settlement | undefined): void {
  forEachSettlement(value, settlement, cancelCopy);
}

function cancelCopy(settlement: Settlement): void {
  settlement.shed('cancelled');
}
