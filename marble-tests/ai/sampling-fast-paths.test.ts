import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { seededRandom } from '../../src/core/random.js';
import { drawFromDistribution, sampleToken, type SamplingParams } from '../../src/ai/inference/sampling.js';

/** A logit: often a tie (a small half-integer), often distinct, now and then ruled out (-Infinity) as a padded row is. */
const logit = fc.oneof(
  { weight: 4, arbitrary: fc.integer({ min: -6, max: 6 }).map((n) => n / 2) },
  { weight: 4, arbitrary: fc.double({ min: -10, max: 10, noNaN: true }) },
  { weight: 1, arbitrary: fc.constant(-Infinity) },
);

/** Logits of a few tokens or of a few hundred (where top-k keeps a few of many). */
const logits = fc
  .oneof(fc.array(logit, { minLength: 1, maxLength: 20 }), fc.array(logit, { minLength: 100, maxLength: 300 }))
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

/** Sampled parameters: a temperature above 0, with or without top-k (a few of many, or most) and top-p. */
const sampled: fc.Arbitrary<SamplingParams> = fc
  .tuple(
    penalties,
    fc.record(
      {
        // Exactly 1 too: the uncut draw then reuses its own sum for the logprob.
        temperature: fc.oneof(fc.constant(1), fc.double({ min: 0.05, max: 2, noNaN: true })),
        top_k: fc.oneof(fc.constant(0), fc.integer({ min: 2, max: 12 }), fc.integer({ min: 2, max: 320 })),
        // Quarters: tied logits give probabilities of exactly 1/2 or 1/4, so the cumulative sum can land on top_p.
        top_p: fc.oneof(fc.constant(1), fc.constantFrom(0.25, 0.5, 0.75), fc.double({ min: 0.01, max: 1, noNaN: true })),
      },
      { requiredKeys: [] },
    ),
  )
  .map(([penalty, shape]) => ({ ...penalty, ...shape }))
  .filter((params) => (params.top_k ?? 0) !== 1);

/** Scores the general order sorts by its own rules (NaN, infinities): the fast path must hand these back. */
const odd = fc
  .tuple(logits, fc.array(fc.tuple(fc.nat(299), fc.constantFrom(Number.NaN, Infinity, -Infinity)), { minLength: 1, maxLength: 3 }))
  .map(([scores, odd]) => {
    const copy = Float32Array.from(scores);
    for (const [at, value] of odd) copy[at % copy.length] = value;
    return copy;
  });

/** The fast draw and the general one from the same seed: same id, same logprob bits, same random numbers taken. */
function sameDraw(scores: Float32Array, params: SamplingParams, history: readonly number[], promptLength: number, seed: number): { id: number } {
  const fast = seededRandom(seed);
  const general = seededRandom(seed);
  const before = Float32Array.from(scores);
  const token = sampleToken(scores, params, fast, history, promptLength);
  const expected = drawFromDistribution(scores, params, general, history, promptLength);
  assert.equal(token.id, expected.id);
  assert.ok(Object.is(token.logprob, expected.logprob), `logprob ${token.logprob} ≠ ${expected.logprob}`);
  assert.equal(fast(), general(), 'the seeded sequence is aligned after the draw');
  assert.deepEqual(scores, before, 'the caller’s logits are left as they were');
  return token;
}

const histories = fc.array(fc.integer({ min: -2, max: 310 }), { maxLength: 40 });

describe('sampling fast paths', () => {
  it('the ranked draw gives the general draw’s token and logprob, and consumes the same random numbers', () => {
    fc.assert(
      fc.property(logits, sampled, histories, fc.nat(40), fc.integer(), (scores, params, history, prompt, seed) => {
        sameDraw(scores, params, history, Math.min(prompt, history.length), seed);
      }),
      { numRuns: 1000 },
    );
  });

  it('scores with NaN or infinities draw as the general path does', () => {
    fc.assert(
      fc.property(odd, fc.oneof(sampled, greedy), histories, fc.integer(), (scores, params, history, seed) => {
        sameDraw(scores, params, history, 0, seed);
      }),
      { numRuns: 300 },
    );
  });

  it('the greedy draw gives the general draw’s token and logprob, and consumes the same random numbers', () => {
    fc.assert(
      fc.property(logits, greedy, histories, fc.nat(40), fc.integer(), (scores, params, history, prompt, seed) => {
        // Same id, logprob bits and random numbers as the general draw; logits left as they were.
        const token = sameDraw(scores, params, history, Math.min(prompt, history.length), seed);
        const penalised = (params.repetition_penalty ?? 1) !== 1 || (params.presence_penalty ?? 0) !== 0 || (params.frequency_penalty ?? 0) !== 0;
        if (!penalised) assert.equal(token.id, Array.from(scores).indexOf(Math.max(...scores)), 'the first of the most likely tokens');
      }),
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
