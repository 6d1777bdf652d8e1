/** A deterministic bag-of-words embedder for tests: each word adds ±1 to a hashed bucket. */
import type { Embedder } from '../../src/ai/stages/embed.js';

/** An embedder of `dim` dimensions that records the texts of each call. */
export function hashingEmbedder(dim = 64): Embedder & { calls: string[][] } {
  const calls: string[][] = [];
  const embedder = async (texts: string[]): Promise<Float32Array[]> => {
    calls.push(texts);
    return texts.map((text) => {
      const vector = new Float32Array(dim);
      for (const word of text.toLowerCase().match(/[\p{L}\p{N}]+/gu) ?? []) {
        let hash = 0x811c9dc5;
        for (let i = 0; i < word.length; i++) hash = Math.imul(hash ^ word.charCodeAt(i), 0x01000193) >>> 0;
        vector[hash % dim]! += hash & 0x80000000 ? -1 : 1;
      }
      if (vector.every((x) => x === 0)) vector[0] = 1;
      return vector;
    });
  };
  return Object.assign(embedder, { calls });
}
