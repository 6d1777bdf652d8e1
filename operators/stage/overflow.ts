/**
 * The overflow policies: what a stage does with an element that arrives when its buffer is full
 * (the table is in `core/vocabulary.ts`). Each case leaves the element accounted for: buffered,
 * shed with a reason, merged, or failed.
 */
import type { Ring } from '../../src/flow/ring.js';
import type { ShedReason } from '../../src/flow/options.js';
import type { StageStats } from '../../src/flow/stats.js';
import { OverflowError, StageError, UnpausableSourceError, type SluiceError } from '../../src/core/errors.js';
import { type TraceRef, settlementOf } from '../../src/core/trace.js';
import { forEachSettlement, giveBack } from '../../src/core/settlement.js';
import type { StageConfig } from './options.js';
import type { Pending } from './task.js';

/** What a policy acts on: the stage whose buffer is full. */
export interface Overflowing<I> {
  readonly config: StageConfig;
  readonly stats: StageStats;
  readonly buffer: Ring<Pending<I>>;
  shed(value: I, trace: TraceRef, seq: number, reason: ShedReason, count: number): void;
  /** Ends the run now, failing what it holds. */
  fail(error: SluiceError): void;
  /** Takes no more input; what is buffered and in flight is delivered, then `error`. */
  failAfterDrain(error: SluiceError): void;
}

/** `incoming` found the buffer full (`asked`: its producer asked for it, so pausing it was possible). */
export function overflow<I>(stage: Overflowing<I>, incoming: Pending<I>, asked: boolean): void {
  const { config, stats, buffer } = stage;
  switch (config.policy) {
    case 'pause':
      // A linked producer asked first; a bounded overshoot comes only from a plain
      // operator that expands one element into several. Anything else cannot be paused.
      if (asked) {
        buffer.push(incoming);
        stats.buffered++;
      } else {
        stats.failed++;
        giveBack(incoming.value, settlementOf(incoming.trace)); // the run fails with it at the door
        stage.fail(new UnpausableSourceError(config.name, config.capacity));
      }
      return;
    case 'shed-incoming':
      stage.shed(incoming.value, incoming.trace, incoming.seq, 'buffer-full', 1);
      return;
    case 'shed-oldest': {
      const oldest = buffer.shift()!;
      buffer.push(incoming);
      // The hook last, with the buffer whole again: it may unsubscribe, which sheds what is buffered.
      stage.shed(oldest.value, oldest.trace, oldest.seq, 'evicted', 1 + oldest.merged);
      return;
    }
    case 'fail':
      // Documented choice: what is buffered and in flight is delivered first, then the error.
      stats.failed++;
      giveBack(incoming.value, settlementOf(incoming.trace));
      stage.failAfterDrain(new OverflowError(config.name, config.capacity));
      return;
    case 'conflate': {
      const newest = buffer.peekLast()!;
      try {
        newest.value = (config.conflate as (pending: I, incoming: I) => I)(newest.value, incoming.value);
      } catch (err) {
        stats.failed++;
        const error = new StageError(config.name, incoming.seq, err);
        forEachSettlement(incoming.value, settlementOf(incoming.trace), (settlement) => settlement.fail(error));
        stage.fail(error);
        return;
      }
      newest.merged++;
      stats.conflated++;
      mergeSettlement(incoming.trace, newest.trace);
      return;
    }
  }
}

/** A merged element settles with the one it was merged into (at once, if that one owes nothing). */
function mergeSettlement(merged: TraceRef, into: TraceRef): void {
  const settlement = settlementOf(merged);
  if (settlement === undefined) return;
  const survivor = settlementOf(into);
  if (survivor === undefined) settlement.deliver();
  else survivor.absorb(settlement);
}
