/**
 * SSE load: the same clients, tokens and rounds as `ws-load.ts`, over server-sent events, against
 * the serving peer users would pick and sluice's own SSE endpoint, each in its own process
 * (`ws-load-server.ts`, kinds `ai-sdk` and `sluice-sse`):
 *
 * - `ai-sdk`: the Vercel AI SDK 6 — `streamText` over `MockLanguageModelV3` fed by
 *   `simulateReadableStream` (no delays), served with `pipeUIMessageStreamToResponse`;
 * - `sluice-sse`: `createHttpHandler`'s `POST /v1/chat/completions` with `stream: true`, over
 *   the same synthetic `TokenWorker` as the WebSocket rows.
 *
 * Both make a token (stamped with the monotonic clock, counted by the server) only when asked:
 * what differs is who asks. The key figure with non-readers is how many tokens the server
 * made for clients that never read them.
 *
 *     node --conditions=sluice-source --import tsx bench/sse-load.ts
 *
 * Sizes come from the same `BENCH_WS_*` variables as `ws-load.ts`; `BENCH_ONLY` picks scenarios
 * (`sse-sluice-all-read`, `sse-ai-sdk-stalled`...).
 */
import { Agent, request as httpRequest, type ClientRequest, type IncomingMessage } from 'node:http';
import { cpus, loadavg } from 'node:os';
import { pathToFileURL } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { formatCount, formatMB, formatRatio, markdownTable, median, monotonicMs, percentile, selected, textTable } from './harness.js';
import { ServerUnresponsive, serverReport, split, startServer, stopServer, wsLoadConfig, type WatchdogState, type WsLoadConfig } from './ws-load.js';
import type { ServerReport } from './ws-load-server.js';

export type SseServer = 'sluice-sse' | 'ai-sdk';

export interface SseScenario {
  readonly id: string;
  readonly server: SseServer;
  readonly stalled: boolean;
}

export function sseScenarios(): SseScenario[] {
  return [
    { id: 'sse-sluice-all-read', server: 'sluice-sse', stalled: false },
    { id: 'sse-ai-sdk-all-read', server: 'ai-sdk', stalled: false },
    { id: 'sse-sluice-stalled', server: 'sluice-sse', stalled: true },
    { id: 'sse-ai-sdk-stalled', server: 'ai-sdk', stalled: true },
  ];
}

export interface SseLoadResult {
  readonly id: string;
  readonly server: SseServer;
  readonly readers: number;
  readonly nonReaders: number;
  readonly expectedTokens: number;
  readonly receivedTokens: number;
  readonly seconds: number;
  readonly tokensPerSecond: number;
  readonly p50: number;
  readonly roundP99: readonly number[];
  readonly p99Median: number;
  readonly errors: number;
  readonly partial: boolean;
  readonly report: ServerReport;
  /** Tokens the server made for the non-readers: while they were served alone (until stuck, or all made), and while the readers ran. */
  readonly fill: { readonly seconds: number; readonly tokens: number; readonly stuck: number } | undefined;
  readonly nonReaderTokensWhileReading: number;
  readonly loadAverage: number;
  /** Set when the server stopped answering (its event loop held): what its watchdog thread saw when the report timed out. */
  readonly held?: WatchdogState;
}

type Progress = (message: string) => void;

/** A request's body and the text of one SSE event's JSON, per server. */
const WIRE: Record<SseServer, { path: string; body: (maxTokens: number) => string; text: (event: string) => string | undefined }> = {
  'sluice-sse': {
    path: '/v1/chat/completions',
    body: (maxTokens) => JSON.stringify({ model: 'synthetic', messages: [{ role: 'user', content: 'load' }], stream: true, max_tokens: maxTokens }),
    text: (event) => (JSON.parse(event) as { choices?: { delta?: { content?: string } }[] }).choices?.[0]?.delta?.content || undefined,
  },
  'ai-sdk': {
    path: '/api/chat',
    body: (maxTokens) => JSON.stringify({ max_tokens: maxTokens }),
    text: (event) => {
      const part = JSON.parse(event) as { type: string; delta?: string };
      return part.type === 'text-delta' ? part.delta : undefined;
    },
  },
};

/** One streamed request: `onText` per token, `onEnd` once (with an error if it failed). */
function stream(
  agent: Agent,
  port: number,
  server: SseServer,
  maxTokens: number,
  onText: (text: string, res: IncomingMessage) => void,
  onEnd: (failed: boolean) => void,
): ClientRequest {
  const wire = WIRE[server];
  const body = wire.body(maxTokens);
  let ended = false;
  const end = (failed: boolean) => {
    if (ended) return;
    ended = true;
    onEnd(failed);
  };
  const req = httpRequest(
    {
      agent,
      host: '127.0.0.1',
      port,
      method: 'POST',
      path: wire.path,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
    },
    (res) => {
      if (res.statusCode !== 200) {
        res.resume();
        return end(true);
      }
      res.setEncoding('utf8');
      let pending = '';
      res.on('data', (chunk: string) => {
        pending += chunk;
        let cut = pending.indexOf('\n\n');
        while (cut >= 0) {
          const event = pending.slice(0, cut);
          pending = pending.slice(cut + 2);
          cut = pending.indexOf('\n\n');
          if (!event.startsWith('data: ')) continue;
          const data = event.slice(6);
          if (data === '[DONE]') continue;
          const text = wire.text(data);
          if (text !== undefined) onText(text, res);
        }
      });
      res.on('end', () => end(false));
      res.on('error', () => end(true));
    },
  );
  req.on('error', () => end(true));
  req.end(body);
  return req;
}

interface Phase {
  readonly received: number;
  readonly errors: number;
  readonly seconds: number;
  readonly partial: boolean;
}

/** Every client runs `plan` requests one after the other; token latencies go to `latencies`. */
async function readPhase(
  agent: Agent,
  port: number,
  server: SseServer,
  clients: number,
  plan: readonly number[],
  deadline: number,
  latencies?: Float64Array,
): Promise<Phase> {
  let received = 0;
  let errors = 0;
  let finished = 0;
  const started = monotonicMs();
  let allDone!: () => void;
  const done = new Promise<'done'>((resolve) => (allDone = () => resolve('done')));
  const run = (r: number) => {
    stream(
      agent,
      port,
      server,
      plan[r]!,
      (text) => {
        if (latencies !== undefined && received < latencies.length) latencies[received] = monotonicMs() - Number(text);
        received++;
      },
      (failed) => {
        if (failed) errors++;
        if (r + 1 < plan.length) run(r + 1);
        else if (++finished === clients) allDone();
      },
    );
  };
  for (let c = 0; c < clients; c++) run(0);
  const outcome = clients === 0 ? 'done' : await Promise.race([done, sleep(deadline, 'deadline' as const)]);
  return { received, errors, seconds: (monotonicMs() - started) / 1000, partial: outcome !== 'done' };
}

export async function measureSseScenario(scenario: SseScenario, config: WsLoadConfig, onProgress: Progress = () => {}): Promise<SseLoadResult> {
  const nonReaders = scenario.stalled ? Math.round((config.clients * config.stalledPercent) / 100) : 0;
  const readers = config.clients - nonReaders;
  const perClient = Math.floor(config.tokens / config.clients);
  const { child, port } = await startServer(scenario.server, config);
  // One keep-alive connection per client at most: the clients' requests are sequential.
  const agent = new Agent({ keepAlive: true, maxSockets: Number.POSITIVE_INFINITY });
  const stuck: ClientRequest[] = [];
  let before: ServerReport | undefined;
  let fillStarted = 0;
  try {
    const warm = await readPhase(agent, port, scenario.server, config.clients, [32, 32], config.deadline);
    onProgress(`${scenario.id}: ${config.clients} clients, ${formatCount(warm.received)} warm-up tokens in ${warm.seconds.toFixed(1)} s`);

    before = await serverReport(child);
    let fill: SseLoadResult['fill'];
    if (nonReaders > 0) {
      // Each reads nothing after the first event: the response is paused, so its socket stops being read.
      for (let i = 0; i < nonReaders; i++) {
        stuck.push(
          stream(
            agent,
            port,
            scenario.server,
            config.stalledTokens,
            (_, res) => res.pause(),
            () => {},
          ),
        );
      }
      const started = (fillStarted = monotonicMs());
      const requested = before.tokensGenerated + nonReaders * config.stalledTokens;
      let now = before;
      while (now.stuck < nonReaders && now.tokensGenerated < requested && monotonicMs() - started < config.fillTimeout) {
        await sleep(250);
        now = await serverReport(child);
      }
      fill = { seconds: (monotonicMs() - started) / 1000, tokens: now.tokensGenerated - before.tokensGenerated, stuck: now.stuck };
      onProgress(
        `${scenario.id}: non-readers served alone ${fill.seconds.toFixed(1)} s: ${formatCount(fill.tokens)} tokens made for them (${formatCount(Math.round(fill.tokens / nonReaders))} each), ${fill.stuck} / ${nonReaders} stuck, ${formatMB(now.buffered)} queued`,
      );
    }

    const loadAverage = loadavg()[0]!;
    const atStart = await serverReport(child, true);
    const latencies = new Float64Array(readers * perClient);
    const roundP99: number[] = [];
    let received = 0;
    let seconds = 0;
    let errors = warm.errors;
    let partial = warm.partial;
    for (const roundTokens of split(perClient, config.rounds)) {
      const own = latencies.subarray(received, received + roundTokens * readers);
      const phase = await readPhase(agent, port, scenario.server, readers, split(roundTokens, config.requests), config.deadline, own);
      roundP99.push(percentile(own.subarray(0, Math.min(phase.received, own.length)).sort(), 99));
      received += phase.received;
      seconds += phase.seconds;
      errors += phase.errors;
      if (phase.partial) {
        partial = true;
        break;
      }
    }
    const report = await serverReport(child);
    const sorted = latencies.subarray(0, Math.min(received, latencies.length)).sort();
    return {
      id: scenario.id,
      server: scenario.server,
      readers,
      nonReaders,
      expectedTokens: readers * perClient,
      receivedTokens: received,
      seconds,
      tokensPerSecond: received / seconds,
      p50: percentile(sorted, 50),
      roundP99,
      p99Median: median(roundP99),
      errors,
      partial,
      report,
      fill,
      nonReaderTokensWhileReading: Math.max(0, report.tokensGenerated - atStart.tokensGenerated - received),
      loadAverage,
    };
  } catch (err) {
    // A server that stops answering is a result (the AI SDK's, generating for non-readers in microtasks), not a crash of the bench.
    if (!(err instanceof ServerUnresponsive) || err.state === undefined) throw err;
    onProgress(`${scenario.id}: ${err.message}`);
    return heldResult(scenario, readers, nonReaders, readers * perClient, err.state, before, fillStarted);
  } finally {
    for (const req of stuck) req.destroy();
    agent.destroy();
    await stopServer(child);
  }
}

/** The result of a scenario whose server stopped answering: only what its watchdog thread could see. */
function heldResult(
  scenario: SseScenario,
  readers: number,
  nonReaders: number,
  expectedTokens: number,
  held: WatchdogState,
  before: ServerReport | undefined,
  fillStarted: number,
): SseLoadResult {
  const report: ServerReport = {
    baselineRss: before?.baselineRss ?? Number.NaN,
    peakRss: held.peakRss,
    rss: held.rss,
    peakHeapUsed: before?.peakHeapUsed ?? Number.NaN,
    peakBuffered: Number.NaN,
    buffered: Number.NaN,
    stuck: 0,
    tokensGenerated: held.tokensGenerated,
    cpuSeconds: Number.NaN,
    loopDelayP99: Number.NaN,
    loopDelayMax: held.heldMs,
    closes: {},
  };
  const fill =
    nonReaders > 0 && before !== undefined && fillStarted > 0
      ? { seconds: (monotonicMs() - fillStarted) / 1000, tokens: held.tokensGenerated - before.tokensGenerated, stuck: 0 }
      : undefined;
  return {
    id: scenario.id,
    server: scenario.server,
    readers,
    nonReaders,
    expectedTokens,
    receivedTokens: 0,
    seconds: Number.NaN,
    tokensPerSecond: Number.NaN,
    p50: Number.NaN,
    roundP99: [],
    p99Median: Number.NaN,
    errors: 0,
    partial: true,
    report,
    fill,
    nonReaderTokensWhileReading: 0,
    loadAverage: loadavg()[0]!,
    held,
  };
}

export async function measureSseLoad(scenarios: readonly SseScenario[], config: WsLoadConfig, onProgress: Progress = () => {}): Promise<SseLoadResult[]> {
  const results: SseLoadResult[] = [];
  for (const scenario of scenarios) {
    const r = await measureSseScenario(scenario, config, onProgress);
    if (r.held === undefined)
      onProgress(
        `${scenario.id}: ${formatCount(r.receivedTokens)} tokens in ${r.seconds.toFixed(2)} s, p99 ${ms(r.p99Median)} ms (rounds ${r.roundP99.map(ms).join(', ')}), server peak RSS ${formatMB(r.report.peakRss)}${r.partial ? ' (PARTIAL)' : ''}`,
      );
    results.push(r);
  }
  return results;
}

const ms = (value: number) => (!Number.isFinite(value) ? '—' : value >= 100 ? value.toFixed(0) : value >= 1 ? value.toFixed(1) : value.toFixed(2));
const LABEL: Record<SseServer, string> = { 'sluice-sse': 'sluice `createHttpHandler` (SSE)', 'ai-sdk': 'Vercel AI SDK 6 `pipeUIMessageStreamToResponse`' };

export function sseLoadReport(results: readonly SseLoadResult[]): {
  header: string[];
  rows: string[][];
  comparisonHeader: string[];
  comparisonRows: string[][];
  notes: string[];
} {
  const header = [
    'server',
    'clients',
    'tokens to readers',
    'tokens/s',
    'p50 ms',
    'p99 ms (median of rounds)',
    'server peak RSS',
    'queued in server, peak',
    'tokens made for non-readers: alone / while readers ran (per non-reader)',
  ];
  const rows = results.map((r) => [
    `${LABEL[r.server]}${r.partial ? ' (partial)' : ''}`,
    r.nonReaders === 0 ? `${r.readers} reading` : `${r.readers} reading + ${r.nonReaders} not`,
    formatCount(r.receivedTokens),
    r.held !== undefined ? 'server held' : formatCount(Math.round(r.tokensPerSecond / 1000) * 1000),
    ms(r.p50),
    ms(r.p99Median),
    formatMB(r.report.peakRss),
    Number.isFinite(r.report.peakBuffered) ? formatMB(r.report.peakBuffered) : '—',
    r.fill === undefined
      ? '—'
      : `${formatCount(r.fill.tokens)} / ${formatCount(r.nonReaderTokensWhileReading)} (${formatCount(Math.round((r.fill.tokens + r.nonReaderTokensWhileReading) / r.nonReaders))})`,
  ]);
  const find = (server: SseServer, stalled: boolean) => results.find((r) => r.server === server && r.nonReaders > 0 === stalled);
  const comparisonHeader = ['all reading / with non-readers', "readers' p99 with ÷ without", 'tokens/s ÷ sluice', 'p99 ÷ sluice', 'peak RSS ÷ sluice'];
  const comparisonRows: string[][] = [];
  for (const server of ['sluice-sse', 'ai-sdk'] as const) {
    const without = find(server, false);
    const withStalled = find(server, true);
    const pair = (pick: (r: SseLoadResult) => number) =>
      [false, true]
        .map((stalled) => {
          const mine = find(server, stalled);
          const sluice = find('sluice-sse', stalled);
          return mine === undefined || sluice === undefined ? '—' : formatRatio(pick(mine) / pick(sluice));
        })
        .join(' / ');
    if (without === undefined && withStalled === undefined) continue;
    comparisonRows.push([
      LABEL[server],
      without !== undefined && withStalled !== undefined ? formatRatio(withStalled.p99Median / without.p99Median) : '—',
      server === 'sluice-sse' ? 'reference' : pair((r) => r.tokensPerSecond),
      server === 'sluice-sse' ? 'reference' : pair((r) => r.p99Median),
      server === 'sluice-sse' ? 'reference' : pair((r) => r.report.peakRss),
    ]);
  }
  const notes = results.map((r) =>
    r.held !== undefined
      ? `${r.id}: the server stopped answering: its event loop had not turned for ${(r.held.heldMs / 1000).toFixed(1)} s when the report timed out, ${formatCount(r.fill?.tokens ?? r.held.tokensGenerated)} tokens made for the non-readers by then (${formatCount(Math.round((r.fill?.tokens ?? 0) / Math.max(1, r.nonReaders)))} each), RSS ${formatMB(r.held.rss)} (peak ${formatMB(r.held.peakRss)}); the readers never ran`
      : `${r.id}: server RSS ${formatMB(r.report.baselineRss)} idle → ${formatMB(r.report.peakRss)} peak (heap in use at most ${formatMB(r.report.peakHeapUsed)}); event-loop delay p99 ${ms(r.report.loopDelayP99)} ms; load average ${r.loadAverage.toFixed(2)}${r.errors > 0 ? `; ${r.errors} failed requests` : ''}${r.receivedTokens !== r.expectedTokens ? `; received ${r.receivedTokens} of ${r.expectedTokens}` : ''}${r.fill === undefined ? '' : `; non-readers served alone ${r.fill.seconds.toFixed(1)} s, ${r.fill.stuck} / ${r.nonReaders} with a full kernel buffer`}`,
  );
  return { header, rows, comparisonHeader, comparisonRows, notes };
}

async function main(): Promise<void> {
  const config = wsLoadConfig();
  const scenarios = sseScenarios().filter((s) => selected(s.id));
  console.log(`# sluice SSE load — ${new Date().toISOString()}`);
  console.log(
    `${cpus()[0]?.model ?? 'unknown cpu'}, ${cpus().length} cores, Node ${process.version}; load average (1 min) at start ${loadavg()[0]!.toFixed(2)}`,
  );
  console.log(`config: ${JSON.stringify(config)}`);
  const results = await measureSseLoad(scenarios, config, (message) => void process.stderr.write(`  · ${message}\n`));
  const report = sseLoadReport(results);
  console.log(`\n## SSE load — token latency generated → received, on loopback\n`);
  console.log(textTable(report.header, report.rows));
  console.log('');
  console.log(textTable(report.comparisonHeader, report.comparisonRows));
  console.log('');
  for (const note of report.notes) console.log(`  - ${note}`);
  console.log(`\n## Markdown\n`);
  console.log(`${markdownTable(report.header, report.rows)}\n`);
  console.log(`${markdownTable(report.comparisonHeader, report.comparisonRows)}\n`);
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) await main();
