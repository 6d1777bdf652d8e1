/** The shapes a token draw takes and gives, apart so the draw's fast paths and penalties can share them. */

/** The parameters that shape the distribution (a subset of `GenerationParams`). */
export interface SamplingParams {
  readonly temperature?: number;
  readonly top_k?: number;
  readonly top_p?: number;
  readonly repetition_penalty?: number;
  readonly presence_penalty?: number;
  readonly frequency_penalty?: number;
}

/** A chosen token and the natural log of its probability under the (penalised) model distribution at temperature 1. */
export interface SampledToken {
  readonly id: number;
  readonly logprob: number;
}

/** @internal Whether top-k and top-p keep every token: the draw then needs no order of the tokens. */
export function untruncated(params: SamplingParams, n: number): boolean {
  const topK = params.top_k ?? 0;
  return (topK === 0 || topK >= n) && (params.top_p ?? 1) >= 1;
}
