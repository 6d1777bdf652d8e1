/**
 * The single-step ceiling of bench 11's decoder: one decode step for 1 sequence, for 16 in one call,
 * and for 16 as two calls of 8 at once (the resident path's split over the pool's two threads), at a
 * past of 32, 64 and 256 positions, timed through the pool with nothing else around it. What the
 * served streams reach is read against it: no scheduler can step faster than the model does.
 */
import type { InferencePool } from '../src/ai/pool/pool.js';
import { monotonicMs } from './harness.js';

/** One timed shape of step. */
export interface CeilingResult {
  readonly past: number;
  /** Sequences stepped, all calls together. */
  readonly sequences: number;
  /** Calls made at once for them. */
  readonly calls: number;
  /** Median ms for the whole step. */
  readonly ms: number;
  readonly tokensPerSecond: number;
}

interface DecoderShapeLike {
  readonly layers: number;
  readonly heads: number;
  readonly headDim: number;
}

/** 64 and 256: the issue's figures; 32: about the mean past of bench 11's short runs (a 17-character prompt, 32 tokens). */
export const CEILING_PASTS = [32, 64, 256] as const;
const SHAPES = [
  { sequences: 1, calls: 1 },
  { sequences: 16, calls: 1 },
  { sequences: 16, calls: 2 },
] as const;

/** Times `reps` steps of each shape (after one untimed), the feeds made before each timed step (the pool transfers them). */
export async function measureDecodeCeiling(pool: InferencePool, model: string, shape: DecoderShapeLike, reps = 12): Promise<CeilingResult[]> {
  const { float32, pastNames, stepFeeds } = await import('../src/ai/pool/kv-stack.js');
  const feedsFor = (rows: number, past: number) =>
    stepFeeds(
      Array.from({ length: rows }, () => {
        const cache = Object.fromEntries(
          pastNames(shape.layers).map((name) => [name, float32(new Float32Array(shape.heads * past * shape.headDim), [1, shape.heads, past, shape.headDim])]),
        );
        return { past: cache, ids: [5], position: past };
      }),
      shape,
    ).feeds;
  const results: CeilingResult[] = [];
  for (const past of CEILING_PASTS) {
    for (const { sequences, calls } of SHAPES) {
      const times: number[] = [];
      for (let rep = 0; rep <= reps; rep++) {
        const feeds = Array.from({ length: calls }, () => feedsFor(sequences / calls, past));
        const started = monotonicMs();
        await Promise.all(feeds.map((f) => pool.run(f, { model })));
        if (rep > 0) times.push(monotonicMs() - started);
      }
      times.sort((a, b) => a - b);
      const ms = times[Math.floor(times.length / 2)]!;
      results.push({ past, sequences, calls, ms, tokensPerSecond: (sequences * 1000) / ms });
    }
  }
  return results;
}

/** The ceiling's tokens/s for `sequences` at `past`, by the best way to call for them. */
export function ceilingAt(results: readonly CeilingResult[], past: number, sequences: number): number | undefined {
  const matching = results.filter((r) => r.past === past && r.sequences === sequences);
  return matching.length === 0 ? undefined : Math.max(...matching.map((r) => r.tokensPerSecond));
}
