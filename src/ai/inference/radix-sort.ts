/**
 * A numeric sort of doubles, largest first, by least-significant-digit radix over their bits: for the
 * few thousand scores of a vocabulary it beats the typed-array sort, which compares pair by pair.
 */

const DIGIT_BITS = 11;
const DIGITS = 1 << DIGIT_BITS;
const PASSES = Math.ceil(64 / DIGIT_BITS);
const counts = new Uint32Array(DIGITS);

/**
 * Sorts `values` (no NaN) largest first, using `spare` (at least as long) as the other buffer of
 * each pass; returns whichever of the two holds the result. Equal values (and -0 beside 0) may come
 * in any order.
 *
 * ## Example
 * ```ts
 * const values = Float64Array.from([1, -2, 3]);
 * sortDescending(values, new Float64Array(3)); // [3, 1, -2]
 * ```
 */
export function sortDescending(values: Float64Array, spare: Float64Array): Float64Array {
  const n = values.length;
  let from = new Uint32Array(values.buffer, values.byteOffset, n * 2);
  let to = new Uint32Array(spare.buffer, spare.byteOffset, n * 2);
  flipToKeys(from, n);
  let result = values;
  for (let pass = 0; pass < PASSES; pass++) {
    if (!scatter(from, to, n, pass * DIGIT_BITS)) continue;
    [from, to] = [to, from];
    result = result === values ? spare : values;
  }
  flipToKeys(from, n);
  return result;
}

/**
 * Turns each double's bits into a key whose unsigned order is the doubles' order reversed, and back
 * (the map is its own inverse): negative doubles already order so, positive ones have every bit
 * flipped but the sign's.
 */
function flipToKeys(words: Uint32Array, n: number): void {
  for (let i = 0; i < n; i++) {
    const high = words[2 * i + 1]!;
    if ((high & 0x80000000) !== 0) continue;
    words[2 * i + 1] = ~high & 0x7fffffff;
    words[2 * i] = ~words[2 * i]!;
  }
}

/** One stable counting pass on the digit at `shift`; false (nothing moved) when every key has the same digit there. */
function scatter(from: Uint32Array, to: Uint32Array, n: number, shift: number): boolean {
  counts.fill(0);
  for (let i = 0; i < n; i++) counts[digit(from, i, shift)]!++;
  let start = 0;
  for (let d = 0; d < DIGITS; d++) {
    const count = counts[d]!;
    if (count === n) return false;
    counts[d] = start;
    start += count;
  }
  for (let i = 0; i < n; i++) {
    const at = counts[digit(from, i, shift)]!++;
    to[2 * at] = from[2 * i]!;
    to[2 * at + 1] = from[2 * i + 1]!;
  }
  return true;
}

/** The key's `DIGIT_BITS` bits from `shift` up, across its low and high words. */
function digit(words: Uint32Array, i: number, shift: number): number {
  if (shift >= 32) return (words[2 * i + 1]! >>> (shift - 32)) & (DIGITS - 1);
  if (shift + DIGIT_BITS <= 32) return (words[2 * i]! >>> shift) & (DIGITS - 1);
  return ((words[2 * i]! >>> shift) | (words[2 * i + 1]! << (32 - shift))) & (DIGITS - 1);
}
