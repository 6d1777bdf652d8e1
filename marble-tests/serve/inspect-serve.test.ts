/**
 * The inspector of `sluice serve`, over real sockets on 127.0.0.1 in gateway mode (fake upstreams
 * on loopback): what each token may see and cancel, and each upstream's circuit on the feed.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, type RunningServer } from '../../src/serve/app.js';
import { serveOptions } from '../../src/cli.js';
import type { InspectSnapshot } from '../../src/serve/inspect/snapshot.js';
import { FakeUpstream } from '../support/fake-upstream.js';
import { until } from '../support/ws-client.js';
import { keepScreenshot, launchChromium, skipWithoutChromium, until as browserUntil } from '../support/chromium.js';
import { firstSnapshot as snapshotAs } from '../support/inspect-feed.js';

const ACME = 'acme-token-0001';
const GLOBEX = 'globex-token-001';
const OPS = 'operator-token-01';
const bearer = (token: string) => ({ authorization: `Bearer ${token}` });

function complete(url: string, token: string, content = 'hello'): Promise<Response> {
  return fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...bearer(token) },
    body: JSON.stringify({ model: 'up-model', messages: [{ role: 'user', content }] }),
  });
}

/** Waits until an asynchronous condition holds (a bound against a hang, not a timing). */
async function untilAsync(condition: () => Promise<boolean>, what: string): Promise<void> {
  const deadline = Date.now() + 30_000;
  while (!(await condition())) {
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await new Promise<void>((resolve) => setTimeout(resolve, 20));
  }
}

const cancel = (url: string, id: string, token: string) => fetch(`${url}/inspect/requests/${id}/cancel`, { method: 'POST', headers: bearer(token) });

describe("the inspector's scope: a tenant's token sees its own requests, an operator's sees all", () => {
  let upstream: FakeUpstream;
  let server: RunningServer;

  before(async () => {
    upstream = await FakeUpstream.start(['up-model']);
    server = await startServer({
      port: 0,
      tokens: { [ACME]: 'acme', [GLOBEX]: 'globex' },
      inspectTokens: [OPS],
      upstreams: [{ baseUrl: upstream.url, name: 'fake' }],
      // An upstream that never answers holds each request in flight until it is cancelled.
      gateway: { baseDelay: 20, idleTimeout: 60_000, breakerCooldown: 60_000 },
    });
  });
  after(async () => {
    await server?.shutdown(0);
    await upstream?.close();
  });

  it("lists, on the feed, only the reader's tenant; cancelling another tenant's request is 404 and leaves it running", async () => {
    upstream.script({ kind: 'stall' }, { kind: 'stall' });
    const acmeAnswer = complete(server.url, ACME, 'acme secret prompt');
    const globexAnswer = complete(server.url, GLOBEX, 'globex secret prompt');
    await until(() => upstream.served.length === 2, 'both requests at the upstream');

    const ops = await snapshotAs(server.url, bearer(OPS));
    assert.deepEqual(ops.viewer, { role: 'operator' });
    assert.equal(ops.requests!.total, 2);
    assert.deepEqual(ops.requests!.byTenant, { acme: 1, globex: 1 });

    const acme = await snapshotAs(server.url, bearer(ACME));
    assert.deepEqual(acme.viewer, { role: 'tenant', tenant: 'acme' });
    assert.equal(acme.requests!.total, 1);
    assert.deepEqual(
      acme.requests!.shown.map((r) => r.tenant),
      ['acme'],
    );
    assert.deepEqual(acme.requests!.byTenant, { acme: 1 });
    assert.equal(acme.graph.failures.length, 0, 'no list of single elements for a tenant');
    assert.ok(acme.graph.nodes.length > 0, "the shared stages are every tenant's to see");
    assert.equal(acme.upstreams!.length, 1, 'the upstreams are shared too');
    const text = JSON.stringify(acme);
    assert.ok(!text.includes('globex'), 'nothing of the other tenant');

    const globexId = ops.requests!.shown.find((r) => r.tenant === 'globex')!.id;
    const acmeId = acme.requests!.shown[0]!.id;
    const refused = await cancel(server.url, globexId, ACME);
    assert.equal(refused.status, 404);
    assert.equal(((await refused.json()) as { error: { code: string } }).error.code, 'request_not_found');
    assert.equal((await snapshotAs(server.url, bearer(OPS))).requests!.total, 2, "the other tenant's request runs on");

    assert.equal((await cancel(server.url, acmeId, ACME)).status, 202);
    assert.equal((await acmeAnswer).status, 409);
    assert.equal((await cancel(server.url, globexId, OPS)).status, 202, 'an operator cancels any request');
    assert.equal((await globexAnswer).status, 409);
    assert.equal((await snapshotAs(server.url, bearer(OPS))).requests!.total, 0);

    // Every request is sampled: each tenant's waterfall holds its own traces only.
    await untilAsync(async () => (await snapshotAs(server.url, bearer(OPS))).graph.waterfall.length >= 2, 'both traces in the waterfall');
    const tenants = (s: InspectSnapshot) => new Set(s.graph.waterfall.map((entry) => entry.tenant));
    assert.deepEqual(tenants(await snapshotAs(server.url, bearer(OPS))), new Set(['acme', 'globex']));
    assert.deepEqual(tenants(await snapshotAs(server.url, bearer(GLOBEX))), new Set(['globex']));
  });

  it("an operator's token opens the inspector only: the API refuses it, and no token or a wrong one is 401", async () => {
    const api = await complete(server.url, OPS);
    assert.equal(api.status, 401);
    for (const headers of [{}, bearer('not-a-token-at-all')]) {
      assert.equal((await fetch(`${server.url}/inspect/events`, { headers })).status, 401);
      assert.equal((await fetch(`${server.url}/inspect/requests/r1/cancel`, { method: 'POST', headers })).status, 401);
    }
  });

  it('bad inspect tokens fail the start with a typed error naming the field; the CLI reads them', async () => {
    await assert.rejects(startServer({ port: 0, inspectTokens: [OPS] }), /inspectTokens.*give tokens too/);
    await assert.rejects(startServer({ port: 0, tokens: { [ACME]: 'acme' }, inspectTokens: [ACME] }), /inspectTokens.*must not also be an API token/);
    await assert.rejects(startServer({ port: 0, tokens: { [ACME]: 'acme' }, inspectTokens: ['short'] }), /at least 8 characters/);
    await assert.rejects(startServer({ port: 0, tokens: { [ACME]: 'acme' }, inspectTokens: [OPS], inspect: false }), /inspect: false/);
    assert.deepEqual(serveOptions(['--token', `acme:${ACME}`, '--inspect-token', OPS], {}).inspectTokens, [OPS]);
    assert.deepEqual(serveOptions([], { SLUICE_INSPECT_TOKENS: `${OPS},other-operator-1` }).inspectTokens, [OPS, 'other-operator-1']);
  });
});

describe('upstreams on the inspector: each with its circuit, attempts in flight, failures by code, retries and fallbacks', () => {
  let bad: FakeUpstream;
  let good: FakeUpstream;
  let server: RunningServer;

  before(async () => {
    bad = await FakeUpstream.start(['up-model']);
    good = await FakeUpstream.start(['up-model']);
    server = await startServer({
      port: 0,
      upstreams: [
        { baseUrl: bad.url, name: 'bad' },
        { baseUrl: good.url, name: 'good' },
      ],
      gateway: { attempts: 2, baseDelay: 5, maxDelay: 20, breakerThreshold: 2, breakerCooldown: 60_000 },
    });
  });
  after(async () => {
    await server?.shutdown(0);
    await bad?.close();
    await good?.close();
  });

  it('an upstream answering 500 shows its failures and retries, passes requests on, and then its circuit open', async () => {
    bad.script(...Array.from({ length: 10 }, () => ({ kind: 'status' as const, status: 500 })));
    const view = async () => {
      const upstreams = (await snapshotAs(server.url, {})).upstreams!;
      return Object.fromEntries(upstreams.map((u) => [u.name, u]));
    };
    assert.equal((await view()).bad!.circuit, 'closed');

    for (let request = 0; request < 3; request++) {
      const answer = await complete(server.url, 'unused');
      assert.equal(answer.status, 200, 'the good upstream answers every one');
      await answer.text();
    }
    const { bad: failing, good: serving } = await view();
    // Two requests tried it twice each (a retry), then it opened; the third was refused at once.
    assert.equal(failing!.circuit, 'open');
    assert.equal(failing!.attempts, 4);
    assert.deepEqual(failing!.failures, { HTTP_500: 4 });
    assert.equal(failing!.retries, 2);
    assert.equal(failing!.fallbacks, 2);
    assert.equal(failing!.rejected, 1);
    assert.equal(failing!.inFlight, 0);
    assert.equal(bad.served.length, 4, 'the open circuit sent it nothing more');
    // Each failed attempt is listed among the recent failures, under its model's node, with its code.
    const failures = (await snapshotAs(server.url, {})).graph.failures.filter((f) => f.stage === 'bad:up-model');
    assert.equal(failures.length, 4);
    assert.deepEqual(
      failures.map((f) => f.code),
      ['HTTP_500', 'HTTP_500', 'HTTP_500', 'HTTP_500'],
    );
    assert.equal(serving!.circuit, 'closed');
    assert.equal(serving!.attempts, 3);
    assert.equal(serving!.succeeded, 3);
    assert.deepEqual(serving!.failures, {});
  });

  it('the page (in Chromium) shows each upstream, the failing one with its circuit open and its failures by code', {
    skip: skipWithoutChromium("the inspector's upstreams in a browser"),
  }, async () => {
    const browser = await launchChromium();
    try {
      const page = await browser.newPage();
      await page.goto(`${server.url}/inspect`);
      const row = (name: string) => page.locator(`[data-testid="upstream-row"][data-name="${name}"]`);
      await browserUntil('the bad upstream open on the page', async () => ((await row('bad').getAttribute('data-circuit')) === 'open' ? true : undefined));
      assert.equal(await row('bad').locator('[data-field="failures"]').textContent(), 'HTTP_500 ×4');
      assert.equal(await row('bad').locator('[data-field="fallbacks"]').getAttribute('data-value'), '2');
      assert.equal(await row('good').getAttribute('data-circuit'), 'closed');
      await keepScreenshot(page, 'inspect-upstreams');
    } finally {
      await browser.close();
    }
  });

  it('an attempt running at an upstream is in flight there until it ends', async () => {
    good.script({ kind: 'stall' });
    const controller = new AbortController();
    const answer = fetch(`${server.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'up-model', messages: [{ role: 'user', content: 'hi' }] }),
      signal: controller.signal,
    }).catch(() => undefined);
    await untilAsync(async () => (await snapshotAs(server.url, {})).upstreams!.find((u) => u.name === 'good')!.inFlight === 1, 'one attempt in flight');
    controller.abort();
    await answer;
    await untilAsync(async () => (await snapshotAs(server.url, {})).upstreams!.find((u) => u.name === 'good')!.inFlight === 0, 'none in flight');
    assert.deepEqual((await snapshotAs(server.url, {})).upstreams!.find((u) => u.name === 'good')!.failures, {}, 'a client that left is no upstream failure');
  });
});

describe("a request's text on the inspector only with inspectContent (--inspect-content)", () => {
  const piece = (content: string) => `data: ${JSON.stringify({ choices: [{ index: 0, delta: { content } }] })}\n\n`;

  for (const inspectContent of [false, true]) {
    it(inspectContent ? 'with it: the prompt and the end of the answer so far' : 'without it (the default): figures only', async () => {
      const upstream = await FakeUpstream.start(['up-model']);
      const server = await startServer({ port: 0, upstreams: [{ baseUrl: upstream.url, name: 'fake' }], inspectContent });
      try {
        // Two pieces, then the upstream holds the stream open: the request stays in flight.
        upstream.script({ kind: 'raw', chunks: [piece('The answer'), piece(' so far')] });
        const controller = new AbortController();
        const answer = await fetch(`${server.url}/v1/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({
            model: 'up-model',
            stream: true,
            messages: [
              { role: 'system', content: 'Be brief.' },
              { role: 'user', content: 'What is sluice?' },
            ],
          }),
          signal: controller.signal,
        });
        assert.equal(answer.status, 200);
        let shown: NonNullable<InspectSnapshot['requests']>['shown'][number] | undefined;
        await untilAsync(async () => {
          shown = (await snapshotAs(server.url, {})).requests!.shown[0];
          return shown?.tokens === 2;
        }, 'both pieces counted');
        if (inspectContent) assert.deepEqual([shown!.prompt, shown!.output], ['What is sluice?', 'The answer so far']);
        else assert.deepEqual([shown!.prompt, shown!.output], [null, null]);
        controller.abort();
      } finally {
        await server.shutdown(0);
        await upstream.close();
      }
    });
  }

  it('is refused with the inspector off, and parsed from --inspect-content / SLUICE_INSPECT_CONTENT', async () => {
    await assert.rejects(startServer({ port: 0, inspect: false, inspectContent: true }), /inspectContent/);
    assert.equal(serveOptions(['--inspect-content'], {}).inspectContent, true);
    assert.equal(serveOptions([], { SLUICE_INSPECT_CONTENT: '1' }).inspectContent, true);
    assert.equal(serveOptions([], {}).inspectContent, undefined);
  });
});
