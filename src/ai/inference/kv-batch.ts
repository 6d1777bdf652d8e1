/**
 * Decode steps of a KV-cache decoder batched across generations (`StepBatcher`): steps whose
 * caches have one length run as one call, caches stacked on the batch axis, no padding (each row
 * computes what it would alone); with `lengthBucket`, shorter caches are left-padded and masked. A call's output cache stays stacked: generations that step
 * together again are fed it as it is, with no copy on this thread; one that steps with others, or
 * alone, has its rows copied out then (a pool transfers its feeds, so rows are never shared).
 */
import { StepBatcher, type StepBatcherOptions } from './step-batcher.js';
import type { DecoderShape, RunModel } from './lm-tensors.js';
import { presentAsPast, rowLogits, stepFeeds, type KvCache, type StackedCache } from '../pool/kv-stack.js';

export { kvBytes, ownCache, presentAsPast, type KvCache } from '../pool/kv-stack.js';

/** Batching of a KV-cache decoder's steps: `StepBatcher`'s options, how far cache lengths in one call may differ, and its tokens. */
export interface DecoderBatchOptions extends StepBatcherOptions {
  /**
   * Tokens one call feeds at most, prefills included (a prompt longer than this runs alone): a long
   * prefill joining does not stall the decode steps of the others for more than this many tokens' work.
   * Default 2,048.
   */
  readonly tokenBudget?: number;
  /**
   * Cache lengths `[k·n, (k+1)·n)` share a call, shorter ones left-padded and masked: such rows may differ
   * from their lone run in the last bits (reductions over a longer row). Default 1: one length per call, exact.
   */
  readonly lengthBucket?: number;
}

/** One step of a cached generation: its prompt (a prefill, over an empty cache) or its next token. */
export interface CachedStep {
  readonly past: KvCache;
  /** The tokens fed: one for a decode step, the prompt for a prefill. */
  readonly ids: readonly number[];
  /** The first fed token's position: the cache's length. */
  readonly position: number;
}

/** What a step gives: the cache one position longer, and the next token's logits. */
export interface CachedResult {
  readonly past: KvCache;
  readonly logits: Float32Array;
}

/** The batcher key of a step: decode steps by cache length (bucketed); a prefill only with prefills of its length over caches of one length. */
export function kvStepKey(bucket: number): (step: { readonly ids: readonly number[]; readonly position: number }) => string {
  return (step) => (step.ids.length === 1 ? String(Math.floor(step.position / bucket)) : `${step.ids.length}@${step.position}`);
}

/** The batcher of a decoder's steps: prefills of one prompt length together, decode steps together. */
export function kvBatcher(shape: DecoderShape, run: RunModel, options: DecoderBatchOptions): StepBatcher<CachedStep, CachedResult> {
  const { lengthBucket: bucket = 1, tokenBudget = 2048, ...rest } = options;
  // A batch is shared: no one generation's signal may abort it (a cancelled one leaves before its call).
  const never = new AbortController().signal;
  return new StepBatcher<CachedStep, CachedResult>(
    async (steps) => {
      const b = steps.length;
      const { feeds, length } = stepFeeds(steps, shape);
      const out = await run(feeds, never);
      const stacked: StackedCache = { tensors: presentAsPast(out, shape.layers), size: b, length: length + steps[0]!.ids.length };
      return steps.map((s, i) => ({
        past: b === 1 ? stacked.tensors : { stacked, row: i, pad: length - s.position },
        logits: b === 1 ? rowLogits(out.logits!, 0) : rowLogits(out.logits!, i).slice(),
      }));
    },
    kvStepKey(bucket),
    { ...rest, weight: (step) => step.ids.length, maxWeight: tokenBudget },
  );
}
