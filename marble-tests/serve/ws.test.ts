import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import { connect, type AddressInfo } from 'node:net';
import { randomBytes } from 'node:crypto';
import type { IncomingHttpHeaders } from 'node:http';
import { join } from 'node:path';
import fc from 'fast-check';
import { WebSocket } from 'ws';
import { MODEL_FILES } from '../../src/ai/models/generate.js';
import { CharLmWorker } from '../../src/ai/inference/onnx-lm.js';
import { generateRequest } from '../../src/ai/inference/worker.js';
import { ScriptedWorker } from 'sluice/testing/ai';
import { unrulyWorker } from '../support/unruly-worker.js';
import { InvalidOptionsError } from '../../src/core/errors.js';
import { attachTokenSocket, type TokenSocket, type TokenSocketEvent, type TokenSocketLimits, type TokenSocketOptions } from '../../src/serve/ws-server.js';
import { CLOSE_CODES, PROTOCOL_ERRORS, SUBPROTOCOL, serverFrameSchema, type ServerFrame } from '../../src/serve/protocol.js';
import { SluiceMetrics } from '../../src/serve/metrics.js';
import { until } from '../support/ws-client.js';
import { generatedModels, type GeneratedModels } from '../support/models.js';

const SECRET = 'sk-test-9f8e7d6c5b4a';
const OTHER_SECRET = 'sk-other-1a2b3c4d';
const authenticate = (token: string) => (token === SECRET ? { tenant: 'acme' } : token === OTHER_SECRET ? { tenant: 'globex' } : undefined);

/** Lets pending I/O run: macrotask turns, no wall-clock. */
const turn = () => new Promise<void>((resolve) => setImmediate(resolve));

/**
 * A deterministic worker: token n is `t<n> ` padded to `size` characters, produced on demand by
 * `decode` (so it honours demand exactly like the ONNX workers); it records each generation's steps and signal.
 */
const countingWorker = (size = 8) => new ScriptedWorker({ name: 'counter', padTo: size, inputTokens: 3 });

interface Served {
  readonly url: string;
  readonly tokens: TokenSocket;
  readonly events: TokenSocketEvent[];
  close(): Promise<void>;
}

async function serve(options: Omit<TokenSocketOptions, 'authenticate' | 'onEvent'> & { limits?: Partial<TokenSocketLimits> }): Promise<Served> {
  const server: Server = createServer((_, res) => res.writeHead(404).end());
  const events: TokenSocketEvent[] = [];
  const tokens = attachTokenSocket(server, { authenticate, onEvent: (e) => events.push(e), path: '/v1/stream', ...options });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `ws://127.0.0.1:${port}/v1/stream`,
    tokens,
    events,
    close: async () => {
      tokens.close();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/** A real ws client that records every frame, validating it against the server frame schema. */
class Client {
  readonly frames: ServerFrame[] = [];
  readonly closed: Promise<{ code: number; reason: string }>;
  closeCode: number | undefined;
  constructor(readonly ws: WebSocket) {
    ws.on('message', (data) => {
      const frame = serverFrameSchema().parse(JSON.parse(String(data))) as ServerFrame;
      this.frames.push(frame);
    });
    this.closed = new Promise((resolve) =>
      ws.on('close', (code, reason) => {
        this.closeCode = code;
        resolve({ code, reason: String(reason) });
      }),
    );
  }

  static open(
    url: string,
    options: { token?: string; via?: 'header' | 'protocol'; protocols?: string[]; origin?: string; autoPong?: boolean } = {},
  ): Promise<Client> {
    const token = options.token ?? SECRET;
    const via = options.via ?? 'header';
    const protocols = options.protocols ?? [SUBPROTOCOL, ...(via === 'protocol' ? [`bearer.${token}`] : [])];
    const ws = new WebSocket(url, protocols, {
      headers: via === 'header' ? { authorization: `Bearer ${token}` } : {},
      ...(options.origin !== undefined && { origin: options.origin }),
      autoPong: options.autoPong ?? true,
    });
    const client = new Client(ws);
    return new Promise((resolve, reject) => {
      ws.once('open', () => resolve(client));
      ws.once('unexpected-response', (_, res) => reject(Object.assign(new Error(`HTTP ${res.statusCode}`), { status: res.statusCode, headers: res.headers })));
      ws.once('error', reject);
    });
  }

  send(message: unknown): void {
    this.ws.send(typeof message === 'string' ? message : JSON.stringify(message));
  }

  of(id: string): ServerFrame[] {
    return this.frames.filter((f) => 'id' in f && f.id === id);
  }

  tokens(id: string) {
    return this.frames.filter((f): f is Extract<ServerFrame, { type: 'token' }> => f.type === 'token' && f.id === id);
  }

  async terminal(id: string): Promise<ServerFrame> {
    await until(() => this.of(id).some((f) => f.type !== 'token') || this.closeCode !== undefined, `the end of ${id}`);
    const end = this.of(id).find((f) => f.type !== 'token');
    assert.ok(end, `request ${id} ended without done or error (connection closed ${this.closeCode})`);
    return end;
  }

  errors() {
    return this.frames.filter((f): f is Extract<ServerFrame, { type: 'error' }> => f.type === 'error');
  }

  /**
   * Stops reading, so the server's send buffer fills: through `ws`'s own `pause()`, which the
   * library honours (pausing its TCP socket directly, `ws` resumes it whenever its frame parser
   * drains).
   */
  pause(): void {
    this.ws.pause();
  }

  resume(): void {
    this.ws.resume();
  }
}

/** Seq runs 0, 1, 2... for the id, and the stream's tokens arrive in order. */
function assertSequential(client: Client, id: string): string {
  const tokens = client.tokens(id);
  tokens.forEach((t, i) => assert.equal(t.seq, i, `seq of ${id}`));
  return tokens.map((t) => t.text).join('');
}

async function settledToZero(served: Served): Promise<void> {
  await until(() => {
    const s = served.tokens.stats();
    return s.activeRequests === 0 && s.timers === 0 && Object.keys(s.tenants).length === 0;
  }, 'server stats back to 0');
}

describe('WebSocket token server', () => {
  let dir: string;
  let generated: GeneratedModels | undefined;
  let charLm: CharLmWorker;

  before(async () => {
    dir = (generated = await generatedModels('ws')).dir;
    charLm = await CharLmWorker.load(join(dir, MODEL_FILES.charLm));
  });
  after(async () => {
    await charLm.release();
    await generated?.remove();
  });

  describe('protocol and multiplexing', () => {
    it('streams several requests on one socket from the real char LM, in order, with done, usage and the trace', async () => {
      const served = await serve({ workers: { charlm: charLm, counter: countingWorker() } });
      try {
        const client = await Client.open(served.url);
        assert.equal(client.ws.protocol, SUBPROTOCOL);
        const traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
        const a = { prompt: 'The stage', temperature: 0.8, seed: 3, max_tokens: 40 };
        const b = { prompt: 'A pipeline', temperature: 0.9, seed: 5, max_tokens: 25 };
        client.send({
          type: 'generate',
          id: 'a',
          prompt: a.prompt,
          parameters: { temperature: a.temperature, seed: a.seed, max_tokens: a.max_tokens },
          traceparent,
        });
        client.send({
          type: 'generate',
          id: 'b',
          model: 'charlm',
          prompt: b.prompt,
          parameters: { temperature: b.temperature, seed: b.seed, max_tokens: b.max_tokens },
        });
        const [doneA, doneB] = await Promise.all([client.terminal('a'), client.terminal('b')]);
        assert.equal(doneA.type, 'done');
        assert.equal(doneB.type, 'done');
        assert.ok(doneA.type === 'done' && doneB.type === 'done');
        assert.equal(doneA.finish_reason, 'length');
        assert.deepEqual(doneA.usage, { input_tokens: 9, output_tokens: 40 });
        assert.equal(doneB.usage.output_tokens, 25);
        // The trace id the client gave comes back; the span is the server's own.
        assert.match(doneA.traceparent, /^00-0af7651916cd43dd8448eb211c80319c-[0-9a-f]{16}-01$/);
        assert.doesNotMatch(doneB.traceparent, /0af7651916cd43dd8448eb211c80319c/);
        // Multiplexing changes nothing: each stream is exactly what the model generates alone.
        assert.equal(assertSequential(client, 'a'), (await charLm.infer(generateRequest(a))).text);
        assert.equal(assertSequential(client, 'b'), (await charLm.infer(generateRequest(b))).text);
        client.ws.close();
        await client.closed;
        await settledToZero(served);
        assert.equal(served.tokens.stats().completed, 2);
      } finally {
        await served.close();
      }
    });

    it('enforces max_tokens whatever the worker does: 50 token frames, finish_reason length; without max_tokens, the server limit', async () => {
      const unruly = unrulyWorker();
      const served = await serve({ worker: unruly, limits: { maxTokens: 80 } });
      try {
        const client = await Client.open(served.url);
        client.send({ type: 'generate', id: 'a', prompt: 'go', parameters: { max_tokens: 50 } });
        client.send({ type: 'generate', id: 'b', prompt: 'go' });
        for (const [id, limit] of [
          ['a', 50],
          ['b', 80],
        ] as const) {
          const done = await client.terminal(id);
          assert.equal(done.type, 'done');
          assert.equal(done.type === 'done' && done.finish_reason, 'length');
          assert.equal(
            client
              .tokens(id)
              .map((t) => t.tokens)
              .reduce((a, b) => a + b, 0),
            limit,
          );
        }
      } finally {
        await served.close();
      }
    });

    it('answers a duplicate live id, bad parameters and unknown models with typed errors, and keeps the first request', async () => {
      const counter = countingWorker();
      const served = await serve({ worker: counter, limits: { maxTokens: 1000 } });
      try {
        const client = await Client.open(served.url);
        client.send({ type: 'generate', id: 'x', prompt: 'go' });
        await until(() => client.tokens('x').length >= 3, 'tokens of x');
        client.send({ type: 'generate', id: 'x', prompt: 'again' });
        client.send({ type: 'generate', id: 'p', prompt: 'go', parameters: { top_p: 3 } });
        client.send({ type: 'generate', id: 'q', prompt: 'go', parameters: { max_tokens: 5000 } });
        client.send({ type: 'generate', id: 'r', prompt: '' });
        client.send({ type: 'generate', id: 'm', prompt: 'go', model: 'gpt-9' });
        await until(() => client.errors().length >= 5, 'five errors');
        const byId = Object.fromEntries(client.errors().map((e) => [e.id, e]));
        assert.equal(byId.x?.code, 'DUPLICATE_ID');
        assert.equal(byId.p?.code, 'INVALID_OPTIONS');
        assert.match(byId.p!.message, /top_p/);
        assert.equal(byId.q?.code, 'INVALID_OPTIONS');
        assert.match(byId.q!.message, /max_tokens/);
        assert.equal(byId.r?.code, 'EMPTY_PROMPT');
        assert.equal(byId.m?.code, 'UNKNOWN_MODEL');
        const before = client.tokens('x').length;
        await until(() => client.tokens('x').length > before + 5, 'x keeps streaming');
        assert.equal(counter.generations.length, 1, 'refused requests never reach the model');
        client.send({ type: 'cancel', id: 'x' });
        await until(() => client.of('x').some((f) => f.type === 'done'), 'done of x');
        assertSequential(client, 'x');
        client.ws.close();
        await settledToZero(served);
      } finally {
        await served.close();
      }
    });
  });

  describe('hello', () => {
    it('greets every connection first with hello: the protocol, its tenant, the models (default first) and the configured limits — never the token', async () => {
      const limits = {
        maxTokens: 123,
        maxConcurrent: 3,
        rate: { perSecond: 7, burst: 9 },
        tenantConcurrent: 5,
        tenantRate: { perSecond: 4, burst: 6 },
        maxPayload: 4096,
        heartbeatInterval: 45_000,
      };
      // Server-side limits a client cannot act on stay out of the greeting.
      const counter = countingWorker();
      const served = await serve({
        workers: { counter, charlm: charLm },
        limits: { ...limits, highWaterMark: 8192, stallTimeout: 5000, maxBadFrames: 4, conflateLimit: 1000 },
      });
      try {
        // Like a page that sends at once: the hello still comes before the answer to it.
        const eager = new Client(new WebSocket(served.url, [SUBPROTOCOL, `bearer.${SECRET}`]));
        eager.ws.once('open', () => eager.send({ type: 'generate', id: 'a', prompt: 'go', parameters: { max_tokens: 2 } }));
        const other = await Client.open(served.url, { token: OTHER_SECRET });
        await eager.terminal('a');
        await until(() => other.frames.length > 0, 'the other hello');
        const connected = served.events.flatMap((e) => (e.kind === 'connected' ? [[e.tenant, e.connection] as const] : []));
        const numberOf = new Map(connected);
        assert.deepEqual(eager.frames[0], {
          type: 'hello',
          protocol: SUBPROTOCOL,
          connection: numberOf.get('acme'),
          tenant: 'acme',
          models: ['counter', 'charlm'],
          limits,
        });
        assert.deepEqual(other.frames[0], {
          type: 'hello',
          protocol: SUBPROTOCOL,
          connection: numberOf.get('globex'),
          tenant: 'globex',
          models: ['counter', 'charlm'],
          limits,
        });
        assert.notEqual(numberOf.get('acme'), numberOf.get('globex'));
        assert.deepEqual(
          eager.frames.map((f) => f.type),
          ['hello', 'token', 'token', 'done'],
          'one hello, before everything else',
        );
        assert.equal(other.frames.length, 1);
        // A request without `model` went to the first model the hello named.
        assert.equal(counter.generations.length, 1);
        const hellos = JSON.stringify([eager.frames[0], other.frames[0]]);
        assert.equal(hellos.includes(SECRET) || hellos.includes(OTHER_SECRET), false, 'no token in a hello');
        // A request over the announced maxTokens is refused as the hello said it would be.
        other.send({ type: 'generate', id: 'big', prompt: 'go', parameters: { max_tokens: limits.maxTokens + 1 } });
        const refusal = await other.terminal('big');
        assert.equal(refusal.type === 'error' && refusal.code, 'INVALID_OPTIONS');
        for (const client of [eager, other]) client.ws.close();
        await settledToZero(served);
      } finally {
        await served.close();
      }
    });

    it('names the single worker of a one-model server, and the default limits', async () => {
      const served = await serve({ worker: countingWorker() });
      try {
        const client = await Client.open(served.url);
        await until(() => client.frames.length > 0, 'the hello');
        const hello = client.frames[0]!;
        assert.ok(hello.type === 'hello');
        assert.deepEqual(hello.models, ['counter']);
        assert.deepEqual(hello.limits, {
          maxTokens: 4096,
          maxConcurrent: 8,
          rate: { perSecond: 20, burst: 40 },
          tenantConcurrent: 32,
          tenantRate: { perSecond: 50, burst: 100 },
          maxPayload: 65536,
          heartbeatInterval: 30_000,
        });
        client.ws.close();
        await settledToZero(served);
      } finally {
        await served.close();
      }
    });
  });

  describe('cancellation', () => {
    it('a cancel stops the tokens, aborts the signal and confirms with done (abort)', async () => {
      const counter = countingWorker();
      const served = await serve({ worker: counter });
      try {
        const client = await Client.open(served.url);
        client.send({ type: 'generate', id: 'c', prompt: 'go' });
        client.send({ type: 'generate', id: 'keep', prompt: 'go', parameters: { max_tokens: 50 } });
        await until(() => client.tokens('c').length >= 10, 'tokens of c');
        client.send({ type: 'cancel', id: 'c' });
        const done = await client.terminal('c');
        assert.ok(done.type === 'done');
        assert.equal(done.finish_reason, 'abort');
        const generation = counter.generations[0]!;
        assert.equal(generation.signal!.aborted, true);
        const steps = generation.steps;
        const received = client.tokens('c').length;
        assert.ok(done.usage.output_tokens >= received);
        assert.equal((await client.terminal('keep')).type, 'done');
        for (let i = 0; i < 50; i++) await turn();
        assert.equal(generation.steps, steps, 'no step after the cancel');
        assert.equal(client.tokens('c').length, received, 'no token after done');
        assert.equal(counter.generations[1]!.signal!.aborted, false, 'a completed request is not aborted');
        await settledToZero(served);
        assert.equal(served.tokens.stats().connections, 1, 'the connection stays');
        client.ws.close();
      } finally {
        await served.close();
      }
    });

    it('closing the socket aborts every request on it and leaves nothing behind', async () => {
      const counter = countingWorker();
      const served = await serve({ worker: counter });
      try {
        const client = await Client.open(served.url);
        for (const id of ['a', 'b', 'c']) client.send({ type: 'generate', id, prompt: 'go' });
        await until(() => ['a', 'b', 'c'].every((id) => client.tokens(id).length > 3), 'three streams');
        assert.equal(served.tokens.stats().activeRequests, 3);
        assert.deepEqual(served.tokens.stats().tenants, { acme: 3 });
        client.ws.terminate();
        await until(() => served.tokens.stats().connections === 0, 'the server saw the close');
        assert.ok(counter.generations.every((g) => g.signal!.aborted));
        const steps = counter.generations.map((g) => g.steps);
        for (let i = 0; i < 50; i++) await turn();
        assert.deepEqual(
          counter.generations.map((g) => g.steps),
          steps,
        );
        await settledToZero(served);
        assert.equal(served.tokens.stats().cancelled, 3);
      } finally {
        await served.close();
      }
    });
  });

  describe('backpressure', () => {
    it('a client that stops reading stops its model (pause) while another client keeps streaming, with the buffer bounded', async () => {
      const counter = countingWorker(1024);
      const highWaterMark = 32 * 1024;
      // Without max_tokens a request gets the server's limit: this one must outlast the test.
      const served = await serve({ worker: counter, limits: { highWaterMark, stallTimeout: 60_000, maxTokens: 10_000_000 } });
      try {
        const slow = await Client.open(served.url);
        const fast = await Client.open(served.url);
        slow.pause();
        slow.send({ type: 'generate', id: 's', prompt: 'go' });
        await until(() => counter.generations.length === 1, 'slow generation started');
        fast.send({ type: 'generate', id: 'f', prompt: 'go' });
        await until(() => counter.generations.length === 2, 'fast generation started');
        const slowGen = counter.generations[0]!;
        const fastGen = counter.generations[1]!;
        // Kernel buffers absorb some frames first; wait until the slow generation's step count settles.
        let stable = false;
        for (let round = 0; round < 2000 && !stable; round++) {
          const steps = slowGen.steps;
          const seen = fast.tokens('f').length;
          await until(() => fast.tokens('f').length >= seen + 50, 'fast client progress');
          stable = slowGen.steps === steps;
        }
        assert.ok(stable, 'the slow generation stopped decoding');
        const paused = slowGen.steps;
        const seen = fast.tokens('f').length;
        await until(() => fast.tokens('f').length >= seen + 500, 'fast client keeps streaming');
        assert.equal(slowGen.steps, paused, 'no step while the client does not read');
        assert.ok(fastGen.steps >= seen + 500);
        // Server memory: at most the high-water mark plus the frame that crossed it.
        assert.ok(served.tokens.stats().buffered <= highWaterMark + 1200, `buffered ${served.tokens.stats().buffered}`);
        // Reading again resumes decoding where it stopped, losing nothing.
        slow.resume();
        await until(() => slowGen.steps > paused + 100, 'slow generation resumes');
        slow.send({ type: 'cancel', id: 's' });
        fast.send({ type: 'cancel', id: 'f' });
        await slow.terminal('s');
        await fast.terminal('f');
        const slowTokens = slow.tokens('s');
        slowTokens.forEach((t, i) => assert.equal(t.text.startsWith(`t${i} `), true));
        assertSequential(fast, 'f');
        slow.ws.close();
        fast.ws.close();
        await settledToZero(served);
      } finally {
        await served.close();
      }
    });

    it('conflate merges pending tokens into larger frames, losing none, and pauses at its limit', async () => {
      const counter = countingWorker(8);
      const served = await serve({ worker: counter, limits: { highWaterMark: 16 * 1024, conflateLimit: 4096, stallTimeout: 60_000 } });
      try {
        const client = await Client.open(served.url);
        client.pause();
        client.send({ type: 'generate', id: 'k', prompt: 'go', policy: 'conflate' });
        await until(() => counter.generations.length === 1, 'generation started');
        const generation = counter.generations[0]!;
        let stable = false;
        for (let round = 0; round < 2000 && !stable; round++) {
          const steps = generation.steps;
          for (let i = 0; i < 200; i++) await turn();
          stable = generation.steps === steps;
        }
        assert.ok(stable, 'decoding paused at the conflate limit');
        client.resume();
        await until(() => client.frames.some((f) => f.type === 'token' && f.tokens > 1), 'a conflated frame');
        await until(() => generation.steps > 2000, 'more tokens');
        client.send({ type: 'cancel', id: 'k' });
        const done = await client.terminal('k');
        assert.ok(done.type === 'done');
        const text = assertSequential(client, 'k');
        const frames = client.tokens('k');
        const count = frames.reduce((sum, f) => sum + f.tokens, 0);
        const expected = Array.from({ length: count }, (_, n) => `t${n} `.padEnd(8, '.')).join('');
        assert.equal(text, expected, 'every token arrives once, in order');
        assert.ok(frames.length < count, 'fewer frames than tokens');
        client.ws.close();
        await settledToZero(served);
      } finally {
        await served.close();
      }
    });

    it('a client stuck beyond stallTimeout is closed with 4008 and its requests are aborted', async () => {
      const counter = countingWorker(1024);
      const served = await serve({ worker: counter, limits: { highWaterMark: 16 * 1024, stallTimeout: 200 } });
      try {
        const client = await Client.open(served.url);
        client.pause();
        client.send({ type: 'generate', id: 's', prompt: 'go' });
        await until(() => counter.generations[0]?.signal?.aborted === true, 'the stall aborts the request');
        client.resume();
        const { code } = await client.closed;
        assert.equal(code, 4008);
        assert.equal(
          client.frames.some((f) => f.type === 'done'),
          false,
        );
        await until(() => served.tokens.stats().connections === 0, 'connection gone');
        await settledToZero(served);
        assert.ok(served.events.some((e) => e.kind === 'closed' && e.cause === 'stalled'));
      } finally {
        await served.close();
      }
    });

    it('a client that reads nothing is cut about stallTimeout after it stalled, not twice that: its close frame cannot get out', async () => {
      const counter = countingWorker(1024);
      const stallTimeout = 3000;
      const served = await serve({ worker: counter, limits: { highWaterMark: 16 * 1024, stallTimeout } });
      try {
        const client = await Client.open(served.url);
        client.pause();
        client.send({ type: 'generate', id: 's', prompt: 'go' });
        await until(() => counter.generations[0]?.signal?.aborted === true, 'the stall to be found', 30_000);
        const foundAt = performance.now();
        await until(() => served.events.some((e) => e.kind === 'closed' && e.cause === 'stalled'), 'the connection to be cut', 30_000);
        const cutAfter = performance.now() - foundAt;
        // Before: the close frame waited behind the buffered data for another stallTimeout.
        assert.ok(cutAfter < stallTimeout / 2, `cut ${Math.round(cutAfter)} ms after the stall was found`);
        client.resume();
        assert.equal((await client.closed).code, 1006, 'a client that read nothing never got the close frame');
      } finally {
        await served.close();
      }
    });
  });

  describe('security', () => {
    it('refuses a missing or wrong token with 401, a foreign origin with 403, a missing subprotocol with 400 — and never echoes secrets', async () => {
      const served = await serve({ worker: countingWorker(), origins: ['https://app.example.com'] });
      try {
        const status = (p: Promise<Client>) =>
          p.then(
            () => assert.fail('the upgrade should have been refused'),
            (err: { status?: number }) => err.status,
          );
        assert.equal(await status(Client.open(served.url, { token: 'nope' })), 401);
        assert.equal(await status(Client.open(served.url, { token: 'nope', via: 'protocol' })), 401);
        assert.equal(await status(Client.open(served.url, { protocols: [] })), 400);
        assert.equal(await status(Client.open(served.url, { origin: 'https://evil.example.com' })), 403);
        const viaProtocol = await Client.open(served.url, { via: 'protocol', origin: 'https://app.example.com' });
        assert.equal(viaProtocol.ws.protocol, SUBPROTOCOL, 'the bearer entry is never selected');
        viaProtocol.send({ type: 'generate', id: 'a', prompt: 'go', parameters: { max_tokens: 3 } });
        assert.equal((await viaProtocol.terminal('a')).type, 'done');
        viaProtocol.ws.close();
        const log = JSON.stringify(served.events) + JSON.stringify(viaProtocol.frames);
        assert.equal(log.includes(SECRET), false);
        assert.equal(log.includes('nope'), false);
        assert.deepEqual(
          served.events.filter((e) => e.kind === 'upgrade-rejected').map((e) => e.kind === 'upgrade-rejected' && e.status),
          [401, 401, 400, 403],
        );
      } finally {
        await served.close();
      }
    });

    it('closes a browser (allowed Origin) whose token is missing or wrong with 4401 and a reason, acts on none of its frames, and leaves nothing behind', async () => {
      const counter = countingWorker();
      const metrics = new SluiceMetrics({ defaultMetrics: false });
      const origin = 'https://app.example.com';
      const served = await serve({ worker: counter, origins: [origin], metrics });
      try {
        // Like a page that sends as soon as it is open: these frames reach the server, which must drop them.
        const protocols: string[] = [];
        const browser = (offered: string[], headers: Record<string, string> = {}) => {
          const ws = new WebSocket(served.url, offered, { origin, headers });
          ws.once('open', () => {
            protocols.push(ws.protocol);
            ws.send(JSON.stringify({ type: 'generate', id: 'a', prompt: 'go', parameters: { max_tokens: 2 } }));
            ws.send('not json');
          });
          return new Client(ws);
        };
        const refused = [browser([SUBPROTOCOL, 'bearer.nope']), browser([SUBPROTOCOL]), browser([SUBPROTOCOL], { authorization: 'Bearer nope' })];
        for (const client of refused) {
          assert.deepEqual(await client.closed, { code: CLOSE_CODES.unauthorized, reason: 'unauthorized: missing or invalid bearer token' });
          assert.deepEqual(client.frames, [], 'no frame answered, not even a hello');
        }
        assert.deepEqual(protocols, [SUBPROTOCOL, SUBPROTOCOL, SUBPROTOCOL], 'each handshake completed, and the bearer entry is never selected');
        assert.equal(counter.generations.length, 0, 'nothing generated');
        const rejection = { kind: 'upgrade-rejected', status: 401, reason: 'missing or invalid bearer token', closeCode: 4401 };
        assert.deepEqual(served.events, [rejection, rejection, rejection], 'no connected, bad-frame or refused event');
        const stats = served.tokens.stats();
        assert.equal(stats.connections, 0);
        assert.equal(stats.started + stats.badFrames, 0);
        assert.deepEqual(stats.upgradesRejected, { 400: 0, 401: 3, 403: 0, 503: 0 });
        // The refusals' kill timers are cleared once their close completed.
        await settledToZero(served);
        const { body } = await metrics.scrape();
        assert.match(body, /^sluice_ws_upgrades_rejected_total\{server="ws",status="401"\} 3$/m);
        assert.match(body, /^sluice_ws_upgrades_rejected_total\{server="ws",status="403"\} 0$/m);
        assert.match(body, /^sluice_ws_connections\{server="ws"\} 0$/m);
        assert.equal(JSON.stringify(served.events).includes('nope'), false);

        // The same page with the right token is served.
        const good = await Client.open(served.url, { origin, via: 'protocol' });
        good.send({ type: 'generate', id: 'a', prompt: 'go', parameters: { max_tokens: 2 } });
        assert.equal((await good.terminal('a')).type, 'done');
        good.ws.close();
        await good.closed;
        await settledToZero(served);
        assert.equal(served.tokens.stats().connections, 0);
      } finally {
        metrics.close();
        await served.close();
      }
    });

    it('keeps the HTTP refusal where a close cannot help: no Origin (401, WWW-Authenticate: Bearer), a foreign Origin (403), no sluice.v1 offered (401)', async () => {
      const served = await serve({ worker: countingWorker(), origins: ['https://app.example.com'] });
      try {
        const refusal = (p: Promise<Client>) =>
          p.then(
            () => assert.fail('the upgrade should have been refused over HTTP'),
            (err: { status?: number; headers?: IncomingHttpHeaders }) => err,
          );
        const noOrigin = await refusal(Client.open(served.url, { token: 'nope', via: 'protocol' }));
        assert.equal(noOrigin.status, 401);
        assert.equal(noOrigin.headers?.['www-authenticate'], 'Bearer');
        // A foreign page gets no socket, whatever its token.
        assert.equal((await refusal(Client.open(served.url, { origin: 'https://evil.example.com', token: 'nope', via: 'protocol' }))).status, 403);
        assert.equal((await refusal(Client.open(served.url, { origin: 'https://evil.example.com', via: 'protocol' }))).status, 403);
        // Without sluice.v1 the handshake could not select the page's subprotocol: HTTP it is.
        assert.equal((await refusal(Client.open(served.url, { origin: 'https://app.example.com', via: 'protocol', protocols: ['bearer.nope'] }))).status, 401);
        assert.deepEqual(
          served.events.map((e) => e.kind === 'upgrade-rejected' && [e.status, e.closeCode]),
          [
            [401, undefined],
            [403, undefined],
            [403, undefined],
            [401, undefined],
          ],
        );
        assert.deepEqual(served.tokens.stats().upgradesRejected, { 400: 0, 401: 2, 403: 2, 503: 0 });
        await settledToZero(served);
      } finally {
        await served.close();
      }
    });

    it('terminates a refused browser that does not answer the 4401 close within a second', async () => {
      const origin = 'https://app.example.com';
      const served = await serve({ worker: countingWorker(), origins: [origin] });
      const { port } = new URL(served.url);
      // A raw TCP peer: it reads the 101 and the close frame, and never answers.
      const socket = connect(Number(port), '127.0.0.1');
      socket.on('error', () => {});
      let received = Buffer.alloc(0);
      socket.on('data', (chunk: Buffer) => (received = Buffer.concat([received, chunk])));
      const gone = new Promise<number>((resolve) => socket.once('close', () => resolve(performance.now())));
      try {
        const handshake = [
          'GET /v1/stream HTTP/1.1',
          `Host: 127.0.0.1:${port}`,
          'Upgrade: websocket',
          'Connection: Upgrade',
          `Sec-WebSocket-Key: ${randomBytes(16).toString('base64')}`,
          'Sec-WebSocket-Version: 13',
          `Sec-WebSocket-Protocol: ${SUBPROTOCOL}, bearer.nope`,
          `Origin: ${origin}`,
        ];
        socket.write(`${handshake.join('\r\n')}\r\n\r\n`);
        const sent = performance.now();
        const reason = Buffer.from('unauthorized: missing or invalid bearer token');
        const closeFrame = Buffer.concat([Buffer.from([0x88, 2 + reason.length, CLOSE_CODES.unauthorized >> 8, CLOSE_CODES.unauthorized & 0xff]), reason]);
        await until(() => received.includes(closeFrame), 'the close frame');
        assert.match(received.subarray(0, 32).toString('latin1'), /^HTTP\/1\.1 101 /);
        assert.equal(served.tokens.stats().timers, 1, 'the refusal holds its kill timer while the peer stays silent');
        assert.equal(served.tokens.stats().connections, 0);
        const waited = (await gone) - sent;
        assert.ok(waited >= 900, `terminated after ${waited.toFixed(0)} ms, before the peer had its second`);
        assert.ok(waited < 10_000, `terminated after ${waited.toFixed(0)} ms (ws's own close timeout is 30 s)`);
        await settledToZero(served);
      } finally {
        socket.destroy();
        await served.close();
      }
    });

    it('validates its options with InvalidOptionsError naming the field', () => {
      const server = createServer();
      assert.throws(
        () => attachTokenSocket(server, { authenticate, worker: countingWorker(), limits: { maxPayload: 0 } }),
        (err: unknown) => err instanceof InvalidOptionsError && err.issues.some((i) => i.path === 'maxPayload'),
      );
      assert.throws(
        () => attachTokenSocket(server, { authenticate }),
        (err: unknown) => err instanceof InvalidOptionsError && err.issues.some((i) => i.path === 'worker'),
      );
      assert.equal(server.listenerCount('upgrade'), 0);
    });

    it('limits concurrent requests per connection, frames per second, and requests per tenant — with typed errors, the connection kept', async () => {
      const counter = countingWorker();
      const served = await serve({ worker: counter, limits: { maxConcurrent: 2, tenantConcurrent: 3, rate: { perSecond: 0.001, burst: 6 } } });
      try {
        const one = await Client.open(served.url);
        one.send({ type: 'generate', id: 'a', prompt: 'go' });
        one.send({ type: 'generate', id: 'b', prompt: 'go' });
        one.send({ type: 'generate', id: 'c', prompt: 'go' });
        await until(() => one.errors().length === 1, 'concurrency error');
        assert.deepEqual([one.errors()[0]!.id, one.errors()[0]!.code], ['c', 'TOO_MANY_REQUESTS']);

        const two = await Client.open(served.url);
        two.send({ type: 'generate', id: 'd', prompt: 'go' });
        two.send({ type: 'generate', id: 'e', prompt: 'go' });
        await until(() => two.errors().length === 1, 'tenant quota error');
        assert.deepEqual([two.errors()[0]!.id, two.errors()[0]!.code], ['e', 'TENANT_QUOTA']);
        const other = await Client.open(served.url, { token: OTHER_SECRET });
        other.send({ type: 'generate', id: 'g', prompt: 'go', parameters: { max_tokens: 2 } });
        assert.equal((await other.terminal('g')).type, 'done', 'another tenant is not held back');
        assert.deepEqual(served.tokens.stats().tenants, { acme: 3 });

        // Frames 4..6 of the burst of 6 spend the rest; the 7th is rate limited.
        one.send({ type: 'cancel', id: 'a' });
        one.send({ type: 'cancel', id: 'zz' });
        one.send({ type: 'cancel', id: 'b' });
        one.send({ type: 'cancel', id: 'c' });
        await until(() => one.errors().length === 3, 'unknown id and rate limit');
        assert.deepEqual(
          one
            .errors()
            .slice(1)
            .map((e) => [e.id, e.code]),
          [
            ['zz', 'UNKNOWN_ID'],
            ['c', 'RATE_LIMITED'],
          ],
        );
        assert.equal(one.ws.readyState, WebSocket.OPEN);
        for (const c of [one, two, other]) c.ws.close();
        await settledToZero(served);
      } finally {
        await served.close();
      }
    });

    it('terminates a client that misses a heartbeat and aborts its work; one that answers pings stays', async () => {
      const counter = countingWorker();
      const served = await serve({ worker: counter, limits: { heartbeatInterval: 30, maxTokens: 10_000_000 } });
      try {
        const deaf = await Client.open(served.url, { autoPong: false });
        const healthy = await Client.open(served.url);
        let pings = 0;
        healthy.ws.on('ping', () => pings++);
        deaf.send({ type: 'generate', id: 'h', prompt: 'go' });
        await until(() => counter.generations.length === 1, 'generation started');
        const { code } = await deaf.closed;
        assert.equal(code, 1006, 'terminated without a close frame');
        assert.equal(counter.generations[0]!.signal!.aborted, true);
        await until(() => pings >= 4, 'several pings to the healthy client');
        assert.equal(healthy.ws.readyState, WebSocket.OPEN);
        assert.ok(served.events.some((e) => e.kind === 'closed' && e.cause === 'heartbeat'));
        healthy.ws.close();
        await settledToZero(served);
      } finally {
        await served.close();
      }
    });

    it('closes with 1009 on an oversized frame and with 1008 after maxBadFrames bad frames in a row', async () => {
      const served = await serve({ worker: countingWorker(), limits: { maxPayload: 1024, maxBadFrames: 3 } });
      try {
        const big = await Client.open(served.url);
        big.send({ type: 'generate', id: 'big', prompt: 'x'.repeat(2000) });
        assert.equal((await big.closed).code, 1009);

        const bad = await Client.open(served.url);
        bad.send('not json');
        bad.send({ type: 'cancel', id: 'nobody' }); // well-formed: resets the count
        bad.send('{"type":"launch"}');
        bad.ws.send(Buffer.from([1, 2, 3]));
        bad.send({ type: 'generate', id: 'x' });
        assert.equal((await bad.closed).code, 1008);
        assert.deepEqual(
          bad.errors().map((e) => e.code),
          ['INVALID_JSON', 'UNKNOWN_ID', 'UNKNOWN_TYPE', 'BINARY_FRAME', 'INVALID_MESSAGE'],
        );
        assert.equal(bad.errors()[4]!.id, 'x');
        assert.match(bad.errors()[4]!.message, /prompt/);
        await settledToZero(served);
      } finally {
        await served.close();
      }
    });
  });

  describe('bad input', () => {
    it('fuzz: ≥ 10,000 random and mutated frames get typed errors, connections close only per the rule, a streaming client is unaffected', async () => {
      const maxBadFrames = 6;
      const maxPayload = 4096;
      const counter = countingWorker();
      const served = await serve({ worker: counter, limits: { maxPayload, maxBadFrames, rate: { perSecond: 1e6, burst: 1e6 }, maxConcurrent: 4 } });
      const healthy = await Client.open(served.url);
      healthy.send({ type: 'generate', id: 'stream', prompt: 'go' });
      const valid = { type: 'generate', id: 'v', prompt: 'hello', parameters: { max_tokens: 2 } };
      type Frame = { kind: 'bad'; data: string | Buffer } | { kind: 'good'; data: string } | { kind: 'oversize'; data: string };
      const json = (v: unknown) => JSON.stringify(v);
      const bad = (data: string | Buffer): Frame => ({ kind: 'bad', data });
      const mutation = fc.oneof(
        fc
          .string()
          .filter((s) => s !== 'generate' && s !== 'cancel')
          .map((type) => bad(json({ ...valid, type }))),
        fc
          .oneof(fc.integer(), fc.boolean(), fc.constant(null), fc.constant(''), fc.string({ minLength: 129, maxLength: 200 }))
          .map((id) => bad(json({ ...valid, id }))),
        fc.oneof(fc.integer(), fc.array(fc.string()), fc.constant(null)).map((prompt) => bad(json({ ...valid, prompt }))),
        fc
          .string({ minLength: 1 })
          .filter((k) => !['type', 'id', 'prompt', 'messages', 'parameters', 'traceparent', 'policy', 'model'].includes(k))
          .map((k) => bad(json({ ...valid, [k]: 1 }))),
        fc.constantFrom('type', 'id', 'prompt').map((k) => bad(json(Object.fromEntries(Object.entries(valid).filter(([key]) => key !== k))))),
        fc.string().map((t) => bad(json({ ...valid, traceparent: t }))),
        fc.oneof(fc.string(), fc.integer(), fc.array(fc.integer())).map((parameters) => bad(json({ ...valid, parameters }))),
        fc.constantFrom('Pause', 'drop', '').map((policy) => bad(json({ ...valid, policy }))),
        fc.uint8Array({ maxLength: 64 }).map((bytes) => bad(Buffer.from(bytes))),
        fc.string().map((s) => bad(json(valid).slice(0, Math.max(1, s.length % json(valid).length)))),
        fc.oneof(fc.integer(), fc.constant('[]'), fc.constant('null'), fc.constant('"generate"')).map((v) => bad(String(v))),
      );
      const random = fc
        .string({ maxLength: 200 })
        .filter((s) => !s.includes('"type"'))
        .map((s) => bad(s));
      const good = fc.string({ minLength: 1, maxLength: 20 }).map((id) => ({ kind: 'good', data: json({ type: 'cancel', id: `unknown-${id}` }) }) as Frame);
      const oversize = fc.constant<Frame>({ kind: 'oversize', data: json({ ...valid, prompt: 'x'.repeat(maxPayload) }) });
      const frame = fc.oneof(
        { weight: 6, arbitrary: mutation },
        { weight: 3, arbitrary: random },
        { weight: 3, arbitrary: good },
        { weight: 1, arbitrary: oversize },
      );

      let sent = 0;
      let closedByRule = 0;
      try {
        await fc.assert(
          fc.asyncProperty(fc.array(frame, { minLength: 60, maxLength: 100 }), async (frames) => {
            const client = await Client.open(served.url);
            // The oracle: answer each frame until the rule closes the connection.
            let inARow = 0;
            let expectedClose: number | undefined;
            const expected: ('bad' | 'good')[] = [];
            for (const f of frames) {
              if (expectedClose !== undefined) break;
              if (f.kind === 'oversize') {
                expectedClose = 1009;
                break;
              }
              expected.push(f.kind);
              inARow = f.kind === 'bad' ? inARow + 1 : 0;
              if (inARow >= maxBadFrames) expectedClose = 1008;
            }
            for (const f of frames) {
              if (client.ws.readyState !== WebSocket.OPEN) break;
              client.ws.send(f.data, { binary: Buffer.isBuffer(f.data) });
              sent++;
            }
            if (expectedClose === undefined) client.send({ type: 'cancel', id: 'sentinel' });
            await until(() => client.closeCode !== undefined || client.errors().some((e) => e.id === 'sentinel'), 'the answer to every frame');
            const answers = client.errors().filter((e) => e.id !== 'sentinel');
            assert.deepEqual(
              answers.map((e) => ((PROTOCOL_ERRORS as readonly string[]).includes(e.code) ? 'bad' : e.code === 'UNKNOWN_ID' ? 'good' : e.code)),
              expected,
            );
            assert.equal(client.frames[0]?.type, 'hello');
            assert.equal(client.frames.length, 1 + answers.length + (expectedClose === undefined ? 1 : 0), 'the hello, then only error frames');
            if (expectedClose !== undefined) {
              assert.equal((await client.closed).code, expectedClose);
              closedByRule++;
            } else {
              assert.equal(client.ws.readyState, WebSocket.OPEN, 'kept open');
              client.ws.close();
              await client.closed;
            }
          }),
          { numRuns: 140, endOnFailure: true },
        );
        assert.ok(sent >= 10_000, `only ${sent} frames sent`);
        assert.ok(closedByRule > 0, 'the close rule was exercised');
        // The healthy client streamed through all of it, in order, never refused.
        const streamed = healthy.tokens('stream').length;
        assert.ok(streamed > 100, `healthy client got ${streamed} tokens`);
        assert.equal(healthy.errors().length, 0);
        healthy.send({ type: 'cancel', id: 'stream' });
        assert.equal((await healthy.terminal('stream')).type, 'done');
        assertSequential(healthy, 'stream');
        assert.equal(counter.generations.length, 1, 'no fuzzed frame started a generation');
        healthy.ws.close();
        await until(() => served.tokens.stats().connections === 0, 'all connections closed');
        await settledToZero(served);
      } finally {
        await served.close();
      }
    });
  });
});
