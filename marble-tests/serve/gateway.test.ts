/**
 * Gateway mode: `startServer({ upstreams })` serving the models of OpenAI-compatible
 * servers on loopback — a scripted fake (stalls, drops, 429/500, counts what it was made to
 * produce) and another sluice server — through the official `openai` client and raw HTTP.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { request as httpRequest, type IncomingMessage } from 'node:http';
import OpenAI from 'openai';
import { VirtualTimeScheduler } from 'rxjs';
import { eventually } from '../../src/testing/index.js';
import { startServer, type RunningServer } from '../../src/serve/app.js';
import { Gateway, UpstreamDiscoveryError } from '../../src/ai/inference/gateway.js';
import { parseUpstream, serveOptions } from '../../src/cli.js';
import { CliProcess } from '../support/cli-process.js';
import { FakeUpstream } from '../support/fake-upstream.js';
import { WsClient as Client, until } from '../support/ws-client.js';

const FAST = { baseDelay: 20, maxDelay: 100, idleTimeout: 400, breakerCooldown: 60_000 } as const;

async function post(
  url: string,
  body: unknown,
  headers: Record<string, string> = {},
): Promise<{ status: number; headers: IncomingMessage['headers']; text: string }> {
  const response = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
  return { status: response.status, headers: Object.fromEntries(response.headers), text: await response.text() };
}

/** Waits until `read()` stops changing over `still` checks `everyMs` apart; returns its value. */
async function quiescent(read: () => number, still = 5, everyMs = 100): Promise<number> {
  let last = read();
  for (let same = 0; same < still; ) {
    await new Promise((resolve) => setTimeout(resolve, everyMs));
    const now = read();
    same = now === last ? same + 1 : 0;
    last = now;
  }
  return last;
}

/** The `data:` payloads of an SSE body, `[DONE]` left out. */
function events(text: string): Record<string, unknown>[] {
  return text
    .split('\n\n')
    .map((block) => block.replace(/^data: /, ''))
    .filter((data) => data !== '' && data !== '[DONE]')
    .map((data) => JSON.parse(data) as Record<string, unknown>);
}

describe('gateway mode against a scripted upstream', () => {
  let a: FakeUpstream;
  let b: FakeUpstream;
  let gateway: RunningServer;
  let client: OpenAI;

  before(async () => {
    a = await FakeUpstream.start(['up-model']);
    b = await FakeUpstream.start(['up-model']);
    gateway = await startServer({
      port: 0,
      upstreams: [
        { baseUrl: a.url, name: 'a', apiKey: 'sk-upstream-a-secret' },
        { baseUrl: b.url, name: 'b' },
      ],
      gateway: { ...FAST, breakerThreshold: 50 },
    });
    client = new OpenAI({ baseURL: `${gateway.url}/v1`, apiKey: 'unused', maxRetries: 0 });
  });
  after(async () => {
    await gateway?.shutdown(0);
    await a?.close();
    await b?.close();
  });

  it('lists the upstream models; models.retrieve() finds one', async () => {
    const list = await client.models.list();
    assert.deepEqual(
      list.data.map((m) => m.id),
      ['up-model'],
    );
    assert.equal((await client.models.retrieve('up-model')).id, 'up-model');
    assert.equal(gateway.stats().pool, undefined, 'no model runs in the gateway');
  });

  it('forwards tools, tool_choice, response_format, raw messages and unknown vendor fields untouched, with the upstream key', async () => {
    const tools = [
      {
        type: 'function',
        function: { name: 'weather', description: 'Weather of a city', parameters: { type: 'object', properties: { city: { type: 'string' } } } },
      },
    ];
    const messages = [
      { role: 'user', content: [{ type: 'text', text: 'Weather in Oslo?' }] },
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'weather', arguments: '{"city":"Oslo"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: 'sunny' },
    ];
    const body = {
      model: 'up-model',
      messages,
      tools,
      tool_choice: 'auto',
      response_format: { type: 'json_object' },
      logit_bias: { '50256': -100 },
      top_k: 20,
      chat_template_kwargs: { enable_thinking: false },
      // Refused for the models served here; the upstream's to decide.
      logprobs: true,
      top_logprobs: 2,
      modalities: ['text', 'audio'],
      stream: true,
    };
    const answer = await post(gateway.url, body);
    assert.equal(answer.status, 200, answer.text);
    const sent = a.last.body;
    const forwarded = [
      'messages',
      'tools',
      'tool_choice',
      'response_format',
      'logit_bias',
      'top_k',
      'chat_template_kwargs',
      'logprobs',
      'top_logprobs',
      'modalities',
    ] as const;
    for (const key of forwarded) {
      assert.deepEqual(sent[key], body[key], key);
    }
    assert.equal(sent.model, 'up-model');
    assert.equal(sent.stream, true);
    assert.deepEqual(sent.stream_options, { include_usage: true });
    assert.equal(a.last.headers.authorization, 'Bearer sk-upstream-a-secret');
  });

  it('streams tool-call deltas to the official client, and a whole answer gathers them with finish_reason tool_calls', async () => {
    const deltas = [
      { role: 'assistant', content: null, tool_calls: [{ index: 0, id: 'call_9', type: 'function', function: { name: 'weather', arguments: '' } }] },
      { tool_calls: [{ index: 0, function: { arguments: '{"city":' } }] },
      { tool_calls: [{ index: 0, function: { arguments: '"Oslo"}' } }] },
    ];
    a.script({ kind: 'stream', deltas, finish: 'tool_calls' });
    const stream = await client.chat.completions.create({
      model: 'up-model',
      messages: [{ role: 'user', content: 'Weather in Oslo?' }],
      tools: [{ type: 'function', function: { name: 'weather', parameters: { type: 'object' } } }],
      stream: true,
    });
    let args = '';
    let name = '';
    let finish: string | null = null;
    for await (const chunk of stream) {
      const choice = chunk.choices[0];
      for (const call of choice?.delta.tool_calls ?? []) {
        name += call.function?.name ?? '';
        args += call.function?.arguments ?? '';
      }
      finish = choice?.finish_reason ?? finish;
    }
    assert.equal(name, 'weather');
    assert.equal(args, '{"city":"Oslo"}');
    assert.equal(finish, 'tool_calls');

    a.script({ kind: 'stream', deltas, finish: 'tool_calls' });
    const whole = await client.chat.completions.create({ model: 'up-model', messages: [{ role: 'user', content: 'Weather in Oslo?' }] });
    const message = whole.choices[0]!.message;
    assert.equal(whole.choices[0]!.finish_reason, 'tool_calls');
    assert.equal(message.content, null);
    assert.deepEqual(message.tool_calls, [{ id: 'call_9', type: 'function', function: { name: 'weather', arguments: '{"city":"Oslo"}' } }]);
  });

  it('retries a 429 after its Retry-After, and a 500, before the first token: the client sees one clean answer', async () => {
    const before = a.served.length;
    a.script(
      { kind: 'status', status: 429, headers: { 'retry-after-ms': '300' } },
      { kind: 'status', status: 500 },
      { kind: 'stream', pieces: ['after', ' retries'] },
    );
    const started = performance.now();
    const answer = await client.chat.completions.create({ model: 'up-model', messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(answer.choices[0]!.message.content, 'after retries');
    assert.equal(a.served.length - before, 3, 'three attempts on the first upstream');
    assert.ok(performance.now() - started >= 300, 'the retry waited for Retry-After');
  });

  it('falls back to the next upstream when the first keeps failing before its first token', async () => {
    const beforeB = b.served.length;
    a.script({ kind: 'status', status: 503 }, { kind: 'status', status: 503 }, { kind: 'status', status: 503 });
    b.script({ kind: 'stream', pieces: ['from', ' b'] });
    const answer = await client.chat.completions.create({ model: 'up-model', messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(answer.choices[0]!.message.content, 'from b');
    assert.equal(b.served.length - beforeB, 1);
  });

  it('a stalled upstream (no status line) times out, is retried, then falls back', async () => {
    a.script({ kind: 'stall' }, { kind: 'stall' }, { kind: 'stall' });
    b.script({ kind: 'stream', pieces: ['b', ' answers'] });
    const answer = await client.chat.completions.create({ model: 'up-model', messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(answer.choices[0]!.message.content, 'b answers');
    // Each stalled attempt was aborted: its connection is closed, not left hanging.
    await eventually(() =>
      assert.ok(
        a.served.slice(-3).every((s) => s.closed),
        'the last three upstream requests closed',
      ),
    );
  });

  it('a drop after the first token is not retried: the stream ends with an error event, and no answer is spliced', async () => {
    const beforeA = a.served.length;
    const beforeB = b.served.length;
    a.script({ kind: 'drop', after: 2 });
    const answer = await post(gateway.url, { model: 'up-model', messages: [{ role: 'user', content: 'hi' }], stream: true });
    const got = events(answer.text);
    const error = got.find((e) => 'error' in e) as { error: { code: string } } | undefined;
    assert.ok(error, `an error event: ${answer.text}`);
    assert.equal(error.error.code, 'upstream_error');
    assert.equal(a.served.length - beforeA, 1, 'not retried');
    assert.equal(b.served.length - beforeB, 0, 'no fallback after a token');
  });

  it("a 400 from the upstream reaches the client as the upstream's 400, without retry or fallback", async () => {
    const beforeA = a.served.length;
    const beforeB = b.served.length;
    a.script({
      kind: 'status',
      status: 400,
      body: JSON.stringify({ error: { message: 'tools[0] is invalid', type: 'invalid_request_error', param: 'tools', code: 'bad_tools' } }),
    });
    const answer = await post(gateway.url, { model: 'up-model', messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(answer.status, 400);
    assert.deepEqual(JSON.parse(answer.text), { error: { message: 'tools[0] is invalid', type: 'invalid_request_error', param: 'tools', code: 'bad_tools' } });
    assert.equal(a.served.length - beforeA, 1);
    assert.equal(b.served.length - beforeB, 0);
  });

  it('every upstream rate limited: 429 with Retry-After for the client', async () => {
    a.script({ kind: 'status', status: 429, headers: { 'retry-after': '90' } });
    b.script({ kind: 'status', status: 429, headers: { 'retry-after': '120' } });
    const answer = await post(gateway.url, { model: 'up-model', messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(answer.status, 429, answer.text);
    assert.equal(answer.headers['retry-after'], '90');
    assert.equal((JSON.parse(answer.text) as { error: { code: string } }).error.code, 'rate_limit_exceeded');
  });

  it('an upstream that never ends an event (a line of megabytes) fails the attempt with a typed error, not unbounded memory', async () => {
    const line = `data: ${'x'.repeat(3 * 2 ** 20)}`;
    a.script({ kind: 'raw', chunks: [line] }, { kind: 'raw', chunks: [line] }, { kind: 'raw', chunks: [line] });
    b.script({ kind: 'raw', chunks: [line] }, { kind: 'raw', chunks: [line] }, { kind: 'raw', chunks: [line] });
    const answer = await post(gateway.url, { model: 'up-model', messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(answer.status, 502, answer.text);
    assert.match(answer.text, /malformed stream/);
  });

  it('a body that ends without a finish reason or [DONE] is a typed error, not a clean end: an error event after the tokens, a 502 before', async () => {
    const cut = `data: ${JSON.stringify({ id: 'x', object: 'chat.completion.chunk', created: 0, model: 'up-model', choices: [{ index: 0, delta: { content: 'half' }, finish_reason: null }] })}\n\n`;
    a.script({ kind: 'raw', chunks: [cut], end: true });
    const streamed = await post(gateway.url, { model: 'up-model', messages: [{ role: 'user', content: 'hi' }], stream: true });
    const got = events(streamed.text);
    assert.ok(
      got.some((e) => 'error' in e),
      streamed.text,
    );
    assert.ok(!streamed.text.includes('"finish_reason":"stop"'), streamed.text);
    // A token came first: not retried, not sent elsewhere.
    a.script({ kind: 'raw', chunks: [cut], end: true });
    const whole = await post(gateway.url, { model: 'up-model', messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(whole.status, 502, whole.text);
    assert.equal((JSON.parse(whole.text) as { error: { code: string } }).error.code, 'upstream_error');
  });

  it('a client that leaves before the first byte aborts the upstream request', async () => {
    a.script({ kind: 'stall' });
    const controller = new AbortController();
    const pending = fetch(`${gateway.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'up-model', messages: [{ role: 'user', content: 'hi' }], stream: true }),
      signal: controller.signal,
    }).catch(() => undefined);
    await until(() => a.served.length > 0 && !a.last.closed && a.last.body.messages !== undefined, 'the upstream to hold the request');
    const held = a.last;
    controller.abort();
    await pending;
    await held.whenClosed;
    assert.equal(held.produced, 0);
  });

  it('reads the upstream only as fast as its client: a client that stops reading blocks the upstream, and leaving stops it at once', async () => {
    a.script({ kind: 'endless', pad: 16 * 1024 });
    const { port } = new URL(gateway.url);
    let response: IncomingMessage | undefined;
    const req = httpRequest(
      { host: '127.0.0.1', port, method: 'POST', path: '/v1/chat/completions', headers: { 'content-type': 'application/json' } },
      (res) => {
        response = res;
        res.pause(); // reads nothing
      },
    );
    req.end(JSON.stringify({ model: 'up-model', messages: [{ role: 'user', content: 'hi' }], stream: true, max_tokens: 4096 }));
    await until(() => response !== undefined, 'the response to start');
    const upstream = a.last;
    // Socket buffers on both hops fill first (loopback buffers grow to a few MB); then nothing moves.
    const held = await quiescent(() => upstream.produced);
    assert.ok(upstream.blocked, 'the upstream waits for drain while the client reads nothing');
    assert.ok(held < 48 * 2 ** 20, `the upstream produced ${held} bytes for a client that read nothing`);
    // Reading again lets it go on.
    response!.resume();
    response!.on('data', () => {});
    await until(() => upstream.produced > held + 64 * 1024, 'the upstream to go on');
    // The client leaves: the upstream's connection closes, having produced almost nothing more.
    const atLeave = upstream.produced;
    req.destroy();
    await upstream.whenClosed;
    assert.ok(upstream.produced - atLeave < 64 * 1024, `${upstream.produced - atLeave} bytes produced after the client left`);
  });

  it('the WebSocket protocol and the chat page serve the upstream model too', async () => {
    a.script({ kind: 'stream', pieces: ['over', ' ws'] });
    const ws = await Client.open(gateway.wsUrl);
    try {
      ws.send({ type: 'generate', id: 'g1', model: 'up-model', prompt: 'hi' });
      await until(() => ws.end('g1') !== undefined, 'the request to end');
      const text = ws.frames.filter((f) => f.type === 'token' && f.id === 'g1').map((f) => (f as { text: string }).text);
      assert.equal(text.join(''), 'over ws');
      assert.equal(ws.end('g1')?.type, 'done');
    } finally {
      ws.ws.close();
    }
    const page = await fetch(`${gateway.url}/`);
    assert.equal(page.status, 200);
  });

  it('exports the upstream stage in /metrics', async () => {
    const metrics = await (await fetch(`${gateway.url}/metrics`)).text();
    assert.match(metrics, /sluice_stage_received_total\{stage="upstream"\} [1-9]/);
  });
});

describe('gateway mode: breaker and discovery', () => {
  it('opens an upstream circuit after repeated failures: later requests go straight to the next one', async () => {
    const a = await FakeUpstream.start(['m']);
    const b = await FakeUpstream.start(['m']);
    const gateway = await startServer({
      port: 0,
      upstreams: [
        { baseUrl: a.url, name: 'a' },
        { baseUrl: b.url, name: 'b' },
      ],
      gateway: { ...FAST, attempts: 1, breakerThreshold: 2 },
    });
    try {
      for (let i = 0; i < 2; i++) {
        a.script({ kind: 'status', status: 500 });
        assert.equal((await post(gateway.url, { model: 'm', messages: [{ role: 'user', content: 'hi' }] })).status, 200);
      }
      assert.equal(gateway.stats().circuits?.a, 'open');
      const beforeA = a.served.length;
      for (let i = 0; i < 3; i++) assert.equal((await post(gateway.url, { model: 'm', messages: [{ role: 'user', content: 'hi' }] })).status, 200);
      assert.equal(a.served.length, beforeA, 'the open circuit kept requests away from a');
    } finally {
      await gateway.shutdown(0);
      await a.close();
      await b.close();
    }
  });

  it('a shutdown leaves no timer of the gateway behind: an open circuit’s cooldown does not hold the process', async () => {
    const a = await FakeUpstream.start(['m']);
    // The gateway's timers on a virtual clock, to see which are left: none may be pending once the server has stopped.
    const timers = new VirtualTimeScheduler();
    const gateway = await startServer({
      port: 0,
      upstreams: [{ baseUrl: a.url, name: 'a' }],
      gateway: { attempts: 1, breakerThreshold: 1, scheduler: timers },
    });
    try {
      a.script({ kind: 'status', status: 500 });
      assert.equal((await post(gateway.url, { model: 'm', messages: [{ role: 'user', content: 'hi' }] })).status, 502);
      assert.equal(gateway.stats().circuits?.a, 'open');
      assert.ok(
        timers.actions.some((action) => !action.closed),
        'the cooldown is pending',
      );
    } finally {
      await gateway.shutdown(0);
      await a.close();
    }
    assert.deepEqual(
      timers.actions.filter((action) => !action.closed).map((action) => action.delay),
      [],
    );
  });

  it('weights pick the first upstream per request: weight 0 is never tried first', async () => {
    const a = await FakeUpstream.start(['m']);
    const b = await FakeUpstream.start(['m']);
    const gateway = await startServer({
      port: 0,
      upstreams: [
        { baseUrl: a.url, name: 'a', weight: 0 },
        { baseUrl: b.url, name: 'b', weight: 1 },
      ],
      gateway: FAST,
    });
    try {
      for (let i = 0; i < 5; i++) assert.equal((await post(gateway.url, { model: 'm', messages: [{ role: 'user', content: 'hi' }] })).status, 200);
      assert.equal(a.served.length, 0);
      assert.equal(b.served.length, 5);
      // b failing before its first token falls back to a, weight or not.
      b.script({ kind: 'status', status: 500 }, { kind: 'status', status: 500 }, { kind: 'status', status: 500 });
      assert.equal((await post(gateway.url, { model: 'm', messages: [{ role: 'user', content: 'hi' }] })).status, 200);
      assert.equal(a.served.length, 1);
    } finally {
      await gateway.shutdown(0);
      await a.close();
      await b.close();
    }
  });

  it('caches deterministic answers and shares identical ones in flight; a sampled request always reaches the upstream', async () => {
    const up = await FakeUpstream.start(['m']);
    const gateway = await startServer({
      port: 0,
      upstreams: [{ baseUrl: up.url, name: 'up' }],
      gateway: { ...FAST, cache: { maxBytes: 1 << 20 }, singleFlight: true },
    });
    const ask = async (body: Record<string, unknown>) => {
      const answer = await post(gateway.url, { model: 'm', messages: [{ role: 'user', content: 'same question' }], ...body });
      assert.equal(answer.status, 200, answer.text);
      return (JSON.parse(answer.text) as { choices: { message: { content: string } }[] }).choices[0]!.message.content;
    };
    try {
      up.script({ kind: 'stream', pieces: ['cached', ' once'] });
      assert.equal(await ask({ temperature: 0 }), 'cached once');
      assert.equal(await ask({ temperature: 0 }), 'cached once');
      assert.equal(up.served.length, 1, 'the second identical request was a hit');
      // Another tool list is another request.
      up.script({ kind: 'stream', pieces: ['with', ' tools'] });
      assert.equal(await ask({ temperature: 0, tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }] }), 'with tools');
      assert.equal(up.served.length, 2);
      // Sampled: never another's answer.
      up.script({ kind: 'stream', pieces: ['one'] }, { kind: 'stream', pieces: ['two'] });
      assert.deepEqual([await ask({ temperature: 1 }), await ask({ temperature: 1 })], ['one', 'two']);
      assert.equal(up.served.length, 4);
      // Two identical ones at once: one upstream call, both get every token.
      up.script({ kind: 'stream', pieces: ['shared', ' in', ' flight'], everyMs: 30 });
      const both = await Promise.all([ask({ seed: 7 }), ask({ seed: 7 })]);
      assert.deepEqual(both, ['shared in flight', 'shared in flight']);
      assert.equal(up.served.length, 5);
      const metrics = await (await fetch(`${gateway.url}/metrics`)).text();
      assert.match(metrics, /sluice_cache_hits_total\{cache="upstream"\} 1/);
    } finally {
      await gateway.shutdown(0);
      await up.close();
    }
  });

  it("a tenant is never answered from another tenant's cache, over HTTP and WebSocket; cacheScope 'global' shares", async (t) => {
    const up = await FakeUpstream.start(['m']);
    t.after(() => up.close());
    const tokens = { 'acme-token-1': 'acme', 'globex-token-1': 'globex' };
    const gateway = await startServer({
      port: 0,
      tokens,
      upstreams: [{ baseUrl: up.url, name: 'up' }],
      gateway: { ...FAST, cache: { maxBytes: 1 << 20 }, singleFlight: true },
    });
    const ask = async (token: string) => {
      const answer = await post(
        gateway.url,
        { model: 'm', messages: [{ role: 'user', content: 'same question' }], temperature: 0 },
        { authorization: `Bearer ${token}` },
      );
      assert.equal(answer.status, 200, answer.text);
      return (JSON.parse(answer.text) as { choices: { message: { content: string } }[] }).choices[0]!.message.content;
    };
    const askWs = async (token: string, id: string) => {
      const ws = await Client.open(gateway.wsUrl, { token });
      try {
        ws.send({ type: 'generate', id, model: 'm', prompt: 'same prompt', parameters: { temperature: 0 } });
        await until(() => ws.end(id) !== undefined, 'the request to end');
        return ws.text(id);
      } finally {
        ws.ws.close();
      }
    };
    try {
      up.script({ kind: 'stream', pieces: ['for', ' acme'] }, { kind: 'stream', pieces: ['for', ' globex'] });
      assert.equal(await ask('acme-token-1'), 'for acme');
      assert.equal(await ask('globex-token-1'), 'for globex', "globex's request reached the upstream");
      assert.equal(await ask('acme-token-1'), 'for acme');
      assert.equal(await ask('globex-token-1'), 'for globex');
      assert.equal(up.served.length, 2, 'each tenant hit its own entry');
      up.script({ kind: 'stream', pieces: ['ws', ' acme'] }, { kind: 'stream', pieces: ['ws', ' globex'] });
      assert.equal(await askWs('acme-token-1', 'a1'), 'ws acme');
      assert.equal(await askWs('globex-token-1', 'g1'), 'ws globex');
      assert.equal(await askWs('globex-token-1', 'g2'), 'ws globex');
      assert.equal(up.served.length, 4);
    } finally {
      await gateway.shutdown(0);
    }
    const shared = await startServer({
      port: 0,
      tokens,
      upstreams: [{ baseUrl: up.url, name: 'up' }],
      gateway: { ...FAST, cache: { maxBytes: 1 << 20 }, cacheScope: 'global' },
    });
    try {
      up.script({ kind: 'stream', pieces: ['for', ' all'] });
      const before = up.served.length;
      const answer = await post(shared.url, { model: 'm', messages: [{ role: 'user', content: 'q' }], seed: 1 }, { authorization: 'Bearer acme-token-1' });
      const again = await post(shared.url, { model: 'm', messages: [{ role: 'user', content: 'q' }], seed: 1 }, { authorization: 'Bearer globex-token-1' });
      assert.equal(answer.text.includes('for all') && again.text.includes('for all'), true);
      assert.equal(up.served.length - before, 1);
    } finally {
      await shared.shutdown(0);
    }
  });

  it('an upstream that cannot be listed fails the start naming it; explicit models skip the listing', async () => {
    await assert.rejects(
      Gateway.start({ upstreams: [{ baseUrl: 'http://127.0.0.1:9/v1', name: 'gone' }], discoveryTimeout: 2_000 }),
      (err: unknown) => err instanceof UpstreamDiscoveryError && /"gone"/.test(err.message) && /models/.test(err.hint ?? ''),
    );
    const gateway = await Gateway.start({ upstreams: [{ baseUrl: 'http://127.0.0.1:9/v1', models: ['x', 'y'] }] });
    assert.deepEqual(gateway.models, ['x', 'y']);
  });

  it('bad upstream options fail at construction with the path of the field', async () => {
    await assert.rejects(Gateway.start({ upstreams: [{ baseUrl: 'ftp://example.com/v1', models: ['x'] }] }), /upstreams\.0\.baseUrl/);
    await assert.rejects(
      Gateway.start({
        upstreams: [
          { baseUrl: 'http://127.0.0.1:1/v1', models: ['x'] },
          { baseUrl: 'http://127.0.0.1:1/v1', models: ['x'] },
        ],
      }),
      /same name/,
    );
    await assert.rejects(startServer({ port: 0, upstreams: [] }), /upstreams/);
  });
});

describe('gateway mode in front of another sluice server', () => {
  let inner: RunningServer;
  let gateway: RunningServer;

  before(async () => {
    inner = await startServer({ port: 0, poolSize: 1 });
    gateway = await startServer({ port: 0, upstreams: [{ baseUrl: `${inner.url}/v1`, name: 'inner' }], gateway: FAST });
  });
  after(async () => {
    await gateway?.shutdown(0);
    await inner?.shutdown(0);
  });

  it("serves the inner server's models, streamed through the official client", async () => {
    // Everything the inner server lists, its embedding model included (GET /models does not say which chat).
    assert.deepEqual([...gateway.models].sort(), [...inner.models, 'sluice-embed'].sort());
    const client = new OpenAI({ baseURL: `${gateway.url}/v1`, apiKey: 'unused', maxRetries: 0 });
    const stream = await client.chat.completions.create({
      model: 'charlm',
      messages: [{ role: 'user', content: 'The stage' }],
      max_tokens: 12,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = '';
    let usage: { completion_tokens: number } | undefined;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta.content ?? '';
      if (chunk.usage) usage = chunk.usage;
    }
    assert.ok(text.length > 0);
    assert.equal(usage?.completion_tokens, 12);
  });

  it("a field the inner server's model cannot honour, or does not know, is refused there, and the gateway passes its 400 on", async () => {
    const tools = [{ type: 'function', function: { name: 'weather' } }];
    const answer = await post(gateway.url, { model: 'charlm', messages: [{ role: 'user', content: 'hi' }], tools });
    assert.equal(answer.status, 400, answer.text);
    assert.match(answer.text, /unsupported_parameter/);
    assert.match(answer.text, /'tools'/);
    const unknown = await post(gateway.url, { model: 'charlm', messages: [{ role: 'user', content: 'hi' }], chat_template_kwargs: {} });
    assert.equal(unknown.status, 400, unknown.text);
    assert.match(unknown.text, /unrecognized_argument/);
  });
});

describe('sluice serve --upstream', () => {
  it('parses url#key=ENV&name=..&weight=..&models=..; bad specs say what is wrong, never printing a key', () => {
    const env = { UP_KEY: 'sk-from-env' };
    assert.deepEqual(parseUpstream('http://127.0.0.1:8000/v1#key=UP_KEY&name=vllm&weight=3&models=a,b', env), {
      baseUrl: 'http://127.0.0.1:8000/v1',
      apiKey: 'sk-from-env',
      name: 'vllm',
      weight: 3,
      models: ['a', 'b'],
    });
    assert.deepEqual(parseUpstream('https://api.example.com/v1', env), { baseUrl: 'https://api.example.com/v1' });
    assert.throws(() => parseUpstream('http://h/v1#key=MISSING', env), /environment variable MISSING/);
    assert.throws(() => parseUpstream('http://h/v1#colour=red', env), /unknown attribute "colour"/);
    assert.throws(() => parseUpstream('http://h/v1#weight=-1', env), /weight/);
    assert.throws(() => parseUpstream('ftp://h/v1', env), /http or https/);
    assert.throws(() => parseUpstream('not a url', env), /not a URL/);
    assert.throws(
      () => parseUpstream('http://user:sk-inline@h/v1', env),
      (err: Error) => /environment variable/.test(err.message) && !err.message.includes('sk-inline'),
    );
    assert.deepEqual(serveOptions(['--upstream', 'http://a/v1#models=x', '--cache-mb', '64'], {}).gateway, {
      cache: { maxBytes: 64 * 2 ** 20 },
      singleFlight: true,
    });
    assert.throws(() => serveOptions(['--cache-mb', '64'], {}), /give --upstream too/);
    assert.deepEqual(serveOptions([], { SLUICE_UPSTREAMS: 'http://a/v1#models=x  http://b/v1#models=y' }).upstreams, [
      { baseUrl: 'http://a/v1', models: ['x'] },
      { baseUrl: 'http://b/v1', models: ['y'] },
    ]);
  });

  it('a process in gateway mode answers through the upstream with the key from the environment, and never prints the key', { timeout: 60_000 }, async () => {
    const fake = await FakeUpstream.start(['fake-model']);
    const secret = 'sk-gateway-test-never-printed';
    const cli = CliProcess.start('serve', ['--port', '0', '--upstream', `${fake.url}#key=FAKE_UPSTREAM_KEY&name=fake`], {
      ...process.env,
      FAKE_UPSTREAM_KEY: secret,
    });
    try {
      const url = await cli.url();
      assert.match(cli.stdout, /models: fake-model/);
      fake.script({ kind: 'stream', pieces: ['through', ' the', ' gateway'] });
      const answer = await post(url, { model: 'fake-model', messages: [{ role: 'user', content: 'a prompt never logged' }] });
      assert.equal(answer.status, 200, answer.text);
      assert.equal((JSON.parse(answer.text) as { choices: { message: { content: string } }[] }).choices[0]!.message.content, 'through the gateway');
      assert.equal(fake.last.headers.authorization, `Bearer ${secret}`);
    } finally {
      assert.equal(await cli.stop(), 0);
      await fake.close();
    }
    assert.ok(!cli.stdout.includes(secret) && !cli.stderr.includes(secret), 'the key was printed');
    assert.match(cli.stderr, /gateway mode: upstreams fake/);
    // The log is JSON lines (pino), one per request, without the prompt or the tokens.
    const lines = cli.stderr
      .trim()
      .split('\n')
      .map((line) => JSON.parse(line) as { msg: string; level: number; request?: { outcome: string; model: string; outputTokens: number } });
    const requests = lines.filter((line) => line.msg === 'request');
    assert.equal(requests.length, 1);
    assert.deepEqual([requests[0]!.request?.outcome, requests[0]!.request?.model, requests[0]!.request?.outputTokens], ['completed', 'fake-model', 3]);
    assert.doesNotMatch(cli.stderr, /prompt never logged|through the gateway/);
  });

  it('an unreachable upstream fails the start (exit 1) naming it and how to start without asking it', { timeout: 60_000 }, async () => {
    const cli = CliProcess.start('serve', ['--port', '0', '--upstream', 'http://127.0.0.1:9/v1#name=gone']);
    assert.equal(await cli.exit(), 1);
    assert.match(cli.stderr, /upstream "gone"/);
    assert.match(cli.stderr, /#models=/);
  });
});
