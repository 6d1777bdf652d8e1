import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { seededRandom } from '../../src/core/random.js';
import { drawFromDistribution, sampleToken, type SamplingParams } from '../../src/ai/inference/sampling.js';

/** Logits with ties (small integers), and now and then a token ruled out (-Infinity) as a padded row is. */
const logits = fc
  .array(fc.oneof({ weight: 8, arbitrary: fc.integer({ min: -6, max: 6 }).map((n) => n / 2) }, { weight: 1, arbitrary: fc.constant(-Infinity) }), {
    minLength: 1,
    maxLength: 300,
  })
  .map((values) => Float32Array.from(values));

const penalties = fc.record(
  {
    repetition_penalty: fc.oneof(fc.constant(1), fc.double({ min: 0.5, max: 2, noNaN: true })),
    presence_penalty: fc.oneof(fc.constant(0), fc.double({ min: -2, max: 2, noNaN: true })),
    frequency_penalty: fc.oneof(fc.constant(0), fc.double({ min: -2, max: 2, noNaN: true })),
  },
  { requiredKeys: [] },
);

/** Parameters under which all the mass is on one token: temperature 0, or `top_k: 1` at any temperature. */
const greedy: fc.Arbitrary<SamplingParams> = fc
  .tuple(
    penalties,
    fc.oneof(
      fc.record({ temperature: fc.constant(0), top_k: fc.nat(5), top_p: fc.double({ min: 0.01, max: 1, noNaN: true }) }, { requiredKeys: ['temperature'] }),
      fc.record({ top_k: fc.constant(1), temperature: fc.double({ min: 0.1, max: 2, noNaN: true }) }, { requiredKeys: ['top_k'] }),
    ),
  )
  .map(([penalty, shape]) => ({ ...penalty, ...shape }));

describe('sampling fast paths', () => {
  it('the greedy draw gives the general draw’s token and logprob, and consumes the same random numbers', () => {
    fc.assert(
      fc.property(
        logits,
        greedy,
        fc.array(fc.integer({ min: -2, max: 310 }), { maxLength: 40 }),
        fc.nat(40),
        fc.integer(),
        (scores, params, history, prompt, seed) => {
          const promptLength = Math.min(prompt, history.length);
          const fast = seededRandom(seed);
          const general = seededRandom(seed);
          const before = Float32Array.from(scores);
          const token = sampleToken(scores, params, fast, history, promptLength);
          const expected = drawFromDistribution(scores, params, general, history, promptLength);
          assert.equal(token.id, expected.id);
          const penalised = (params.repetition_penalty ?? 1) !== 1 || (params.presence_penalty ?? 0) !== 0 || (params.frequency_penalty ?? 0) !== 0;
          if (!penalised) assert.equal(token.id, Array.from(scores).indexOf(Math.max(...scores)), 'the first of the most likely tokens');
          assert.ok(Object.is(token.logprob, expected.logprob), `logprob ${token.logprob} ≠ ${expected.logprob}`);
          assert.equal(fast(), general(), 'the seeded sequence is aligned after the draw');
          assert.deepEqual(scores, before, 'the caller’s logits are left as they were');
        },
      ),
      { numRuns: 500 },
    );
  });

  it('a seeded greedy generation draws the same tokens step after step as the general path', () => {
    fc.assert(
      fc.property(fc.array(logits, { minLength: 1, maxLength: 12 }), greedy, fc.integer(), (steps, params, seed) => {
        const fast = seededRandom(seed);
        const general = seededRandom(seed);
        const ids: number[] = [1, 2];
        const reference: number[] = [1, 2];
        for (const scores of steps) {
          ids.push(sampleToken(scores, params, fast, ids, 2).id);
          reference.push(drawFromDistribution(scores, params, general, reference, 2).id);
        }
        assert.deepEqual(ids, reference);
      }),
    );
  });
});
