/**
 * OpenTelemetry spans for sluice requests and stages, through `@opentelemetry/api` only:
 * with no SDK registered every call here is a no-op, so users who do not trace pay
 * nothing and are never forced onto an SDK.
 *
 * A request span follows the GenAI semantic conventions (`"chat {model}"`,
 * `gen_ai.*` attributes). Stage spans are rebuilt after the fact from a sampled
 * element's `StageRecord`s: sluice measures durations, not timestamps, so each stage
 * span is laid end to end after the previous one, starting when the element entered.
 *
 * Sluice's `TraceContext` and the OTel span share one trace id: start the span first,
 * then start the element's trace from the span's traceparent (`genAiSpan(...).traceparent`
 * into `traced(value, { traceparent })`).
 */
import type { Attributes, Context, Span, Tracer, SpanKind as SpanKindType } from '@opentelemetry/api';
import { otelApi } from '../core/peers.js';
import { parseTraceparent, type TraceContext } from '../core/trace.js';
import type { GenerationDone, GenerationParams } from '../ai/inference/worker.js';
import { errorMessage } from '../core/errors.js';

const { ROOT_CONTEXT, SpanKind, SpanStatusCode, TraceFlags, context: otelContext, isSpanContextValid, trace: otelTrace } = otelApi();

const TRACER_NAME = 'sluice';

/** The tracer to use: the given one, else the global provider's (a no-op until an SDK registers one). */
export function sluiceTracer(tracer?: Tracer): Tracer {
  return tracer ?? otelTrace.getTracer(TRACER_NAME);
}

/**
 * A context whose parent span is the one a W3C `traceparent` names (remote), or
 * undefined when the header is missing or malformed. Works without any propagator
 * registered, which `propagation.extract` would need.
 */
export function contextFromTraceparent(header: string | undefined, base: Context = ROOT_CONTEXT): Context | undefined {
  if (header === undefined) return undefined;
  const parent = parseTraceparent(header);
  if (parent === undefined) return undefined;
  return otelTrace.setSpanContext(base, {
    traceId: parent.traceId,
    spanId: parent.spanId,
    traceFlags: parent.sampled ? TraceFlags.SAMPLED : TraceFlags.NONE,
    isRemote: true,
  });
}

/** The `traceparent` of a span that is recording, or undefined (a no-op tracer's span has no id of its own). */
export function traceparentOf(span: Span): string | undefined {
  const spanContext = span.spanContext();
  if (!span.isRecording() || !isSpanContextValid(spanContext)) return undefined;
  const flags = (spanContext.traceFlags & TraceFlags.SAMPLED) === TraceFlags.SAMPLED ? '01' : '00';
  return `00-${spanContext.traceId}-${spanContext.spanId}-${flags}`;
}

/** Options of `genAiSpan`: the tracer, the operation, the model and the parent context. */
export interface GenAiSpanOptions {
  readonly tracer?: Tracer;
  /** `gen_ai.operation.name`. Default `chat`. */
  readonly operation?: string;
  /** `gen_ai.request.model`. */
  readonly model: string;
  /** `gen_ai.provider.name`. Default `sluice`. */
  readonly provider?: string;
  /** Request parameters, recorded as `gen_ai.request.*`. */
  readonly params?: GenerationParams;
  /** An incoming W3C traceparent: the span continues that trace. */
  readonly traceparent?: string;
  /** The parent when there is no traceparent. Default: the active context. */
  readonly parent?: Context;
  /** Span kind. Default `SERVER` (sluice answering a request). */
  readonly kind?: SpanKindType;
  /** When the request began (epoch ms). Default now. */
  readonly startTime?: number;
}

/** A started GenAI span, its context (parent of stage spans) and the traceparent the element's trace should continue. */
export interface GenAiSpan {
  readonly span: Span;
  readonly context: Context;
  /** The recording span's traceparent, else the incoming one, else undefined. */
  readonly traceparent: string | undefined;
}

/**
 * Starts a request span named `"{operation} {model}"` with the GenAI request attributes.
 *
 * ## Example
 * ```ts
 * const { span, context, traceparent } = genAiSpan({ model: 'charlm', params: request, traceparent: req.headers.traceparent });
 * const element = traced(request, { traceparent, sampled: true });
 * // ... generate with element.trace ...
 * endGenAiSpan(span, { done });
 * recordStageSpans(element.trace, context);
 * ```
 */
export function genAiSpan(options: GenAiSpanOptions): GenAiSpan {
  const { span, parent, traceparent } = startGenAiSpan(options);
  return { span, context: otelTrace.setSpan(parent, span), traceparent };
}

/** A started GenAI span and the context it was started in: `spanContext` makes the span's own (the parent of stage spans) when needed. */
export interface StartedGenAiSpan {
  readonly span: Span;
  readonly parent: Context;
  readonly traceparent: string | undefined;
}

/**
 * {@link genAiSpan} without making the span's context, which a server keeps for the whole request
 * (a context is a Map and three closures) and needs only to lay out stage spans at the end.
 */
export function startGenAiSpan(options: GenAiSpanOptions): StartedGenAiSpan {
  const operation = options.operation ?? 'chat';
  const attributes: Attributes = {
    'gen_ai.operation.name': operation,
    'gen_ai.provider.name': options.provider ?? 'sluice',
    'gen_ai.request.model': options.model,
  };
  const params = options.params;
  if (params !== undefined) {
    if (params.temperature !== undefined) attributes['gen_ai.request.temperature'] = params.temperature;
    if (params.top_p !== undefined) attributes['gen_ai.request.top_p'] = params.top_p;
    if (params.top_k !== undefined) attributes['gen_ai.request.top_k'] = params.top_k;
    if (params.max_tokens !== undefined) attributes['gen_ai.request.max_tokens'] = params.max_tokens;
    if (params.seed !== undefined) attributes['gen_ai.request.seed'] = params.seed;
    if (params.stop !== undefined) attributes['gen_ai.request.stop_sequences'] = [...params.stop];
  }
  const parent = contextFromTraceparent(options.traceparent) ?? options.parent ?? otelContext.active();
  const span = sluiceTracer(options.tracer).startSpan(
    `${operation} ${options.model}`,
    { kind: options.kind ?? SpanKind.SERVER, attributes, ...(options.startTime !== undefined && { startTime: options.startTime }) },
    parent,
  );
  const own = traceparentOf(span);
  return { span, parent, traceparent: own ?? (parseTraceparent(options.traceparent ?? '') ? options.traceparent : undefined) };
}

/** The context whose active span is `span`, under `parent`. */
export function spanContext(parent: Context, span: Span): Context {
  return otelTrace.setSpan(parent, span);
}

/** How a GenAI request ended, for {@link endGenAiSpan}. */
export interface GenAiOutcome {
  readonly done?: GenerationDone;
  /** Set when the request failed; its `code` (or class name) becomes `error.type`. */
  readonly error?: unknown;
  readonly responseId?: string;
  readonly responseModel?: string;
  /** Trace notes to attach as `sluice.<stage>.<key>` attributes. */
  readonly trace?: TraceContext;
  /** When the request ended (epoch ms). Default now. */
  readonly endTime?: number;
}

/** A low-cardinality name for an error, as `error.type` wants: its `code`, else its class name. */
export function errorType(error: unknown): string {
  if (typeof error === 'object' && error !== null) {
    const code = (error as { code?: unknown }).code;
    if (typeof code === 'string' && code.length > 0) return code;
    if (error instanceof Error) return error.name;
  }
  return '_OTHER';
}

/** Ends a span started by {@link genAiSpan} with the response attributes, usage and `error.type` on failure. */
export function endGenAiSpan(span: Span, outcome: GenAiOutcome): void {
  const { done, error } = outcome;
  if (done !== undefined) {
    span.setAttribute('gen_ai.response.finish_reasons', [done.finishReason]);
    span.setAttribute('gen_ai.usage.input_tokens', done.usage.inputTokens);
    span.setAttribute('gen_ai.usage.output_tokens', done.usage.outputTokens);
  }
  if (outcome.responseId !== undefined) span.setAttribute('gen_ai.response.id', outcome.responseId);
  if (outcome.responseModel !== undefined) span.setAttribute('gen_ai.response.model', outcome.responseModel);
  const notes = outcome.trace?.notes;
  if (notes !== undefined) for (const key in notes) span.setAttribute(`sluice.${key}`, notes[key]!);
  if (error !== undefined) {
    span.setAttribute('error.type', errorType(error));
    span.setStatus({ code: SpanStatusCode.ERROR, message: errorMessage(error) });
  }
  span.end(outcome.endTime);
}

/** Options of `recordStageSpans`. */
export interface StageSpanOptions {
  readonly tracer?: Tracer;
  /** When the element entered its first stage (epoch ms). Default: so that the last stage ends now. */
  readonly startTime?: number;
}

/**
 * One child span per stage record of a sampled element, named `"stage {name}"`, laid
 * end to end from `startTime`: each span covers the stage's queue wait, service and
 * paused time, with a `sluice.service.start` event where the work began. Returns the
 * number of spans made (0 for an unsampled trace).
 *
 * ## Example
 * ```ts
 * answers.subscribe((answer) => recordStageSpans(answer.trace, otelTrace.setSpan(context.active(), requestSpan)));
 * ```
 */
export function recordStageSpans(trace: TraceContext, parent: Context, options: StageSpanOptions = {}): number {
  const records = trace.records;
  if (records === undefined || records.length === 0) return 0;
  const tracer = sluiceTracer(options.tracer);
  let cursor = options.startTime ?? Date.now() - records.reduce((sum, r) => sum + r.queueWait + r.service + r.paused, 0);
  for (const record of records) {
    const attributes: Attributes = {
      'sluice.stage.name': record.stage,
      'sluice.stage.queue_wait_ms': record.queueWait,
      'sluice.stage.service_ms': record.service,
      'sluice.stage.paused_ms': record.paused,
    };
    if (record.retries > 0) attributes['sluice.stage.retries'] = record.retries;
    if (record.conflated > 0) attributes['sluice.stage.conflated'] = record.conflated;
    if (record.shed !== undefined) attributes['sluice.stage.shed'] = record.shed;
    const span = tracer.startSpan(`stage ${record.stage}`, { kind: SpanKind.INTERNAL, attributes, startTime: cursor }, parent);
    span.addEvent('sluice.service.start', cursor + record.queueWait);
    if (record.shed !== undefined) span.setStatus({ code: SpanStatusCode.ERROR, message: `shed: ${record.shed}` });
    cursor += record.queueWait + record.service + record.paused;
    span.end(cursor);
  }
  return records.length;
}
