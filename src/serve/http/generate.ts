/**
 * A completion answered over HTTP, streamed as server-sent events or whole.
 *
 * Streaming honours the client's pace end to end: a token is asked of the worker only
 * after the previous one was accepted by the socket (`res.write` returned true, or
 * `drain` fired), so a slow reader pauses decoding instead of filling memory. A client
 * that disconnects aborts the generation: the worker's `AbortSignal` fires and no
 * further step runs.
 */
import { performance } from 'node:perf_hooks';
import { AbortedError, SluiceError } from '../../core/errors.js';
import type { StageStats } from '../../flow/stats.js';
import type { GenerateRequest, GenerationDone } from '../../ai/inference/worker.js';
import { ApiError, type ChatWorker, mergeDelta, openAiFinish, tierClass, toApiError } from '../openai-wire.js';
import { headerValue, sendError, sendJson } from '../http-io.js';
import { streamCompletion } from '../sse.js';
import type { Framing } from '../framing.js';
import { type TokenLimit, limitTokens } from '../token-limit.js';
import type { RequestTrace } from '../telemetry.js';
import type { RequestContext } from './context.js';
import type { HttpEdge } from './edge.js';

/** What a framed answer needs of its body. */
export interface AnswerShape {
  readonly model: string;
  readonly stream?: boolean | null | undefined;
  readonly stream_options?: { readonly include_usage?: boolean | undefined } | null | undefined;
  /** OpenAI's tier: `priority` goes first at the server's door, `flex` is shed first. */
  readonly service_tier?: string | null | undefined;
}

/** A completion to answer: the body it was asked with, the worker that generates it, and how its answer is framed. */
export interface Generation {
  readonly body: AnswerShape;
  readonly worker: ChatWorker;
  readonly request: GenerateRequest;
  readonly framing: Framing;
}

/** How a generation was stopped before its end, if it was: read by the answer and the telemetry. */
class Stops {
  readonly controller = new AbortController();
  /** The drain's deadline ended it. */
  interrupted: SluiceError | undefined;
  /** An operator cancelled it from the inspector. */
  cancelled: ApiError | undefined;

  /** A stop the client must hear about, else undefined. */
  told(): SluiceError | ApiError | undefined {
    return this.interrupted ?? this.cancelled;
  }
}

/** Answers `job` for `ctx`: resolves when the answer ended, however it ended. */
export function generate(edge: HttpEdge, ctx: RequestContext, job: Generation): Promise<void> {
  const { config } = edge;
  const { res } = ctx;
  const requestTrace = edge.telemetry.begin({
    model: job.body.model,
    request: job.request,
    traceparent: headerValue(ctx.req.headers.traceparent),
    startTime: Date.now() - (performance.now() - ctx.arrivedAt),
    transport: 'http',
    tenant: ctx.tenant,
    logId: ctx.id,
  });
  const stops = new Stops();
  const interrupt = () => {
    stops.interrupted = new SluiceError('SHUTDOWN', 'The server shut down before this completion finished; retry on another instance.');
    stops.controller.abort(stops.interrupted);
  };
  edge.interrupts.add(interrupt);
  // An operator's cancel (the inspector): the model stops as for a client that left, and the client is told so.
  requestTrace.cancelWith(() => {
    // 409 alone is retried by the OpenAI SDKs (a lock timeout to them): the header says this one is final.
    stops.cancelled ??= new ApiError(409, 'The request was cancelled by an operator.', 'invalid_request_error', 'request_cancelled', null, {
      'x-should-retry': 'false',
    });
    stops.controller.abort(new AbortedError(config.stage, 'cancelled by an operator'));
  });
  const onClose = () => {
    // `close` after `finish` is the normal end; before it, the client left.
    if (!res.writableFinished) stops.controller.abort(new AbortedError(config.stage, 'the client disconnected'));
  };
  res.on('close', onClose);
  res.setHeader('traceparent', requestTrace.traceparent);

  let done: GenerationDone | undefined;
  let paused = 0;
  const startedAt = performance.now();
  const finish = (error: unknown): void => {
    edge.interrupts.delete(interrupt);
    res.off('close', onClose);
    // A pipeline (sluice-rag, a guarded model) counted the request in its own stages, a blocked one in its guard only: once per element.
    if (job.worker.stages === undefined && requestTrace.trace.record(config.stage) === undefined) {
      const { signal } = stops.controller;
      countEdgeStage(config.stageStats, error, signal.aborted && stops.interrupted === undefined);
      requestTrace.trace.addRecord({
        stage: config.stage,
        queueWait: startedAt - ctx.arrivedAt,
        service: Math.max(0, performance.now() - startedAt - paused),
        paused,
        retries: 0,
        conflated: 0,
      });
    }
    const aborted = stops.controller.signal;
    requestTrace.end({ responseId: ctx.id, done, error: error ?? (aborted.aborted ? aborted.reason : undefined), status: res.statusCode });
  };

  return new Promise<void>((resolve) => {
    const end = (error: unknown) => {
      finish(error);
      resolve();
    };
    let limit: TokenLimit;
    try {
      const generated = job.worker.generate(job.request, {
        signal: stops.controller.signal,
        trace: requestTrace.trace,
        stage: config.stage,
        onDone: (d) => (done = d),
        ...(ctx.tenant !== undefined && { tenant: ctx.tenant }),
        ...(tierClass(job.body.service_tier) !== undefined && { priority: tierClass(job.body.service_tier) }),
      });
      limit = limitTokens(generated, job.request.max_tokens ?? config.maxTokens);
    } catch (err) {
      sendError(res, toApiError(err));
      return end(err);
    }
    const reported = () => (done = limit.done(done));
    if (job.body.stream === true) {
      streamCompletion(res, limit.tokens, {
        id: ctx.id,
        created: Math.floor(Date.now() / 1000),
        model: job.body.model,
        framing: job.framing,
        includeUsage: job.body.stream_options?.include_usage === true,
        getDone: reported,
        onPaused: (ms) => (paused += ms),
        onToken: (token) => requestTrace.token(token.text),
        end,
        interrupted: () => stops.told(),
        cancelled: () => stops.cancelled,
      });
    } else {
      answerWhole(ctx, job, limit, requestTrace, stops, {
        reported: () => {
          reported();
          return done;
        },
        end,
      });
    }
  });
}

/** The answer as one JSON body, once the last token came. */
function answerWhole(
  ctx: RequestContext,
  job: Generation,
  limit: TokenLimit,
  requestTrace: RequestTrace,
  stops: Stops,
  on: { readonly reported: () => GenerationDone | undefined; readonly end: (error: unknown) => void },
): void {
  const { res } = ctx;
  const created = Math.floor(Date.now() / 1000);
  let text = '';
  const extra: Record<string, unknown> = {};
  limit.tokens.subscribe({
    next: (token) => {
      requestTrace.token(token.text);
      text += token.text;
      if (token.delta !== undefined) mergeDelta(extra, token.delta);
    },
    error: (err: unknown) => {
      const { interrupted, cancelled, controller } = stops;
      if (interrupted !== undefined) sendError(res, toApiError(interrupted));
      else if (cancelled !== undefined) sendError(res, cancelled);
      else if (!controller.signal.aborted) sendError(res, toApiError(err));
      on.end(controller.signal.aborted && interrupted === undefined ? undefined : (interrupted ?? err));
    },
    complete: () => {
      if (stops.cancelled !== undefined) {
        sendError(res, stops.cancelled);
        return on.end(undefined);
      }
      const done = on.reported();
      const usage = done?.usage ?? { inputTokens: 0, outputTokens: 0 };
      sendJson(res, 200, {
        id: ctx.id,
        object: job.framing.wholeObject,
        created,
        model: job.body.model,
        choices: [job.framing.whole(text, extra, openAiFinish(done))],
        usage: { prompt_tokens: usage.inputTokens, completion_tokens: usage.outputTokens, total_tokens: usage.inputTokens + usage.outputTokens },
      });
      on.end(undefined);
    },
  });
}

/** A request the handler observed as its stage: entered, then delivered, given back (the client left) or failed. */
function countEdgeStage(stats: StageStats | undefined, error: unknown, cancelled: boolean): void {
  if (stats === undefined) return;
  stats.receivedCount++;
  if (cancelled) stats.shed.cancelled++;
  else if (error !== undefined) stats.failed++;
  else {
    stats.deliveredCount++;
    stats.emittedCount++;
  }
}
