/**
 * Reciprocal rank fusion (Cormack, Clarke and Büttcher, SIGIR 2009): rankings of different
 * scales (cosine, BM25) merged by rank alone, `Σ 1 / (k + rank)`, so neither scale has to be
 * calibrated against the other.
 */

/** The constant of reciprocal rank fusion: how much the first ranks outweigh the later ones. */
export const RRF_K = 60;

/** One fused entry: its id, fused score and its rank (0-based) in each ranking that holds it. */
export interface Fused {
  readonly id: string;
  readonly score: number;
  readonly ranks: readonly (number | undefined)[];
}

/**
 * Fuses rankings (each a list of ids, best first) into one, best first; ties keep the order of
 * the first ranking that holds them, then id order. `weights` (default 1 each) scale each ranking's votes.
 */
export function reciprocalRankFusion(rankings: readonly (readonly string[])[], k: number = RRF_K, weights?: readonly number[]): Fused[] {
  const fused = new Map<string, { score: number; ranks: (number | undefined)[] }>();
  rankings.forEach((ranking, which) => {
    ranking.forEach((id, rank) => {
      let entry = fused.get(id);
      if (entry === undefined) fused.set(id, (entry = { score: 0, ranks: rankings.map(() => undefined) }));
      entry.score += (weights?.[which] ?? 1) / (k + rank + 1);
      entry.ranks[which] = rank;
    });
  });
  const best = (ranks: readonly (number | undefined)[]): number => Math.min(...ranks.map((r) => r ?? Infinity));
  return [...fused.entries()]
    .map(([id, { score, ranks }]) => ({ id, score, ranks }))
    .sort((a, b) => b.score - a.score || best(a.ranks) - best(b.ranks) || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
}
