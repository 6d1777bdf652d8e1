/**
 * What `/metrics` shows of state users alert on, scraped from real servers: the embedding
 * cache of default serve mode, a gateway's circuit breakers from start-up, and exemplars on the
 * latency histograms (the request's trace id) in the OpenMetrics format a scraper asks for —
 * the classic format otherwise — each checked by promtool.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startServer, type RunningServer } from '../../src/serve/app.js';
import { prefersOpenMetrics } from '../../src/serve/metrics.js';
import { FakeUpstream } from '../support/fake-upstream.js';

/** The Accept header Prometheus 2.x sends when it scrapes. */
const PROMETHEUS_ACCEPT =
  'application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1';

async function scrape(url: string, accept?: string): Promise<{ type: string; text: string }> {
  const response = await fetch(`${url}/metrics`, accept === undefined ? {} : { headers: { accept } });
  assert.equal(response.status, 200);
  return { type: response.headers.get('content-type') ?? '', text: await response.text() };
}

/** The value of the sample `name{labels}`, or undefined. */
function sample(text: string, name: string, labels: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${name}{${labels}} `));
  return line === undefined ? undefined : Number(line.slice(name.length + labels.length + 3).split(' ')[0]);
}

/** `promtool check metrics` on classic text; `undefined` when promtool is missing outside CI. */
function promtoolCheck(text: string): string | undefined {
  const check = spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8' });
  if (check.error !== undefined) {
    assert.notEqual(process.env.CI, 'true', 'promtool is required under CI=true (apt-get install prometheus)');
    return undefined;
  }
  assert.equal(check.status, 0, `promtool check metrics failed:\n${check.stdout}${check.stderr}`);
  return check.stdout;
}

/**
 * The OpenMetrics text through Prometheus's own OpenMetrics parser (`promtool tsdb
 * create-blocks-from openmetrics`, which parses it strictly, exemplars and `# EOF` included).
 * `promtool check metrics` reads only the classic format, and the importer wants a timestamp
 * on every sample: one is put before each sample's exemplar (or at its end).
 */
async function promtoolParseOpenMetrics(text: string): Promise<void> {
  const stamped = text
    .split('\n')
    .map((line) => {
      if (line === '' || line.startsWith('#')) return line;
      const exemplar = line.indexOf(' # {');
      return exemplar < 0 ? `${line} 1700000000` : `${line.slice(0, exemplar)} 1700000000${line.slice(exemplar)}`;
    })
    .join('\n');
  const dir = await mkdtemp(join(tmpdir(), 'sluice-openmetrics-'));
  try {
    await writeFile(join(dir, 'metrics.txt'), stamped);
    const parse = spawnSync('promtool', ['tsdb', 'create-blocks-from', 'openmetrics', join(dir, 'metrics.txt'), join(dir, 'blocks')], { encoding: 'utf8' });
    if (parse.error !== undefined) {
      assert.notEqual(process.env.CI, 'true', 'promtool is required under CI=true (apt-get install prometheus)');
      return;
    }
    assert.equal(parse.status, 0, `promtool could not parse the OpenMetrics exposition:\n${parse.stdout}${parse.stderr}`);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

describe('/metrics of default serve mode', () => {
  let models: string;
  let running: RunningServer;
  const traces = ['4bf92f3577b34da6a3ce929d0e0e4736', '0af7651916cd43dd8448eb211c80319c'];

  before(async () => {
    models = await mkdtemp(join(tmpdir(), 'sluice-metrics-'));
    running = await startServer({ port: 0, models, poolSize: 1 });
    for (const trace of traces) {
      const response = await fetch(`${running.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', traceparent: `00-${trace}-00f067aa0ba902b7-01` },
        body: JSON.stringify({ model: 'sluice-rag', max_tokens: 8, messages: [{ role: 'user', content: 'How does a stage pause a fast producer?' }] }),
      });
      assert.equal(response.status, 200, await response.text());
    }
  });
  after(async () => {
    await running?.shutdown(1000);
    await rm(models, { recursive: true, force: true });
  });

  it("exports sluice-rag's embedding cache: the same question twice is a miss, then a hit", async () => {
    const { text } = await scrape(running.url);
    assert.equal(sample(text, 'sluice_cache_misses_total', 'cache="embed"'), 1);
    assert.equal(sample(text, 'sluice_cache_hits_total', 'cache="embed"'), 1);
    assert.equal(sample(text, 'sluice_cache_entries', 'cache="embed"'), 1);
    assert.ok((sample(text, 'sluice_cache_bytes', 'cache="embed"') ?? 0) > 0);
  });

  it('serves OpenMetrics with trace-id exemplars when the scraper asks for it, valid for Prometheus’s parser', async () => {
    const { type, text } = await scrape(running.url, PROMETHEUS_ACCEPT);
    assert.match(type, /^application\/openmetrics-text; version=1\.0\.0/);
    assert.ok(text.endsWith('# EOF\n'));
    const exemplars = [...text.matchAll(/^(\w+)_bucket\{[^}]*\} \S+ # \{trace_id="([0-9a-f]{32})"\}/gm)].map(([, name, trace]) => ({ name, trace }));
    for (const name of ['sluice_e2e_request_latency_seconds', 'sluice_time_to_first_token_seconds', 'gen_ai_server_request_duration_seconds']) {
      const found = exemplars.filter((e) => e.name === name);
      assert.ok(found.length > 0, `${name} carries exemplars`);
      assert.ok(
        found.every((e) => traces.includes(e.trace!)),
        `${name}: every exemplar names a request's trace (${JSON.stringify(found)})`,
      );
    }
    // The latest request fell in some bucket of its end-to-end latency: its trace is that bucket's exemplar.
    assert.ok(exemplars.some((e) => e.name === 'sluice_e2e_request_latency_seconds' && e.trace === traces[1]));
    assert.match(text, /^sluice_cache_hits_total\{cache="embed"\} 1$/m, 'counters keep their _total samples');
    await promtoolParseOpenMetrics(text);
  });

  it('serves the classic text format otherwise, counters named as before an OpenMetrics scrape, valid for promtool', async () => {
    await scrape(running.url, PROMETHEUS_ACCEPT);
    const { type, text } = await scrape(running.url);
    assert.match(type, /^text\/plain; version=0\.0\.4/);
    assert.doesNotMatch(text, /# \{trace_id=/);
    assert.doesNotMatch(text, /# EOF/);
    assert.match(text, /^# TYPE sluice_cache_hits_total counter$/m);
    promtoolCheck(text);
    assert.match((await scrape(running.url, 'text/plain')).type, /^text\/plain/);
  });

  it('reads the Accept header by its weights', () => {
    assert.equal(prefersOpenMetrics(PROMETHEUS_ACCEPT), true);
    assert.equal(prefersOpenMetrics('application/openmetrics-text'), true);
    assert.equal(prefersOpenMetrics(undefined), false);
    assert.equal(prefersOpenMetrics('*/*'), false);
    assert.equal(prefersOpenMetrics('text/plain;version=0.0.4'), false);
    assert.equal(prefersOpenMetrics('text/plain, application/openmetrics-text;q=0.5'), false);
    assert.equal(prefersOpenMetrics('application/openmetrics-text;q=0'), false);
  });
});

describe('/metrics of gateway mode: the circuit breakers', () => {
  it('has a state series per upstream from start-up; an opened circuit shows as 2 with its opens, failures and refusals', async () => {
    const a = await FakeUpstream.start(['m']);
    const b = await FakeUpstream.start(['m']);
    const running = await startServer({
      port: 0,
      upstreams: [
        { baseUrl: a.url, name: 'a' },
        { baseUrl: b.url, name: 'b' },
      ],
      gateway: { attempts: 1, baseDelay: 1, breakerThreshold: 2, breakerCooldown: 60_000 },
    });
    const ask = () =>
      fetch(`${running.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hi' }] }),
      }).then((r) => r.text());
    try {
      const fresh = (await scrape(running.url)).text;
      for (const name of ['a', 'b']) {
        assert.equal(sample(fresh, 'sluice_circuit_breaker_state', `breaker="upstream:${name}"`), 0, `upstream ${name} from start-up`);
        assert.equal(sample(fresh, 'sluice_circuit_breaker_opens_total', `breaker="upstream:${name}"`), 0);
      }
      a.script({ kind: 'status', status: 500 }, { kind: 'status', status: 500 });
      await ask();
      await ask();
      await ask();
      const { text } = await scrape(running.url);
      assert.equal(sample(text, 'sluice_circuit_breaker_state', 'breaker="upstream:a"'), 2);
      assert.equal(sample(text, 'sluice_circuit_breaker_opens_total', 'breaker="upstream:a"'), 1);
      assert.equal(sample(text, 'sluice_circuit_breaker_failures_total', 'breaker="upstream:a"'), 2);
      assert.equal(sample(text, 'sluice_circuit_breaker_rejected_total', 'breaker="upstream:a"'), 1);
      assert.equal(sample(text, 'sluice_circuit_breaker_state', 'breaker="upstream:b"'), 0);
      promtoolCheck(text);
      await promtoolParseOpenMetrics((await scrape(running.url, PROMETHEUS_ACCEPT)).text);
    } finally {
      await running.shutdown(0);
      await a.close();
      await b.close();
    }
  });
});
