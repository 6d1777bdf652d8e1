/**
 * Limits that hold across transports: a tenant's requests are counted together over HTTP and
 * WebSocket; on an open server each WebSocket connection and each HTTP peer is a tenant of its
 * own. Served in gateway mode against a scripted upstream that holds every request, so requests
 * stay running as long as the test needs.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, type RunningServer, type ServeOptions } from '../../src/serve/app.js';
import type { RequestLogEntry } from '../../src/serve/request-log.js';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createHttpHandler } from '../../src/serve/http.js';
import { TenantQuotas } from '../../src/serve/tenant-quotas.js';
import { ScriptedWorker } from 'sluice/testing/ai';
import { FakeUpstream } from '../support/fake-upstream.js';
import { WsClient, until } from '../support/ws-client.js';

/** A gateway-mode server in front of a fresh scripted upstream serving model `m`; `close` stops both. */
async function gatewayOnFake(
  options: Omit<ServeOptions, 'port' | 'upstreams'> = {},
): Promise<{ upstream: FakeUpstream; server: RunningServer; close(): Promise<void> }> {
  const upstream = await FakeUpstream.start(['m']);
  const server = await startServer({ ...options, port: 0, upstreams: [{ baseUrl: upstream.url, name: 'fake' }] });
  return {
    upstream,
    server,
    close: async () => {
      await server.shutdown(0);
      await upstream.close();
    },
  };
}

function completion(url: string, headers: Record<string, string>, signal: AbortSignal): Promise<Response> {
  return fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model: 'm', stream: true, messages: [{ role: 'user', content: 'hi' }] }),
    signal,
  });
}

describe('tenant limits over HTTP, shared with the WebSocket server', () => {
  let upstream: FakeUpstream;
  let server: RunningServer;
  const acme = { authorization: 'Bearer acme-token-1' };

  before(async () => {
    upstream = await FakeUpstream.start(['m']);
    server = await startServer({
      port: 0,
      tokens: { 'acme-token-1': 'acme', 'globex-token-1': 'globex' },
      limits: { tenantConcurrent: 2 },
      upstreams: [{ baseUrl: upstream.url, name: 'fake' }],
    });
  });
  after(async () => {
    await server?.shutdown(0);
    await upstream?.close();
  });

  it('--tenant-concurrent 2: of ten concurrent completions two run, eight get 429 tenant_quota; WebSocket counts against the same quota', async () => {
    upstream.script({ kind: 'stall' }, { kind: 'stall' });
    const controller = new AbortController();
    // The two admitted hold their status line until a first token, which never comes; the others are answered at once.
    const answers: Response[] = [];
    const all = Array.from({ length: 10 }, () =>
      completion(server.url, acme, controller.signal).then(
        (a) => void answers.push(a),
        () => undefined,
      ),
    );
    await until(() => answers.length === 8 && upstream.served.length === 2, 'eight answers, and the two admitted to reach the upstream');
    assert.deepEqual(
      answers.map((a) => a.status),
      Array(8).fill(429),
    );
    assert.equal(((await answers[0]!.json()) as { error: { code: string } }).error.code, 'tenant_quota');
    assert.equal(server.stats().httpInFlight, 2);

    const ws = await WsClient.open(server.wsUrl, { headers: acme });
    try {
      ws.send({ type: 'generate', id: 'w', model: 'm', prompt: 'hi' });
      await until(() => ws.end('w') !== undefined, 'the WebSocket refusal');
      const end = ws.end('w');
      assert.equal(end?.type === 'error' && end.code, 'TENANT_QUOTA');
    } finally {
      ws.ws.close();
    }
    // Another tenant is not held by acme's quota.
    upstream.script({ kind: 'stream', pieces: ['ok'] });
    const globex = await completion(server.url, { authorization: 'Bearer globex-token-1' }, controller.signal);
    assert.equal(globex.status, 200);
    await globex.text();

    controller.abort();
    await Promise.all(all);
    await until(() => server.stats().httpInFlight === 0, 'the held completions to end');
    // The slots came back.
    upstream.script({ kind: 'stream', pieces: ['again'] });
    const again = await completion(server.url, acme, new AbortController().signal);
    assert.equal(again.status, 200);
    await again.text();
  });
});

describe('limits on an open server', () => {
  let upstream: FakeUpstream;
  let server: RunningServer;

  before(async () => {
    upstream = await FakeUpstream.start(['m']);
    server = await startServer({ port: 0, limits: { tenantConcurrent: 1, maxConcurrent: 4 }, upstreams: [{ baseUrl: upstream.url, name: 'fake' }] });
  });
  after(async () => {
    await server?.shutdown(0);
    await upstream?.close();
  });

  it('each WebSocket connection is a tenant of its own: one client running its quota does not refuse another', async () => {
    upstream.script({ kind: 'stall' }, { kind: 'stream', pieces: ['b', ' runs'] });
    const a = await WsClient.open(server.wsUrl);
    const b = await WsClient.open(server.wsUrl);
    try {
      a.send({ type: 'generate', id: 'a1', model: 'm', prompt: 'hi' });
      await until(() => upstream.served.length === 1, 'a to hold a request');
      b.send({ type: 'generate', id: 'b1', model: 'm', prompt: 'hi' });
      await until(() => b.end('b1') !== undefined, 'b to be answered');
      assert.equal(b.end('b1')?.type, 'done');
      a.send({ type: 'generate', id: 'a2', model: 'm', prompt: 'hi' });
      await until(() => a.end('a2') !== undefined, 'a to be refused its second');
      const refusal = a.end('a2');
      assert.equal(refusal?.type === 'error' && refusal.code, 'TENANT_QUOTA');
    } finally {
      a.ws.close();
      b.ws.close();
    }
  });

  it('an HTTP peer is a tenant of its own, apart from the WebSocket connections', async () => {
    await until(() => server.stats().ws.activeRequests === 0, 'the previous test to end');
    upstream.script({ kind: 'stall' }, { kind: 'stream', pieces: ['ws', ' runs'] });
    const controller = new AbortController();
    // Its status line waits for a first token that never comes: the request is held, in flight.
    const held = completion(server.url, {}, controller.signal).catch(() => undefined);
    await until(() => server.stats().httpInFlight === 1, 'the first request to be admitted');
    const second = await completion(server.url, {}, controller.signal);
    assert.equal(second.status, 429, 'the peer has its one request running');
    const ws = await WsClient.open(server.wsUrl);
    try {
      ws.send({ type: 'generate', id: 'w', model: 'm', prompt: 'hi' });
      await until(() => ws.end('w') !== undefined, 'the WebSocket request');
      assert.equal(ws.end('w')?.type, 'done');
    } finally {
      ws.ws.close();
      controller.abort();
      await held;
    }
  });
});

describe('drain a load balancer can see', () => {
  it('while running streams finish, the server keeps listening: /readyz 503, new completions and upgrades 503 with Retry-After; then it closes', async () => {
    const { upstream, server, close } = await gatewayOnFake();
    try {
      upstream.script({ kind: 'stream', pieces: Array.from({ length: 15 }, (_, i) => `p${i} `), everyMs: 100 });
      const running = await completion(server.url, {}, new AbortController().signal);
      assert.equal(running.status, 200);
      const body = running.text();
      const stopping = server.shutdown(10_000);
      await until(() => server.stats().httpInFlight === 1, 'the drain to begin');
      const ready = await fetch(`${server.url}/readyz`);
      assert.equal(ready.status, 503, 'the probe is answered during the drain, not refused');
      assert.deepEqual(await ready.json(), { status: 'draining' });
      const late = await completion(server.url, {}, new AbortController().signal);
      assert.equal(late.status, 503);
      assert.ok(Number(late.headers.get('retry-after')) >= 1, 'a late completion is told when to retry');
      assert.equal(((await late.json()) as { error: { code: string } }).error.code, 'server_shutting_down');
      const upgrade = await WsClient.open(server.wsUrl).then(
        () => undefined,
        (err: { status?: number; headers?: Record<string, string> }) => err,
      );
      assert.equal(upgrade?.status, 503);
      // The running stream finishes whole.
      const text = await body;
      assert.match(text, /p14 /);
      assert.match(text, /"finish_reason":"stop"/);
      await stopping;
      await assert.rejects(fetch(`${server.url}/healthz`), 'closed once drained');
    } finally {
      await close();
    }
  });
});

describe('serving metrics a vLLM user recognises', () => {
  it('time to first token, inter-token latency, end-to-end, queue time, running and waiting, prompt tokens — per model', async () => {
    const { upstream, server, close } = await gatewayOnFake();
    const value = async (name: string): Promise<number> => {
      const text = await (await fetch(`${server.url}/metrics`)).text();
      const line = text.split('\n').find((l) => l.startsWith(`${name}{model_name="m"} `));
      return line === undefined ? 0 : Number(line.split(' ').at(-1));
    };
    try {
      upstream.script({ kind: 'stall' });
      const controller = new AbortController();
      const held = completion(server.url, {}, controller.signal).catch(() => undefined);
      await until(() => upstream.served.length === 1, 'the request to reach the upstream');
      assert.equal(await value('sluice_num_requests_waiting'), 1, 'admitted, no token yet: waiting');
      assert.equal(await value('sluice_num_requests_running'), 0);
      controller.abort();
      await held;
      await until(() => server.stats().httpInFlight === 0, 'the held request to end');
      assert.equal(await value('sluice_num_requests_waiting'), 0);

      const names = [
        'sluice_time_to_first_token_seconds_count',
        'sluice_inter_token_latency_seconds_count',
        'sluice_e2e_request_latency_seconds_count',
        'sluice_request_queue_time_seconds_count',
        'sluice_prompt_tokens_total',
      ];
      const before = await Promise.all(names.map(value));
      upstream.script({ kind: 'stream', pieces: ['a', 'b', 'c', 'd', 'e'] });
      const answer = await completion(server.url, {}, new AbortController().signal);
      await answer.text();
      const after = await Promise.all(names.map(value));
      // 5 tokens: one first, four gaps; the fake reports 7 prompt tokens.
      assert.deepEqual(
        after.map((n, i) => n - before[i]!),
        [1, 4, 1, 1, 7],
      );
      assert.equal(await value('sluice_num_requests_running'), 0);
    } finally {
      await close();
    }
  });
});

describe('request log', () => {
  it('one entry per request, HTTP and WebSocket, with outcome, tokens, timings and causes — never a prompt or a token', async () => {
    const entries: RequestLogEntry[] = [];
    const { upstream, server, close } = await gatewayOnFake({ gateway: { attempts: 1, baseDelay: 1 }, requestLog: (e) => entries.push(e) });
    const ask = (body: Record<string, unknown>) =>
      fetch(`${server.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) }).then(
        async (r) => [r.status, await r.text()] as const,
      );
    try {
      upstream.script({ kind: 'stream', pieces: ['TOKEN-TEXT-1', 'TOKEN-TEXT-2'] });
      assert.equal((await ask({ model: 'm', stream: true, messages: [{ role: 'user', content: 'SECRET-PROMPT-1' }] }))[0], 200);
      assert.equal((await ask({ model: 'm', messages: [{ role: 'user', content: 'SECRET-PROMPT-2' }], temperature: 9 }))[0], 400);
      upstream.script({ kind: 'status', status: 500 });
      assert.equal((await ask({ model: 'm', messages: [{ role: 'user', content: 'SECRET-PROMPT-3' }] }))[0], 502);
      const ws = await WsClient.open(server.wsUrl);
      try {
        upstream.script({ kind: 'stream', pieces: ['TOKEN-TEXT-3'] });
        ws.send({ type: 'generate', id: 'w1', model: 'm', prompt: 'SECRET-PROMPT-4' });
        ws.send({ type: 'generate', id: 'w2', model: 'nope', prompt: 'SECRET-PROMPT-5' });
        await until(() => ws.end('w1') !== undefined && ws.end('w2') !== undefined, 'both ends');
      } finally {
        ws.ws.close();
      }
      await until(() => entries.length >= 5, 'five entries');
      const [completed, invalid, failed] = entries.filter((e) => e.transport === 'http');
      assert.equal(completed?.outcome, 'completed');
      assert.match(completed!.id, /^chatcmpl-/);
      assert.equal(completed!.model, 'm');
      assert.equal(completed!.status, 200);
      assert.equal(completed!.outputTokens, 2);
      assert.equal(completed!.inputTokens, 7);
      assert.ok(completed!.ttftMs !== undefined && completed!.durationMs >= completed!.ttftMs);
      assert.match(completed!.tenant ?? '', /^anonymous-/);
      assert.deepEqual([invalid?.outcome, invalid?.status, invalid?.error?.code], ['refused', 400, 'invalid_value']);
      assert.deepEqual([failed?.outcome, failed?.status], ['failed', 502]);
      assert.match(failed!.error?.code ?? '', /WORK_FAILED|HTTP_STATUS|FALLBACK/);
      assert.match(JSON.stringify(failed!.error), /500/, 'the cause names the upstream status');
      const wsEntries = entries.filter((e) => e.transport === 'ws');
      assert.deepEqual(wsEntries.map((e) => [e.id.split(':')[1], e.outcome]).sort(), [
        ['w1', 'completed'],
        ['w2', 'refused'],
      ]);
      const text = JSON.stringify(entries);
      assert.doesNotMatch(text, /SECRET-PROMPT|TOKEN-TEXT/, 'no prompt or token text in the log');
    } finally {
      await close();
    }
  });
});

describe('CORS for the listed origins (--origin)', () => {
  it('answers a preflight from an allowed origin and marks its responses; another origin gets no CORS headers', async () => {
    const allowed = 'https://app.example.com';
    const { server, close } = await gatewayOnFake({ origins: [allowed] });
    try {
      const preflight = (origin: string) =>
        fetch(`${server.url}/v1/chat/completions`, {
          method: 'OPTIONS',
          headers: { origin, 'access-control-request-method': 'POST', 'access-control-request-headers': 'authorization, content-type, x-stainless-os' },
        });
      const ok = await preflight(allowed);
      assert.equal(ok.status, 204);
      assert.equal(ok.headers.get('access-control-allow-origin'), allowed);
      assert.match(ok.headers.get('access-control-allow-methods') ?? '', /POST/);
      assert.match(ok.headers.get('access-control-allow-headers') ?? '', /x-stainless-os/);
      assert.match(ok.headers.get('vary') ?? '', /Origin/);
      const refused = await preflight('https://evil.example.com');
      assert.equal(refused.status, 403);
      assert.equal(refused.headers.get('access-control-allow-origin'), null);

      const answer = await fetch(`${server.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { origin: allowed, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hi' }] }),
      });
      assert.equal(answer.status, 200);
      assert.equal(answer.headers.get('access-control-allow-origin'), allowed);
      assert.match(answer.headers.get('access-control-expose-headers') ?? '', /retry-after/i);
      await answer.text();
      const foreign = await fetch(`${server.url}/v1/models`, { headers: { origin: 'https://evil.example.com' } });
      assert.equal(foreign.headers.get('access-control-allow-origin'), null, 'a page from another origin cannot read the answer');
    } finally {
      await close();
    }
  });
});

describe('tenant limits on /v1/embeddings', () => {
  it('an embeddings request holds a slot of its tenant like a completion, and is logged', async () => {
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const entries: RequestLogEntry[] = [];
    const handler = createHttpHandler({
      worker: new ScriptedWorker({ name: 'unused', tokens: [] }),
      embeddings: { slow: { embed: async (texts) => (await gate, { vectors: texts.map(() => Float32Array.of(1, 0)), tokens: texts.length }) } },
      tenant: () => 'acme',
      tenantQuotas: new TenantQuotas({ tenantConcurrent: 1, tenantRate: { perSecond: 100, burst: 100 } }),
      requestLog: (e) => entries.push(e),
    });
    const server = createServer(handler);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1/embeddings`;
    const ask = () => fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'slow', input: 'x' }) });
    try {
      const first = ask();
      await new Promise((resolve) => setTimeout(resolve, 50));
      const second = await ask();
      assert.equal(second.status, 429);
      release();
      assert.equal((await first).status, 200);
      assert.equal((await ask()).status, 200, 'the slot came back');
      assert.deepEqual(
        entries.map((e) => [e.outcome, e.status]),
        [
          ['refused', 429],
          ['completed', 200],
          ['completed', 200],
        ],
      );
    } finally {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  });
});

describe('x-request-id', () => {
  it('every API answer carries one, a completion its own id, and it is the id of the request’s log line (refusals too)', async () => {
    const entries: RequestLogEntry[] = [];
    const handler = createHttpHandler({
      worker: new ScriptedWorker({ name: 'echo', tokens: ['a', 'b'] }),
      requestLog: (e) => entries.push(e),
    });
    const server = createServer(handler);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    const chat = (body: unknown) =>
      fetch(`${base}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
    try {
      const done = await chat({ model: 'echo', messages: [{ role: 'user', content: 'hi' }] });
      assert.equal(done.status, 200);
      const answer = (await done.json()) as { id: string };
      assert.equal(done.headers.get('x-request-id'), answer.id);
      const refused = await chat({ model: 'echo', messages: [] });
      assert.equal(refused.status, 400);
      await refused.text();
      const models = await fetch(`${base}/v1/models`);
      await models.text();
      const ids = [done, refused, models].map((r) => r.headers.get('x-request-id'));
      assert.match(ids[0]!, /^chatcmpl-/);
      assert.match(ids[2]!, /^req-/);
      assert.equal(new Set(ids).size, 3, 'one id per request');
      await until(() => entries.length === 2, 'both log lines');
      assert.deepEqual(
        entries.map((e) => [e.id, e.outcome]),
        [
          [ids[0], 'completed'],
          [ids[1], 'refused'],
        ],
      );
      assert.equal((await fetch(`${base}/healthz`)).headers.get('x-request-id'), null, 'not on the probes');
    } finally {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  });
});
