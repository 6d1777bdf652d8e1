/**
 * End to end: the inspector page (examples/inspect.html) in headless Debian Chromium driven by
 * playwright-core, under load — a library pipeline with a deliberately slow stage served by
 * `inspector()`, and the real `sluice serve` with long generations over WebSocket and HTTP.
 *
 * Needs /usr/bin/chromium, as browser.e2e.test.ts does (skipped without it, except under CI=true).
 * Screenshots of the page are kept in test-artifacts/screenshots (or `SLUICE_E2E_SCREENSHOTS=<dir>`). Every wait is on a condition:
 * nothing here asserts speed.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Browser, Page } from 'playwright-core';
import { keepScreenshot, launchChromium, skipWithoutChromium, until } from '../support/chromium.js';
import { lastValueFrom, map, tap } from 'rxjs';
import { fromIterable } from '../../src/flow/sources.js';
import { stage } from '../../operators/stage.js';
import { StageStats } from '../../src/flow/stats.js';
import { activeIntrospector } from '../../src/flow/introspection.js';
import { inspector, type Inspector } from '../../src/serve/inspect/inspector.js';
import { CliProcess } from '../support/cli-process.js';
import { WsClient } from '../support/ws-client.js';

const skip = skipWithoutChromium("the inspector's browser test");
const LONG_ANSWER = 200_000;

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** The inspector page, read through its test ids and the raw values its cells carry. */
class InspectPage {
  constructor(readonly page: Page) {}

  async seq(): Promise<number> {
    return Number((await this.page.locator('body').getAttribute('data-seq')) ?? 0);
  }

  /** Waits until the page rendered `n` more snapshots than now: what it shows was built after this call. */
  async refreshed(n = 2): Promise<void> {
    const from = await this.seq();
    await until(`${n} more snapshots`, async () => ((await this.seq()) >= from + n ? true : undefined));
  }

  nodeNames(): Promise<string[]> {
    return this.page.locator('[data-testid="graph"] [data-testid="node"]').evaluateAll((all) => all.map((n) => n.getAttribute('data-name') ?? ''));
  }

  async figure(stageName: string, field: string): Promise<number> {
    const value = await this.page.locator(`[data-testid="stage-row"][data-name="${stageName}"] [data-field="${field}"]`).getAttribute('data-value');
    return Number(value);
  }

  async bottleneck(): Promise<string> {
    return (await this.page.getByTestId('bottleneck').getAttribute('data-value')) ?? '';
  }
}

/**
 * What overlaps in the stage graph as drawn: two boxes (with whatever their text spills), a box's
 * text outside its box, an edge label over a box or another label, an edge across a box it does
 * not join. Empty when the layout is clean.
 */
async function layoutProblems(page: Page): Promise<string[]> {
  type Box = { left: number; right: number; top: number; bottom: number };
  // Rectangles only come from the page; the checks run here.
  const nodes = await page.locator('[data-testid="graph"] [data-testid="node"]').evaluateAll((all) =>
    all.map((g) => ({
      name: g.getAttribute('data-name') ?? '',
      whole: g.getBoundingClientRect().toJSON() as Box,
      box: g.querySelector('rect.box')!.getBoundingClientRect().toJSON() as Box,
      texts: [...g.querySelectorAll('text')].map((t) => ({ text: t.textContent ?? '', rect: t.getBoundingClientRect().toJSON() as Box })),
    })),
  );
  const labels = await page
    .locator('[data-testid="edge"] text')
    .evaluateAll((all) => all.map((t) => ({ text: t.textContent ?? '', rect: t.getBoundingClientRect().toJSON() as Box })));
  const edges = await page.locator('[data-testid="edge"]').evaluateAll((all) =>
    all.map((e) => ({
      from: e.getAttribute('data-from') ?? '',
      to: e.getAttribute('data-to') ?? '',
      rect: e.querySelector('path')!.getBoundingClientRect().toJSON() as Box,
    })),
  );
  const meets = (a: Box, b: Box) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  const inside = (a: Box, b: Box) => a.left >= b.left - 0.5 && a.right <= b.right + 0.5 && a.top >= b.top - 0.5 && a.bottom <= b.bottom + 0.5;
  const problems: string[] = [];
  for (const [i, a] of nodes.entries()) {
    for (const b of nodes.slice(i + 1)) if (meets(a.whole, b.whole)) problems.push(`boxes ${a.name} and ${b.name} overlap`);
    for (const t of a.texts) if (!inside(t.rect, a.box)) problems.push(`"${t.text}" runs out of the box ${a.name}`);
  }
  for (const [i, label] of labels.entries()) {
    for (const node of nodes) if (meets(label.rect, node.box)) problems.push(`edge label "${label.text}" covers the box ${node.name}`);
    for (const other of labels.slice(i + 1)) if (meets(label.rect, other.rect)) problems.push(`edge labels "${label.text}" and "${other.text}" overlap`);
  }
  for (const edge of edges)
    for (const node of nodes)
      if (node.name !== edge.from && node.name !== edge.to && meets(edge.rect, node.box))
        problems.push(`edge ${edge.from} → ${edge.to} crosses the box ${node.name}`);
  return problems;
}

describe('the inspector page in headless Chromium', { skip }, () => {
  let browser: Browser | undefined;
  const pageErrors: string[] = [];

  before(async () => {
    browser = await launchChromium();
  });
  after(async () => {
    await browser?.close();
  });

  it('a library pipeline served by inspector(): every stage drawn, the slow stage the bottleneck, figures that agree with StageStats; nothing left once closed', async () => {
    const hookBefore = activeIntrospector();
    const inspecting: Inspector = await inspector({ interval: 150 });
    const slowStats = new StageStats();
    const parseStats = new StageStats();
    let stopped = false;
    // Elements for as long as the test looks; the slow stage holds the line.
    function* forever() {
      for (let i = 0; !stopped; i++) yield i;
    }
    const run = lastValueFrom(
      fromIterable(forever()).pipe(
        // Sampling is decided where an element's trace starts: at the first stage.
        stage((n: number) => n + 1, { name: 'parse', capacity: 4, stats: parseStats, sampleRate: 0.2 }),
        stage(
          async (n: number) => {
            await sleep(15);
            return n * 2;
          },
          { name: 'slow-model', capacity: 8, concurrency: 2, stats: slowStats },
        ),
        stage((n: number) => String(n), { name: 'format', capacity: 4 }),
        tap((element) => inspecting.graph.observeTrace(element.trace)),
        map((element) => element.value),
      ),
      { defaultValue: '' },
    );
    const page = await browser!.newPage({ viewport: { width: 1400, height: 1000 } });
    page.on('pageerror', (err) => pageErrors.push(err.message));
    try {
      await page.goto(inspecting.url);
      const inspect = new InspectPage(page);
      await until('the feed to be live', async () => ((await page.getByTestId('connection').getAttribute('data-state')) === 'open' ? true : undefined));
      const names = await until('every stage in the graph', async () => {
        const drawn = await inspect.nodeNames();
        return ['parse', 'slow-model', 'format'].every((n) => drawn.includes(n)) ? drawn : undefined;
      });
      assert.deepEqual([...names].sort(), ['format', 'parse', 'slow-model']);
      assert.equal(await page.locator('[data-testid="edge"]').count(), 2);
      assert.equal(await page.locator('[data-testid="edge"][data-from="parse"][data-to="slow-model"]').count(), 1);

      await until('the slow stage to show as the bottleneck', async () => ((await inspect.bottleneck()) === 'slow-model' ? true : undefined));
      assert.equal(await page.locator('[data-testid="node"][data-name="slow-model"]').getAttribute('data-bottleneck'), 'true');
      assert.equal(await page.locator('[data-testid="stage-row"][data-name="slow-model"]').getAttribute('data-bottleneck'), 'true');
      // Upstream of it waits for it; downstream starves.
      const shares = page.locator('[data-testid="stage-row"][data-name="parse"] [data-field="shares"]');
      await until('parse to be backpressured most of the time', async () => (Number(await shares.getAttribute('data-backpressured')) > 0.5 ? true : undefined));

      // Within one refresh: counters read before and after bracket what the page shows.
      for (let look = 0; look < 3; look++) {
        const before = { received: slowStats.received, delivered: slowStats.delivered, parsed: parseStats.delivered };
        await inspect.refreshed();
        const shown = {
          received: await inspect.figure('slow-model', 'received'),
          delivered: await inspect.figure('slow-model', 'delivered'),
          parsed: await inspect.figure('parse', 'delivered'),
        };
        const afterwards = { received: slowStats.received, delivered: slowStats.delivered, parsed: parseStats.delivered };
        for (const key of ['received', 'delivered', 'parsed'] as const)
          assert.ok(before[key] <= shown[key] && shown[key] <= afterwards[key], `${key}: ${before[key]} ≤ ${shown[key]} ≤ ${afterwards[key]}`);
      }
      assert.equal(await inspect.figure('slow-model', 'unaccounted'), 0);
      assert.equal(await inspect.figure('slow-model', 'failed'), 0);
      // A second pipeline whose stage fails on every other element: the page lists them under recent failures.
      await lastValueFrom(
        fromIterable([1, 2, 3, 4]).pipe(
          stage(
            (n: number) => {
              if (n % 2 === 0) throw new RangeError(`not shown ${n}`);
              return n;
            },
            { name: 'picky', errorPolicy: 'skip' },
          ),
        ),
        { defaultValue: undefined },
      );
      const failure = page.locator('[data-testid="failure-row"]').first();
      await until('a failure listed', async () => ((await failure.count()) > 0 ? true : undefined));
      assert.deepEqual([await failure.getAttribute('data-name'), await failure.getAttribute('data-code')], ['picky', 'WORK_FAILED']);
      assert.match((await failure.textContent()) ?? '', /RangeError/);
      assert.doesNotMatch((await page.getByTestId('failures').textContent()) ?? '', /not shown/, 'no element or error message in the list');
      await until('sampled elements in the waterfall', async () => ((await page.locator('[data-testid="waterfall-row"]').count()) > 0 ? true : undefined));
      await until('service-time percentiles', async () => ((await inspect.figure('slow-model', 'p99')) >= 10 ? true : undefined));
      assert.deepEqual(await layoutProblems(page), []);
      await keepScreenshot(page, 'inspect-pipeline');
      assert.deepEqual(pageErrors, []);
    } finally {
      stopped = true;
      await run;
      await page.close();
      await inspecting.close();
    }
    assert.equal(inspecting.graph.running, false);
    assert.equal(inspecting.feedStats().ticking, false);
    assert.equal(activeIntrospector(), hookBefore, 'the hook is detached');
  });

  describe('against `sluice serve --token`, under load over WebSocket and HTTP', () => {
    const token = 'inspect-e2e-0123456789';
    let models: string;
    let server: CliProcess | undefined;
    let url: string;
    let page: Page;
    let inspect: InspectPage;

    before(async () => {
      models = await mkdtemp(join(tmpdir(), 'sluice-inspect-e2e-'));
      server = CliProcess.start('serve', ['--port', '0', '--models', models, '--token', `ops:${token}`, '--max-tokens', String(LONG_ANSWER)]);
      url = await server.url();
      page = await browser!.newPage({ viewport: { width: 1400, height: 1100 } });
      page.on('pageerror', (err) => pageErrors.push(err.message));
      inspect = new InspectPage(page);
    });
    after(async () => {
      await page?.close();
      server?.kill();
      if (models !== undefined) await rm(models, { recursive: true, force: true });
    });

    const auth = () => ({ authorization: `Bearer ${token}`, 'content-type': 'application/json' });

    it('asks for the token, then shows the pipeline with the numbers of /metrics', async () => {
      await page.goto(`${url}/inspect`);
      const connection = page.getByTestId('connection');
      await until('the page to be refused without a token', async () => ((await connection.getAttribute('data-state')) === 'unauthorized' ? true : undefined));
      await page.getByTestId('token').fill(token);
      await page.getByTestId('token').press('Enter');
      await until('the feed to be live', async () => ((await connection.getAttribute('data-state')) === 'open' ? true : undefined));

      // A few answers of the RAG pipeline, so its stages run.
      for (let i = 0; i < 2; i++) {
        const res = await fetch(`${url}/v1/chat/completions`, {
          method: 'POST',
          headers: auth(),
          body: JSON.stringify({ model: 'sluice-rag', max_tokens: 8, messages: [{ role: 'user', content: 'How does a stage pause a fast producer?' }] }),
        });
        assert.equal(res.status, 200, await res.text());
      }
      const scrape = async () => {
        const text = await (await fetch(`${url}/metrics`)).text();
        const received = new Map<string, number>();
        for (const m of text.matchAll(/^sluice_stage_received_total\{stage="([^"]+)"\} (\d+)$/gm)) received.set(m[1]!, Number(m[2]));
        return received;
      };
      const ran = [...(await scrape())].filter(([name, n]) => n > 0 && name !== 'generate').map(([name]) => name);
      assert.ok(ran.length >= 3, `the RAG stages ran: ${ran.join(', ')}`);
      const drawn = await until('every stage that ran in the graph', async () => {
        const names = await inspect.nodeNames();
        return ran.every((n) => names.includes(n)) ? names : undefined;
      });
      assert.ok(drawn.length >= ran.length, drawn.join(', '));
      for (const name of ran) {
        const before = (await scrape()).get(name)!;
        await inspect.refreshed();
        const shown = await inspect.figure(name, 'received');
        const afterwards = (await scrape()).get(name)!;
        assert.ok(before <= shown && shown <= afterwards, `${name}: /metrics ${before} ≤ page ${shown} ≤ /metrics ${afterwards}`);
      }
      // The serve pipeline (five stages, and the sluice-rag model feeding the last) at common widths: nothing drawn over anything.
      for (const width of [1280, 1024, 1920]) {
        await page.setViewportSize({ width, height: 1100 });
        await inspect.refreshed();
        assert.deepEqual(await layoutProblems(page), [], `at ${width} px`);
        await keepScreenshot(page, `inspect-serve-${width}`);
      }
      await page.setViewportSize({ width: 1400, height: 1100 });
    });

    it('lists requests in flight over both transports, and Cancel ends them as a client cancel would', async () => {
      const ws = await WsClient.open(`${url.replace(/^http/, 'ws')}/v1/ws`, { token });
      const streams: { done: Promise<string>; abort: AbortController }[] = [];
      try {
        for (const id of ['long-a', 'long-b', 'long-c'])
          ws.send({ type: 'generate', id, model: 'charlm', prompt: 'The stage', parameters: { max_tokens: LONG_ANSWER } });
        for (let i = 0; i < 2; i++) {
          const abort = new AbortController();
          const res = await fetch(`${url}/v1/chat/completions`, {
            method: 'POST',
            headers: auth(),
            signal: abort.signal,
            body: JSON.stringify({ model: 'charlm', stream: true, max_tokens: LONG_ANSWER, messages: [{ role: 'user', content: 'The stage' }] }),
          });
          assert.equal(res.status, 200);
          streams.push({ done: res.text().catch(() => ''), abort });
        }
        const rows = page.locator('[data-testid="request-row"]');
        await until('five requests listed', async () => ((await rows.count()) === 5 ? true : undefined));
        assert.equal(await page.locator('[data-testid="request-row"][data-transport="ws"]').count(), 3);
        assert.equal(await page.locator('[data-testid="request-row"][data-transport="http"]').count(), 2);
        assert.equal(await page.getByTestId('requests-note').getAttribute('data-total'), '5');
        await until('tokens counted for every request', async () => {
          const counts = await page
            .locator('[data-testid="request-row"] [data-field="tokens"]')
            .evaluateAll((all) => all.map((c) => Number(c.getAttribute('data-value'))));
          return counts.length === 5 && counts.every((n) => n > 0) ? true : undefined;
        });
        // The tokens streaming are the last stages' outputs: the tile reads them once, not again for the model behind them.
        await until('the streams counted as outputs/s', async () => {
          const tile = Number(((await page.locator('#t-throughput').textContent()) ?? '').replace(/[^\d.]/g, ''));
          const rows = await page
            .locator('[data-testid="stage-row"]')
            .evaluateAll((all) =>
              all.map((r) => ({ name: r.getAttribute('data-name'), rate: Number(r.querySelector('[data-field="throughput"]')?.getAttribute('data-value')) })),
            );
          const streaming = rows.filter((r) => r.name === 'stream' || r.name === 'generate').reduce((a, r) => a + r.rate, 0);
          return tile > 0 && Math.abs(tile - streaming) <= 1 ? true : undefined;
        });
        assert.equal(await page.locator('[data-testid="client-row"]').count(), 1);
        const html = await page.content();
        assert.ok(!html.includes('The stage'), 'no prompt on the page');
        await keepScreenshot(page, 'inspect-serve');

        // Cancel a WebSocket request from the page: its client gets done with finish_reason abort.
        const wsRow = page.locator('[data-testid="request-row"][data-transport="ws"]').first();
        const wsRef = (await wsRow.locator('[data-field="id"]').textContent()) ?? '';
        const wsId = ['long-a', 'long-b', 'long-c'].find((id) => wsRef.endsWith(`:${id}`))!;
        assert.ok(wsId, wsRef);
        await wsRow.getByTestId('cancel').click();
        const end = await until('the cancelled request to end', async () => ws.end(wsId));
        assert.equal(end.type, 'done');
        assert.equal(end.type === 'done' && end.finish_reason, 'abort');
        // The client may hear its end before the page hears the answer to its POST: wait for the page.
        await until('the page to report the cancel', async () =>
          (await page.getByTestId('action-status').getAttribute('data-state')) === 'ok' ? true : undefined,
        );

        // Cancel an HTTP stream: it ends with a request_cancelled error event and [DONE].
        await page.locator('[data-testid="request-row"][data-transport="http"]').first().getByTestId('cancel').click();
        const body = await Promise.race(streams.map((s) => s.done.then((text) => (text.includes('request_cancelled') ? text : new Promise<string>(() => {})))));
        assert.match(body, /data: \[DONE\]\n\n$/);
        await until('three requests left on the page', async () => ((await rows.count()) === 3 ? true : undefined));
        assert.deepEqual(pageErrors, []);
      } finally {
        for (const id of ['long-a', 'long-b', 'long-c']) if (ws.end(id) === undefined) ws.send({ type: 'cancel', id });
        for (const s of streams) s.abort.abort();
        ws.ws.close();
        await ws.closed;
      }
      await until('no request left on the page', async () => ((await page.locator('[data-testid="request-row"]').count()) === 0 ? true : undefined));
    });

    it('SIGTERM with the page still reading: the feed ends and the server exits with 0', async () => {
      assert.equal(await server!.stop(), 0, server!.output());
      await until('the page to see the feed end', async () =>
        (await page.getByTestId('connection').getAttribute('data-state')) === 'closed' ? true : undefined,
      );
    });
  });
});
