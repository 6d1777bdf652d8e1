/**
 * `sluice/serve` — WebSocket token streams, the OpenAI-compatible HTTP handler, the
 * server behind `sluice serve`, Prometheus metrics, OpenTelemetry spans and the inspector. Needs
 * the optional peers `src/core/peer-list.ts` declares for it (the README's install table).
 *
 * @module
 */
import './peers-serve.js'; // first: a missing peer fails the import here, naming it
export { createHttpHandler } from './serve/http.js';
export type { HttpHandler, HttpHandlerOptions, HttpDrainReport, ChatWorker } from './serve/http.js';
export { SluiceMetrics } from './serve/metrics.js';
export type { SluiceMetricsOptions, RequestObservation, SocketCounters } from './serve/metrics.js';
export type { Exposition } from './serve/metrics/exposition.js';
export type { BatchCounters } from './serve/metrics/pipeline-collectors.js';
export { genAiSpan, endGenAiSpan, recordStageSpans, contextFromTraceparent, traceparentOf, sluiceTracer } from './serve/otel.js';
export type { GenAiSpan, GenAiSpanOptions, GenAiOutcome, StageSpanOptions } from './serve/otel.js';
export { attachTokenSocket } from './serve/ws-server.js';
export type {
  TokenSocket,
  TokenSocketOptions,
  TokenSocketLimits,
  TokenSocketStats,
  RefusalStatus,
  RefusalCloseCode,
  SocketClient,
  TokenSocketEvent,
  TokenWorker,
  Principal,
  Authenticate,
  CloseCause,
  DrainReport,
} from './serve/ws-server.js';
export { startServer, WS_PATH } from './serve/app.js';
export { PipelineGraph } from './serve/inspect/pipeline-graph.js';
export type {
  PipelineGraphOptions,
  GraphSnapshot,
  NodeSnapshot,
  EdgeSnapshot,
  NodeState,
  WaterfallEntry,
  FailureEntry,
  DeadLetterEntry,
} from './serve/inspect/pipeline-graph.js';
export { inspector } from './serve/inspect/inspector.js';
export type { Inspector, InspectorOptions } from './serve/inspect/inspector.js';
export { RequestRegistry } from './serve/inspect/requests.js';
export type { RequestInfo, RequestView, RequestsPage, RequestHandle } from './serve/inspect/requests.js';
export type { DecodeBatchView, InspectSnapshot, InspectSources, InspectViewer, SocketsPage } from './serve/inspect/snapshot.js';
export type { FeedStats } from './serve/inspect/feed.js';
export type { TraceObserver } from './serve/telemetry.js';
export type { ServeOptions, RunningServer, ServerStats, ShutdownReport } from './serve/app.js';
export type { LocalModelSpec } from './serve/backends.js';
export type { EmbeddingModel } from './serve/openai-wire.js';
export type { RequestLog, RequestLogEntry } from './serve/request-log.js';
export type { TenantQuotas, TenantLimits, QuotaRefusal } from './serve/tenant-quotas.js';
export type { RequestMeter } from './serve/metrics.js';
export type { RequestRegistryOptions } from './serve/inspect/requests.js';
export {
  SUBPROTOCOL,
  BEARER_PROTOCOL_PREFIX,
  CLOSE_CODES,
  PROTOCOL_ERRORS,
  REQUEST_ERRORS,
} from './serve/protocol.js';
export type {
  ClientMessage,
  GenerateMessage,
  CancelMessage,
  ServerFrame,
  HelloFrame,
  HelloLimits,
  TokenFrame,
  DoneFrame,
  ErrorFrame,
  ErrorCode,
  ProtocolErrorCode,
  RequestErrorCode,
} from './serve/protocol.js';
