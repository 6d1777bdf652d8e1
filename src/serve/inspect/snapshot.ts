/**
 * What one message of the inspector's feed holds: the graph, the running requests and the
 * WebSocket clients, each cut to a bounded page (the busiest nodes, the oldest requests, the
 * most buffered clients) with counts of the rest, so hundreds of stages or thousands of requests
 * make a message of bounded size. Figures only: no prompt or token text is ever in it.
 */
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

export interface InspectSnapshot {
  /** Counts the feed's messages: a page sees a gap when it was sent fewer (it read slowly). */
  readonly seq: number;
  /** Epoch ms. */
  readonly at: number;
  readonly graph: GraphSnapshot;
  readonly requests: RequestsPage | null;
  readonly sockets: SocketsPage | null;
}

export interface SnapshotLimits {
  /** Nodes sent: the busiest first (the bottleneck always), the rest counted in `omitted`. */
  readonly nodes: number;
  /** Requests and clients listed. */
  readonly rows: number;
}

export function buildSnapshot(sources: InspectSources, seq: number, limits: SnapshotLimits): InspectSnapshot {
  return {
    seq,
    at: Date.now(),
    graph: boundGraph(sources.graph.snapshot(), limits.nodes),
    requests: sources.requests === undefined ? null : sources.requests.page(limits.rows),
    sockets: sources.sockets === undefined ? null : socketsPage(sources.sockets(), limits.rows),
  };
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
