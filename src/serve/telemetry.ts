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
import type { Context, Span, Tracer } from '@opentelemetry/api';
import { parseTraceparent, sampler, traced, type TraceContext } from '../core/trace.js';
import { questionOf, type GenerateRequest, type GenerationDone } from '../ai/inference/worker.js';
import type { RequestMeter, SluiceMetrics } from './metrics.js';
import { type RequestLog, errorField, outcomeOf, round } from './request-log.js';
import { endGenAiSpan, errorType, recordStageSpans, spanContext, startGenAiSpan, traceparentOf, type StartedGenAiSpan } from './otel.js';
import type { RequestHandle, RequestRegistry } from './inspect/requests.js';

/** What takes every finished request's trace besides the metrics: a `PipelineGraph`'s service times and waterfall. */
export interface TraceObserver {
  /** `tenant`: whose request it was, so a tenant's inspector shows only its own. */
  observeTrace(trace: TraceContext, tenant?: string): void;
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

/** The telemetry fields of a transport's options: HTTP and WebSocket take the same ones. */
export function telemetryOptionsOf(options: RequestTelemetryOptions): RequestTelemetryOptions {
  const { tracer, metrics, sampleRate, requestLog, requests, graph } = options;
  return { tracer, metrics, sampleRate, requestLog, requests, graph };
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
    const otel = startGenAiSpan({
      ...(tracer && { tracer }),
      model: start.model,
      params: start.request,
      ...(incoming !== undefined && { traceparent: incoming }),
      ...(startTime !== undefined && { startTime }),
    });
    const seq = this.seq++;
    const sampled = this.sample(seq) || (incoming !== undefined && parseTraceparent(incoming)?.sampled === true);
    const trace = traced(start.request, { seq, sampled, ...(otel.traceparent !== undefined && { traceparent: otel.traceparent }) }).trace;
    const requests = this.options.requests;
    const listed = requests?.add({
      transport: start.transport ?? 'http',
      model: start.model,
      tenant: start.tenant,
      ref: start.logId,
      ...(requests.content && { prompt: questionOf(start.request) }),
    });
    return new RequestTrace(this.options, start, otel, trace, startTime, this.options.metrics?.requestStarted(start.model, trace), listed);
  }
}

/**
 * One request's span and trace, from `begin()` to `end()`. It keeps what it needs of the start
 * and the span as fields of its own: it lives as long as the request, the objects it was given need not.
 */
export class RequestTrace {
  private readonly model: string;
  private readonly transport: 'http' | 'ws';
  private readonly tenant: string | undefined;
  private readonly logId: string | undefined;
  private readonly span: Span;
  /** The context the span was started in: the span's own is made at the end, and only for stage spans. */
  private readonly parent: Context;
  /** A recording span's traceparent, taken at the start: an ended span names no parent any more. */
  private readonly spanTraceparent: string | undefined;
  private readonly startedAt = performance.now();
  /** Microseconds from the start to the first token: a small integer, where a clock reading kept in the field is a heap number of its own. */
  private firstTokenMicros: number | undefined;

  constructor(
    private readonly options: RequestTelemetryOptions,
    start: RequestStart,
    otel: StartedGenAiSpan,
    /** The element trace the worker records into. */
    readonly trace: TraceContext,
    /** When the request arrived (epoch ms) if the transport knew it before now; else taken as `startedAt` when stage spans need it. */
    private readonly startTime: number | undefined,
    private readonly meter: RequestMeter | undefined,
    private readonly listed?: RequestHandle | undefined,
  ) {
    this.model = start.model;
    this.transport = start.transport ?? 'http';
    this.tenant = start.tenant;
    this.logId = start.logId;
    this.span = otel.span;
    this.parent = otel.parent;
    this.spanTraceparent = traceparentOf(otel.span);
  }

  /** The traceparent to give the client. The trace's is made when first read: its strings need not live as long as the request. */
  get traceparent(): string {
    return this.spanTraceparent ?? this.trace.traceparent;
  }

  /** A token went to the client (time to first token, inter-token latency, running and waiting); its text, for an inspector that shows content. */
  token(text?: string): void {
    this.firstTokenMicros ??= Math.round((performance.now() - this.startedAt) * 1000);
    this.meter?.token();
    this.listed?.token(text);
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
      transport: this.transport,
      id: this.logId ?? responseId,
      ...(this.tenant !== undefined && { tenant: this.tenant }),
      model: this.model,
      outcome: outcomeOf(error),
      ...(status !== undefined && { status }),
      ...(done !== undefined && { finishReason: done.finishReason, inputTokens: done.usage.inputTokens, outputTokens: done.usage.outputTokens }),
      ...(this.firstTokenMicros !== undefined && { ttftMs: round(this.firstTokenMicros / 1000) }),
      durationMs: round(performance.now() - this.startedAt),
      ...(error !== undefined && { error: errorField(error) }),
    });
    const { tracer, metrics } = this.options;
    const trace = this.trace;
    // A span that does not record ignores what it is told (a no-op tracer's, an unsampled one's): nothing to build for it.
    if (this.span.isRecording())
      endGenAiSpan(this.span, { ...(done && { done }), ...(error !== undefined && { error }), responseId, responseModel: this.model, trace });
    // The span's context only for a sampled trace with stage records: it is a Map and three closures.
    if (trace.records !== undefined && trace.records.length > 0) {
      const startTime = this.startTime ?? Date.now() - (performance.now() - this.startedAt);
      recordStageSpans(trace, spanContext(this.parent, this.span), tracer === undefined ? { startTime } : { tracer, startTime });
    }
    this.options.graph?.observeTrace(trace, this.tenant);
    if (metrics === undefined) return;
    metrics.observeTrace(trace);
    if (done !== undefined)
      metrics.observeGeneration(this.model, done, (performance.now() - this.startedAt) / 1000, error === undefined ? undefined : errorType(error), trace);
  }
}
