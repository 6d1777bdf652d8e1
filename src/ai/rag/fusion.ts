/**
 * Merging rankings of different scales (cosine, BM25): by rank alone (reciprocal rank fusion,
 * Cormack, Clarke and Büttcher, SIGIR 2009, `Σ 1 / (k + rank)`), or by scores each put on its
 * ranking's own scale (`scoreFusion`, what hybrid retrieval uses).
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

/** One entry of a ranking with its score (cosine, BM25...), best first. */
export interface RankedScore {
  readonly id: string;
  readonly score: number;
}

/**
 * Fuses rankings by their scores, each divided by its ranking's best (a convex combination of
 * normalised scores, as compared by Bruch, Gai and Ingber, TOIS 2023), weighed (`weights`, default 1
 * each) and summed. An entry a ranking does not hold counts that ranking's lowest score, since it
 * stood below every one it holds, or 0 when the ranking is `complete` (it holds every entry that
 * scores at all, as a BM25 search that found fewer passages than it was asked for does). Unlike rank
 * fusion, a clear winner of one ranking keeps its margin over passages both rank fairly. Best first;
 * ties keep the order of the first ranking that holds them, then id order.
 */
export function scoreFusion(rankings: readonly (readonly RankedScore[])[], weights?: readonly number[], complete?: readonly boolean[]): Fused[] {
  const scales = rankings.map((ranking, which) => {
    const scores = ranking.map((entry) => entry.score);
    const best = Math.max(0, ...scores);
    const normal = (score: number): number => (best > 0 ? Math.max(0, score) / best : 0);
    return { normal, floor: ranking.length === 0 || complete?.[which] === true ? 0 : normal(Math.min(...scores)) };
  });
  const fused = new Map<string, { score: number; ranks: (number | undefined)[] }>();
  rankings.forEach((ranking, which) => {
    ranking.forEach((entry, rank) => {
      let found = fused.get(entry.id);
      if (found === undefined) fused.set(entry.id, (found = { score: 0, ranks: rankings.map(() => undefined) }));
      found.ranks[which] = rank;
    });
  });
  for (const entry of fused.values()) {
    rankings.forEach((ranking, which) => {
      const rank = entry.ranks[which];
      const scale = scales[which]!;
      entry.score += (weights?.[which] ?? 1) * (rank === undefined ? scale.floor : scale.normal(ranking[rank]!.score));
    });
  }
  const best = (ranks: readonly (number | undefined)[]): number => Math.min(...ranks.map((r) => r ?? Infinity));
  return [...fused.entries()]
    .map(([id, { score, ranks }]) => ({ id, score, ranks }))
    .sort((a, b) => b.score - a.score || best(a.ranks) - best(b.ranks) || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
}
