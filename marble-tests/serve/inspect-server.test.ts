/**
 * The inspector's server side over real sockets on 127.0.0.1: its options, its feed (auth,
 * origins, conflation for a reader that stops reading), the cancel action across HTTP and
 * WebSocket, and nothing left behind once it closes.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, request as httpRequest, type IncomingMessage, type Server } from 'node:http';
import { connect } from 'node:net';
import type { AddressInfo } from 'node:net';
import OpenAI from 'openai';
import { lastValueFrom } from 'rxjs';
import { fromIterable } from '../../src/flow/sources.js';
import { stage } from '../../operators/stage.js';
import { activeIntrospector } from '../../src/flow/introspection.js';
import { InvalidOptionsError } from '../../src/core/errors.js';
import { ScriptedWorker } from 'sluice/testing/ai';
import { createHttpHandler } from '../../src/serve/http.js';
import { attachTokenSocket, type TokenSocket } from '../../src/serve/ws-server.js';
import { inspector, type Inspector } from '../../src/serve/inspect/inspector.js';
import { PipelineGraph } from '../../src/serve/inspect/pipeline-graph.js';
import { RequestRegistry } from '../../src/serve/inspect/requests.js';
import type { InspectSnapshot } from '../../src/serve/inspect/snapshot.js';
import { WsClient, until } from '../support/ws-client.js';

const TOKEN = 'inspect-secret-1';
const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** A model that writes one token every few ms until it is stopped: a long generation. */
const trickleWorker = () => new ScriptedWorker({ name: 'trickle', tokens: { repeat: 'x' }, delay: 3 });

/** GET/POST with headers; the status and body (the body not read for a stream: the caller gets the response). */
function call(url: string, init: { method?: string; headers?: Record<string, string> } = {}): Promise<{ status: number; headers: Headers; body: string }> {
  return fetch(url, { method: init.method ?? 'GET', headers: init.headers ?? {} }).then(async (res) => ({
    status: res.status,
    headers: res.headers,
    body: res.headers.get('content-type')?.startsWith('text/event-stream') ? (await res.body?.cancel(), '') : await res.text(),
  }));
}

/** The first snapshot of the feed. */
async function firstSnapshot(url: string, headers: Record<string, string>): Promise<InspectSnapshot> {
  const res = await fetch(url, { headers });
  assert.equal(res.status, 200);
  const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
  let text = '';
  while (!text.includes('\n\n')) text += (await reader.read()).value ?? '';
  await reader.cancel();
  const data = /^data: (.*)$/m.exec(text)![1]!;
  return JSON.parse(data) as InspectSnapshot;
}

describe('inspector(): options', () => {
  it('bad options fail at once, naming the field', () => {
    const bad = (options: Record<string, unknown>, field: RegExp) =>
      assert.throws(
        () => inspector(options as never),
        (err: unknown) => err instanceof InvalidOptionsError && field.test(err.message),
      );
    bad({ port: -1 }, /port/);
    bad({ token: 'short' }, /token.*8 characters/);
    bad({ host: '0.0.0.0' }, /token.*loopback/);
    bad({ interval: 5 }, /interval/);
    bad({ graph: {} }, /graph must be a PipelineGraph/);
    bad({ requests: [] }, /requests must be a RequestRegistry/);
    bad({ origins: ['not a url'] }, /origin/);
    bad({ prot: 1 }, /unknown option "prot"/);
    bad({ tenantTokens: { short: 'acme' } }, /tenantTokens: a tenant token must have at least 8 characters/);
    assert.throws(
      () => inspector({ tenantTokens: { 'sk-secret': '' } }),
      (err: unknown) => err instanceof InvalidOptionsError && /tenant names/.test(err.message) && !err.message.includes('sk-secret'),
      'an error never quotes a token',
    );
    bad({ token: TOKEN, tenantTokens: { [TOKEN]: 'acme' } }, /tenantTokens.*operator's token/);
  });
});

describe('inspector() with tenants’ tokens', () => {
  const ACME = 'acme-token-0001';
  const GLOBEX = 'globex-token-01';
  const requests = new RequestRegistry();
  let inspecting: Inspector;
  const cancelled: string[] = [];
  const add = (tenant: string) => {
    const handle = requests.add({ transport: 'http', model: 'm', tenant });
    handle.cancelWith(() => cancelled.push(handle.id));
    return handle;
  };
  const as = (token: string) => ({ authorization: `Bearer ${token}` });
  const cancel = (id: string, token: string) => fetch(`${inspecting.url}/requests/${id}/cancel`, { method: 'POST', headers: as(token) });

  before(async () => {
    inspecting = await inspector({ token: TOKEN, tenantTokens: { [ACME]: 'acme', [GLOBEX]: 'globex' }, requests, interval: 50 });
  });
  after(async () => {
    await inspecting.close();
  });

  it("a tenant's token sees and cancels only its tenant's requests; the operator's all; another token nothing", async () => {
    const [a1, a2, g1] = [add('acme'), add('acme'), add('globex')];
    const acme = await firstSnapshot(`${inspecting.url}/events`, as(ACME));
    assert.deepEqual(acme.viewer, { role: 'tenant', tenant: 'acme' });
    assert.deepEqual(
      acme.requests!.shown.map((r) => r.id),
      [a1.id, a2.id],
    );
    assert.equal((await firstSnapshot(`${inspecting.url}/events`, as(GLOBEX))).requests!.total, 1);
    assert.equal((await firstSnapshot(`${inspecting.url}/events`, as(TOKEN))).requests!.total, 3);
    assert.equal((await fetch(`${inspecting.url}/events`, { headers: as('not-a-known-token') })).status, 401);

    assert.equal((await cancel(g1.id, ACME)).status, 404, "another tenant's request reads as none");
    assert.deepEqual(cancelled, []);
    assert.equal((await cancel(a1.id, ACME)).status, 202);
    assert.equal((await cancel(g1.id, TOKEN)).status, 202);
    assert.deepEqual(cancelled, [a1.id, g1.id]);
    for (const handle of [a1, a2, g1]) handle.end();
  });
});

describe('the inspector feed and its guards', () => {
  let inspecting: Inspector;
  const auth = { authorization: `Bearer ${TOKEN}` };

  before(async () => {
    inspecting = await inspector({ token: TOKEN, origins: ['https://ops.example.com'], interval: 50 });
  });
  after(async () => {
    await inspecting.close();
  });

  it('serves the page without auth, under a strict CSP; the feed and actions need the token', async () => {
    const page = await call(inspecting.url);
    assert.equal(page.status, 200);
    assert.match(
      page.headers.get('content-security-policy')!,
      /^default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'$/,
    );
    assert.match(page.body, /<title>sluice inspector<\/title>/);
    const attempts: Record<string, string>[] = [{}, { authorization: 'Bearer wrong-token-xx' }, { authorization: TOKEN }];
    for (const headers of attempts) {
      const feed = await call(`${inspecting.url}/events`, { headers });
      assert.equal(feed.status, 401);
      assert.equal(feed.headers.get('www-authenticate'), 'Bearer');
      assert.equal(JSON.parse(feed.body).error.code, 'invalid_api_key');
      const cancel = await call(`${inspecting.url}/requests/r1/cancel`, { method: 'POST', headers });
      assert.equal(cancel.status, 401);
    }
    const snapshot = await firstSnapshot(`${inspecting.url}/events`, auth);
    assert.equal(snapshot.seq >= 1, true);
    assert.ok(Array.isArray(snapshot.graph.nodes));
    assert.equal(snapshot.requests, null, 'no registry given: no requests list');
    assert.equal(snapshot.sockets, null);
  });

  it('refuses a foreign origin before anything else, even with the token; a listed origin gets CORS', async () => {
    const evil = { origin: 'https://evil.example', ...auth };
    assert.equal((await call(`${inspecting.url}/events`, { headers: evil })).status, 403);
    assert.equal((await call(`${inspecting.url}/requests/r1/cancel`, { method: 'POST', headers: evil })).status, 403);
    assert.equal((await call(`${inspecting.url}/events`, { method: 'OPTIONS', headers: { origin: 'https://evil.example' } })).status, 403);
    const preflight = await call(`${inspecting.url}/events`, { method: 'OPTIONS', headers: { origin: 'https://ops.example.com' } });
    assert.equal(preflight.status, 204);
    assert.equal(preflight.headers.get('access-control-allow-origin'), 'https://ops.example.com');
    const listed = await call(`${inspecting.url}/events`, { headers: { origin: 'https://ops.example.com', ...auth } });
    assert.equal(listed.status, 200);
    assert.equal(listed.headers.get('access-control-allow-origin'), 'https://ops.example.com');
    // The page's own origin is this host.
    const own = await call(`${inspecting.url}/events`, { headers: { origin: new URL(inspecting.url).origin, ...auth } });
    assert.equal(own.status, 200);
    assert.equal(own.headers.get('access-control-allow-origin'), null);
  });

  it('an open inspector answers only requests addressed to a loopback host (DNS rebinding)', async () => {
    const open = await inspector({});
    try {
      const { port } = open.server.address() as AddressInfo;
      const status = await new Promise<number>((resolve, reject) => {
        httpRequest({ host: '127.0.0.1', port, path: '/inspect/events', headers: { host: `attacker.example:${port}` } }, (res) => {
          res.resume();
          resolve(res.statusCode!);
        })
          .on('error', reject)
          .end();
      });
      assert.equal(status, 403);
      assert.equal((await firstSnapshot(`${open.url}/events`, {})).graph.omitted, 0);
    } finally {
      await open.close();
    }
  });

  it('a reader that stops reading is sent nothing more than one snapshot: later ones are skipped, and it gets the newest when it reads again', async () => {
    // Many running stages make each snapshot large, so the socket buffers fill in a moment.
    let open: () => void = () => {};
    const gate = new Promise<void>((resolve) => (open = resolve));
    const held = Array.from({ length: 150 }, (_, i) => lastValueFrom(fromIterable([i]).pipe(stage(() => gate, { name: `held-stage-${i}` }))));
    const { port } = new URL(inspecting.url);
    const socket = connect(Number(port), '127.0.0.1');
    let received = '';
    socket.setEncoding('utf8');
    socket.on('data', (chunk: string) => (received += chunk));
    socket.write(`GET /inspect/events HTTP/1.1\r\nhost: 127.0.0.1:${port}\r\nauthorization: Bearer ${TOKEN}\r\n\r\n`);
    await until(() => received.includes('event: snapshot'), 'the first snapshot');
    socket.pause();
    try {
      await until(() => inspecting.feedStats().blocked === 1, 'the feed to find the paused reader blocked', 60_000);
      const message = Buffer.byteLength(received.slice(received.indexOf('event: snapshot')).split('\n\n')[0]!) + 2;
      const skippedAt = inspecting.feedStats().skipped;
      const queued: number[] = [];
      for (let look = 0; look < 10; look++) {
        await sleep(60);
        queued.push(inspecting.feedStats().maxQueued);
      }
      const stats = inspecting.feedStats();
      assert.ok(stats.skipped >= skippedAt + 5, `snapshots were skipped, not queued (${stats.skipped - skippedAt})`);
      // At most the one message whose write did not drain (snapshots vary a little in size).
      assert.ok(Math.max(...queued) <= message * 1.5, `queued ${Math.max(...queued)} bytes; one message is ${message}`);
      // Once it reads again it gets the state of now, not a backlog of the snapshots it missed.
      const times = () => [...received.matchAll(/^data: \{"seq":\d+,"at":(\d+)/gm)].map((m) => Number(m[1]));
      const resumedAt = Date.now();
      received = '';
      socket.resume();
      await until(() => times().some((at) => at >= resumedAt), 'a snapshot of now after reading again', 60_000);
    } finally {
      socket.destroy();
      open();
      await Promise.all(held);
    }
  });
});

describe('the feed keeps server memory bounded', () => {
  it('readers that never read hold at most one message each in the server, however many snapshots pass them by', async () => {
    const inspecting = await inspector({ interval: 50 });
    // Many running stages make each snapshot large, so the sockets' kernel buffers fill in a moment.
    let open: () => void = () => {};
    const gate = new Promise<void>((resolve) => (open = resolve));
    const held = Array.from({ length: 150 }, (_, i) => lastValueFrom(fromIterable([i]).pipe(stage(() => gate, { name: `never-read-stage-${i}` }))));
    const { port } = new URL(inspecting.url);
    const readers = Array.from({ length: 3 }, () => {
      const socket = connect(Number(port), '127.0.0.1');
      // Never read: not one byte of the answer is taken from the socket.
      socket.pause();
      socket.write(`GET /inspect/events HTTP/1.1\r\nhost: 127.0.0.1:${port}\r\n\r\n`);
      return socket;
    });
    try {
      await until(() => inspecting.feedStats().blocked === 3, 'every reader blocked', 60_000);
      const skippedAt = inspecting.feedStats().skipped;
      let queued = 0;
      // At least 20 more ticks for each reader: every one skipped, nothing more queued.
      while (inspecting.feedStats().skipped < skippedAt + 60) {
        queued = Math.max(queued, inspecting.feedStats().queued);
        await sleep(20);
      }
      const message = inspecting.feedStats().largestMessage;
      assert.ok(queued > 0, 'the blocked readers each hold their last message');
      // One message each, plus its HTTP chunk framing (a size line and two CRLFs).
      assert.ok(queued <= 3 * (message + 32), `queued ${queued} bytes for 3 readers; the largest message is ${message}`);
      assert.equal(inspecting.feedStats().readers, 3);
    } finally {
      for (const socket of readers) socket.destroy();
      open();
      await Promise.all(held);
      await inspecting.close();
    }
  });
});

describe('cancelling a running request from the inspector', () => {
  let server: Server;
  let sockets: TokenSocket;
  let inspecting: Inspector;
  let base: string;
  const requests = new RequestRegistry();

  before(async () => {
    const worker = trickleWorker();
    const handler = createHttpHandler({ worker, requests });
    server = createServer(handler);
    sockets = attachTokenSocket(server, { worker, requests, path: '/v1/ws' });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    inspecting = await inspector({ requests, sockets: () => sockets.clients(), interval: 50 });
  });
  after(async () => {
    await inspecting.close();
    sockets.close();
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });

  const cancel = (id: string) => call(`${inspecting.url}/requests/${id}/cancel`, { method: 'POST' });

  it('a WebSocket request ends with done, finish_reason abort, as a client cancel does', async () => {
    const client = await WsClient.open(`${base.replace('http', 'ws')}/v1/ws`);
    try {
      client.send({ type: 'generate', id: 'long-1', prompt: 'never shown' });
      await until(() => client.text('long-1').length > 3, 'tokens');
      const listed = (await firstSnapshot(`${inspecting.url}/events`, {})).requests!;
      assert.equal(listed.total, 1);
      const row = listed.shown[0]!;
      assert.deepEqual([row.transport, row.model, row.ref, row.cancellable], ['ws', 'trickle', '1:long-1', true]);
      assert.ok(row.tokens > 0 && row.ttftMs !== null);
      assert.ok(!JSON.stringify(listed).includes('never shown'), 'no prompt in the feed');
      const clients = (await firstSnapshot(`${inspecting.url}/events`, {})).sockets!;
      assert.equal(clients.total, 1);
      assert.equal(clients.shown[0]!.requests, 1);

      const answer = await cancel(row.id);
      assert.equal(answer.status, 202);
      await until(() => client.end('long-1') !== undefined, 'the end of the request');
      const end = client.end('long-1')!;
      assert.equal(end.type, 'done');
      assert.equal(end.type === 'done' && end.finish_reason, 'abort');
      assert.equal(requests.size, 0);
      assert.equal((await cancel(row.id)).status, 404, 'an ended request cannot be cancelled again');
      assert.equal(sockets.stats().cancelled, 1);
    } finally {
      client.ws.close();
      await client.closed;
    }
  });

  it('a streamed HTTP completion ends with a request_cancelled error event and [DONE]; a whole one with 409', async () => {
    const res = await fetch(`${base}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'trickle', stream: true, messages: [{ role: 'user', content: 'hi' }] }),
    });
    assert.equal(res.status, 200);
    const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
    let body = '';
    await until(() => requests.size === 1, 'the completion to be listed');
    const id = requests.page(1).shown[0]!.id;
    body += (await reader.read()).value ?? '';
    assert.equal((await cancel(id)).status, 202);
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      body += value;
    }
    assert.match(body, /"code":"request_cancelled"/);
    assert.match(body, /data: \[DONE\]\n\n$/);
    assert.equal(requests.size, 0);

    const whole = fetch(`${base}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'trickle', messages: [{ role: 'user', content: 'hi' }] }),
    });
    await until(() => requests.size === 1, 'the completion to be listed');
    await until(() => requests.page(1).shown[0]!.tokens > 2, 'tokens');
    assert.equal((await cancel(requests.page(1).shown[0]!.id)).status, 202);
    const answer = await whole;
    assert.equal(answer.status, 409);
    assert.equal(answer.headers.get('x-should-retry'), 'false');
    assert.equal(((await answer.json()) as { error: { code: string } }).error.code, 'request_cancelled');
  });

  it('the OpenAI SDK, with its retries on, takes a cancelled whole completion as final: one request, an APIError 409 request_cancelled', async () => {
    let posts = 0;
    const count = (req: IncomingMessage) => void (req.method === 'POST' && posts++);
    server.on('request', count);
    // Were the SDK to retry, each retry is cancelled too, so the test ends and counts them rather than hanging.
    const retriesCancelled = setInterval(() => {
      if (posts > 1) for (const row of requests.page(10).shown) if (row.tokens > 0) requests.cancel(row.id);
    }, 10);
    try {
      const sdk = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 2 });
      const answer = sdk.chat.completions.create({ model: 'trickle', messages: [{ role: 'user', content: 'hi' }] }).then(
        () => undefined,
        (err: unknown) => err,
      );
      await until(() => requests.size === 1 && requests.page(1).shown[0]!.tokens > 2, 'tokens');
      assert.equal((await cancel(requests.page(1).shown[0]!.id)).status, 202);
      const error = await answer;
      assert.ok(error instanceof OpenAI.APIError, String(error));
      assert.equal(error.status, 409);
      assert.equal(error.code, 'request_cancelled');
      assert.equal(posts, 1, 'the SDK did not send it again');
    } finally {
      clearInterval(retriesCancelled);
      server.off('request', count);
    }
  });

  it('an unknown id is 404; a GET on the action is 405', async () => {
    assert.equal((await cancel('r999999')).status, 404);
    assert.equal((await call(`${inspecting.url}/requests/r1/cancel`)).status, 405);
  });
});

describe('the inspector leaves nothing behind', () => {
  it('after close: no hook, no timer, no feed; a given graph is left running for its owner', async () => {
    const timers = () => process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length;
    const timersBefore = timers();
    const hookBefore = activeIntrospector();
    const own = await inspector({ interval: 50 });
    assert.notEqual(activeIntrospector(), hookBefore);
    const snapshot = firstSnapshot(`${own.url}/events`, {});
    await snapshot;
    // A reader still connected when it closes: its stream is ended too.
    const res = await fetch(`${own.url}/events`);
    const reader = res.body!.getReader();
    await reader.read();
    assert.equal(own.feedStats().readers >= 1, true);
    await own.close();
    assert.equal((await reader.read().catch(() => ({ done: true }))).done, true);
    assert.equal(own.feedStats().ticking, false);
    assert.equal(own.graph.running, false);
    assert.equal(activeIntrospector(), hookBefore);
    await until(() => timers() <= timersBefore, 'its timers to be gone');

    const graph = new PipelineGraph({ interval: 50 }).start();
    const given = await inspector({ graph });
    await given.close();
    assert.equal(graph.running, true, "the owner's graph keeps running");
    graph.stop();
  });
});
