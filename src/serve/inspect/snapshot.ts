/**
 * What one message of the inspector's feed holds: the graph, the running requests and the
 * WebSocket clients, each cut to a bounded page (the busiest nodes, the oldest requests, the
 * most buffered clients) with counts of the rest, so hundreds of stages or thousands of requests
 * make a message of bounded size. Figures only: no prompt or token text is ever in it.
 *
 * Cut to its viewer too: an operator sees everything; a tenant sees the shared stages' figures
 * but only its own requests, connections and traces, and no list of single elements that belong
 * to no tenant it can be told (failures, dead letters).
 */
import type { UpstreamView } from '../../ai/inference/upstream-stats.js';
import type { SocketClient } from '../socket-stats.js';
import type { GraphSnapshot, NodeSnapshot, PipelineGraph } from './pipeline-graph.js';
import type { RequestRegistry, RequestsPage } from './requests.js';

/** Where the inspector's figures come from. */
export interface InspectSources {
  readonly graph: PipelineGraph;
  /** The running requests; without it the page has no requests list. */
  readonly requests?: RequestRegistry | undefined;
  /** The WebSocket connections now; without it the page has no clients list. */
  readonly sockets?: (() => readonly SocketClient[]) | undefined;
  /** A gateway's upstreams now (`Gateway.upstreams()`); without it the page has no upstreams list. */
  readonly upstreams?: (() => readonly UpstreamView[]) | undefined;
  /** Each decoder's batched decode steps now; without it the page has no batching list. */
  readonly batches?: (() => readonly DecodeBatchView[]) | undefined;
}

/** One model's continuous batching, as the inspector lists it: totals since start and what runs or waits now. */
export interface DecodeBatchView {
  /** The served model. */
  readonly model: string;
  /** Batched model calls so far. */
  readonly calls: number;
  /** Decode steps run in them (`steps / calls`: the mean batch). */
  readonly steps: number;
  /** The most steps one call ran. */
  readonly largest: number;
  /** Steps per call at most. */
  readonly maxBatch: number;
  /** Steps asked and waiting for a call now. */
  readonly waiting: number;
  /** Calls running now. */
  readonly running: number;
}

/** The WebSocket clients: the most buffered `shown`, and totals over all. */
export interface SocketsPage {
  readonly total: number;
  /** Bytes buffered, all connections together. */
  readonly buffered: number;
  /** Connections above the high-water mark now. */
  readonly stalled: number;
  readonly shown: readonly SocketClient[];
}

/** Who reads the inspector: an operator sees every tenant's requests; a tenant only its own. */
export type InspectViewer = { readonly role: 'operator' } | { readonly role: 'tenant'; readonly tenant: string };

export const OPERATOR: InspectViewer = { role: 'operator' };

/** The feed's scope of a viewer: readers with the same scope are sent the same message. */
export function scopeOf(viewer: InspectViewer): string {
  return viewer.role === 'operator' ? '*' : `tenant:${viewer.tenant}`;
}

/** The viewer a scope stands for (`scopeOf` undone). */
export function viewerOf(scope: string): InspectViewer {
  return scope.startsWith('tenant:') ? { role: 'tenant', tenant: scope.slice('tenant:'.length) } : OPERATOR;
}

/** Everything the inspector shows at one moment: the graph, requests, sockets and server stats. */
export interface InspectSnapshot {
  /** Counts the feed's messages: a page sees a gap when it was sent fewer (it read slowly). */
  readonly seq: number;
  /** Epoch ms. */
  readonly at: number;
  /** Whom it was cut for. */
  readonly viewer: InspectViewer;
  readonly graph: GraphSnapshot;
  readonly requests: RequestsPage | null;
  readonly sockets: SocketsPage | null;
  /** Each upstream of a gateway: its circuit, attempts in flight, failures by code. Shared by every tenant, as the stages are. */
  readonly upstreams: readonly UpstreamView[] | null;
  /** Each decoder's continuous batching. Shared by every tenant, as the stages are. */
  readonly batches: readonly DecodeBatchView[] | null;
}

export interface SnapshotLimits {
  /** Nodes sent: the busiest first (the bottleneck always), the rest counted in `omitted`. */
  readonly nodes: number;
  /** Requests and clients listed. */
  readonly rows: number;
}

/** One message for `viewer`; `graph` is the graph's snapshot of now, taken once for every viewer of a tick. */
export function buildSnapshot(
  sources: InspectSources,
  seq: number,
  limits: SnapshotLimits,
  viewer: InspectViewer = OPERATOR,
  graph: GraphSnapshot = sources.graph.snapshot(),
): InspectSnapshot {
  const tenant = viewer.role === 'tenant' ? viewer.tenant : undefined;
  const clients = sources.sockets?.();
  return {
    seq,
    at: Date.now(),
    viewer,
    graph: boundGraph(tenant === undefined ? graph : tenantGraph(graph, tenant), limits.nodes),
    requests: sources.requests === undefined ? null : sources.requests.page(limits.rows, tenant),
    sockets: clients === undefined ? null : socketsPage(tenant === undefined ? clients : clients.filter((c) => c.tenant === tenant), limits.rows),
    upstreams: sources.upstreams === undefined ? null : sources.upstreams().slice(0, limits.rows),
    batches: sources.batches === undefined ? null : sources.batches().slice(0, limits.rows),
  };
}

/** What a tenant may see of the graph: the figures, its own traces, no single elements of others. */
function tenantGraph(graph: GraphSnapshot, tenant: string): GraphSnapshot {
  return { ...graph, waterfall: graph.waterfall.filter((entry) => entry.tenant === tenant), failures: [], deadLetters: [] };
}

/** The `limit` nodes that matter most now (the bottleneck, then by work and queue), their edges, and the rest counted. */
export function boundGraph(graph: GraphSnapshot, limit: number): GraphSnapshot {
  if (graph.nodes.length <= limit) return graph;
  const weight = (n: NodeSnapshot) =>
    n.id === graph.bottleneck ? Number.POSITIVE_INFINITY : n.shares.working + n.shares.backpressured + n.buffered + n.inFlight;
  const kept = [...graph.nodes].sort((a, b) => weight(b) - weight(a)).slice(0, limit);
  const ids = new Set(kept.map((n) => n.id));
  // Keep the graph's own order (the order stages registered), so the layout does not reshuffle between messages.
  const nodes = graph.nodes.filter((n) => ids.has(n.id));
  const edges = graph.edges.filter((e) => ids.has(e.from) && ids.has(e.to));
  return { ...graph, nodes, edges, omitted: graph.omitted + (graph.nodes.length - nodes.length) };
}

function socketsPage(clients: readonly SocketClient[], limit: number): SocketsPage {
  let buffered = 0;
  let stalled = 0;
  for (const client of clients) {
    buffered += client.buffered;
    if (client.stalledMs !== null) stalled++;
  }
  const shown = [...clients].sort((a, b) => b.buffered - a.buffered || a.connection - b.connection).slice(0, limit);
  return { total: clients.length, buffered, stalled, shown };
}
