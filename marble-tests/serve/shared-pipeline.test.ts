/**
 * The server's door: every request, HTTP or WebSocket, enters one bounded queue by priority class;
 * when it is full the lowest class is refused at once with 429 and Retry-After (a WebSocket error
 * frame with `retry_after_ms`), counted by reason on /metrics; the inspector's graph shows it.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ScriptedWorker } from 'sluice/testing/ai';
import { startServer, type RunningServer } from '../../src/serve/app.js';
import { WsClient as Client, until } from '../support/ws-client.js';
import { serveOptions } from '../../src/cli.js';

/** Polls an async condition (a scrape), failing after 30 s. */
async function eventually(condition: () => Promise<boolean> | boolean, what: string): Promise<void> {
  const deadline = Date.now() + 30_000;
  while (!(await condition())) {
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await new Promise<void>((resolve) => setTimeout(resolve, 5));
  }
}

describe('the shared door of sluice serve', () => {
  let models: string;
  let running: RunningServer;
  // Streams until the client leaves: a held generation keeps its slot.
  const model = new ScriptedWorker({ name: 'slow', tokens: { repeat: 'x ' }, delay: 'turn', hang: { after: 1 } });

  before(async () => {
    models = await mkdtemp(join(tmpdir(), 'sluice-door-'));
    running = await startServer({ port: 0, models, poolSize: 1, languageModel: model, maxQueue: 2, streams: 1, stageCapacity: 1 });
  });
  after(async () => {
    await running.shutdown(500);
    await rm(models, { recursive: true, force: true });
  });

  const ask = (controller: AbortController, tier?: string) =>
    fetch(`${running.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'slow', stream: true, max_tokens: 100, messages: [{ role: 'user', content: 'hi' }], ...(tier && { service_tier: tier }) }),
      signal: controller.signal,
    }).catch((err: unknown) => err);
  const metric = async (line: string) => {
    const text = await (await fetch(`${running.url}/metrics`)).text();
    const found = text.split('\n').find((l) => l.startsWith(line));
    return found === undefined ? 0 : Number(found.split(' ').at(-1));
  };

  it('holds one stream and two at the door, none in the stage; refuses the next at once with 429 and Retry-After', async () => {
    const controller = new AbortController();
    const held = [ask(controller)];
    await eventually(async () => running.stats().httpInFlight === 1, 'one request in');
    held.push(ask(controller), ask(controller));
    await eventually(async () => (await metric('sluice_stage_buffered{stage="intake"}')) === 2, 'two waiting at the door');
    // A request the stream stage cannot start waits at the door, where its class orders it: never in the stage.
    assert.equal(await metric('sluice_stage_buffered{stage="stream"}'), 0);
    const refused = (await ask(new AbortController(), 'flex')) as Response;
    assert.equal(refused.status, 429);
    assert.ok(Number(refused.headers.get('retry-after')) >= 1);
    const body = (await refused.json()) as { error: { code: string; type: string } };
    assert.equal(body.error.code, 'server_busy');
    assert.equal(await metric('sluice_stage_shed_total{stage="intake",reason="buffer-full"}'), 1);

    // A request of a higher class takes the place of the newest default one, which is refused.
    const urgent = ask(controller, 'priority');
    const evicted = (await Promise.race(held.slice(1))) as Response;
    assert.equal(evicted.status, 429);
    assert.equal(await metric('sluice_stage_shed_total{stage="intake",reason="evicted"}'), 1);

    // The inspector draws the door as a node of its own, with its queue against its bound.
    const feed = new AbortController();
    const events = await fetch(`${running.url}/inspect/events`, { signal: feed.signal });
    const reader = events.body!.getReader();
    let text = '';
    while (!text.includes('"kind":"intake"')) {
      const { value, done } = await reader.read();
      if (done) break;
      text += new TextDecoder().decode(value);
    }
    feed.abort();
    assert.match(text, /"name":"intake","kind":"intake","capacity":2/);
    controller.abort();
    await Promise.all([...held, urgent]);
  });

  it('refuses a WebSocket request the same way: an error frame with ADMISSION_REJECTED and retry_after_ms', async () => {
    await eventually(async () => (await metric('sluice_stage_buffered{stage="intake"}')) === 0 && running.stats().httpInFlight === 0, 'the door empty');
    const client = await Client.open(running.wsUrl);
    for (const id of ['a', 'b', 'c', 'd']) client.send({ type: 'generate', id, model: 'slow', prompt: 'hi', parameters: { max_tokens: 100 } });
    await eventually(async () => (await metric('sluice_stage_buffered{stage="intake"}')) === 2, 'two waiting at the door');
    client.send({ type: 'generate', id: 'e', model: 'slow', prompt: 'hi', parameters: { max_tokens: 100 } });
    await until(() => client.end('e') !== undefined, 'e refused');
    const end = client.end('e')!;
    assert.ok(end.type === 'error' && end.code === 'ADMISSION_REJECTED' && (end.retry_after_ms ?? 0) >= 1000, JSON.stringify(end));
    for (const id of ['a', 'b', 'c', 'd']) client.send({ type: 'cancel', id });
    await until(() => ['a', 'b', 'c', 'd'].every((id) => client.end(id) !== undefined), 'every request ended');
    client.ws.close();
  });

  it('takes the door and stream sizes and tenant classes from flags, naming a bad one', () => {
    const options = serveOptions(
      ['--max-queue', '9', '--max-streams', '3', '--stage-capacity', '5', '--tenant-priority', 'acme:high', '--tenant-rate', '7'],
      {},
    );
    assert.deepEqual((options.limits as { tenantRate?: unknown } | undefined)?.tenantRate, { perSecond: 7, burst: 14 });
    assert.equal(options.maxQueue, 9);
    assert.equal(options.streams, 3);
    assert.equal(options.stageCapacity, 5);
    assert.deepEqual(options.tenantPriorities, { acme: 'high' });
    assert.throws(() => serveOptions(['--tenant-priority', 'acme:urgent'], {}), /--tenant-priority/);
    assert.throws(() => serveOptions(['--max-queue', '-1'], {}), /--max-queue/);
  });
});
