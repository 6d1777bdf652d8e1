/**
 * Gateway mode over WebSocket: an upstream's failure is judged as over HTTP (docs/serving.md, *One
 * judgement of every failure*) and the `error` frame says what the HTTP answer says — the client's
 * own mistake with the upstream's words, a refused key as `UPSTREAM_MISCONFIGURED` without them, a
 * rate limit or an open circuit with `retry_after_ms`, silence as `UPSTREAM_TIMEOUT` — never the
 * upstream's words for a failure that is not the client's. Against a scripted upstream on
 * loopback behind the real server; each case also asks over HTTP and compares.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, type RunningServer } from '../../src/serve/app.js';
import { FakeUpstream, type Script } from '../support/fake-upstream.js';
import { WsClient, until } from '../support/ws-client.js';

const inStream = (error: Record<string, unknown>): Script => ({ kind: 'raw', chunks: [`data: ${JSON.stringify({ error })}\n\n`], end: true });

/** A secret an upstream may echo back; no client may ever read it. */
const SECRET = 'sk-live-7f3a9c';

interface Case {
  readonly name: string;
  readonly script: Script;
  readonly status: number;
  readonly code: string;
  /** Words of the upstream the frame must carry; undefined: none of the upstream's words. */
  readonly keeps?: string;
  readonly retryAfter?: boolean;
}

const CASES: readonly Case[] = [
  {
    name: 'an in-stream 400, the client’s mistake',
    script: inStream({ message: 'messages[0] is malformed', type: 'invalid_request_error', param: 'messages', code: null }),
    status: 400,
    code: 'INVALID_REQUEST',
    keeps: 'messages[0] is malformed',
  },
  {
    name: 'an in-stream context_length_exceeded',
    script: inStream({ message: 'This model’s maximum context length is 8 tokens.', type: 'invalid_request_error', code: 'context_length_exceeded' }),
    status: 400,
    code: 'CONTEXT_LENGTH_EXCEEDED',
    keeps: 'maximum context length is 8 tokens',
  },
  {
    name: 'an in-stream 401, a refused key',
    script: inStream({ message: `Incorrect API key provided: ${SECRET}`, type: 'invalid_request_error', code: 'invalid_api_key' }),
    status: 502,
    code: 'UPSTREAM_MISCONFIGURED',
  },
  {
    name: 'an in-stream 429 without a Retry-After',
    script: inStream({ message: `Rate limit reached for organization ${SECRET}`, type: 'requests', code: 'rate_limit_exceeded' }),
    status: 429,
    code: 'RATE_LIMIT_EXCEEDED',
    retryAfter: true,
  },
  {
    name: 'an HTTP 429 without a Retry-After',
    script: { kind: 'status', status: 429, body: JSON.stringify({ error: { message: `slow down ${SECRET}`, type: 'requests' } }) },
    status: 429,
    code: 'RATE_LIMIT_EXCEEDED',
    retryAfter: true,
  },
  {
    name: 'an in-stream 500',
    script: inStream({ message: `internal trace at /srv/${SECRET}`, type: 'server_error' }),
    status: 502,
    code: 'UPSTREAM_ERROR',
  },
  { name: 'a silent upstream', script: { kind: 'stall' }, status: 504, code: 'UPSTREAM_TIMEOUT' },
];

describe('gateway over WebSocket: error frames judged as the HTTP answers are', () => {
  let upstream: FakeUpstream;
  let server: RunningServer;
  before(async () => {
    upstream = await FakeUpstream.start(['m']);
    server = await startServer({
      port: 0,
      upstreams: [{ baseUrl: upstream.url, name: 'up' }],
      gateway: { attempts: 1, baseDelay: 1, maxDelay: 5, idleTimeout: 150, breakerThreshold: 10_000 },
    });
  });
  after(async () => {
    await server?.shutdown(0);
    await upstream?.close();
  });

  for (const c of CASES) {
    it(`${c.name}: HTTP ${c.status}, frame ${c.code}`, async () => {
      upstream.clear().script(c.script);
      const http = await fetch(`${server.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hi' }] }),
      });
      const body = await http.text();
      assert.equal(http.status, c.status, body);
      assert.equal(http.headers.get('retry-after') !== null, c.retryAfter === true, `Retry-After: ${http.headers.get('retry-after')}`);

      upstream.clear().script(c.script);
      const ws = await WsClient.open(server.wsUrl);
      try {
        ws.send({ type: 'generate', id: 'q', model: 'm', prompt: 'hi' });
        await until(() => ws.end('q') !== undefined, 'the end of q');
        const frame = ws.end('q')!;
        assert.equal(frame.type, 'error', JSON.stringify(frame));
        if (frame.type !== 'error') return;
        assert.equal(frame.code, c.code, JSON.stringify(frame));
        assert.ok(!frame.message.includes(SECRET) && !body.includes(SECRET), `no upstream secret reaches a client: ${frame.message}`);
        if (c.keeps !== undefined) assert.match(frame.message, new RegExp(c.keeps.replace(/[[\]]/g, '\\$&')));
        assert.equal(frame.retry_after_ms !== undefined, c.retryAfter === true, JSON.stringify(frame));
        if (c.retryAfter === true) assert.equal(frame.retry_after_ms, Number(http.headers.get('retry-after')) * 1000);
      } finally {
        ws.ws.close();
      }
    });
  }
});
