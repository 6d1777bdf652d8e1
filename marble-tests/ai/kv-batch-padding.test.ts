/**
 * Decode steps whose caches have different lengths in one call (`kvBatcher` with `lengthBucket`):
 * shorter caches left-padded and masked, each row's logits and cache those of its lone step up to
 * the rounding of reductions over a longer row; a mask that let the padding in would be far off.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import * as ort from 'onnxruntime-node';
import { DEFAULT_DECODER, buildDecoderModel } from '../../src/ai/models/decoder.js';
import { kvBatcher, ownCache, presentAsPast } from '../../src/ai/inference/kv-batch.js';
import { int64 } from '../../src/ai/inference/lm-tensors.js';

const shape = { layers: DEFAULT_DECODER.layers, heads: DEFAULT_DECODER.heads, headDim: DEFAULT_DECODER.hidden / DEFAULT_DECODER.heads };

function maxDifference(a: Float32Array, b: Float32Array): number {
  assert.equal(a.length, b.length);
  let most = 0;
  for (let i = 0; i < a.length; i++) most = Math.max(most, Math.abs(a[i]! - b[i]!));
  return most;
}

describe('kvBatcher with a lengthBucket', () => {
  it('property: rows of different cache lengths in one call get their lone logits and caches (within rounding)', async () => {
    const session = await ort.InferenceSession.create(buildDecoderModel(DEFAULT_DECODER));
    const run = (feeds: Record<string, ort.Tensor>) => session.run(feeds) as Promise<Record<string, ort.Tensor>>;
    const prefill = async (ids: readonly number[]) => {
      const feeds: Record<string, ort.Tensor> = {
        input_ids: int64(ids, [1, ids.length]),
        attention_mask: int64(
          ids.map(() => 1),
          [1, ids.length],
        ),
        position_ids: int64(
          ids.map((_, i) => i),
          [1, ids.length],
        ),
      };
      for (let l = 0; l < shape.layers; l++)
        for (const part of ['key', 'value'])
          feeds[`past_key_values.${l}.${part}`] = new ort.Tensor('float32', new Float32Array(0), [1, shape.heads, 0, shape.headDim]);
      return presentAsPast(await run(feeds), shape.layers);
    };
    const alone = kvBatcher(shape, run, { maxBatch: 1 });
    const padded = kvBatcher(shape, run, { maxBatch: 8, lengthBucket: 128 });
    const never = new AbortController().signal;
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.record({ ids: fc.array(fc.nat({ max: DEFAULT_DECODER.vocabSize - 1 }), { minLength: 1, maxLength: 90 }), next: fc.nat({ max: 127 }) }), {
          minLength: 2,
          maxLength: 6,
        }),
        async (rows) => {
          const steps = await Promise.all(rows.map(async (r) => ({ past: await prefill(r.ids), ids: [r.next], position: r.ids.length })));
          const expected: Awaited<ReturnType<typeof alone.step>>[] = [];
          for (const step of steps) expected.push(await alone.step(step, never));
          const calls = padded.stats.calls;
          const got = await Promise.all(steps.map((step) => padded.step(step, never)));
          assert.equal(padded.stats.calls, calls + 1, 'all rows in one call');
          got.forEach((result, i) => {
            assert.ok(maxDifference(result.logits, expected[i]!.logits) < 1e-4, `row ${i} logits`);
            const mine = ownCache(result.past, shape);
            const lone = ownCache(expected[i]!.past, shape);
            for (const name of Object.keys(lone)) {
              assert.deepEqual(mine[name]!.dims, lone[name]!.dims, name);
              assert.ok(maxDifference(mine[name]!.data as Float32Array, lone[name]!.data as Float32Array) < 1e-4, name);
            }
          });
        },
      ),
      { numRuns: 40 },
    );
    await session.release();
  });
});
