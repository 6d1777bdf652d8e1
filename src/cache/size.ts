/**
 * Bytes every cache entry costs beyond its value: the map slot, the entry record,
 * the links of the LRU order. An estimate, deliberately on the high side.
 */
export const ENTRY_OVERHEAD = 96;

/**
 * Estimates the bytes `value` holds: strings count 2 bytes per UTF-16 code unit,
 * typed arrays their byte length, numbers 8, booleans 4, arrays and objects the
 * sum of their parts plus a slot per element or key. An estimate for a bound,
 * not a measurement: pass your own `sizeOf` for values this does not see into
 * (a class holding a native buffer, say).
 *
 * ## Example
 * ```ts
 * estimateSize('hello');          // 10
 * estimateSize(['a', 'b']);       // 2 + 2 + two 8-byte slots + 16
 * ```
 */
export function estimateSize(value: unknown): number {
  return measure(value, new Set());
}

function measure(value: unknown, seen: Set<object>): number {
  switch (typeof value) {
    case 'string':
      return value.length * 2;
    case 'number':
    case 'bigint':
      return 8;
    case 'boolean':
      return 4;
    case 'object':
      break;
    default:
      return 0;
  }
  if (value === null) return 0;
  if (seen.has(value)) return 0; // shared or cyclic parts count once
  seen.add(value);
  if (ArrayBuffer.isView(value)) return value.byteLength + 16;
  if (value instanceof ArrayBuffer) return value.byteLength + 16;
  let total = 16;
  if (Array.isArray(value)) {
    for (const item of value) total += 8 + measure(item, seen);
    return total;
  }
  for (const key of Object.keys(value)) total += 8 + key.length * 2 + measure((value as Record<string, unknown>)[key], seen);
  return total;
}
