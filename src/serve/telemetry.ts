/**
 * Request telemetry, one module for both transports (the HTTP handler and the WebSocket
 * server): a request's GenAI span and element trace when it starts, its metrics and stage
 * spans when it ends.
 *
 * A server keeps one `RequestTelemetry`: it numbers requests from 0 in arrival order and
 * samples them by that number (a sampled incoming traceparent is always sampled). Each
 * `begin()` gives a `RequestTrace`: the trace the worker records into, the traceparent to
 * hand back to the client, and `end()`.
 */
import type { Tracer } from '@opentelemetry/api';
import { parseTraceparent, sampler, traced, type TraceContext } from '../core/trace.js';
import type { GenerateRequest, GenerationDone } from '../ai/inference/worker.js';
import type { RequestMeter, SluiceMetrics } from './metrics.js';
import { type RequestLog, errorField, outcomeOf, round } from './request-log.js';
import { endGenAiSpan, errorType, genAiSpan, recordStageSpans, traceparentOf, type GenAiSpan } from './otel.js';
import type { RequestHandle, RequestRegistry } from './inspect/requests.js';

/** What takes every finished request's trace besides the metrics: a `PipelineGraph`'s service times and waterfall. */
export interface TraceObserver {
  observeTrace(trace: TraceContext): void;
}

export interface RequestTelemetryOptions {
  /** Default: the global provider's tracer (a no-op unless an SDK is registered). */
  readonly tracer?: Tracer | undefined;
  readonly metrics?: SluiceMetrics | undefined;
  /** Share of requests whose per-stage timing is recorded. */
  readonly sampleRate: number;
  /** Gets one entry per request when it ends. */
  readonly requestLog?: RequestLog | undefined;
  /** Lists each request while it runs (the inspector's in-flight list and its cancel). */
  readonly requests?: RequestRegistry | undefined;
  /** Gets each finished request's trace (an inspector's graph). */
  readonly graph?: TraceObserver | undefined;
}

/** What a request is when it starts. */
export interface RequestStart {
  /** The model as the client named it: the span's and the metrics' model. */
  readonly model: string;
  readonly request: GenerateRequest;
  /** The client's W3C traceparent: the span and the trace continue it. */
  readonly traceparent?: string | undefined;
  /** When the request arrived (epoch ms), if before now. */
  readonly startTime?: number | undefined;
  /** For the request log. Default `http`. */
  readonly transport?: 'http' | 'ws';
  readonly tenant?: string | undefined;
  /** The request's id in the log when not the response id (WebSocket: `<connection>:<id>`). */
  readonly logId?: string | undefined;
}

/** How a request ended. */
export interface RequestEnd {
  readonly responseId: string;
  readonly done?: GenerationDone | undefined;
  /** Set when it failed or was aborted; becomes `error.type`. */
  readonly error?: unknown;
  /** The HTTP status sent, for the request log. */
  readonly status?: number | undefined;
}

/** A server's request numbering and sampling, and where its spans and metrics go. */
export class RequestTelemetry {
  private seq = 0;
  private readonly sample: (seq: number) => boolean;

  constructor(private readonly options: RequestTelemetryOptions) {
    this.sample = sampler(options.sampleRate);
  }

  /** Starts a request's span and its element trace (which continues the span). */
  begin(start: RequestStart): RequestTrace {
    const { tracer } = this.options;
    const { traceparent: incoming, startTime } = start;
    const otel = genAiSpan({
      ...(tracer && { tracer }),
      model: start.model,
      params: start.request,
      ...(incoming !== undefined && { traceparent: incoming }),
      ...(startTime !== undefined && { startTime }),
    });
    const seq = this.seq++;
    const sampled = this.sample(seq) || (incoming !== undefined && parseTraceparent(incoming)?.sampled === true);
    const trace = traced(start.request, { seq, sampled, ...(otel.traceparent !== undefined && { traceparent: otel.traceparent }) }).trace;
    const listed = this.options.requests?.add({ transport: start.transport ?? 'http', model: start.model, tenant: start.tenant, ref: start.logId });
    return new RequestTrace(this.options, start, otel, trace, startTime ?? Date.now(), this.options.metrics?.requestStarted(start.model), listed);
  }
}

/** One request's span and trace, from `begin()` to `end()`. */
export class RequestTrace {
  /** The traceparent to give the client, taken at the start: an ended span names no parent any more. */
  readonly traceparent: string;
  private readonly startedAt = performance.now();

  constructor(
    private readonly options: RequestTelemetryOptions,
    private readonly start: RequestStart,
    private readonly otel: GenAiSpan,
    /** The element trace the worker records into. */
    readonly trace: TraceContext,
    private readonly startEpoch: number,
    private readonly meter: RequestMeter | undefined,
    private readonly listed?: RequestHandle | undefined,
  ) {
    this.traceparent = traceparentOf(otel.span) ?? trace.traceparent;
  }

  private firstTokenAt: number | undefined;

  private get model(): string {
    return this.start.model;
  }

  /** A token went to the client (time to first token, inter-token latency, running and waiting). */
  token(): void {
    this.firstTokenAt ??= performance.now();
    this.meter?.token();
    this.listed?.token();
  }

  /** How an operator's cancel from the inspector ends this request: as its client's cancel would. */
  cancelWith(cancel: () => void): void {
    this.listed?.cancelWith(cancel);
  }

  /** Ends the span, lays out the stage spans, and feeds the trace and the generation report to the metrics. */
  end({ responseId, done, error, status }: RequestEnd): void {
    this.listed?.end();
    this.meter?.end(done);
    this.options.requestLog?.({
      transport: this.start.transport ?? 'http',
      id: this.start.logId ?? responseId,
      ...(this.start.tenant !== undefined && { tenant: this.start.tenant }),
      model: this.model,
      outcome: outcomeOf(error),
      ...(status !== undefined && { status }),
      ...(done !== undefined && { finishReason: done.finishReason, inputTokens: done.usage.inputTokens, outputTokens: done.usage.outputTokens }),
      ...(this.firstTokenAt !== undefined && { ttftMs: round(this.firstTokenAt - this.startedAt) }),
      durationMs: round(performance.now() - this.startedAt),
      ...(error !== undefined && { error: errorField(error) }),
    });
    const { tracer, metrics } = this.options;
    const trace = this.trace;
    endGenAiSpan(this.otel.span, { ...(done && { done }), ...(error !== undefined && { error }), responseId, responseModel: this.model, trace });
    recordStageSpans(trace, this.otel.context, { ...(tracer && { tracer }), startTime: this.startEpoch });
    this.options.graph?.observeTrace(trace);
    if (metrics === undefined) return;
    metrics.observeTrace(trace);
    if (done !== undefined)
      metrics.observeGeneration(this.model, done, (performance.now() - this.startedAt) / 1000, error === undefined ? undefined : errorType(error));
  }
}
