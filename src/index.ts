/**
 * `sluice` — the flow core: the demand protocol, sources and sinks, `stage` and the flow
 * operators (batching, fan-out, admission), resilience wrappers and caches. Its runtime
 * imports are rxjs and zod: importing it loads no native library and no server.
 * Models, inference and RAG are in `sluice/ai`; serving in `sluice/serve`.
 *
 * @module
 */
export { Flow, subscribeWithDemand, isFlow } from './flow/demand.js';
export type { DemandSubscription, Outlet, Producer } from './flow/demand.js';
export { KillSwitch } from './flow/kill-switch.js';
export type { KillEvent } from './flow/kill-switch.js';
export { StageStats } from './flow/stats.js';
export { POLICIES } from './flow/options.js';
export type { Policy, ShedReason, Outcome } from './flow/options.js';
export * from './core/errors.js';
export { Traced, TraceContext, traced, parseTraceparent } from './core/trace.js';
export type { StageRecord } from './core/trace.js';
export { stage } from '../operators/stage.js';
export type { StageContext, StageOperator, StageOptions, Work, WorkResult, ShedEvent, FailureEvent } from '../operators/stage.js';
export { fromIterable, fromAsyncIterable, fromReadable } from './flow/sources.js';
export { toWritable, toAsyncIterable, untraced, WritableClosedError, AlreadyIteratedError } from './flow/sinks.js';
export type { ToWritableOptions, ToAsyncIterableOptions, FlowIterator } from './flow/sinks.js';
export { fromPush } from './flow/push.js';
export { handoff } from './flow/handoff.js';
export type { HandoffHandle } from './flow/handoff.js';
export { asFlow } from './resilience/as-flow.js';
export type { PushOptions, PushPolicy } from './flow/push.js';
export { Batch, batch, unbatch } from '../operators/batch.js';
export type { BatchOptions, BatchOperator, UnbatchOptions, UnbatchOperator } from '../operators/batch.js';
export { partition, stableHash, laneOf } from '../operators/partition.js';
export type { PartitionOptions } from '../operators/partition.js';
export { balance } from '../operators/balance.js';
export type { BalanceOptions } from '../operators/balance.js';
export { broadcast } from '../operators/broadcast.js';
export type { BroadcastOptions, BroadcastBranchesOptions, BroadcastCountOptions } from '../operators/broadcast.js';
export { mergeFlows } from '../operators/merge.js';
export type { FanOutOperator, LaneFactory, LaneShedEvent } from '../operators/lanes.js';
export type { LaneOptions } from '../operators/fan-out-options.js';
export { CacheStats } from './cache/stats.js';
export type { CacheMetric } from './cache/stats.js';
export { cacheKey } from './cache/key.js';
export type { CacheRequest, ChatMessage } from './cache/key.js';
export { estimateSize } from './cache/size.js';
export { LruCache } from './cache/lru.js';
export type { LruCacheOptions } from './cache/lru.js';
export { SemanticCache, normalize, cosineSimilarity } from './cache/semantic.js';
export type { SemanticCacheOptions, SemanticLookup, Embedder } from './cache/semantic.js';
export { SingleFlight } from './cache/flight.js';
export type { FlightOutcome, FlightWork } from './cache/flight.js';
export { cached } from './cache/cached.js';
export type { CachedOptions, CachedAnswer, CacheOutcome, ResponseCacheOptions, SemanticOptions } from './cache/cached.js';
export { withTimeouts } from './resilience/timeouts.js';
export type { TimeoutOptions } from './resilience/timeouts.js';
export { retrying } from './resilience/retry.js';
export type { RetryOptions } from './resilience/retry.js';
export { withCircuitBreaker } from './resilience/breaker.js';
export { CircuitBreaker } from './resilience/breaker.js';
export type { CircuitBreakerOptions, CircuitState, CircuitStateChange, CircuitPermit, CircuitCounts } from './resilience/breaker.js';
export { fallback } from './resilience/fallback.js';
export type { FallbackOptions } from './resilience/fallback.js';
export { admission } from '../operators/admission.js';
export type { AdmissionOptions, AdmissionOperator, RejectEvent } from '../operators/admission.js';
export { route } from './resilience/route.js';
export type { RouteOptions, RouteVariant, RunReport, ShadowReport } from './resilience/route.js';
export { StreamTimeoutError, CircuitOpenError, FallbackExhaustedError } from './resilience/errors.js';
export type { StreamTimeoutKind } from './resilience/errors.js';
export { seededRandom } from './resilience/random.js';
export type { StreamWork, Worker as StreamWorker, NamedWorker } from './resilience/relay.js';
