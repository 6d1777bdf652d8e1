/**
 * The live graph an inspector shows: every operator with a run going (or ended a moment ago),
 * learned from the introspection hook — a node per operator (its shared `StageStats`), an edge
 * from each operator to the one it feeds — and, sampled on a timer, what each is doing: its
 * queue against its capacity, work in flight, demand from downstream, throughput, and how its
 * time splits between working, starved (waiting for upstream), backpressured (waiting for
 * downstream) and idle. Service times come from the trace records of sampled elements, into
 * an HDR histogram per node. Bounded: a node count limit, fixed windows, fixed sparklines.
 */
import { asyncScheduler, type SchedulerLike, type Subscription } from 'rxjs';
import { lazySchema } from '../../core/zod.js';
import { parseOptions, positiveInt, schedulerSchema } from '../../flow/options.js';
import type { DemandLink } from '../../flow/protocol.js';
import {
  attachIntrospector,
  type DeadLetterRecord,
  type InspectedRun,
  type Introspector,
  type RunCounters,
  type RunDescription,
} from '../../flow/introspection.js';
import type { StageStats } from '../../flow/stats.js';
import type { ShedReason } from '../../flow/options.js';
import type { StageRecord, TraceContext } from '../../core/trace.js';
import { Ring } from '../../flow/ring.js';
import { hdrHistogram } from '../../core/peers.js';

/** What a node was doing at one sample. */
export type NodeState = 'working' | 'starved' | 'backpressured' | 'idle';

/** One stage in a graph snapshot: its queue, demand, latency, sheds and state. */
export interface NodeSnapshot extends RunDescription {
  readonly id: string;
  /** Runs going now (a per-request pipeline has one per request). */
  readonly runs: number;
  readonly buffered: number;
  readonly inFlight: number;
  /** Elements its consumers would take now; null when one does not speak demand (unbounded). */
  readonly demand: number | null;
  readonly received: number;
  readonly delivered: number;
  /** Outputs sent downstream: `delivered`, unless an element leaves as many (a generation's tokens, a stream's items). */
  readonly emitted: number;
  readonly shed: Readonly<Record<ShedReason, number>>;
  readonly failed: number;
  /** received − (delivered + shed + failed + buffered + in flight): 0 when every element is accounted for. */
  readonly unaccounted: number;
  /** Outputs emitted per second, over the last sample: a streaming stage's rate while its elements stream. */
  readonly throughput: number;
  /** Throughput at each of the last samples, oldest first. */
  readonly sparkline: readonly number[];
  /** Share of the window's samples in each state (they add up to 1; all 0 before the first sample). */
  readonly shares: Readonly<Record<NodeState, number>>;
  /** Service time of sampled elements, ms. */
  readonly serviceMs: { readonly count: number; readonly p50: number; readonly p99: number };
  /** When its last run ended (ms, the scheduler's clock); undefined while one runs. */
  readonly endedAt: number | undefined;
}

/** A link in a graph snapshot: which stage feeds which. */
export interface EdgeSnapshot {
  readonly from: string;
  readonly to: string;
}

/** One element's passage through the stages, for the waterfall view. */
export interface WaterfallEntry {
  readonly traceId: string;
  /** The tenant whose request it was, when a server said (a tenant's inspector sees only its own). */
  readonly tenant?: string;
  readonly records: readonly StageRecord[];
}

/** An element that failed in a stage: which, when, and the error's code — never the element or its message (it may quote a prompt). */
export interface FailureEntry {
  /** The scheduler's clock, ms. */
  readonly at: number;
  readonly node: string;
  readonly stage: string;
  readonly seq: number;
  /** A sluice error's code (`STAGE_TIMEOUT`, `GUARD_BLOCKED`...; `WORK_FAILED` wraps what the work threw), else the error's name. */
  readonly code: string;
  /** For `WORK_FAILED`: the name of what the work threw (`TypeError`...). */
  readonly cause?: string;
}

/** A message a NATS link receiver gave up on: where and why — never its body nor its reason's text (either may quote a prompt). */
export interface DeadLetterEntry extends DeadLetterRecord {
  /** The scheduler's clock, ms. */
  readonly at: number;
  readonly node: string;
  /** The link's name. */
  readonly link: string;
}

/** A `PipelineGraph` at one moment. */
export interface GraphSnapshot {
  /** The scheduler's clock, ms. */
  readonly at: number;
  readonly nodes: readonly NodeSnapshot[];
  readonly edges: readonly EdgeSnapshot[];
  /** The node that limits the pipeline's throughput now: busy most of the window. */
  readonly bottleneck: string | undefined;
  /** Recent sampled elements, newest last: per stage, queue wait against service. */
  readonly waterfall: readonly WaterfallEntry[];
  /** Nodes left out by the `maxNodes` bound. */
  readonly omitted: number;
  /** The latest failed elements, newest last. */
  readonly failures: readonly FailureEntry[];
  /** The latest dead letters of the NATS links seen, newest last. */
  readonly deadLetters: readonly DeadLetterEntry[];
}

/** Options of `PipelineGraph`: its sampling interval and window, and its bounds on nodes, failures and dead letters. */
export interface PipelineGraphOptions {
  /** Sample interval, ms. Default 250. */
  readonly interval?: number;
  /** Samples the state shares are taken over. Default 40 (10 s at the default interval). */
  readonly window?: number;
  /** Throughput samples kept per node for its sparkline. Default 60. */
  readonly sparkline?: number;
  /** How long a node whose runs all ended stays in the graph, ms. Default 30 000. */
  readonly retain?: number;
  /** Most nodes kept; the longest-ended go first, then the newest are refused. Default 500. */
  readonly maxNodes?: number;
  /** Sampled elements kept for the waterfall. Default 20. */
  readonly waterfall?: number;
  /** Failed elements kept. Default 20. */
  readonly failures?: number;
  /** Dead letters kept. Default 20. */
  readonly deadLetters?: number;
  /** Timers of the sampler. Default `asyncScheduler`. */
  readonly scheduler?: SchedulerLike;
}

interface Histogram {
  recordValue(value: number): void;
  getValueAtPercentile(percentile: number): number;
  readonly totalCount: number;
  reset(): void;
}

const optionsSchema = lazySchema((z) =>
  z.strictObject({
    interval: positiveInt('interval').optional(),
    window: positiveInt('window').optional(),
    sparkline: positiveInt('sparkline').optional(),
    retain: z.number({ error: 'retain must be a number of ms' }).min(0, { error: 'retain must be ≥ 0' }).optional(),
    maxNodes: positiveInt('maxNodes').optional(),
    waterfall: positiveInt('waterfall').optional(),
    failures: positiveInt('failures').optional(),
    deadLetters: positiveInt('deadLetters').optional(),
    scheduler: schedulerSchema().optional(),
  }),
);

/** Unresolved consumer links kept per node (a plain subscriber's never resolve): bounded. */
const MAX_PENDING = 64;

class Node {
  readonly runs = new Set<InspectedRun>();
  readonly states: Ring<NodeState>;
  readonly rates: Ring<number>;
  /** The nodes its runs feed. */
  readonly feeds = new Set<Node>();
  /** The operator's own counts (`InspectedRun.counters`), from its latest run: they outlive the runs. */
  counters: (() => RunCounters) | undefined;
  /** Consumer links not known yet when its run started (a consumer that registers after): resolved when sampled. */
  readonly pending = new Set<DemandLink>();
  endedAt: number | undefined;
  lastEmitted: number;
  lastAt: number;
  times: Histogram | undefined;
  constructor(
    readonly id: string,
    readonly stats: StageStats,
    readonly description: RunDescription,
    window: number,
    sparkline: number,
    now: number,
  ) {
    this.states = new Ring(window);
    this.rates = new Ring(sparkline);
    this.lastEmitted = 0;
    this.lastAt = now;
  }
}

/** Keeps the last `size` values: pushing onto a full ring drops the oldest. */
function push<T>(ring: Ring<T>, value: T, size: number): void {
  if (ring.length >= size) ring.shift();
  ring.push(value);
}

/** The live graph of a pipeline's stages and links, with the state of each: what the inspector shows. */
export class PipelineGraph implements Introspector {
  private readonly nodes = new Map<StageStats, Node>();
  /** Whose link each is: how a run finds the node it feeds. */
  private readonly owners = new WeakMap<DemandLink, Node>();
  private readonly traces: WaterfallEntry[] = [];
  private readonly failures: FailureEntry[] = [];
  private readonly deadLetters: DeadLetterEntry[] = [];
  private readonly config: Required<Omit<PipelineGraphOptions, 'scheduler'>>;
  private readonly scheduler: SchedulerLike;
  private timer: Subscription | undefined;
  private detach: (() => void) | undefined;
  private ids = 0;
  private omitted = 0;

  constructor(options: PipelineGraphOptions = {}) {
    parseOptions(optionsSchema(), options, 'PipelineGraph options');
    this.config = {
      interval: options.interval ?? 250,
      window: options.window ?? 40,
      sparkline: options.sparkline ?? 60,
      retain: options.retain ?? 30_000,
      maxNodes: options.maxNodes ?? 500,
      waterfall: options.waterfall ?? 20,
      failures: options.failures ?? 20,
      deadLetters: options.deadLetters ?? 20,
    };
    this.scheduler = options.scheduler ?? asyncScheduler;
    // Loaded here, so a missing or broken histogram library fails the construction, never a request.
    hdrHistogram();
  }

  /** Sees every run started from now on, and samples on the interval. */
  start(): this {
    if (this.detach !== undefined) return this;
    this.detach = attachIntrospector(this);
    this.timer = this.scheduler.schedule(
      function tick(this: { schedule(state?: unknown, delay?: number): unknown }, graph?: PipelineGraph) {
        graph!.sample();
        this.schedule(graph, graph!.config.interval);
      },
      this.config.interval,
      this,
    );
    return this;
  }

  /** Stops sampling and seeing runs; forgets nothing already seen. No timer or hook is left behind. */
  stop(): void {
    this.detach?.();
    this.detach = undefined;
    this.timer?.unsubscribe();
    this.timer = undefined;
  }

  /** True while the graph is attached and sampling. */
  get running(): boolean {
    return this.detach !== undefined;
  }

  /** Called by the flow while this graph is attached (its introspection hook), not by users. */
  runStarted(run: InspectedRun, own: DemandLink | undefined, feeds: DemandLink | undefined, within?: InspectedRun): void {
    let node = this.nodes.get(run.stats);
    if (node === undefined) {
      if (this.nodes.size >= this.config.maxNodes && !this.evict()) {
        this.omitted++;
        return;
      }
      node = new Node(`n${++this.ids}`, run.stats, run.describe(), this.config.window, this.config.sparkline, this.scheduler.now());
      this.nodes.set(run.stats, node);
    }
    node.runs.add(run);
    node.endedAt = undefined;
    if (run.counters !== undefined) node.counters = () => run.counters!();
    if (own !== undefined) this.owners.set(own, node);
    // A consumer known by its link first; else the run whose work subscribed this one (it streams into that stage).
    const consumer = feeds === undefined ? undefined : this.owners.get(feeds);
    const host = consumer === undefined && within !== undefined ? this.nodes.get(within.stats) : undefined;
    if (host !== undefined) {
      if (host !== node) node.feeds.add(host);
    } else if (feeds !== undefined) this.link(node, feeds);
  }

  /** Called by the flow while this graph is attached (its introspection hook), not by users. */
  runEnded(run: InspectedRun): void {
    const node = this.nodes.get(run.stats);
    if (node === undefined || !node.runs.delete(run)) return;
    if (node.runs.size === 0) node.endedAt = this.scheduler.now();
  }

  /** Called by the flow while this graph is attached (its introspection hook), not by users. */
  elementFailed(run: InspectedRun, seq: number, error: unknown): void {
    const node = this.nodes.get(run.stats);
    if (node === undefined) return;
    const code = errorCode(error);
    const cause = code === 'WORK_FAILED' ? nameOf((error as { cause?: unknown }).cause) : undefined;
    this.failures.push({ at: this.scheduler.now(), node: node.id, stage: node.description.name, seq, code, ...(cause !== undefined && { cause }) });
    if (this.failures.length > this.config.failures) this.failures.shift();
  }

  /** Called by the flow while this graph is attached (its introspection hook), not by users. */
  deadLettered(run: InspectedRun, letter: DeadLetterRecord): void {
    const node = this.nodes.get(run.stats);
    if (node === undefined) return;
    const { subject, seq, code, deliveries } = letter;
    this.deadLetters.push({ at: this.scheduler.now(), node: node.id, link: node.description.name, subject, seq, code, deliveries });
    if (this.deadLetters.length > this.config.deadLetters) this.deadLetters.shift();
  }

  /**
   * Takes a finished element's trace: its records feed each stage's service-time histogram, and
   * the element joins the waterfall. Unsampled traces have no records and cost nothing.
   */
  observeTrace(trace: TraceContext, tenant?: string): void {
    const records = trace.records;
    if (records === undefined || records.length === 0) return;
    for (const record of records) {
      if (record.shed !== undefined) continue;
      for (const node of this.nodes.values()) {
        if (node.description.name !== record.stage) continue;
        node.times ??= newHistogram();
        // Microseconds, at least 1: the histogram's lowest value.
        node.times.recordValue(Math.max(1, Math.round(record.service * 1000)));
      }
    }
    this.traces.push({ traceId: trace.traceId, ...(tenant !== undefined && { tenant }), records: records.map((r) => ({ ...r })) });
    if (this.traces.length > this.config.waterfall) this.traces.shift();
  }

  /** One sample of every node (the timer calls it; a test may too). */
  sample(): void {
    const now = this.scheduler.now();
    for (const [stats, node] of this.nodes) {
      if (node.endedAt !== undefined && now - node.endedAt > this.config.retain) {
        this.nodes.delete(stats);
        continue;
      }
      const counts = countersOf(node);
      // Outputs, not finished inputs: a stage streaming one long generation delivers nothing until it ends.
      const emitted = counts.emitted ?? counts.delivered;
      const seconds = (now - node.lastAt) / 1000;
      push(node.rates, seconds > 0 ? (emitted - node.lastEmitted) / seconds : 0, this.config.sparkline);
      node.lastEmitted = emitted;
      node.lastAt = now;
      if (node.runs.size > 0) push(node.states, stateOf(counts.buffered, counts.inFlight, demandOf(node), slotsOf(node)), this.config.window);
    }
    for (const node of this.nodes.values()) {
      for (const consumer of node.feeds) if (!this.nodes.has(consumer.stats)) node.feeds.delete(consumer);
      // A copy: `link` puts back what is still unknown, which a live iteration would visit again, forever.
      const pending = [...node.pending];
      node.pending.clear();
      for (const link of pending) this.link(node, link);
    }
  }

  /** The graph as it is now: nodes, edges, the bottleneck and recent failures. */
  snapshot(): GraphSnapshot {
    const nodes = [...this.nodes.values()].map((node) => this.nodeSnapshot(node));
    const edges: EdgeSnapshot[] = [];
    for (const node of this.nodes.values())
      for (const consumer of node.feeds) if (this.nodes.has(consumer.stats)) edges.push({ from: node.id, to: consumer.id });
    // A NATS link joins its publishers to its receivers through the server, not through a link object.
    for (const publisher of this.nodes.values()) {
      if (publisher.description.kind !== 'nats-publish') continue;
      for (const receiver of this.nodes.values())
        if (receiver.description.kind === 'nats-receive' && receiver.description.name === publisher.description.name)
          edges.push({ from: publisher.id, to: receiver.id });
    }
    return {
      at: this.scheduler.now(),
      nodes,
      edges,
      bottleneck: bottleneckOf(nodes),
      waterfall: [...this.traces],
      omitted: this.omitted,
      failures: [...this.failures],
      deadLetters: [...this.deadLetters],
    };
  }

  private nodeSnapshot(node: Node): NodeSnapshot {
    const { received, delivered, emitted, failed, buffered, inFlight, shed: shedBy } = countersOf(node);
    const shed = { 'buffer-full': 0, evicted: 0, lagging: 0, cancelled: 0, ...shedBy };
    const shedTotal = Object.values(shed).reduce((a, b) => a + b, 0);
    const demand = demandOf(node);
    const counts: Record<NodeState, number> = { working: 0, starved: 0, backpressured: 0, idle: 0 };
    for (const state of valuesOf(node.states)) counts[state]++;
    const samples = node.states.length;
    const share = (state: NodeState) => (samples === 0 ? 0 : counts[state] / samples);
    const rates = valuesOf(node.rates);
    const times = node.times;
    return {
      id: node.id,
      ...node.description,
      runs: runsOf(node),
      buffered,
      inFlight,
      demand: Number.isFinite(demand) ? demand : null,
      received,
      delivered,
      emitted: emitted ?? delivered,
      shed,
      failed,
      unaccounted: received - (delivered + shedTotal + failed + buffered + inFlight),
      throughput: rates.at(-1) ?? 0,
      sparkline: rates,
      shares: { working: share('working'), starved: share('starved'), backpressured: share('backpressured'), idle: share('idle') },
      serviceMs:
        times === undefined || times.totalCount === 0
          ? { count: 0, p50: 0, p99: 0 }
          : { count: times.totalCount, p50: times.getValueAtPercentile(50) / 1000, p99: times.getValueAtPercentile(99) / 1000 },
      endedAt: node.endedAt,
    };
  }

  /** Records that `node` feeds the owner of `link`; an owner not known yet is looked up again at the next sample (while the run lives). */
  private link(node: Node, link: DemandLink): void {
    const consumer = this.owners.get(link);
    if (consumer !== undefined) {
      if (consumer !== node) node.feeds.add(consumer);
    } else if (node.runs.size > 0 && node.pending.size < MAX_PENDING) node.pending.add(link);
  }

  /** Makes room for a new node by dropping the one that ended longest ago; false when every node is running. */
  private evict(): boolean {
    let oldest: Node | undefined;
    for (const node of this.nodes.values()) if (node.endedAt !== undefined && (oldest === undefined || node.endedAt < oldest.endedAt!)) oldest = node;
    if (oldest === undefined) return false;
    this.nodes.delete(oldest.stats);
    return true;
  }
}

function errorCode(error: unknown): string {
  const { code, status } = (error ?? {}) as { code?: unknown; status?: unknown };
  // A model server's HTTP failure reads as its status (HTTP_500), as the upstreams table counts it.
  if (code === 'HTTP_STATUS' && typeof status === 'number') return `HTTP_${status}`;
  return typeof code === 'string' ? code : (nameOf(error) ?? 'Error');
}

function nameOf(error: unknown): string | undefined {
  return error instanceof Error ? error.name : undefined;
}

function valuesOf<T>(ring: Ring<T>): T[] {
  return Array.from({ length: ring.length }, (_, i) => ring.at(i) as T);
}

function newHistogram(): Histogram {
  // Packed buckets: a few KB per node; values from 1 µs to an hour, 2 significant digits.
  return hdrHistogram().build({ lowestDiscernibleValue: 1, highestTrackableValue: 3_600_000_000, numberOfSignificantValueDigits: 2, bitBucketSize: 'packed' });
}

/** The node's counts: its operator's own (`counters`), else its shared `StageStats`. */
function countersOf(node: Node): RunCounters {
  if (node.counters !== undefined) return node.counters();
  const stats = node.stats;
  return {
    received: stats.received,
    delivered: stats.delivered,
    emitted: stats.emitted,
    shed: stats.shed,
    failed: stats.failed,
    buffered: stats.buffered,
    inFlight: stats.inFlight,
  };
}

/** Runs of the node's operator, not counting parts of them (a fan-out's lanes). */
function runsOf(node: Node): number {
  let runs = 0;
  for (const run of node.runs) if (run.part !== true) runs++;
  return runs;
}

/** Elements its runs work on at once, summed (a run that does not say counts as 1). */
function slotsOf(node: Node): number {
  const each = node.description.concurrency;
  return (Number.isFinite(each) && each > 0 ? each : 1) * node.runs.size;
}

/** What the consumers of a node's runs would take now, summed (Infinity if one is unbounded). */
function demandOf(node: Node): number {
  let total = 0;
  for (const run of node.runs) total += run.demandNow();
  return total;
}

/**
 * Working: every slot is busy (`slots` elements in flight) or elements wait for one, and results
 * may be handed on. Backpressured: it holds elements (in flight or buffered) and its consumers take
 * none. Starved: a slot is free, nothing waits and its consumers want more — it waits for upstream
 * (a stage running 3 of 16 streams is not what limits the pipeline). Idle: it holds nothing and
 * nobody asks.
 */
export function stateOf(buffered: number, inFlight: number, demand: number, slots = 1): NodeState {
  if (demand === 0) return buffered > 0 || inFlight > 0 ? 'backpressured' : 'idle';
  // Buffered with demand and nothing in flight: at concurrency 0 of its own, it waits to start work — count it as working.
  return buffered > 0 || inFlight >= Math.max(1, slots) ? 'working' : 'starved';
}

/** The node busy the largest share of the window, if it was busy most of it. */
export function bottleneckOf(nodes: readonly NodeSnapshot[]): string | undefined {
  let best: NodeSnapshot | undefined;
  for (const node of nodes) {
    if (node.runs === 0 || node.shares.working < 0.5) continue;
    const fill = node.capacity > 0 ? node.buffered / (node.capacity * node.runs) : 0;
    const bestFill = best === undefined || best.capacity === 0 ? 0 : best.buffered / (best.capacity * best.runs);
    if (best === undefined || node.shares.working > best.shares.working || (node.shares.working === best.shares.working && fill > bestFill)) best = node;
  }
  return best?.id;
}
