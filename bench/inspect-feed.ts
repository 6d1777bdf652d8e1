/**
 * What an open inspector page costs a served pipeline: streamed `/v1/chat/completions` through
 * a per-request pipeline of two stages (`createHttpHandler`, a `PipelineGraph` and the inspector's
 * routes wired as `sluice serve` wires them), with the feed `/inspect/events` read by nobody, by
 * one reader, and by one slow reader that never reads after its first chunk. The three run in
 * turns within one run, so the ratios compare like with like; the slow reader's bytes queued in
 * the server are reported beside them.
 *
 *     node --conditions=sluice-source --import tsx bench/inspect-feed.ts
 *
 * Environment: BENCH_FEED_REQUESTS=6000 (per round, a few seconds), BENCH_FEED_CLIENTS=16, BENCH_FEED_TOKENS=64
 * (per request), BENCH_FEED_ROUNDS=5 (per configuration), BENCH_FEED_INTERVAL=500 (ms between
 * snapshots, the page's default). Client and server share this process (and its event loop): the
 * feed's cost shows as lost throughput.
 */
import { Agent, createServer, request as httpRequest, type Server } from 'node:http';
import { connect, type AddressInfo, type Socket } from 'node:net';
import { cpus, loadavg } from 'node:os';
import { pathToFileURL } from 'node:url';
import { map } from 'rxjs';
import { asFlow } from '../src/resilience/as-flow.js';
import { fromIterable } from '../src/flow/sources.js';
import { stage } from '../operators/stage.js';
import type { Token } from '../src/ai/inference/worker.js';
import { createHttpHandler } from '../src/serve/http.js';
import { PipelineGraph } from '../src/serve/inspect/pipeline-graph.js';
import { RequestRegistry } from '../src/serve/inspect/requests.js';
import { inspectRoutes, type InspectRoutes } from '../src/serve/inspect/routes.js';
import { envInt, formatCount, median, monotonicMs, selected, textTable } from './harness.js';

export type FeedReaders = 'none' | 'one' | 'slow';

export interface InspectFeedConfig {
  readonly requests: number;
  readonly clients: number;
  readonly tokens: number;
  readonly rounds: number;
  readonly interval: number;
}

export interface InspectFeedResult {
  readonly id: string;
  readonly readers: FeedReaders;
  /** Tokens per second of each round. */
  readonly rounds: readonly number[];
  readonly tokensPerSecond: number;
  /** This process's CPU time (user + system) per token, ns, median of the rounds: steadier than wall time on a shared machine. */
  readonly cpuNsPerToken: number;
  /** Most bytes queued in the server for one feed reader, sampled through the rounds. */
  readonly maxQueued: number;
  /** The largest feed message built (what one queued message weighs). */
  readonly largestMessage: number;
}

export function inspectFeedConfig(): InspectFeedConfig {
  return {
    requests: envInt('BENCH_FEED_REQUESTS', 6_000),
    clients: envInt('BENCH_FEED_CLIENTS', 16),
    tokens: envInt('BENCH_FEED_TOKENS', 64),
    rounds: envInt('BENCH_FEED_ROUNDS', 5),
    interval: envInt('BENCH_FEED_INTERVAL', 500),
  };
}

export const FEED_SCENARIOS: readonly { readonly id: string; readonly readers: FeedReaders }[] = [
  { id: 'inspect-feed-none', readers: 'none' },
  { id: 'inspect-feed-one', readers: 'one' },
  { id: 'inspect-feed-slow', readers: 'slow' },
];

interface Served {
  readonly server: Server;
  readonly routes: InspectRoutes;
  readonly graph: PipelineGraph;
  readonly port: number;
}

async function serve(config: InspectFeedConfig): Promise<Served> {
  const text: Token[] = Array.from({ length: config.tokens }, (_, index) => ({ text: 'x', index }));
  // Built once, run per request (as sluice-rag's stages are): each is one node of the graph, with a run per request.
  const decode = stage((token: Token) => token, { name: 'decode' });
  const detokenize = stage(async (token: Token) => token, { name: 'detokenize', concurrency: 4 });
  const worker = {
    name: 'bench',
    generate: () =>
      asFlow(
        fromIterable(text).pipe(
          decode,
          detokenize,
          map((token) => token.value),
        ),
      ),
  };
  const requests = new RequestRegistry();
  const graph = new PipelineGraph().start();
  const api = createHttpHandler({ worker, requests, graph });
  const routes = inspectRoutes({ sources: { graph, requests }, page: undefined, interval: config.interval, limits: { nodes: 200, rows: 50 } });
  const server = createServer((req, res) => {
    if (!routes.handle(req, res)) api(req, res);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { server, routes, graph, port: (server.address() as AddressInfo).port };
}

/** One streamed completion, read to its end; resolves with the tokens seen. */
function complete(port: number, agent: Agent): Promise<number> {
  const body = JSON.stringify({ model: 'bench', stream: true, messages: [{ role: 'user', content: 'hi' }] });
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      {
        host: '127.0.0.1',
        port,
        path: '/v1/chat/completions',
        method: 'POST',
        agent,
        headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
      },
      (res) => {
        if (res.statusCode !== 200) {
          res.resume();
          return reject(new Error(`the completion answered ${res.statusCode}`));
        }
        let tokens = 0;
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => {
          for (let at = chunk.indexOf('"content"'); at >= 0; at = chunk.indexOf('"content"', at + 1)) tokens++;
        });
        res.on('end', () => resolve(tokens));
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

/** A feed reader: `one` reads all it is sent, `slow` stops reading after its first chunk. Returns its closer. */
function openReader(port: number, readers: FeedReaders): () => void {
  if (readers === 'none') return () => {};
  const socket: Socket = connect(port, '127.0.0.1');
  socket.on('error', () => {});
  socket.write(`GET /inspect/events HTTP/1.1\r\nhost: 127.0.0.1:${port}\r\n\r\n`);
  socket.on('data', () => {
    if (readers === 'slow') socket.pause();
  });
  return () => socket.destroy();
}

async function round(
  served: Served,
  config: InspectFeedConfig,
  readers: FeedReaders,
): Promise<{ tokensPerSecond: number; cpuNsPerToken: number; maxQueued: number }> {
  const agent = new Agent({ keepAlive: true, maxSockets: config.clients });
  const close = openReader(served.port, readers);
  let maxQueued = 0;
  const watch = setInterval(() => (maxQueued = Math.max(maxQueued, served.routes.feedStats().maxQueued)), 50);
  let left = config.requests;
  let tokens = 0;
  const started = monotonicMs();
  const cpu = process.cpuUsage();
  await Promise.all(
    Array.from({ length: config.clients }, async () => {
      while (left-- > 0) {
        // Read before adding: `tokens += await ...` would read `tokens` before the await, and lose the other clients' counts.
        const seen = await complete(served.port, agent);
        tokens += seen;
      }
    }),
  );
  const seconds = (monotonicMs() - started) / 1000;
  const used = process.cpuUsage(cpu);
  clearInterval(watch);
  close();
  agent.destroy();
  if (tokens !== config.requests * (config.tokens + 1)) throw new Error(`expected ${config.requests * (config.tokens + 1)} content deltas, got ${tokens}`);
  const made = config.requests * config.tokens;
  return { tokensPerSecond: made / seconds, cpuNsPerToken: ((used.user + used.system) * 1000) / made, maxQueued };
}

export async function measureInspectFeed(config: InspectFeedConfig, onProgress: (message: string) => void = () => {}): Promise<InspectFeedResult[]> {
  const scenarios = FEED_SCENARIOS.filter((s) => selected(s.id));
  const served = await serve(config);
  try {
    // A warm-up round, not reported: the JIT and the sockets settle.
    await round(served, { ...config, requests: Math.min(config.requests, 300) }, 'none');
    const perScenario = new Map(scenarios.map((s) => [s.id, { tokens: [] as number[], cpu: [] as number[], maxQueued: 0 }]));
    for (let r = 0; r < config.rounds; r++) {
      // Each round runs the scenarios in a rotated order, so a drift of the machine's load does not favour one.
      for (let i = 0; i < scenarios.length; i++) {
        const scenario = scenarios[(i + r) % scenarios.length]!;
        const result = await round(served, config, scenario.readers);
        const entry = perScenario.get(scenario.id)!;
        entry.tokens.push(result.tokensPerSecond);
        entry.cpu.push(result.cpuNsPerToken);
        entry.maxQueued = Math.max(entry.maxQueued, result.maxQueued);
        onProgress(
          `${scenario.id} round ${r + 1}: ${formatCount(Math.round(result.tokensPerSecond))} tokens/s, ${Math.round(result.cpuNsPerToken)} ns cpu/token`,
        );
      }
    }
    return scenarios.map((s) => {
      const entry = perScenario.get(s.id)!;
      return {
        id: s.id,
        readers: s.readers,
        rounds: entry.tokens,
        tokensPerSecond: median(entry.tokens),
        cpuNsPerToken: median(entry.cpu),
        maxQueued: entry.maxQueued,
        largestMessage: served.routes.feedStats().largestMessage,
      };
    });
  } finally {
    served.routes.close();
    served.graph.stop();
    served.server.closeAllConnections();
    await new Promise<void>((resolve) => served.server.close(() => resolve()));
  }
}

export function inspectFeedReport(results: readonly InspectFeedResult[]): { header: string[]; rows: string[][] } {
  const none = results.find((r) => r.readers === 'none');
  const header = [
    'feed readers',
    'tokens/s (median)',
    'rounds',
    'over none',
    'cpu ns/token',
    'over none',
    'max bytes queued for a reader',
    'largest message, bytes',
  ];
  const rows = results.map((r) => [
    r.readers === 'none' ? 'none' : r.readers === 'one' ? 'one, reading' : 'one, never reading after its first chunk',
    formatCount(Math.round(r.tokensPerSecond)),
    r.rounds.map((t) => formatCount(Math.round(t))).join(' / '),
    none === undefined ? '' : `${(r.tokensPerSecond / none.tokensPerSecond).toFixed(3)}×`,
    String(Math.round(r.cpuNsPerToken)),
    none === undefined ? '' : `${(r.cpuNsPerToken / none.cpuNsPerToken).toFixed(3)}×`,
    r.readers === 'none' ? '' : formatCount(r.maxQueued),
    r.readers === 'none' ? '' : formatCount(r.largestMessage),
  ]);
  return { header, rows };
}

async function main(): Promise<void> {
  const config = inspectFeedConfig();
  console.log(`# inspector feed cost — ${new Date().toISOString()}, ${cpus()[0]?.model ?? 'cpu'} × ${cpus().length}, Node ${process.version}`);
  console.log(`config: ${JSON.stringify(config)}; load average at start ${loadavg()[0]!.toFixed(2)}`);
  const results = await measureInspectFeed(config, (message) => process.stderr.write(`  · ${message}\n`));
  const report = inspectFeedReport(results);
  console.log(textTable(report.header, report.rows));
  console.log(`load average at end ${loadavg()[0]!.toFixed(2)}`);
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) await main();
