import { after, afterEach, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { ROOT_CONTEXT, SpanKind, SpanStatusCode, trace } from '@opentelemetry/api';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor, type ReadableSpan } from '@opentelemetry/sdk-trace-base';
import { TraceContext } from '../../src/core/trace.js';
import { ScriptedWorker } from 'sluice/testing/ai';
import { createHttpHandler, type HttpHandlerOptions } from '../../src/serve/http.js';
import { genAiSpan, recordStageSpans, traceparentOf } from '../../src/serve/otel.js';
import { WebSocket } from 'ws';
import { attachTokenSocket } from '../../src/serve/ws-server.js';
import { SUBPROTOCOL } from '../../src/serve/protocol.js';

/** Emits 8 tokens, one an event-loop turn, or fails after `failAfter` of them; remembers the trace it was given. */
const scripted = (name: string, failAfter?: number) =>
  new ScriptedWorker({
    name,
    delay: 'turn',
    maxTokens: 8,
    inputTokens: 2,
    ...(failAfter !== undefined && { fail: { after: failAfter, error: Object.assign(new Error('the accelerator fell over'), { code: 'DEVICE_LOST' }) } }),
  });
const traces = (worker: ScriptedWorker) => worker.generations.flatMap((g) => (g.trace === undefined ? [] : [g.trace]));

async function serve(options: HttpHandlerOptions): Promise<{ base: string; server: Server }> {
  const server = createServer(createHttpHandler(options));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { server, base: `http://127.0.0.1:${(server.address() as AddressInfo).port}` };
}

async function close(server: Server): Promise<void> {
  server.closeAllConnections();
  await new Promise<void>((resolve) => server.close(() => resolve()));
}

const chat = (base: string, body: Record<string, unknown>, headers: Record<string, string> = {}) =>
  fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], ...body }),
  });

const INCOMING = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';

describe('without an SDK (the API alone is a no-op)', () => {
  it('still carries an incoming traceparent into the element trace and back in the response', async () => {
    const worker = scripted('scripted');
    const { base, server } = await serve({ worker });
    try {
      const response = await chat(base, { model: 'scripted', max_tokens: 2 }, { traceparent: INCOMING });
      assert.equal(response.status, 200);
      await response.json();
      assert.equal(traces(worker)[0]!.traceId, '4bf92f3577b34da6a3ce929d0e0e4736');
      assert.equal(traces(worker)[0]!.parentSpan, '00f067aa0ba902b7');
      const back = response.headers.get('traceparent') ?? '';
      assert.match(back, /^00-4bf92f3577b34da6a3ce929d0e0e4736-[0-9a-f]{16}-01$/);
      assert.notEqual(back, INCOMING, 'the response names the server side span, not the caller');
    } finally {
      await close(server);
    }
  });
});

describe('with the SDK as the global tracer provider', () => {
  const exporter = new InMemorySpanExporter();
  const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  let base: string;
  let server: Server;
  const worker = scripted('scripted');
  const failing = scripted('failing', 2);
  before(async () => {
    trace.setGlobalTracerProvider(provider);
    ({ base, server } = await serve({ workers: { scripted: worker, failing } }));
  });
  afterEach(() => exporter.reset());
  after(async () => {
    await close(server);
    await provider.shutdown();
    trace.disable();
  });

  const byName = (name: string) => exporter.getFinishedSpans().filter((s) => s.name === name);

  it('makes a "chat {model}" server span with GenAI attributes, continuing the incoming trace', async () => {
    const response = await chat(base, { model: 'scripted', max_tokens: 3, temperature: 0.5, top_p: 0.9, seed: 4, stream: true }, { traceparent: INCOMING });
    await response.text();
    const [span] = byName('chat scripted') as [ReadableSpan];
    assert.ok(span, 'the request span exists');
    assert.equal(span.kind, SpanKind.SERVER);
    assert.equal(span.spanContext().traceId, '4bf92f3577b34da6a3ce929d0e0e4736');
    assert.equal(span.parentSpanContext?.spanId, '00f067aa0ba902b7');
    assert.deepEqual(
      { ...span.attributes, 'gen_ai.response.id': typeof span.attributes['gen_ai.response.id'] },
      {
        'gen_ai.operation.name': 'chat',
        'gen_ai.provider.name': 'sluice',
        'gen_ai.request.model': 'scripted',
        'gen_ai.request.temperature': 0.5,
        'gen_ai.request.top_p': 0.9,
        'gen_ai.request.max_tokens': 3,
        'gen_ai.request.seed': 4,
        'gen_ai.response.finish_reasons': ['length'],
        'gen_ai.response.model': 'scripted',
        'gen_ai.response.id': 'string',
        'gen_ai.usage.input_tokens': 2,
        'gen_ai.usage.output_tokens': 3,
        'sluice.generate.finish_reason': 'length',
        'sluice.generate.input_tokens': 2,
        'sluice.generate.output_tokens': 3,
        'sluice.generate.ttft_ms': span.attributes['sluice.generate.ttft_ms'],
        'sluice.generate.tokens_per_s': span.attributes['sluice.generate.tokens_per_s'],
      },
    );
    assert.equal(response.headers.get('traceparent'), `00-${span.spanContext().traceId}-${span.spanContext().spanId}-01`);
    // sluice's element trace and the OTel span share the trace id; the element continues the span.
    const elementTrace = traces(worker).at(-1)!;
    assert.equal(elementTrace.traceId, span.spanContext().traceId);
    assert.equal(elementTrace.parentSpan, span.spanContext().spanId);
  });

  it('adds a child span per stage record, inside the request span', async () => {
    const response = await chat(base, { model: 'scripted', max_tokens: 2 });
    await response.json();
    const [request] = byName('chat scripted') as [ReadableSpan];
    const [stage] = byName('stage generate') as [ReadableSpan];
    assert.ok(stage, 'the stage span exists');
    assert.equal(stage.parentSpanContext?.spanId, request.spanContext().spanId);
    assert.equal(stage.spanContext().traceId, request.spanContext().traceId);
    assert.equal(stage.attributes['sluice.stage.name'], 'generate');
    assert.equal(typeof stage.attributes['sluice.stage.service_ms'], 'number');
    const toMs = ([s, ns]: [number, number]) => s * 1000 + ns / 1e6;
    assert.ok(toMs(stage.startTime) >= toMs(request.startTime) - 1, 'the stage starts within the request');
    assert.ok(toMs(stage.endTime) <= toMs(request.endTime) + 1, 'and ends within it');
    assert.match(response.headers.get('traceparent') ?? '', new RegExp(`^00-${request.spanContext().traceId}-${request.spanContext().spanId}-01$`));
  });

  it('marks a failed generation with error.type and an error status', async () => {
    const response = await chat(base, { model: 'failing' });
    assert.equal(response.status, 500);
    const body = (await response.json()) as { error: { code: string; type: string } };
    assert.deepEqual([body.error.type, body.error.code], ['server_error', 'DEVICE_LOST']);
    const [span] = byName('chat failing') as [ReadableSpan];
    assert.equal(span.attributes['error.type'], 'DEVICE_LOST');
    assert.equal(span.status.code, SpanStatusCode.ERROR);
    assert.deepEqual(span.attributes['gen_ai.response.finish_reasons'], ['abort']);
  });
});

describe('a tracer passed as an option', () => {
  it('is used instead of the global provider', async () => {
    const exporter = new InMemorySpanExporter();
    const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
    const { base, server } = await serve({ worker: scripted('scripted'), tracer: provider.getTracer('test') });
    try {
      await (await chat(base, { model: 'scripted', max_tokens: 1 })).json();
      assert.deepEqual(
        exporter
          .getFinishedSpans()
          .map((s) => s.name)
          .sort(),
        ['chat scripted', 'stage generate'],
      );
    } finally {
      await close(server);
      await provider.shutdown();
    }
  });
});

describe('WebSocket requests', () => {
  it('get a GenAI span continuing the message traceparent, and the done frame names it', async () => {
    const exporter = new InMemorySpanExporter();
    const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
    const worker = scripted('scripted');
    const server = createServer();
    const sockets = attachTokenSocket(server, { worker, tracer: provider.getTracer('test') });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      const ws = new WebSocket(`ws://127.0.0.1:${(server.address() as AddressInfo).port}/`, [SUBPROTOCOL]);
      const frames: { type: string; traceparent?: string }[] = [];
      await new Promise<void>((resolve, reject) => {
        ws.on('open', () => ws.send(JSON.stringify({ type: 'generate', id: 'a', prompt: 'hi', parameters: { max_tokens: 3 }, traceparent: INCOMING })));
        ws.on('message', (data) => {
          const frame = JSON.parse(String(data)) as { type: string; traceparent?: string };
          frames.push(frame);
          if (frame.type === 'done' || frame.type === 'error') resolve();
        });
        ws.on('error', reject);
      });
      ws.close();
      const done = frames.at(-1)!;
      assert.equal(done.type, 'done');
      const [span] = exporter.getFinishedSpans().filter((s) => s.name === 'chat scripted');
      assert.ok(span, 'a request span');
      assert.equal(span.spanContext().traceId, '4bf92f3577b34da6a3ce929d0e0e4736');
      assert.equal(span.parentSpanContext?.spanId, '00f067aa0ba902b7');
      assert.equal(span.attributes['gen_ai.usage.output_tokens'], 3);
      assert.deepEqual(span.attributes['gen_ai.response.finish_reasons'], ['length']);
      assert.equal(done.traceparent, `00-4bf92f3577b34da6a3ce929d0e0e4736-${span.spanContext().spanId}-01`);
      assert.equal(traces(worker)[0]!.traceId, '4bf92f3577b34da6a3ce929d0e0e4736');
    } finally {
      sockets.close();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      await provider.shutdown();
    }
  });
});

describe('recordStageSpans', () => {
  it('lays stage spans end to end from the start time, each covering queue wait, service and paused time', () => {
    const exporter = new InMemorySpanExporter();
    const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
    const tracer = provider.getTracer('test');
    const element = new TraceContext(0, true);
    element.addRecord({ stage: 'embed', queueWait: 5, service: 10, paused: 0, retries: 0, conflated: 0 });
    element.addRecord({ stage: 'infer', queueWait: 20, service: 100, paused: 7, retries: 1, conflated: 0 });
    element.addRecord({ stage: 'guard', queueWait: 0, service: 3, paused: 0, retries: 0, conflated: 0, shed: 'buffer-full' });
    const { span: parent, context } = genAiSpan({ tracer, model: 'm', parent: ROOT_CONTEXT });
    assert.equal(recordStageSpans(element, context, { tracer, startTime: 1_700_000_000_000 }), 3);
    assert.equal(traceparentOf(parent), `00-${parent.spanContext().traceId}-${parent.spanContext().spanId}-01`);
    parent.end();
    assert.equal(traceparentOf(parent), undefined, 'an ended span is no longer a parent to hand out');
    const spans = exporter.getFinishedSpans().filter((s) => s.name.startsWith('stage '));
    const ms = ([s, ns]: [number, number]) => Math.round(s * 1000 + ns / 1e6) - 1_700_000_000_000;
    assert.deepEqual(
      spans.map((s) => [s.name, ms(s.startTime), ms(s.endTime), ms(s.events[0]!.time)]),
      [
        ['stage embed', 0, 15, 5],
        ['stage infer', 15, 142, 35],
        ['stage guard', 142, 145, 142],
      ],
    );
    assert.ok(spans.every((s) => s.parentSpanContext?.spanId === parent.spanContext().spanId));
    assert.equal(spans[1]!.attributes['sluice.stage.retries'], 1);
    assert.equal(spans[2]!.status.code, SpanStatusCode.ERROR);
    assert.equal(recordStageSpans(new TraceContext(1, false), context, { tracer }), 0, 'unsampled traces make no spans');
  });
});
