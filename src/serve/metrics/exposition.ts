/**
 * The exposition formats: which one a scraper asked for, rendering the registry in it, and the
 * exemplars that only OpenMetrics carries.
 */
import type { Histogram, LabelValues, Registry, RegistryContentType } from 'prom-client';
import { promClient } from '../../core/peers.js';
import type { TraceContext } from '../../core/trace.js';

const prom = promClient();

/** A `/metrics` response: the exposition text and its content type. */
export interface Exposition {
  /** The `Content-Type` to answer with. */
  readonly contentType: string;
  /** The exposition text. */
  readonly body: string;
}

/**
 * Whether an `Accept` header prefers OpenMetrics to the classic text format: listed with a
 * weight above 0 and no lower than `text/plain`'s (Prometheus asks for OpenMetrics first).
 */
export function prefersOpenMetrics(accept: string | undefined): boolean {
  if (accept === undefined) return false;
  let openMetrics = -1;
  let text = -1;
  for (const range of accept.split(',')) {
    const [type = '', ...params] = range.split(';').map((part) => part.trim().toLowerCase());
    const q = params.find((p) => p.startsWith('q='));
    const weight = q === undefined ? 1 : Number(q.slice(2));
    if (!Number.isFinite(weight)) continue;
    if (type === 'application/openmetrics-text') openMetrics = Math.max(openMetrics, weight);
    else if (type === 'text/plain') text = Math.max(text, weight);
  }
  return openMetrics > 0 && openMetrics >= text;
}

/** Renders `registry` once in the format asked for, leaving it in the classic text format. */
export async function render(registry: Registry<RegistryContentType>, openMetrics: boolean): Promise<Exposition> {
  // prom-client renames counters for OpenMetrics (drops `_total` from the family name) and keeps the rename: put the names back after.
  const names = registry.getMetricsAsArray().map((metric) => [metric, metric.name] as const);
  registry.setContentType(openMetrics ? prom.Registry.OPENMETRICS_CONTENT_TYPE : prom.Registry.PROMETHEUS_CONTENT_TYPE);
  try {
    return { contentType: registry.contentType, body: await registry.metrics() };
  } finally {
    for (const [metric, name] of names) metric.name = name;
    registry.setContentType(prom.Registry.PROMETHEUS_CONTENT_TYPE);
  }
}

/**
 * An observation of a histogram made with exemplars: a sampled trace (one a tracing backend
 * keeps) becomes the exemplar of the bucket, as `trace_id`.
 */
export function observe<T extends string>(histogram: Histogram<T>, labels: LabelValues<T>, value: number, trace: TraceContext | undefined): void {
  histogram.observe(trace?.sampled === true ? { labels, value, exemplarLabels: { trace_id: trace.traceId } as LabelValues<T> } : { labels, value });
}
