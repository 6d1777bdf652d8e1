import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import { connect, type AddressInfo } from 'node:net';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { traced } from '../../src/core/trace.js';
import { ScriptedWorker } from 'sluice/testing/ai';
import { generateRequest } from '../../src/ai/inference/worker.js';
import { createHttpHandler } from '../../src/serve/http.js';
import { SluiceMetrics } from '../../src/serve/metrics.js';
import { RequestTelemetry } from '../../src/serve/telemetry.js';
import { attachTokenSocket, type TokenSocketEvent } from '../../src/serve/ws-server.js';
import { Quotas } from '../../src/serve/ws/quotas.js';
import { ServerBudget, WriteBudget } from '../../src/serve/ws/fair-share.js';
import { GenerationContext } from '../../src/serve/ws/generation.js';
import { StreamTable } from '../../src/serve/ws/stream-table.js';
import { WsClient, until } from '../support/ws-client.js';

/** Emits `t0 t1 ...` one step per macrotask (slow enough to cancel midway); remembers each trace it was given. */
const stepping = () => new ScriptedWorker({ name: 'stepping', delay: 'turn', maxTokens: 8, inputTokens: 2 });
const traces = (worker: ScriptedWorker) => worker.generations.flatMap((g) => (g.trace === undefined ? [] : [g.trace]));

async function listen(server: Server): Promise<number> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return (server.address() as AddressInfo).port;
}

async function stop(server: Server): Promise<void> {
  server.closeAllConnections();
  await new Promise<void>((resolve) => server.close(() => resolve()));
}

describe('requests on HTTP and WebSocket, through one telemetry module', () => {
  it('numbers request traces from 0 in arrival order, the numbers the sampler counts, on HTTP as on WebSocket', async () => {
    const httpWorker = stepping();
    const wsWorker = stepping();
    const server = createServer(createHttpHandler({ worker: httpWorker }));
    const sockets = attachTokenSocket(server, { worker: wsWorker });
    const port = await listen(server);
    try {
      for (let i = 0; i < 2; i++) {
        const response = await fetch(`http://127.0.0.1:${port}/v1/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ model: 'stepping', messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 }),
        });
        await response.json();
      }
      const client = await WsClient.open(`ws://127.0.0.1:${port}/`);
      for (const id of ['a', 'b']) {
        client.send({ type: 'generate', id, prompt: 'hi', parameters: { max_tokens: 1 } });
        await until(() => client.end(id) !== undefined, `the end of ${id}`);
      }
      client.ws.close();
      assert.deepEqual(
        traces(wsWorker).map((t) => t.seq),
        [0, 1],
      );
      assert.deepEqual(
        traces(httpWorker).map((t) => t.seq),
        [0, 1],
      );
    } finally {
      sockets.close();
      await stop(server);
    }
  });

  it('names the request span in the done frame of a request the client cancelled', async () => {
    const exporter = new InMemorySpanExporter();
    const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
    const server = createServer();
    const sockets = attachTokenSocket(server, { worker: stepping(), tracer: provider.getTracer('test') });
    const port = await listen(server);
    try {
      const client = await WsClient.open(`ws://127.0.0.1:${port}/`);
      client.send({ type: 'generate', id: 'a', prompt: 'hi', parameters: { max_tokens: 1000 } });
      await until(() => client.text('a').length > 0, 'a first token');
      client.send({ type: 'cancel', id: 'a' });
      await until(() => client.end('a') !== undefined, 'the end of a');
      client.ws.close();
      const done = client.end('a');
      assert.equal(done?.type, 'done');
      assert.equal(done.type === 'done' && done.finish_reason, 'abort');
      const [span] = exporter.getFinishedSpans().filter((s) => s.name === 'chat stepping');
      assert.ok(span, 'a request span');
      assert.equal(done.type === 'done' && done.traceparent, `00-${span.spanContext().traceId}-${span.spanContext().spanId}-01`);
    } finally {
      sockets.close();
      await stop(server);
      await provider.shutdown();
    }
  });
});

describe('RequestTelemetry', () => {
  const request = generateRequest({ prompt: 'hi' });

  it('samples requests by their number, and always one whose incoming traceparent is sampled', () => {
    const telemetry = new RequestTelemetry({ sampleRate: 0.5 });
    const traces = [0, 1, 2, 3].map(() => telemetry.begin({ model: 'm', request }).trace);
    assert.deepEqual(
      traces.map((t) => [t.seq, t.sampled]),
      [
        [0, true],
        [1, false],
        [2, true],
        [3, false],
      ],
    );
    const continued = telemetry.begin({ model: 'm', request, traceparent: '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' }).trace;
    assert.deepEqual([continued.seq, continued.sampled, continued.traceId], [4, true, '4bf92f3577b34da6a3ce929d0e0e4736']);
  });

  it('ends the span with the response, and feeds the generation to the metrics', async () => {
    const exporter = new InMemorySpanExporter();
    const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
    const metrics = new SluiceMetrics({ defaultMetrics: false });
    try {
      const telemetry = new RequestTelemetry({ tracer: provider.getTracer('test'), metrics, sampleRate: 1 });
      const started = telemetry.begin({ model: 'm', request });
      started.end({ responseId: 'r1', done: { finishReason: 'stop', usage: { inputTokens: 2, outputTokens: 5 }, timeToFirstToken: 3, tokensPerSecond: 100 } });
      const [span] = exporter.getFinishedSpans();
      assert.ok(span);
      assert.equal(
        started.traceparent,
        `00-${span.spanContext().traceId}-${span.spanContext().spanId}-01`,
        'the traceparent names the request span, ended or not',
      );
      assert.deepEqual([span.name, span.attributes['gen_ai.response.id'], span.attributes['gen_ai.usage.output_tokens']], ['chat m', 'r1', 5]);
      const { body } = await metrics.scrape();
      assert.match(body, /sluice_generated_tokens_total\{gen_ai_request_model="m"\} 5/);
    } finally {
      metrics.close();
      await provider.shutdown();
    }
  });
});

describe('a handshake ws finds malformed', () => {
  it('is refused with 400 and a JSON body, counted in upgradesRejected and reported as upgrade-rejected', async () => {
    const events: TokenSocketEvent[] = [];
    const server = createServer();
    const sockets = attachTokenSocket(server, { worker: stepping(), onEvent: (e) => events.push(e) });
    const port = await listen(server);
    try {
      const reply = await new Promise<string>((resolve, reject) => {
        const socket = connect(port, '127.0.0.1', () =>
          socket.write(
            [
              'GET / HTTP/1.1',
              'Host: 127.0.0.1',
              'Connection: Upgrade',
              'Upgrade: websocket',
              'Sec-WebSocket-Version: 13',
              'Sec-WebSocket-Key: not-a-key',
              'Sec-WebSocket-Protocol: sluice.v1',
              '',
              '',
            ].join('\r\n'),
          ),
        );
        let text = '';
        socket.on('data', (chunk) => (text += chunk.toString()));
        socket.on('close', () => resolve(text));
        socket.on('error', reject);
      });
      assert.match(reply, /^HTTP\/1\.1 400 /);
      assert.match(reply, /invalid handshake: Missing or invalid Sec-WebSocket-Key header/);
      assert.equal(sockets.stats().upgradesRejected[400], 1);
      assert.ok(events.some((e) => e.kind === 'upgrade-rejected' && e.status === 400));
    } finally {
      sockets.close();
      await stop(server);
    }
  });
});

describe('Quotas', () => {
  it('holds a tenant to its concurrency, then to its start rate, and says which with when to retry', () => {
    let now = 0;
    const quotas = new Quotas({ rate: { perSecond: 1, burst: 2 }, tenantConcurrent: 2, tenantRate: { perSecond: 1, burst: 3 } }, undefined, () => now);
    assert.equal(quotas.acquire('acme'), undefined);
    assert.equal(quotas.acquire('acme'), undefined);
    assert.equal(quotas.acquire('acme'), 'tenant has 2 requests running, its limit');
    assert.equal(quotas.acquire('globex'), undefined, 'tenants are apart');
    assert.deepEqual(quotas.tenants.tenants(), { acme: 2, globex: 1 });
    quotas.release('acme');
    assert.equal(quotas.acquire('acme'), undefined, 'the third start of the burst');
    quotas.release('acme');
    assert.equal(quotas.acquire('acme'), 'tenant started more than 1 requests per second (burst 3); retry in 1000 ms');
    assert.deepEqual(quotas.tenants.tenants(), { acme: 1, globex: 1 }, 'a refusal takes no slot');
    now = 1000;
    assert.equal(quotas.acquire('acme'), undefined);
    for (const tenant of ['acme', 'acme', 'globex']) quotas.release(tenant);
    assert.deepEqual(quotas.tenants.tenants(), {}, 'a tenant with nothing running is forgotten');
  });

  it('holds each connection to its frame rate, each with a bucket of its own', () => {
    let now = 0;
    const quotas = new Quotas({ rate: { perSecond: 10, burst: 2 }, tenantConcurrent: 1, tenantRate: { perSecond: 1, burst: 1 } }, undefined, () => now);
    const one = quotas.frameBucket();
    const two = quotas.frameBucket();
    assert.deepEqual([one.take(), one.take(), one.take(), two.take()], [true, true, false, true]);
    now = 100;
    assert.equal(one.take(), true);
    assert.equal(one.take(), false, 'a tenth of a second gave back one frame at 10 per second');
    now = 10_000;
    assert.deepEqual([one.take(), one.take(), one.take()], [true, true, false], 'refilled to the burst, not beyond');
  });
});

describe('write budgets', () => {
  const turn = () => new Promise<void>((resolve) => setImmediate(resolve));
  const waiter = (log: string[], name: string) => ({ pump: () => log.push(name) });

  it('stops a connection after its frames for the turn and wakes it on the next', async () => {
    const log: string[] = [];
    const owner = waiter(log, 'a');
    const budget = new WriteBudget(new ServerBudget(100), owner, 2);
    assert.equal(budget.mayWrite(), true);
    budget.spend();
    budget.spend();
    assert.deepEqual([budget.mayWrite(), budget.mayWrite(), budget.timers()], [false, false, 1]);
    await turn();
    assert.deepEqual([log, budget.timers(), budget.mayWrite()], [['a'], 0, true]);
  });

  it('shares the server budget, waking the connections that waited in the order they came, minus the ones gone', async () => {
    const log: string[] = [];
    const server = new ServerBudget(2);
    const [a, b, c] = ['a', 'b', 'c'].map((name) => waiter(log, name)) as [ReturnType<typeof waiter>, ReturnType<typeof waiter>, ReturnType<typeof waiter>];
    const budgets = [a, b, c].map((owner) => new WriteBudget(server, owner, 10));
    budgets[0]!.spend();
    budgets[1]!.spend();
    assert.deepEqual(
      budgets.map((budget) => budget.mayWrite()),
      [false, false, false],
    );
    budgets[1]!.close();
    await turn();
    assert.deepEqual(log, ['a', 'c']);
    assert.equal(budgets[2]!.mayWrite(), true);
  });
});

describe('GenerationContext', () => {
  const trace = traced('x').trace;

  it('makes no AbortSignal until the worker reads it, and one read after the abort is born aborted with the reason', () => {
    const unread = new GenerationContext(trace, 'm');
    unread.abort(new Error('gone'));
    const late = unread.signal;
    assert.equal(late.aborted, true);
    assert.equal((late.reason as Error).message, 'gone');
    const read = new GenerationContext(trace, 'm');
    const signal = read.signal;
    assert.equal(signal.aborted, false);
    assert.equal(read.signal, signal, 'one signal per request');
    read.abort('first');
    read.abort('second');
    assert.equal(signal.reason, 'first');
  });

  it('keeps the report of an onDone a wrapper passed on without its object', () => {
    const context = new GenerationContext(trace, 'm');
    const forwarded = { onDone: context.onDone };
    const done = { finishReason: 'stop', usage: { inputTokens: 1, outputTokens: 2 }, timeToFirstToken: undefined, tokensPerSecond: undefined } as const;
    forwarded.onDone(done);
    assert.equal(context.done, done);
    assert.equal(context.stage, 'm');
    assert.equal(context.trace, trace);
  });
});

describe('StreamTable', () => {
  it('finds, counts and removes streams by id, the first held apart from the others', () => {
    const table = new StreamTable<{ id: string }>();
    const a = { id: 'a' };
    const b = { id: 'b' };
    const c = { id: 'c' };
    assert.equal(table.size, 0);
    assert.equal(table.single(), undefined);
    table.add(a);
    assert.equal(table.single(), a);
    table.add(b);
    table.add(c);
    assert.equal(table.size, 3);
    assert.equal(table.single(), undefined);
    assert.deepEqual(table.values(), [a, b, c]);
    assert.equal(table.get('b'), b);
    table.delete('a');
    assert.equal(table.has('a'), false);
    assert.equal(table.size, 2);
    table.delete('b');
    assert.equal(table.single(), c);
    table.add(a);
    assert.deepEqual(
      table
        .values()
        .map((s) => s.id)
        .sort(),
      ['a', 'c'],
    );
    table.delete('nope');
    assert.equal(table.size, 2);
  });
});
