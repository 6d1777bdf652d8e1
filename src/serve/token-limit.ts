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

/**
 * The limit as a count, for a consumer that sees every token itself (the WebSocket stream): no
 * operator between the worker's Flow and its subscriber, whose objects every request would carry.
 */
export class TokenCap {
  private count = 0;

  constructor(private readonly max: number) {}

  /** Counts a token; true when it is past the limit (it is not sent, and the generation is cut). */
  over(): boolean {
    return ++this.count > this.max;
  }

  done(reported: GenerationDone | undefined): GenerationDone | undefined {
    // Cut at the token after the limit, not at the limit: a worker that stops there itself ends as
    // it does (with its own report), and one that does not has made one token too many, unsent.
    if (this.count <= this.max) return reported;
    return {
      finishReason: 'length',
      usage: { inputTokens: reported?.usage.inputTokens ?? 0, outputTokens: this.max },
      timeToFirstToken: reported?.timeToFirstToken,
      tokensPerSecond: reported?.tokensPerSecond,
    };
  }
}

export function limitTokens(flow: Observable<Token>, max: number): TokenLimit {
  const cap = new TokenCap(max);
  return {
    tokens: flow.pipe(takeWhile(() => !cap.over())),
    done: (reported) => cap.done(reported),
  };
}
