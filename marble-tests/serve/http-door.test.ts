/**
 * The door at the HTTP edge: while the intake would refuse a completion, it is answered 429
 * `server_busy` from its bytes — its body never parsed nor checked, its model never asked — the
 * socket stays usable for the next request, and every refusal is counted with its reason.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import { connect, type AddressInfo, type Socket } from 'node:net';
import { performance } from 'node:perf_hooks';
import { eventually } from 'sluice/testing';
import { ScriptedWorker } from 'sluice/testing/ai';
import { Intake } from '../../src/ai/pipelines/intake.js';
import { pipelineWorker, streamStage, type PipelineWorker } from '../../src/ai/pipelines/pipeline-worker.js';
import type { GenerateOptions, GenerateRequest } from '../../src/ai/inference/worker.js';
import { createHttpHandler } from '../../src/serve/http.js';
import { SluiceMetrics } from '../../src/serve/metrics.js';
import { plainString } from '../../src/serve/http/door.js';
import type { RequestLogEntry } from '../../src/serve/request-log.js';

/** One HTTP/1.1 exchange on a kept-alive socket: resolves with the status and body once `content-length` bytes came. */
function exchange(socket: Socket, request: string | readonly string[]): Promise<{ status: number; headers: string; body: string }> {
  return new Promise((resolve, reject) => {
    let received = Buffer.alloc(0);
    const onData = (chunk: Buffer) => {
      received = Buffer.concat([received, chunk]);
      const end = received.indexOf('\r\n\r\n');
      if (end < 0) return;
      const headers = received.subarray(0, end).toString('latin1');
      const rest = received.subarray(end + 4);
      let body: string | undefined;
      if (/transfer-encoding: chunked/i.test(headers)) {
        if (rest.indexOf('0\r\n\r\n') >= 0) body = dechunk(rest.toString('utf8'));
      } else {
        const length = Number(/content-length: (\d+)/i.exec(headers)?.[1] ?? 0);
        if (rest.length >= length) body = rest.subarray(0, length).toString('utf8');
      }
      if (body === undefined) return;
      socket.off('data', onData);
      resolve({ status: Number(headers.split(' ')[1]), headers, body });
    };
    socket.on('data', onData);
    socket.once('error', reject);
    const parts = typeof request === 'string' ? [request] : request;
    // Parts written one turn apart: a body that arrives after its headers.
    parts.reduce<Promise<void>>(
      (previous, part) => previous.then(() => new Promise((next) => socket.write(part, () => setImmediate(next)))),
      Promise.resolve(),
    );
  });
}

/** A chunked body's content (small bodies: no chunk extensions, whole in the buffer). */
function dechunk(text: string): string {
  let out = '';
  for (let at = 0; ; ) {
    const eol = text.indexOf('\r\n', at);
    const size = Number.parseInt(text.slice(at, eol), 16);
    if (size === 0) return out;
    out += text.slice(eol + 2, eol + 2 + size);
    at = eol + 2 + size + 2;
  }
}

function post(body: string, path = '/v1/chat/completions'): string {
  return `POST ${path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
}

const MALFORMED = '{"model": "slow", "messages": [oops';

describe('the HTTP door', () => {
  const intake = new Intake({ maxQueue: 1 });
  // Streams until the client leaves: a held generation keeps its slot.
  const model = new ScriptedWorker({ name: 'slow', tokens: { repeat: 'x ' }, delay: 'turn', hang: { after: 1 } });
  let asked = 0;
  const slow: PipelineWorker = pipelineWorker({
    name: 'slow',
    intake,
    pipeline: (jobs) => jobs.pipe(streamStage((job) => model.generate(job.request, job.options), { concurrency: 1, capacity: 1 })),
  });
  // Counts the requests that reached the model's worker (the door answers before it).
  const counted = {
    name: 'slow',
    generate: (request: GenerateRequest, options?: GenerateOptions) => {
      asked++;
      return slow.generate(request, options);
    },
  };
  const metrics = new SluiceMetrics({ defaultMetrics: false });
  metrics.registerStage('intake', intake.stats);
  const logged: RequestLogEntry[] = [];
  const handler = createHttpHandler({ workers: { slow: counted }, metrics, intake, requestLog: (entry) => logged.push(entry) });
  const held = new AbortController();
  let server: Server;
  let url: string;
  let port: number;

  const hold = () =>
    fetch(`${url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'slow', stream: true, messages: [{ role: 'user', content: 'hi' }] }),
      signal: held.signal,
    }).catch(() => undefined);

  before(async () => {
    server = createServer(handler);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    port = (server.address() as AddressInfo).port;
    url = `http://127.0.0.1:${port}`;
  });
  after(async () => {
    held.abort();
    slow.close();
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
    metrics.close();
  });

  it('lets a malformed body through to its 400 while the door has room', async () => {
    const socket = connect(port, '127.0.0.1');
    const answer = await exchange(socket, post(MALFORMED));
    socket.destroy();
    assert.equal(answer.status, 400);
    assert.match(answer.body, /invalid_json/);
  });

  it('when full, answers 429 from the bytes: a malformed body is not parsed, the model never asked', async () => {
    // One streaming, one in the stage's buffer, one waiting at the door (maxQueue 1): full.
    for (let i = 0; i < 3; i++) void hold();
    await eventually(() => assert.equal(intake.waiting, 1));
    const before = asked;
    const socket = connect(port, '127.0.0.1');
    const answer = await exchange(socket, post(MALFORMED));
    socket.destroy();
    assert.equal(answer.status, 429);
    assert.match(answer.headers, /retry-after: \d+/i);
    assert.equal((JSON.parse(answer.body) as { error: { code: string } }).error.code, 'server_busy');
    assert.equal(asked, before);
  });

  it('keeps a kept-alive socket working after a refusal, its body read even when it came late', async () => {
    await eventually(() => assert.equal(intake.waiting, 1));
    const socket = connect(port, '127.0.0.1');
    const body = JSON.stringify({ model: 'slow', messages: [{ role: 'user', content: 'a body sent after its headers' }] }).replace('"messages"', '"messages" ');
    const request = post(body);
    const split = request.indexOf('\r\n\r\n') + 4;
    const first = await exchange(socket, [request.slice(0, split), request.slice(split, split + 10), `${request.slice(split + 10)}`]);
    const second = await exchange(socket, post(MALFORMED));
    const third = await exchange(socket, 'GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n');
    socket.destroy();
    assert.deepEqual([first.status, second.status, third.status], [429, 429, 200]);
    assert.doesNotMatch(first.headers, /connection: close/i);
  });

  it('counts every refusal at the door as a shed of the intake, with its reason', async () => {
    await eventually(() => assert.equal(intake.waiting, 1));
    const shedBefore = intake.stats.shed['buffer-full'];
    const receivedBefore = intake.stats.received;
    const before = asked;
    const socket = connect(port, '127.0.0.1');
    for (let i = 0; i < 5; i++) assert.equal((await exchange(socket, post(MALFORMED))).status, 429);
    socket.destroy();
    assert.equal(intake.stats.shed['buffer-full'] - shedBefore, 5);
    assert.equal(intake.stats.received - receivedBefore, 5);
    assert.equal(asked, before);
    const text = await (await fetch(`${url}/metrics`)).text();
    const line = text.split('\n').find((l) => l.startsWith('sluice_stage_shed_total{stage="intake",reason="buffer-full"}'));
    assert.equal(Number(line?.split(' ').at(-1)), intake.stats.shed['buffer-full']);
  });

  it('logs door refusals at most 10 a second, while /metrics counts them all', async () => {
    await eventually(() => assert.equal(intake.waiting, 1));
    const shedBefore = intake.stats.shed['buffer-full'];
    const loggedBefore = logged.filter((entry) => entry.error?.code === 'server_busy').length;
    const started = performance.now();
    const socket = connect(port, '127.0.0.1');
    for (let i = 0; i < 40; i++) assert.equal((await exchange(socket, post(MALFORMED))).status, 429);
    socket.destroy();
    const seconds = Math.ceil((performance.now() - started) / 1000) + 1;
    const lines = logged.filter((entry) => entry.error?.code === 'server_busy').length - loggedBefore;
    assert.equal(intake.stats.shed['buffer-full'] - shedBefore, 40);
    assert.ok(lines <= 10 * seconds, `${lines} lines in at most ${seconds} s`);
    assert.ok(
      logged.some((entry) => entry.status === 429 && entry.error?.code === 'server_busy'),
      'a door refusal is logged as refused',
    );
    assert.ok(lines < 40 || seconds > 4, 'not one line per refusal');
  });

  it('lets a request of a higher class in: it takes the place of a waiting one', async () => {
    await eventually(() => assert.equal(intake.waiting, 1));
    const before = asked;
    const evictedBefore = intake.stats.shed.evicted;
    const urgent = fetch(`${url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'slow', stream: true, service_tier: 'priority', messages: [{ role: 'user', content: 'hi' }] }),
      signal: held.signal,
    }).catch(() => undefined);
    await eventually(() => assert.equal(intake.stats.shed.evicted, evictedBefore + 1));
    assert.equal(asked, before + 1);
    void urgent;
  });

  it('goes the long way when the bytes do not tell the model or the tier plainly', () => {
    const read = (body: string, key: string) => plainString(Buffer.from(body), Buffer.from(`"${key}"`));
    assert.equal(read('{"model": "slow", "stream": true}', 'model'), 'slow');
    assert.equal(read('{"model":"slow"}', 'service_tier'), undefined);
    assert.equal(typeof read('{"model":"a","metadata":{"model":"b"}}', 'model'), 'symbol');
    assert.equal(typeof read('{"model":"sl\\"ow"}', 'model'), 'symbol');
    assert.equal(typeof read('{"model": 7}', 'model'), 'symbol');
  });
});

describe('the HTTP door with maxLoopLag', () => {
  const intake = new Intake({ maxQueue: 8 });
  const model = new ScriptedWorker({ name: 'quick', tokens: ['a', 'b'] });
  const quick = pipelineWorker({
    name: 'quick',
    intake,
    pipeline: (jobs) => jobs.pipe(streamStage((job) => model.generate(job.request, job.options), { concurrency: 2 })),
  });
  const handler = createHttpHandler({ workers: { quick }, intake, maxLoopLag: 50 });
  let server: Server;
  let port: number;

  before(async () => {
    server = createServer(handler);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    port = (server.address() as AddressInfo).port;
  });
  after(async () => {
    await handler.drain();
    quick.close();
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });

  /** Sends `body` on `socket` while the loop is blocked for `blockMs`: the server sees it once the loop runs again, late. */
  const behindLoop = (socket: Socket, body: string, blockMs: number) => {
    const answer = exchange(socket, post(body));
    const until = performance.now() + blockMs;
    while (performance.now() < until) {} // the loop stalls, as under a burst it cannot keep up with
    return answer;
  };

  it('refuses completions while the event loop runs late, counted as lagging; a priority one and later ones enter', async () => {
    const socket = connect(port, '127.0.0.1');
    await new Promise((resolve) => socket.once('connect', resolve));
    const ask = JSON.stringify({ model: 'quick', messages: [{ role: 'user', content: 'hi' }] });
    const refused = await behindLoop(socket, ask, 200);
    assert.equal(refused.status, 429);
    assert.equal((JSON.parse(refused.body) as { error: { code: string } }).error.code, 'server_busy');
    assert.equal(intake.stats.shed.lagging, 1);
    const urgent = await behindLoop(socket, JSON.stringify({ model: 'quick', service_tier: 'priority', messages: [{ role: 'user', content: 'hi' }] }), 200);
    assert.equal(urgent.status, 200);
    // Caught up: the next request enters.
    await eventually(async () => assert.equal((await exchange(socket, post(ask))).status, 200));
    socket.destroy();
  });
});
