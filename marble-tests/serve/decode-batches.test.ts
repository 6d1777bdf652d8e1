/**
 * Continuous batching, visible: `sluice serve` exports each decoder's batched decode steps on
 * /metrics (`sluice_decode_batch_*`) and lists them on the inspector's feed and page, so an
 * operator sees how many generations each model call stepped, and what waits for a call.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startServer, type RunningServer } from '../../src/serve/app.js';
import { keepScreenshot, launchChromium, skipWithoutChromium, until as browserUntil } from '../support/chromium.js';
import { firstSnapshot as snapshot } from '../support/inspect-feed.js';
import { qwenModelDir } from '../support/local-model-dir.js';

/** A metric's value on /metrics, by its whole series name (labels included). */
async function metric(url: string, series: string): Promise<number | undefined> {
  const line = (await (await fetch(`${url}/metrics`)).text()).split('\n').find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.split(' ').at(-1));
}

/** One streamed charlm completion, read to its end. */
async function stream(url: string, tokens: number): Promise<void> {
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'charlm', stream: true, max_tokens: tokens, messages: [{ role: 'user', content: 'The stage' }] }),
  });
  assert.equal(res.status, 200);
  await res.text();
}

describe("a decoder's continuous batching on /metrics and the inspector", () => {
  let models: string;
  let server: RunningServer;

  before(async () => {
    models = await mkdtemp(join(tmpdir(), 'sluice-batches-'));
    server = await startServer({ port: 0, models, poolSize: 1, maxBatch: 16 });
  });
  after(async () => {
    await server.shutdown(500);
    await rm(models, { recursive: true, force: true });
  });

  it('counts the calls and steps of concurrent generations: the feed and /metrics agree, and calls stepped several at once', async () => {
    const before = await snapshot(server.url);
    const row = () => before.batches?.find((b) => b.model === 'charlm');
    assert.deepEqual(
      { ...row(), calls: 0, steps: 0 },
      { model: 'charlm', calls: 0, steps: 0, largest: 0, maxBatch: 16, waiting: 0, running: 0 },
      'charlm is listed before it ran',
    );
    assert.equal(
      before.batches?.some((b) => b.model === 'sluice-rag'),
      false,
      'sluice-rag answers by extraction: it steps no decoder',
    );
    // Eight streams at once on a one-thread pool: steps asked while a call runs wait and join the next.
    await Promise.all(Array.from({ length: 8 }, () => stream(server.url, 48)));
    const after = (await snapshot(server.url)).batches!.find((b) => b.model === 'charlm')!;
    // A prefill and 47 decode steps per stream at least; the steps of a stream stopped by its end token are fewer.
    assert.ok(after.steps >= 8 && after.steps <= 8 * 48, `steps ${after.steps}`);
    assert.ok(after.calls < after.steps, `calls ${after.calls} < steps ${after.steps}: some calls stepped several generations`);
    assert.ok(after.largest >= 2 && after.largest <= 16, `largest ${after.largest}`);
    assert.equal(after.waiting, 0, 'nothing waits once every stream ended');
    assert.equal(after.running, 0);
    assert.equal(await metric(server.url, 'sluice_decode_batch_steps_total{model="charlm"}'), after.steps);
    assert.equal(await metric(server.url, 'sluice_decode_batch_calls_total{model="charlm"}'), after.calls);
    assert.equal(await metric(server.url, 'sluice_decode_batch_largest_steps{model="charlm"}'), after.largest);
    assert.equal(await metric(server.url, 'sluice_decode_batch_waiting_steps{model="charlm"}'), 0);
  });

  it('the page (in Chromium) lists the model with its steps per call, largest batch and totals', {
    skip: skipWithoutChromium('decode batching on the inspector page'),
  }, async () => {
    await Promise.all(Array.from({ length: 4 }, () => stream(server.url, 16)));
    const steps = (await snapshot(server.url)).batches!.find((b) => b.model === 'charlm')!.steps;
    const browser = await launchChromium();
    try {
      const page = await browser.newPage();
      await page.goto(`${server.url}/inspect`);
      const row = page.locator('[data-testid="batch-row"][data-model="charlm"]');
      await browserUntil('the charlm row on the page', async () => ((await row.count()) === 1 ? true : undefined));
      assert.equal(await row.locator('[data-field="steps"]').getAttribute('data-value'), String(steps));
      assert.match((await row.locator('[data-field="largest"]').textContent()) ?? '', /^\d+ \/ 16$/);
      assert.ok(Number(await row.locator('[data-field="mean"]').getAttribute('data-value')) > 1, 'more than one step per call on average');
      await keepScreenshot(page, 'inspect-batches');
    } finally {
      await browser.close();
    }
  });
});

describe('a --model decoder: requests with prompts of different lengths share decode calls', () => {
  let models: string;
  let dir: Awaited<ReturnType<typeof qwenModelDir>>;

  before(async () => {
    models = await mkdtemp(join(tmpdir(), 'sluice-batches-lengths-'));
    dir = await qwenModelDir('lengths');
  });
  after(async () => {
    await dir.remove();
    await rm(models, { recursive: true, force: true });
  });

  /** Eight greedy streams at once, each prompt a different length; their texts, and the server's calls and steps. */
  async function run(lengthBucket: number | undefined): Promise<{ texts: string[]; calls: number; steps: number }> {
    const server = await startServer({
      port: 0,
      models,
      poolSize: 1,
      maxBatch: 16,
      localModels: [dir.dir],
      inspect: false,
      ...(lengthBucket !== undefined && { lengthBucket }),
    });
    try {
      const texts = await Promise.all(
        Array.from({ length: 8 }, async (_, i) => {
          const res = await fetch(`${server.url}/v1/chat/completions`, {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: JSON.stringify({ model: 'lengths', max_tokens: 12, temperature: 0, messages: [{ role: 'user', content: 'words '.repeat(1 + 3 * i) }] }),
          });
          assert.equal(res.status, 200);
          return ((await res.json()) as { choices: { message: { content: string } }[] }).choices[0]!.message.content;
        }),
      );
      const calls = (await metric(server.url, 'sluice_decode_batch_calls_total{model="lengths"}'))!;
      const steps = (await metric(server.url, 'sluice_decode_batch_steps_total{model="lengths"}'))!;
      return { texts, calls, steps };
    } finally {
      await server.shutdown(500);
    }
  }

  it('by default in one call, left-padded; with --length-bucket 1 one call per length; the same greedy tokens either way', async () => {
    const padded = await run(undefined);
    const exact = await run(1);
    assert.deepEqual(padded.texts, exact.texts);
    assert.equal(exact.calls, exact.steps, `no two contexts had one length: ${exact.calls} calls for ${exact.steps} steps`);
    assert.ok(padded.calls * 2 <= padded.steps, `${padded.calls} calls for ${padded.steps} steps`);
  });
});
