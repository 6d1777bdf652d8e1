import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import fc from 'fast-check';
import * as ort from 'onnxruntime-node';
import { firstValueFrom, toArray } from 'rxjs';
import { subscribeWithDemand } from '../../src/flow/demand.js';
import { fromIterable } from '../../src/flow/sources.js';
import { AbortedError, InvalidOptionsError } from '../../src/core/errors.js';
import { TraceContext, type Traced } from '../../src/core/trace.js';
import { stage } from '../../operators/stage.js';
import { MODEL_FILES } from '../../src/ai/models/generate.js';
import { SIGNATURES, loadModel, type LoadedModel } from '../../src/ai/models/load.js';
import { EmptyPromptError, HttpStatusError, MalformedEventError, ProviderError, RateLimitedError } from '../../src/ai/inference/errors.js';
import { StopMatcher, applyOccurrencePenalties, applyRepetitionPenalty, distribution, sampleToken } from '../../src/ai/inference/sampling.js';
import { seededRandom } from '../../src/resilience/random.js';
import { generateRequest, type GenerateRequest, type GenerationDone, type ModelWorker, type Token } from '../../src/ai/inference/worker.js';
import { OpenAIWorker, SseParser } from '../../src/ai/inference/openai.js';
import { CharLmWorker, DecoderLmWorker, type RunModel } from '../../src/ai/inference/onnx-lm.js';
import { generatedModels, type GeneratedModels } from '../support/models.js';
import { guardedWorker } from '../../src/ai/pipelines/guarded-worker.js';
import type { StageStats } from '../../src/flow/stats.js';

const texts = (tokens: readonly Token[]) => tokens.map((t) => t.text).join('');
/** Lets pending I/O and promise chains run: several macrotask turns, no wall-clock. */
const settle = async (turns = 20) => {
  for (let i = 0; i < turns; i++) await new Promise<void>((resolve) => setImmediate(resolve));
};

function issuesOf(fn: () => unknown): string[] {
  try {
    fn();
  } catch (err) {
    assert.ok(err instanceof InvalidOptionsError, `expected InvalidOptionsError, got ${String(err)}`);
    return err.issues.map((i) => i.path);
  }
  return assert.fail('expected InvalidOptionsError');
}

/** Runs a generation to its end, collecting tokens, the done report and the error. */
function run(worker: ModelWorker, request: GenerateRequest, signal?: AbortSignal) {
  return new Promise<{ tokens: Token[]; done: GenerationDone | undefined; error: unknown }>((resolve) => {
    const tokens: Token[] = [];
    let done: GenerationDone | undefined;
    worker.generate(request, { ...(signal && { signal }), onDone: (d) => (done = d) }).subscribe({
      next: (t) => tokens.push(t),
      error: (error: unknown) => resolve({ tokens, done, error }),
      complete: () => resolve({ tokens, done, error: undefined }),
    });
  });
}

describe('generation requests', () => {
  it('names every invalid parameter in InvalidOptionsError at construction', () => {
    const bad: [Record<string, unknown>, string][] = [
      [{ temperature: -0.1 }, 'temperature'],
      [{ top_p: 0 }, 'top_p'],
      [{ top_p: 1.5 }, 'top_p'],
      [{ top_k: -1 }, 'top_k'],
      [{ top_k: 2.5 }, 'top_k'],
      [{ max_tokens: 0 }, 'max_tokens'],
      [{ max_tokens: 1.5 }, 'max_tokens'],
      [{ stop: 'END' }, 'stop'],
      [{ repetition_penalty: 0 }, 'repetition_penalty'],
      [{ seed: 0.5 }, 'seed'],
      [{ temprature: 1 }, 'temprature'],
    ];
    for (const [params, field] of bad) {
      assert.deepEqual(
        issuesOf(() => generateRequest({ prompt: 'hi', ...params } as GenerateRequest)),
        [field],
        JSON.stringify(params),
      );
    }
    assert.deepEqual(issuesOf(() => generateRequest({ prompt: 'hi', top_p: 0, max_tokens: 0 })).sort(), ['max_tokens', 'top_p']);
  });

  it('accepts the edges of every range and freezes the request', () => {
    const request = generateRequest({ prompt: 'hi', temperature: 0, top_p: 1, top_k: 0, max_tokens: 1, stop: ['x'], repetition_penalty: 0.5, seed: 3 });
    assert.ok(Object.isFrozen(request));
    assert.equal(generateRequest(request), request);
  });

  it('rejects an empty prompt or chat with EmptyPromptError', () => {
    for (const input of [{ prompt: '' }, { messages: [] }, { messages: [{ role: 'user', content: '' }] }]) {
      assert.throws(() => generateRequest(input as GenerateRequest), EmptyPromptError, JSON.stringify(input));
    }
    assert.throws(() => generateRequest({} as GenerateRequest), InvalidOptionsError);
  });
});

describe('guardedWorker options', () => {
  it('are checked when it is made, naming each bad field, not at the first request', () => {
    const worker = { name: 'm', generate: () => fromIterable([]), infer: async () => ({}) } as unknown as ModelWorker<GenerateRequest, never>;
    const classify = () => ({ label: 'safe', score: 0 });
    assert.deepEqual(
      issuesOf(() => guardedWorker(worker as never, { classify, thresholds: { flag: -1, block: 0.8 } })),
      ['thresholds.flag'],
    );
    assert.deepEqual(
      issuesOf(() => guardedWorker(worker as never, { classify: 'not a function' as never })),
      ['classify'],
    );
    assert.deepEqual(
      issuesOf(() => guardedWorker({ name: 'x' } as never, { classify })),
      ['worker.generate', 'worker.infer'],
    );
    assert.deepEqual(
      issuesOf(() => guardedWorker(worker as never, { classify, generateStats: {} as StageStats })),
      ['generateStats'],
    );
    assert.doesNotThrow(() => guardedWorker(worker as never, { classify }));
  });
});

describe('ONNX language-model worker options', () => {
  const run: RunModel = async () => ({});
  it('are checked when a worker is made or loaded, naming each bad field', async () => {
    assert.deepEqual(issuesOf(() => new CharLmWorker({ vocab: 'abc', run: 1, maxTokens: 0, windw: 4 } as never)).sort(), [
      'maxTokens',
      'run',
      'vocab',
      'windw',
    ]);
    assert.doesNotThrow(() => new CharLmWorker({ vocab: ['a', 'b'], run, window: 4 }));
    const shape = { layers: 2, heads: 2, headDim: 8 };
    assert.deepEqual(
      issuesOf(() => new DecoderLmWorker({ shape: { ...shape, layers: 0 }, run, eosTokenId: -1, eosTokenIds: [1.5], codec: {}, vocabSze: 9 } as never)).sort(),
      ['codec', 'eosTokenId', 'eosTokenIds.0', 'shape.layers', 'vocabSze'],
    );
    assert.doesNotThrow(() => new DecoderLmWorker({ shape, run, eosTokenIds: [0], vocabSize: 128 }));
    // load checks before it reads a file: the path need not exist.
    await assert.rejects(
      CharLmWorker.load('no/such.onnx', { window: 0 }),
      (error: unknown) => error instanceof InvalidOptionsError && error.issues[0]?.path === 'window',
    );
    await assert.rejects(
      DecoderLmWorker.load('no/such.onnx', { maxTokens: -1 }),
      (error: unknown) => error instanceof InvalidOptionsError && error.issues[0]?.path === 'maxTokens',
    );
  });
});

describe('sampling', () => {
  const logits = Float32Array.from([1.5, 3, -1, 2.2, 0.3, 2.9]);

  it('is reproducible with a seed', () => {
    const draw = (seed: number) => {
      const random = seededRandom(seed);
      return Array.from({ length: 50 }, () => sampleToken(logits, { temperature: 1.3 }, random).id);
    };
    assert.deepEqual(draw(7), draw(7));
    assert.notDeepEqual(draw(7), draw(8));
  });

  it('temperature 0 is greedy whatever the random draw', () => {
    for (const r of [0, 0.5, 0.999]) assert.equal(sampleToken(logits, { temperature: 0 }, () => r).id, 1);
  });

  it('top-k and top-p restrict the support to the most likely tokens', () => {
    fc.assert(
      fc.property(
        fc.array(fc.float({ min: -5, max: 5, noNaN: true }), { minLength: 2, maxLength: 40 }),
        fc.integer({ min: 1, max: 10 }),
        fc.double({ min: 0.05, max: 1, noNaN: true }),
        (values, k, p) => {
          const scores = Float32Array.from(values);
          const ranked = [...scores.keys()].sort((a, b) => scores[b]! - scores[a]! || a - b);
          const topK = distribution(scores, { top_k: k });
          const supportK = [...topK.keys()].filter((i) => topK[i]! > 0);
          assert.ok(supportK.length <= k);
          assert.deepEqual(new Set(supportK), new Set(ranked.slice(0, supportK.length)));
          const full = distribution(scores, {});
          const topP = distribution(scores, { top_p: p });
          const supportP = ranked.filter((i) => topP[i]! > 0);
          assert.deepEqual(supportP, ranked.slice(0, supportP.length), 'top-p keeps a prefix of the ranking');
          const mass = (n: number) => ranked.slice(0, n).reduce((sum, i) => sum + full[i]!, 0);
          assert.ok(mass(supportP.length) >= p - 1e-9, 'the kept tokens reach top_p');
          assert.ok(supportP.length === 1 || mass(supportP.length - 1) < p + 1e-9, 'and no fewer would');
          assert.ok(Math.abs(topP.reduce((a, b) => a + b, 0) - 1) < 1e-9);
        },
      ),
    );
    const random = seededRandom(1);
    for (let i = 0; i < 200; i++) assert.ok([1, 5].includes(sampleToken(logits, { top_k: 2 }, random).id));
  });

  it('a repetition penalty lowers the probability of tokens already generated', () => {
    const before = distribution(logits, {}, []);
    const after = distribution(logits, { repetition_penalty: 1.8 }, [1, 2]);
    assert.ok(after[1]! < before[1]!, 'positive logit, penalised');
    assert.ok(after[2]! < before[2]!, 'negative logit, penalised (multiplied, not divided)');
    const raw = Float64Array.from([2, -1]);
    applyRepetitionPenalty(raw, [0, 1, 1], 2);
    assert.deepEqual([...raw], [1, -2]);
  });

  it("OpenAI's presence and frequency penalties count generated tokens only, not the prompt's", () => {
    const raw = Float64Array.from([2, 1, 0]);
    applyOccurrencePenalties(raw, [0, 0, 1], 0.5, 0.25);
    assert.deepEqual([...raw], [1, 0.25, 0]);
    const uniform = [0, 0, 0, 0];
    // History [2, 2 | 1, 1]: the prompt is the first two; only token 1 was generated (twice).
    const penalised = distribution(uniform, { presence_penalty: 1, frequency_penalty: 0.5 }, [2, 2, 1, 1], 2);
    assert.ok(penalised[1]! < penalised[0]!, 'the generated token is less likely');
    assert.equal(penalised[2], penalised[0], 'the prompt token is not penalised');
    const negative = distribution(uniform, { presence_penalty: -1 }, [3], 0);
    assert.ok(negative[3]! > negative[0]!, 'a negative penalty makes it more likely');
    assert.deepEqual([...distribution(uniform, { presence_penalty: 0, frequency_penalty: 0 }, [1, 1], 0)], [0.25, 0.25, 0.25, 0.25]);
  });

  it('the stop sequence that begins first wins, even when a shorter one completes sooner (found by the property below)', () => {
    const matcher = new StopMatcher(['bca', 'c']);
    assert.deepEqual(matcher.push('bc'), { text: '', stopped: false }); // 'c' matched, but 'bca' may begin before it
    assert.deepEqual(matcher.push('a'), { text: '', stopped: true });
    const ended = new StopMatcher(['bca', 'c']);
    assert.deepEqual(ended.push('bc'), { text: '', stopped: false });
    assert.equal(ended.flush(), 'b'); // the text ended: 'bca' never came, so 'c' stops it
    assert.equal(ended.matched, true);
  });

  it('stop sequences stop across token boundaries and are never emitted (any split)', () => {
    const alphabet = fc.constantFrom('a', 'b', 'c', 'é', '🌍');
    fc.assert(
      fc.property(
        fc.array(alphabet, { maxLength: 40 }).map((a) => a.join('')),
        fc.array(
          fc.array(alphabet, { minLength: 1, maxLength: 4 }).map((a) => a.join('')),
          { minLength: 1, maxLength: 3 },
        ),
        fc.array(fc.nat(), { maxLength: 20 }),
        (text, stops, cuts) => {
          const points = [...new Set(cuts.map((c) => c % (text.length + 1)))].sort((a, b) => a - b);
          const pieces = [0, ...points, text.length].slice(1).map((end, i, ends) => text.slice(i === 0 ? 0 : ends[i - 1], end));
          const matcher = new StopMatcher(stops);
          let out = '';
          let stopped = false;
          for (const piece of pieces) {
            const step = matcher.push(piece);
            out += step.text;
            if (step.stopped) {
              stopped = true;
              break;
            }
          }
          if (!stopped) {
            out += matcher.flush(); // the end of the text decides what was still held back
            stopped = matcher.matched;
          }
          const first = Math.min(...stops.map((s) => text.indexOf(s)).filter((i) => i >= 0));
          assert.equal(stopped, Number.isFinite(first));
          assert.equal(out, Number.isFinite(first) ? text.slice(0, first) : text);
        },
      ),
    );
  });
});

// ---------------------------------------------------------------- OpenAI over a loopback server

type Handler = (req: IncomingMessage, res: ServerResponse, body: string) => void;
let server: Server;
let handler: Handler = (_req, res) => res.end();
let baseUrl = '';

const sse = (...events: unknown[]) => events.map((e) => `data: ${typeof e === 'string' ? e : JSON.stringify(e)}\n\n`).join('');
const delta = (content: string, finish: string | null = null) => ({ choices: [{ index: 0, delta: { content }, finish_reason: finish }] });

/** Writes `bytes` in pieces of `size` bytes, each in its own write after an event-loop turn so they leave as separate chunks. */
async function writeSplit(res: ServerResponse, bytes: Buffer, size: number): Promise<void> {
  for (let i = 0; i < bytes.length; i += size) {
    res.write(bytes.subarray(i, i + size));
    await new Promise<void>((resolve) => setImmediate(resolve));
  }
}

describe('OpenAI-compatible client', () => {
  before(async () => {
    server = createServer((req, res) => {
      let body = '';
      req.setEncoding('utf8');
      req.on('data', (c: string) => (body += c));
      req.on('end', () => handler(req, res, body));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`;
  });
  after(async () => {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });

  const worker = () => new OpenAIWorker({ baseUrl, model: 'tiny', apiKey: 'k' });
  const words = ['Hé', 'llo', ', ', 'wörld', ' 🌍', '!', ' ça', ' va'];

  it('streams tokens intact when events, lines and UTF-8 characters are split across chunks', async () => {
    let seen: Record<string, unknown> = {};
    let authorization: string | undefined;
    handler = async (req, res, body) => {
      seen = JSON.parse(body) as Record<string, unknown>;
      authorization = req.headers.authorization;
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const stream = sse(...words.map((w) => delta(w)), delta('', 'stop'), { choices: [], usage: { prompt_tokens: 5, completion_tokens: 8 } }, '[DONE]');
      await writeSplit(res, Buffer.from(stream.replaceAll('\n\n', '\r\n\r\n'), 'utf8'), 3);
      res.end();
    };
    const { tokens, done, error } = await run(worker(), generateRequest({ messages: [{ role: 'user', content: 'Hi' }], max_tokens: 20, temperature: 0.5 }));
    assert.equal(error, undefined);
    assert.deepEqual(
      tokens.map((t) => t.text),
      words,
    );
    assert.deepEqual(
      tokens.map((t) => t.index),
      words.map((_, i) => i),
    );
    assert.equal(done?.finishReason, 'stop');
    assert.deepEqual(done?.usage, { inputTokens: 5, outputTokens: 8 });
    assert.equal(seen.stream, true);
    assert.equal(seen.max_tokens, 20);
    assert.deepEqual(seen.messages, [{ role: 'user', content: 'Hi' }]);
    assert.equal(authorization, 'Bearer k');
  });

  it('parses SSE split at every byte boundary (fast-check)', () => {
    const payloads = ['{"a":"é🌍"}', 'line1\nline2', '[DONE]'];
    const stream = ': comment\r\nevent: x\ndata: {"a":"é🌍"}\r\n\r\ndata: line1\ndata:line2\r\rdata: [DONE]\n\n';
    const bytes = Buffer.from(stream, 'utf8');
    fc.assert(
      fc.property(fc.uniqueArray(fc.integer({ min: 1, max: bytes.length - 1 }), { maxLength: 12 }), (cuts) => {
        const parser = new SseParser();
        const ends = [...cuts.sort((a, b) => a - b), bytes.length];
        const events = ends.flatMap((end, i) => parser.push(bytes.subarray(i === 0 ? 0 : ends[i - 1], end)));
        assert.deepEqual([...events, ...parser.end()], payloads);
      }),
    );
  });

  it('bounds an event: a line that never ends, or an event of endless data lines, fails with MalformedEventError', () => {
    const endless = new SseParser(100);
    assert.deepEqual(endless.push(Buffer.from('data: {"ok":1}\n\n')), ['{"ok":1}']);
    assert.throws(() => {
      for (let i = 0; i < 10; i++) endless.push(Buffer.from('x'.repeat(20)));
    }, MalformedEventError);
    const lines = new SseParser(100);
    assert.throws(() => {
      for (let i = 0; i < 20; i++) lines.push(Buffer.from('data: 0123456789\n'));
    }, MalformedEventError);
  });

  it('applies stop sequences split across streamed tokens and never emits them', async () => {
    handler = (_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(sse(delta('one EN'), delta('D two'), delta(' three', 'stop'), '[DONE]'));
    };
    const { tokens, done } = await run(worker(), generateRequest({ prompt: 'x', stop: ['END'] }));
    assert.equal(texts(tokens), 'one ');
    assert.equal(done?.finishReason, 'stop');
  });

  it('aborting closes the connection: the server sees it close', async () => {
    let closed!: Promise<void>;
    handler = (req, res) => {
      closed = new Promise<void>((resolve) => res.on('close', () => resolve()));
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(sse(delta('first')));
      void req; // the stream is left open: only the client can end it
    };
    const controller = new AbortController();
    const tokens: Token[] = [];
    const result = new Promise<unknown>((resolve) => {
      worker()
        .generate(generateRequest({ prompt: 'x' }), { signal: controller.signal })
        .subscribe({
          next: (t) => {
            tokens.push(t);
            controller.abort();
          },
          error: resolve,
          complete: () => resolve(undefined),
        });
    });
    const error = await result;
    assert.ok(error instanceof AbortedError, String(error));
    assert.deepEqual(
      tokens.map((t) => t.text),
      ['first'],
    );
    await closed;
  });

  it('unsubscribing closes the connection too', async () => {
    let closed!: Promise<void>;
    handler = (_req, res) => {
      closed = new Promise<void>((resolve) => res.on('close', () => resolve()));
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(sse(delta('a'), delta('b')));
    };
    const first = await firstValueFrom(worker().generate(generateRequest({ prompt: 'x' })));
    assert.equal(first.text, 'a');
    await closed;
  });

  it('reads the response body only on demand, not ahead', async () => {
    handler = async (_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      for (let i = 0; i < 40; i++) {
        res.write(sse(delta(`t${i} `)));
        await new Promise<void>((resolve) => setImmediate(resolve));
      }
      res.end(sse(delta('', 'stop'), '[DONE]'));
    };
    let reads = 0;
    const counting: typeof fetch = async (input, init) => {
      const response = await fetch(input, init);
      const reader = response.body!.getReader();
      // highWaterMark 0: this stream reads the socket's stream only when its own reader asks.
      const body = new ReadableStream<Uint8Array>(
        {
          async pull(controller) {
            reads++;
            const { done, value } = await reader.read();
            if (done) controller.close();
            else controller.enqueue(value);
          },
          cancel: (reason) => reader.cancel(reason),
        },
        { highWaterMark: 0 },
      );
      return new Response(body, { status: response.status, headers: response.headers });
    };
    const tokens: Token[] = [];
    const subscription = subscribeWithDemand(new OpenAIWorker({ baseUrl, model: 'tiny', fetch: counting }).generate(generateRequest({ prompt: 'x' })), {
      next: (t) => tokens.push(t),
    });
    for (let n = 1; n <= 3; n++) {
      subscription.request(1);
      await settle(40);
      assert.equal(tokens.length, n);
      assert.ok(reads <= n, `${reads} body reads for ${n} token(s)`);
    }
    subscription.cancel();
  });

  it('HTTP 429 is a RateLimitedError carrying retryAfter; other statuses HttpStatusError', async () => {
    handler = (_req, res) => {
      res.writeHead(429, { 'content-type': 'application/json', 'retry-after': '2' });
      res.end('{"error":{"message":"slow down"}}');
    };
    const { error } = await run(worker(), generateRequest({ prompt: 'x' }));
    assert.ok(error instanceof RateLimitedError, String(error));
    assert.equal(error.retryAfter, 2000);
    assert.equal(error.status, 429);
    assert.match(error.message, /slow down/);
    await assert.rejects(worker().infer(generateRequest({ prompt: 'x' })), (e: unknown) => e instanceof RateLimitedError && e.retryAfter === 2000);
    handler = (_req, res) => {
      res.writeHead(503);
      res.end('down');
    };
    const failed = await run(worker(), generateRequest({ prompt: 'x' }));
    assert.ok(failed.error instanceof HttpStatusError && !(failed.error instanceof RateLimitedError) && failed.error.status === 503);
  });

  it('malformed events are MalformedEventError; an error object mid-stream is ProviderError', async () => {
    const cases: [string, new (...args: never[]) => Error][] = [
      [sse(delta('ok'), '{not json'), MalformedEventError],
      [sse({ nope: true }), MalformedEventError],
      [sse(delta('cut off')), MalformedEventError],
      [sse(delta('ok'), { error: { message: 'overloaded', type: 'server_error' } }), ProviderError],
    ];
    for (const [stream, type] of cases) {
      handler = (_req, res) => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.end(stream);
      };
      const { error } = await run(worker(), generateRequest({ prompt: 'x' }));
      assert.ok(error instanceof type, `${JSON.stringify(stream)} → ${String(error)}`);
    }
    handler = (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{}');
    };
    assert.ok((await run(worker(), generateRequest({ prompt: 'x' }))).error instanceof MalformedEventError);
  });

  it('infer asks for the whole answer without streaming', async () => {
    let seen: Record<string, unknown> = {};
    handler = (_req, res, body) => {
      seen = JSON.parse(body) as Record<string, unknown>;
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(
        JSON.stringify({
          choices: [{ index: 0, message: { role: 'assistant', content: 'Hello ✓' }, finish_reason: 'length' }],
          usage: { prompt_tokens: 3, completion_tokens: 2 },
        }),
      );
    };
    const completion = await worker().infer(generateRequest({ prompt: 'Hi', seed: 4 }));
    assert.deepEqual(completion, { text: 'Hello ✓', finishReason: 'length', usage: { inputTokens: 3, outputTokens: 2 } });
    assert.equal(seen.stream, false);
    assert.equal(seen.seed, 4);
  });

  it('invalid parameters fail before any request is sent', () => {
    assert.throws(
      () => worker().generate({ prompt: 'x', top_k: -3 }),
      (e: unknown) => e instanceof InvalidOptionsError && e.issues[0]?.path === 'top_k',
    );
    assert.throws(
      () => new OpenAIWorker({ baseUrl: 'not a url', model: 'm' }),
      (e: unknown) => e instanceof InvalidOptionsError && e.issues[0]?.path === 'baseUrl',
    );
  });
});

// ---------------------------------------------------------------- ONNX adapters on generated models

describe('ONNX language-model adapters', () => {
  const root = fileURLToPath(new URL('../../', import.meta.url));
  let dir: string;
  let generated: GeneratedModels | undefined;
  let corpus: string;
  let charLm: CharLmWorker;
  let reference: LoadedModel;
  let decoderPath: string;

  before(async () => {
    dir = (generated = await generatedModels('inference')).dir;
    corpus = await readFile(join(root, 'data', 'corpus.txt'), 'utf8');
    charLm = await CharLmWorker.load(join(dir, MODEL_FILES.charLm));
    decoderPath = join(dir, MODEL_FILES.decoder);
    reference = await loadModel(decoderPath, { signature: SIGNATURES.decoderWithPast });
  });
  after(async () => {
    await charLm.release();
    await reference.release();
    await generated?.remove();
  });

  /** A decoder whose every model call is counted and recorded. */
  async function countedDecoder(options: { eosTokenId?: number } = {}) {
    const calls: { inputLength: number; pastLength: number }[] = [];
    const runner: RunModel = async (feeds) => {
      calls.push({ inputLength: feeds.input_ids!.dims[1]!, pastLength: feeds['past_key_values.0.key']!.dims[2]! });
      return (await reference.run(feeds)) as Record<string, ort.Tensor>;
    };
    const worker = await DecoderLmWorker.load(decoderPath, { run: runner, ...options });
    return { worker, calls };
  }

  it('the char LM samples text from the corpus alphabet, reproducibly with a seed', async () => {
    const request = generateRequest({ prompt: 'The stage', max_tokens: 120, temperature: 0.9, seed: 11 });
    const a = await run(charLm, request);
    const b = await run(charLm, request);
    assert.equal(a.tokens.length, 120);
    assert.equal(a.done?.finishReason, 'length');
    const alphabet = new Set(corpus);
    assert.ok(
      [...texts(a.tokens)].every((ch) => alphabet.has(ch)),
      texts(a.tokens),
    );
    assert.equal(texts(a.tokens), texts(b.tokens));
    assert.ok(a.tokens.every((t) => typeof t.logprob === 'number' && t.logprob <= 0));
    const other = await run(charLm, generateRequest({ ...request, seed: 12 }));
    assert.notEqual(texts(other.tokens), texts(a.tokens));
  });

  it('decoder greedy output equals a reference loop without the cache, and the loop uses the cache', async () => {
    const prompt = 'Hello, ';
    const steps = 12;
    const ids = Array.from(prompt, (c) => c.charCodeAt(0));
    const { layers, heads, headDim } = { layers: 2, heads: 4, headDim: 16 };
    for (let step = 0; step < steps; step++) {
      const n = ids.length;
      const feeds: Record<string, ort.Tensor> = {
        input_ids: new ort.Tensor('int64', BigInt64Array.from(ids, BigInt), [1, n]),
        attention_mask: new ort.Tensor('int64', new BigInt64Array(n).fill(1n), [1, n]),
        position_ids: new ort.Tensor('int64', BigInt64Array.from([...Array(n).keys()], BigInt), [1, n]),
      };
      for (let l = 0; l < layers; l++) {
        feeds[`past_key_values.${l}.key`] = new ort.Tensor('float32', new Float32Array(0), [1, heads, 0, headDim]);
        feeds[`past_key_values.${l}.value`] = new ort.Tensor('float32', new Float32Array(0), [1, heads, 0, headDim]);
      }
      const { logits } = await reference.run(feeds);
      const last = (logits!.data as Float32Array).subarray((n - 1) * 128, n * 128);
      ids.push(last.reduce((best, v, i) => (v > last[best]! ? i : best), 0));
    }
    const expected = String.fromCharCode(...ids.slice(prompt.length));

    const { worker, calls } = await countedDecoder();
    const { tokens, done } = await run(worker, generateRequest({ prompt, temperature: 0, max_tokens: steps }));
    assert.equal(texts(tokens), expected);
    assert.equal(done?.finishReason, 'length');
    assert.deepEqual(done?.usage, { inputTokens: prompt.length, outputTokens: steps });
    assert.deepEqual(
      calls,
      // The first step feeds the prompt; every later one a single token over a cache that grew by one.
      Array.from({ length: steps }, (_, i) =>
        i === 0 ? { inputLength: prompt.length, pastLength: 0 } : { inputLength: 1, pastLength: prompt.length + i - 1 },
      ),
    );
  });

  it('max_tokens bounds the output; an end-of-text token ends it with stop', async () => {
    const { worker } = await countedDecoder();
    const few = await run(worker, generateRequest({ prompt: 'abc', temperature: 0, max_tokens: 3 }));
    assert.equal(few.tokens.length, 3);
    assert.equal(few.done?.finishReason, 'length');
    const firstId = few.tokens[0]!.text.charCodeAt(0);
    const { worker: withEos } = await countedDecoder({ eosTokenId: firstId });
    const ended = await run(withEos, generateRequest({ prompt: 'abc', temperature: 0, max_tokens: 3 }));
    assert.equal(ended.tokens.length, 0);
    assert.equal(ended.done?.finishReason, 'stop');
  });

  it('a stop sequence spanning decoded tokens stops the decoder and is not emitted', async () => {
    const { worker } = await countedDecoder();
    const full = texts((await run(worker, generateRequest({ prompt: 'Hello, ', temperature: 0, max_tokens: 12 }))).tokens);
    const stop = full.slice(5, 8);
    const expected = full.slice(0, full.indexOf(stop));
    const { tokens, done } = await run(worker, generateRequest({ prompt: 'Hello, ', temperature: 0, max_tokens: 12, stop: [stop] }));
    assert.equal(texts(tokens), expected);
    assert.equal(done?.finishReason, 'stop');
  });

  it('aborting stops decoding between steps and errors with AbortedError', async () => {
    const { worker, calls } = await countedDecoder();
    const controller = new AbortController();
    const tokens: Token[] = [];
    let done: GenerationDone | undefined;
    const error = await new Promise<unknown>((resolve) => {
      worker.generate(generateRequest({ prompt: 'Hi', max_tokens: 200, seed: 1 }), { signal: controller.signal, onDone: (d) => (done = d) }).subscribe({
        next: (t) => {
          tokens.push(t);
          if (tokens.length === 3) controller.abort(new Error('user left'));
        },
        error: resolve,
        complete: () => resolve(undefined),
      });
    });
    assert.ok(error instanceof AbortedError && /user left/.test(error.message), String(error));
    await settle();
    assert.equal(tokens.length, 3);
    assert.equal(calls.length, 3, 'no step after the abort');
    assert.equal(done?.finishReason, 'abort');
  });

  it('backpressure: a consumer requesting one token at a time gets one decode step per request', async () => {
    const { worker, calls } = await countedDecoder();
    const tokens: Token[] = [];
    let completed = false;
    const subscription = subscribeWithDemand(worker.generate(generateRequest({ prompt: 'Hi', max_tokens: 5, seed: 2 })), {
      next: (t) => tokens.push(t),
      complete: () => (completed = true),
    });
    await settle();
    assert.equal(calls.length, 0, 'nothing decoded before demand');
    for (let n = 1; n <= 5; n++) {
      subscription.request(1);
      await settle();
      assert.equal(tokens.length, n);
      assert.equal(calls.length, n, `after ${n} request(s), ${n} decode step(s)`);
    }
    assert.ok(completed);
  });

  it('runs as a stage work function and notes ttft and tokens/s in the trace', async () => {
    const { worker } = await countedDecoder();
    const out = await firstValueFrom(
      fromIterable([generateRequest({ prompt: 'Hi', temperature: 0, max_tokens: 4 })]).pipe(
        stage((request: GenerateRequest, context) => worker.generate(request, context), { name: 'infer' }),
        toArray(),
      ),
    );
    assert.equal(out.length, 4);
    const notes = (out[0] as Traced<Token>).trace.notes ?? {};
    assert.equal(notes['infer.finish_reason'], 'length');
    assert.equal(notes['infer.output_tokens'], 4);
    assert.equal(notes['infer.input_tokens'], 2);
    assert.equal(typeof notes['infer.ttft_ms'], 'number');
    assert.equal(typeof notes['infer.tokens_per_s'], 'number');
    const trace = new TraceContext(0, false);
    charLm.generate(generateRequest({ prompt: 'a', max_tokens: 2, seed: 1 }), { trace, stage: 'lm' }).subscribe();
    await settle();
    assert.equal(trace.notes?.['lm.finish_reason'], 'length');
  });

  it('an infer call gathers the completion', async () => {
    const completion = await charLm.infer(generateRequest({ messages: [{ role: 'user', content: 'The' }], max_tokens: 10, seed: 5 }));
    assert.equal([...completion.text].length, 10);
    assert.equal(completion.finishReason, 'length');
  });
});
