import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { sortDescending } from '../../src/ai/inference/radix-sort.js';

/** Doubles of every kind but NaN: signed zeros, subnormals, infinities, ties, the float32 values logits are. */
const value = fc.oneof(
  fc.double({ noNaN: true }),
  fc.constantFrom(0, -0, Infinity, -Infinity, Number.MIN_VALUE, -Number.MIN_VALUE, 1, -1),
  fc.float({ noNaN: true }).map(Math.fround),
);

describe('sortDescending', () => {
  it('orders any doubles but NaN largest first, as the typed-array sort reversed', () => {
    fc.assert(
      fc.property(fc.oneof(fc.array(value, { maxLength: 40 }), fc.array(value, { minLength: 2000, maxLength: 3000 })), (list) => {
        const values = Float64Array.from(list);
        const expected = Float64Array.from(list).sort().reverse();
        const sorted = sortDescending(values, new Float64Array(list.length));
        // -0 and 0 may come in either order: compare with ===, which holds them equal.
        assert.ok(
          sorted.every((v, i) => v === expected[i]),
          'same values in the same order',
        );
      }),
      { numRuns: 200 },
    );
  });

  it('sorts values that share their high bits (passes with one digit are skipped)', () => {
    const values = Float64Array.from([1.5, 1.25, 1.75, 1.125, 1.5]);
    assert.deepEqual([...sortDescending(values, new Float64Array(5))], [1.75, 1.5, 1.5, 1.25, 1.125]);
  });
});
