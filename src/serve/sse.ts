/**
 * A completion (chat or text) streamed as server-sent events at the client's pace: a token is asked of the
 * worker only once the socket took the previous one. A failure before the first token is a plain
 * error response; after it, an `error` event and `[DONE]`.
 */
import type { ServerResponse } from 'node:http';
import { subscribeWithDemand } from '../flow/demand.js';
import { AbortedError, type SluiceError } from '../core/errors.js';
import type { GenerationDone, Token } from '../ai/inference/worker.js';
import type { Observable } from 'rxjs';
import { type ApiError, openAiFinish, toApiError } from './openai-wire.js';
import { sendError } from './http-io.js';
import type { Framing } from './framing.js';

export interface StreamConfig {
  readonly id: string;
  readonly created: number;
  readonly model: string;
  /** Chat deltas or a text completion's text. */
  readonly framing: Framing;
  readonly includeUsage: boolean;
  readonly getDone: () => GenerationDone | undefined;
  readonly onPaused: (ms: number) => void;
  /** A token was written to the response. */
  readonly onToken: (token: Token) => void;
  readonly end: (error: unknown) => void;
  /** Set when the drain's deadline (or an operator's cancel) ended the completion: what the client is told. */
  readonly interrupted: () => SluiceError | ApiError | undefined;
  /** Set when an operator cancelled it (the inspector): a model that then ends quietly still ends the stream with this error. */
  readonly cancelled?: () => ApiError | undefined;
}

/**
 * Writes a token Flow as chunk events (`chat.completion.chunk` or `text_completion`), one
 * token asked at a time: the next is requested only once the socket took the last one.
 */
export function streamCompletion(res: ServerResponse, flow: Observable<Token>, stream: StreamConfig): void {
  const { framing } = stream;
  const chunk = (content: unknown, finishReason: string | null) =>
    `data: ${JSON.stringify({ id: stream.id, object: framing.chunkObject, created: stream.created, model: stream.model, choices: [framing.choice(content, finishReason)] })}\n\n`;
  // The status line waits for the first token: a failure before it (a guard block, every upstream
  // rate limited) is then an ordinary error response with its own status and Retry-After.
  let started = false;
  const start = () => {
    if (started) return;
    started = true;
    res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', 'x-accel-buffering': 'no' });
    if (framing.opening !== undefined) res.write(chunk(framing.opening, null));
  };

  let waiting: (() => void) | undefined;
  const stopWaiting = () => {
    if (waiting !== undefined) res.off('drain', waiting);
    waiting = undefined;
  };
  // `close` ends a wait for `drain` that would otherwise never come; the abort it triggers ends the flow.
  res.once('close', stopWaiting);

  const subscription = subscribeWithDemand(flow, {
    next: (token) => {
      if (res.destroyed) return;
      start();
      stream.onToken(token);
      if (res.write(chunk(framing.token(token), null))) return subscription.request(1);
      const pausedAt = performance.now();
      waiting = () => {
        waiting = undefined;
        stream.onPaused(performance.now() - pausedAt);
        subscription.request(1);
      };
      res.once('drain', waiting);
    },
    error: (err: unknown) => {
      stopWaiting();
      if (!started && !res.destroyed) sendError(res, toApiError(stream.interrupted() ?? err));
      else if (!res.destroyed && !res.writableEnded) {
        const error = toApiError(stream.interrupted() ?? err);
        res.write(`data: ${JSON.stringify({ error: { message: error.message, type: error.type, param: error.param, code: error.code } })}\n\n`);
        res.end('data: [DONE]\n\n');
      }
      stream.end(res.destroyed && err instanceof AbortedError ? undefined : err);
    },
    complete: () => {
      stopWaiting();
      const cancelled = stream.cancelled?.();
      if (cancelled !== undefined) {
        if (!started) sendError(res, cancelled);
        else if (!res.destroyed && !res.writableEnded) {
          res.write(
            `data: ${JSON.stringify({ error: { message: cancelled.message, type: cancelled.type, param: cancelled.param, code: cancelled.code } })}\n\n`,
          );
          res.end('data: [DONE]\n\n');
        }
        return stream.end(undefined);
      }
      start();
      const done = stream.getDone();
      res.write(chunk(framing.closing, openAiFinish(done)));
      if (stream.includeUsage) {
        const usage = done?.usage ?? { inputTokens: 0, outputTokens: 0 };
        const usageChunk = {
          id: stream.id,
          object: framing.chunkObject,
          created: stream.created,
          model: stream.model,
          choices: [],
          usage: { prompt_tokens: usage.inputTokens, completion_tokens: usage.outputTokens, total_tokens: usage.inputTokens + usage.outputTokens },
        };
        res.write(`data: ${JSON.stringify(usageChunk)}\n\n`);
      }
      res.end('data: [DONE]\n\n');
      stream.end(undefined);
    },
  });
  subscription.request(1);
}
