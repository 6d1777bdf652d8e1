/**
 * The server's promise on `max_tokens`: a client gets at most that many tokens from any worker,
 * one that ignores the parameter included. The worker's Flow is cut after the limit (which
 * cancels the generation) and the generation reads as finished for `length`, with that many
 * output tokens, as if the worker had stopped there itself.
 */
import { takeWhile, type Observable } from 'rxjs';
import type { GenerationDone, Token } from '../ai/inference/worker.js';

export interface TokenLimit {
  /** The worker's tokens, at most `max` (demand passes through). */
  readonly tokens: Observable<Token>;
  /** What to report of the generation: the worker's report, or `length` if the limit cut it. */
  done(reported: GenerationDone | undefined): GenerationDone | undefined;
}

export function limitTokens(flow: Observable<Token>, max: number): TokenLimit {
  let count = 0;
  // Cut at the token after the limit, not at the limit: a worker that stops there itself ends as
  // it does (with its own report), and one that does not has made one token too many, unsent.
  const cut = () => count > max;
  return {
    tokens: flow.pipe(takeWhile(() => ++count <= max)),
    done: (reported) => {
      if (!cut()) return reported;
      return {
        finishReason: 'length',
        usage: { inputTokens: reported?.usage.inputTokens ?? 0, outputTokens: max },
        timeToFirstToken: reported?.timeToFirstToken,
        tokensPerSecond: reported?.tokensPerSecond,
      };
    },
  };
}
