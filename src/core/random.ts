/**
 * A seeded 32-bit generator (mulberry32). Model weights come from integer arithmetic only, so the same seed
 * gives the same bytes on every machine; no Math.random, no platform-dependent transcendental functions.
 */
export function seededRandom(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Fisher–Yates with a seeded generator: a deterministic permutation of `items`. */
export function shuffled<T>(items: readonly T[], seed: number): T[] {
  const random = seededRandom(seed);
  const out = [...items];
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [out[i], out[j]] = [out[j]!, out[i]!];
  }
  return out;
}

/** FNV-1a over the UTF-16 code units of `text`, salted by `seed`: a stable 32-bit hash. */
export function fnv1a(text: string, seed = 0): number {
  return fnv1aFrom(0x811c9dc5 ^ seed, text) >>> 0;
}

/**
 * One FNV-1a step: folds a UTF-16 code unit into `hash`. Works on the signed 32-bit
 * form (small integers, never a heap number); `>>> 0` gives the usual unsigned hash.
 */
export function fnv1aStep(hash: number, code: number): number {
  return Math.imul(hash ^ code, 0x01000193);
}

/** Continues an FNV-1a hash over `text` (signed form): `fnv1aFrom(fnv1aFrom(h, a), b) === fnv1aFrom(h, a + b)`. */
export function fnv1aFrom(hash: number, text: string): number {
  for (let i = 0; i < text.length; i++) hash = fnv1aStep(hash, text.charCodeAt(i));
  return hash;
}

/**
 * MurmurHash3's 32-bit finalizer: a bijection in which every output bit depends on every input
 * bit (full avalanche). FNV-1a alone leaves its high bits nearly fixed across keys that differ only
 * in their last characters (`u0`…`u199`), which skews any split that reads them.
 */
export function fmix32(hash: number): number {
  hash ^= hash >>> 16;
  hash = Math.imul(hash, 0x85ebca6b);
  hash ^= hash >>> 13;
  hash = Math.imul(hash, 0xc2b2ae35);
  hash ^= hash >>> 16;
  return hash >>> 0;
}
