/**
 * Graceful shutdown of the WebSocket token server (`drain`), open servers without
 * authentication, and its counters on `/metrics`.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { ScriptedWorker } from 'sluice/testing/ai';
import { attachTokenSocket, type TokenSocket, type TokenSocketEvent, type TokenSocketOptions } from '../../src/serve/ws-server.js';
import { CLOSE_CODES } from '../../src/serve/protocol.js';
import { SluiceMetrics } from '../../src/serve/metrics.js';
import { WsClient, until } from '../support/ws-client.js';

/**
 * Generates `max_tokens` tokens, except that a prompt starting with `hang` stops after
 * 3 tokens and waits until its signal aborts: a request that cannot finish by itself.
 */
const hangingWorker = () =>
  new ScriptedWorker({ name: 'hanging', inputTokens: 1, hang: { after: 3, when: (request) => request.prompt?.startsWith('hang') === true } });

interface Served {
  readonly server: Server;
  readonly port: number;
  readonly tokens: TokenSocket;
  close(): Promise<void>;
}

async function serve(options: TokenSocketOptions): Promise<Served> {
  const server = createServer((_, res) => res.writeHead(404).end());
  const tokens = attachTokenSocket(server, options);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    server,
    port: (server.address() as AddressInfo).port,
    tokens,
    close: async () => {
      tokens.close();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/** A client of the server on `port`. */
const open = (port: number, headers: Record<string, string> = {}) => WsClient.open(`ws://127.0.0.1:${port}/`, { headers });

describe('WebSocket drain (graceful shutdown)', () => {
  it('refuses new work, lets running requests finish, ends the rest with SHUTDOWN and closes with 1001', async () => {
    const worker = hangingWorker();
    const served = await serve({ worker });
    try {
      const client = await open(served.port);
      client.send({ type: 'generate', id: 'hang-1', prompt: 'hang on', parameters: { max_tokens: 100 } });
      client.send({ type: 'generate', id: 'hang-2', prompt: 'hang on', parameters: { max_tokens: 100 } });
      await until(() => client.frames.filter((f) => f.type === 'token').length >= 6, 'the hanging requests to start');
      // A request that finishes by itself during the drain.
      client.send({ type: 'generate', id: 'short', prompt: 'short', parameters: { max_tokens: 200 } });
      await until(() => served.tokens.stats().activeRequests === 3, 'three running requests');

      const draining = served.tokens.drain(300);
      assert.equal(served.tokens.draining, true);
      client.send({ type: 'generate', id: 'late', prompt: 'too late', parameters: { max_tokens: 5 } });
      await assert.rejects(open(served.port), (err: Error & { status?: number }) => err.status === 503);

      const again = served.tokens.drain(10);
      const report = await draining;
      assert.deepEqual(report, { running: 3, finished: 1, interrupted: 2 });
      assert.deepEqual(await again, report, 'a second drain while one runs gets the same report');
      assert.equal(await client.closed, 1001);
      assert.equal(client.end('short')?.type, 'done');
      for (const id of ['hang-1', 'hang-2']) {
        const end = client.end(id);
        assert.equal(end?.type, 'error');
        assert.equal(end.type === 'error' && end.code, 'SHUTDOWN');
      }
      const late = client.end('late');
      assert.equal(late?.type === 'error' && late.code, 'SHUTTING_DOWN');
      // Every request that started ended with exactly one terminal frame.
      for (const id of ['hang-1', 'hang-2', 'short', 'late'])
        assert.equal(client.frames.filter((f) => 'id' in f && f.id === id && f.type !== 'token').length, 1, id);
      assert.ok(worker.generations[0]!.signal!.aborted && worker.generations[1]!.signal!.aborted, 'the interrupted generations were aborted');
      const stats = served.tokens.stats();
      assert.equal(stats.interrupted, 2);
      assert.equal(stats.activeRequests, 0);
      await until(() => served.tokens.stats().timers === 0, 'no timer left');
    } finally {
      await served.close();
    }
  });

  it('refuses a browser during the drain with close 1013 (try again later) it can read, and other clients with HTTP 503', async () => {
    const events: TokenSocketEvent[] = [];
    const served = await serve({ worker: hangingWorker(), onEvent: (e) => events.push(e) });
    try {
      const client = await open(served.port);
      client.send({ type: 'generate', id: 'hang', prompt: 'hang on', parameters: { max_tokens: 100 } });
      await until(() => served.tokens.stats().activeRequests === 1, 'the running request');
      const draining = served.tokens.drain(60_000);

      const browser = await WsClient.open(`ws://127.0.0.1:${served.port}/`, { origin: `http://127.0.0.1:${served.port}` });
      const reason = new Promise<string>((resolve) => browser.ws.once('close', (_, data) => resolve(String(data))));
      assert.equal(await browser.closed, CLOSE_CODES.tryAgainLater);
      assert.equal(await reason, 'try again later: the server is shutting down');
      assert.deepEqual(browser.frames, [], 'a refused browser gets no hello');
      await assert.rejects(open(served.port), (err: Error & { status?: number }) => err.status === 503);
      assert.deepEqual(
        events.filter((e) => e.kind === 'upgrade-rejected'),
        [
          { kind: 'upgrade-rejected', status: 503, reason: 'the server is shutting down', closeCode: 1013 },
          { kind: 'upgrade-rejected', status: 503, reason: 'the server is shutting down' },
        ],
      );
      const stats = served.tokens.stats();
      assert.equal(stats.connections, 1, 'the refused browser never became a connection');
      assert.deepEqual(stats.upgradesRejected, { 400: 0, 401: 0, 403: 0, 503: 2 });

      // The drain still ends when the running request does.
      client.send({ type: 'cancel', id: 'hang' });
      assert.deepEqual(await draining, { running: 1, finished: 1, interrupted: 0 });
      assert.equal(await client.closed, 1001);
      await until(() => served.tokens.stats().timers === 0 && served.tokens.stats().connections === 0, 'nothing left');
    } finally {
      await served.close();
    }
  });

  it('with nothing running, resolves at once and closes the idle connections', async () => {
    const served = await serve({ worker: hangingWorker() });
    try {
      const client = await open(served.port);
      assert.deepEqual(await served.tokens.drain(60_000), { running: 0, finished: 0, interrupted: 0 });
      assert.equal(await client.closed, 1001);
    } finally {
      await served.close();
    }
  });
});

describe('WebSocket server without authenticate', () => {
  it('admits every connection as a tenant of its own ("anonymous-<n>"), ignoring any token: one cannot spend another\'s quota', async () => {
    const served = await serve({ worker: hangingWorker(), limits: { tenantConcurrent: 1 } });
    try {
      const a = await open(served.port);
      const b = await open(served.port, { authorization: 'Bearer whatever-token' });
      a.send({ type: 'generate', id: 'x', prompt: 'hang', parameters: { max_tokens: 10 } });
      await until(() => Object.values(served.tokens.stats().tenants).reduce((n, r) => n + r, 0) === 1, 'a to run one request');
      // a spent its quota of 1; b's is its own.
      b.send({ type: 'generate', id: 'y', prompt: 'ok', parameters: { max_tokens: 2 } });
      await until(() => b.end('y') !== undefined, 'b to be answered');
      assert.equal(b.end('y')?.type, 'done');
      a.send({ type: 'generate', id: 'z', prompt: 'ok', parameters: { max_tokens: 2 } });
      await until(() => a.end('z') !== undefined, 'the refusal of a second request on a');
      const refusal = a.end('z');
      assert.equal(refusal?.type === 'error' && refusal.code, 'TENANT_QUOTA');
      const tenants = [a, b].map((client) => client.frames[0]?.type === 'hello' && client.frames[0].tenant);
      assert.deepEqual(tenants, ['anonymous-1', 'anonymous-2'], 'the hello names the tenant');
    } finally {
      await served.close();
    }
  });
});

describe('WebSocket tenant request rate', () => {
  it("is one bucket across the tenant's connections; over it, TENANT_QUOTA says when to retry", async () => {
    const served = await serve({
      worker: hangingWorker(),
      limits: { tenantRate: { perSecond: 0.01, burst: 2 } },
      authenticate: () => ({ tenant: 'acme' }),
    });
    try {
      const a = await open(served.port, { authorization: 'Bearer acme-token-1' });
      const b = await open(served.port, { authorization: 'Bearer acme-token-2' });
      a.send({ type: 'generate', id: '1', prompt: 'ok', parameters: { max_tokens: 1 } });
      b.send({ type: 'generate', id: '2', prompt: 'ok', parameters: { max_tokens: 1 } });
      await until(() => a.end('1') !== undefined && b.end('2') !== undefined, 'the first two');
      b.send({ type: 'generate', id: '3', prompt: 'ok', parameters: { max_tokens: 1 } });
      await until(() => b.end('3') !== undefined, 'the third');
      assert.equal(a.end('1')?.type, 'done');
      assert.equal(b.end('2')?.type, 'done');
      const third = b.end('3');
      assert.equal(third?.type === 'error' && third.code, 'TENANT_QUOTA');
      assert.match(third?.type === 'error' ? third.message : '', /per second \(burst 2\); retry in \d+ ms/);
      assert.equal(served.tokens.stats().tenants.acme, undefined, 'a refused request holds no concurrency slot');
    } finally {
      await served.close();
    }
  });
});

describe('WebSocket counters on /metrics', () => {
  it('exports connections, requests by outcome and bad frames, read at scrape time', async () => {
    const metrics = new SluiceMetrics({ defaultMetrics: false });
    const served = await serve({ worker: hangingWorker(), metrics, name: 'chat' });
    try {
      const client = await open(served.port);
      client.send({ type: 'generate', id: 'a', prompt: 'ok', parameters: { max_tokens: 4 } });
      client.send('not json');
      await until(
        () => client.end('a') !== undefined && client.frames.some((f) => f.type === 'error' && f.code === 'INVALID_JSON'),
        'done and the bad-frame error',
      );
      const { body } = await metrics.scrape();
      assert.match(body, /^sluice_ws_connections\{server="chat"\} 1$/m);
      assert.match(body, /^sluice_ws_requests_started_total\{server="chat"\} 1$/m);
      assert.match(body, /^sluice_ws_requests_ended_total\{server="chat",outcome="completed"\} 1$/m);
      assert.match(body, /^sluice_ws_bad_frames_total\{server="chat"\} 1$/m);
      // The generation was observed too (time to first token, token usage).
      assert.match(body, /^gen_ai_client_token_usage_count\{gen_ai_operation_name="chat",gen_ai_request_model="hanging",gen_ai_token_type="output"\} 1$/m);
      client.ws.close();
      await client.closed;
      await until(() => served.tokens.stats().connections === 0, 'the connection to close');
      assert.match((await metrics.scrape()).body, /^sluice_ws_connections\{server="chat"\} 0$/m);
    } finally {
      metrics.close();
      await served.close();
    }
  });
});
