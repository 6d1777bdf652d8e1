import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, request as httpRequest, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { spawnSync } from 'node:child_process';
import { rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { firstValueFrom, toArray } from 'rxjs';
import { StageStats } from '../../src/flow/stats.js';
import { fromIterable } from '../../src/flow/sources.js';
import { CacheStats } from '../../src/cache/stats.js';
import { CircuitBreaker } from '../../src/resilience/breaker.js';
import { stage } from '../../operators/stage.js';
import { eventually } from 'sluice/testing';
import { ScriptedWorker } from 'sluice/testing/ai';
import { MODEL_FILES } from '../../src/ai/models/generate.js';
import { generateRequest } from '../../src/ai/inference/worker.js';
import { unrulyWorker } from '../support/unruly-worker.js';
import { OpenAIWorker, SseParser } from '../../src/ai/inference/openai.js';
import { CharLmWorker } from '../../src/ai/inference/onnx-lm.js';
import { HttpStatusError } from '../../src/ai/inference/errors.js';
import { createHttpHandler, type HttpHandler, type HttpHandlerOptions } from '../../src/serve/http.js';
import { SluiceMetrics } from '../../src/serve/metrics.js';
import { generatedModels, type GeneratedModels } from '../support/models.js';

/** Polls until `read()` has not changed for `still` consecutive looks (quiescence, not speed). */
async function quiescent(read: () => number, still = 5, everyMs = 40): Promise<number> {
  let last = read();
  let same = 0;
  while (same < still) {
    await new Promise((resolve) => setTimeout(resolve, everyMs));
    const now = read();
    same = now === last ? same + 1 : 0;
    last = now;
  }
  return last;
}

/** A deterministic worker: token i is `t<i> ` padded to `tokenBytes`, one per decode step, each step a macrotask away. */
const countingWorker = (name: string, tokenBytes?: number) =>
  new ScriptedWorker({ name, padTo: tokenBytes, delay: 'turn', inputTokens: 3, maxTokens: 1_000_000 });

interface Running {
  readonly server: Server;
  readonly base: string;
  readonly handler: HttpHandler;
}

async function start(options: HttpHandlerOptions): Promise<Running> {
  const handler = createHttpHandler(options);
  const server = createServer(handler);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return { server, base: `http://127.0.0.1:${port}`, handler };
}

async function stop(running: Running | undefined): Promise<void> {
  if (running === undefined) return;
  running.server.closeAllConnections();
  await new Promise<void>((resolve) => running.server.close(() => resolve()));
}

const post = (base: string, body: unknown, headers: Record<string, string> = {}) =>
  fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });

const user = (content: string) => [{ role: 'user', content }];

/** Reads a whole SSE body into the parsed `data` payloads. */
async function events(response: Response): Promise<string[]> {
  const parser = new SseParser();
  const out: string[] = [];
  for await (const chunk of response.body!) out.push(...parser.push(chunk as Uint8Array));
  out.push(...parser.end());
  return out;
}

/** One sample of the Prometheus text: `name{labels} value`, labels given in exposition order. */
function sample(text: string, name: string, labels = ''): number | undefined {
  const prefix = labels === '' ? `${name} ` : `${name}{${labels}} `;
  const line = text.split('\n').find((l) => l.startsWith(prefix));
  return line === undefined ? undefined : Number(line.slice(prefix.length));
}

describe('POST /v1/chat/completions with a deterministic worker', () => {
  const worker = countingWorker('counter');
  const metrics = new SluiceMetrics();
  let running: Running;
  before(async () => {
    running = await start({ workers: { counter: worker }, metrics, maxBodyBytes: 4096 });
  });
  after(async () => {
    await stop(running);
    metrics.close();
  });

  it('streams chat.completion.chunk events, a finish_reason, usage and [DONE]', async () => {
    const response = await post(running.base, { model: 'counter', messages: user('hi'), stream: true, max_tokens: 4, stream_options: { include_usage: true } });
    assert.equal(response.status, 200);
    assert.match(response.headers.get('content-type') ?? '', /^text\/event-stream/);
    const data = await events(response);
    assert.equal(data.at(-1), '[DONE]');
    const chunks = data.slice(0, -1).map(
      (d) =>
        JSON.parse(d) as {
          id: string;
          object: string;
          model: string;
          choices: { delta: { role?: string; content?: string }; finish_reason: string | null }[];
          usage?: { prompt_tokens: number; completion_tokens: number; total_tokens: number };
        },
    );
    assert.ok(chunks.every((c) => c.object === 'chat.completion.chunk' && c.model === 'counter' && c.id === chunks[0]!.id));
    assert.equal(chunks[0]!.choices[0]!.delta.role, 'assistant');
    const text = chunks.flatMap((c) => c.choices.map((choice) => choice.delta.content ?? '')).join('');
    assert.equal(text, 't0 t1 t2 t3 ');
    const finals = chunks.filter((c) => c.choices[0]?.finish_reason);
    assert.deepEqual(
      finals.map((c) => c.choices[0]!.finish_reason),
      ['length'],
    );
    assert.deepEqual(chunks.at(-1)!.usage, { prompt_tokens: 3, completion_tokens: 4, total_tokens: 7 });
    assert.deepEqual(chunks.at(-1)!.choices, []);
  });

  it('answers a chat.completion with usage when not streaming', async () => {
    const response = await post(running.base, { model: 'counter', messages: user('hi'), max_tokens: 3 });
    assert.equal(response.status, 200);
    const body = (await response.json()) as {
      object: string;
      choices: { message: { role: string; content: string }; finish_reason: string }[];
      usage: unknown;
    };
    assert.equal(body.object, 'chat.completion');
    assert.deepEqual(body.choices[0]!.message, { role: 'assistant', content: 't0 t1 t2 ', refusal: null });
    assert.equal(body.choices[0]!.finish_reason, 'length');
    assert.deepEqual(body.usage, { prompt_tokens: 3, completion_tokens: 3, total_tokens: 6 });
  });

  it('refuses bad requests with OpenAI-style errors naming the parameter', async () => {
    const cases: [unknown, number, string | null, string][] = [
      [{ model: 'counter', messages: user('hi'), temperature: 3 }, 400, 'temperature', 'invalid_request_error'],
      [{ model: 'counter', messages: 'hi' }, 400, 'messages', 'invalid_request_error'],
      [{ model: 'counter', messages: [{ role: 'wizard', content: 'x' }] }, 400, 'messages.0.role', 'invalid_request_error'],
      [{ model: 'counter', messages: user('hi'), frobnicate: 1 }, 400, 'frobnicate', 'invalid_request_error'],
      [{ model: 'counter', messages: user('') }, 400, 'messages', 'invalid_request_error'],
      [{ messages: user('hi') }, 400, 'model', 'invalid_request_error'],
      ['{not json', 400, null, 'invalid_request_error'],
      [{ model: 'gpt-9', messages: user('hi') }, 404, 'model', 'invalid_request_error'],
      [{ model: 'counter', messages: user('hi'), max_tokens: 4097 }, 400, 'max_tokens', 'invalid_request_error'],
      [{ model: 'counter', messages: user('hi'), max_completion_tokens: 5000 }, 400, 'max_completion_tokens', 'invalid_request_error'],
      [{ model: 'counter', messages: user('x'.repeat(5000)) }, 413, null, 'invalid_request_error'],
    ];
    for (const [body, status, param, type] of cases) {
      const response = await post(running.base, body);
      assert.equal(response.status, status, JSON.stringify(body).slice(0, 80));
      const { error } = (await response.json()) as { error: { message: string; type: string; param: string | null; code: string | null } };
      assert.equal(error.param, param, JSON.stringify(body).slice(0, 80));
      assert.equal(error.type, type);
      assert.ok(error.message.length > 0);
      if (status === 404) assert.equal(error.code, 'model_not_found');
    }
    assert.equal((await fetch(`${running.base}/v1/chat/completions`)).status, 405);
    assert.equal((await fetch(`${running.base}/nope`)).status, 404);
  });

  it('the OpenAI surface clients expect: GET /v1/models/{id}, 405 with Allow, JSON-only POST bodies, precise messages', async () => {
    const model = await fetch(`${running.base}/v1/models/counter`);
    assert.equal(model.status, 200);
    assert.deepEqual(await model.json(), { id: 'counter', object: 'model', created: 0, owned_by: 'sluice' });
    const missing = await fetch(`${running.base}/v1/models/nope`);
    assert.equal(missing.status, 404);
    assert.equal(((await missing.json()) as { error: { code: string } }).error.code, 'model_not_found');
    for (const [path, method, allow] of [
      ['/v1/chat/completions', 'GET', 'POST'],
      ['/v1/models', 'DELETE', 'GET, HEAD'],
      ['/v1/models/counter', 'POST', 'GET, HEAD'],
      ['/healthz', 'POST', 'GET, HEAD'],
    ] as const) {
      const response = await fetch(`${running.base}${path}`, { method });
      assert.equal(response.status, 405, `${method} ${path}`);
      assert.equal(response.headers.get('allow'), allow, `${method} ${path}`);
    }
    // A cross-site form or fetch can send text/plain without a preflight: it must not start a generation.
    const plain = await fetch(`${running.base}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'text/plain' },
      body: JSON.stringify({ model: 'counter', messages: user('hi') }),
    });
    assert.equal(plain.status, 415);
    assert.equal(((await plain.json()) as { error: { code: string } }).error.code, 'unsupported_media_type');
    const charset = await post(running.base, { model: 'counter', messages: user('hi'), max_tokens: 2 }, { 'content-type': 'application/json; charset=utf-8' });
    assert.equal(charset.status, 200);
    const numeric = await post(running.base, { model: 5, messages: user('hi') });
    assert.equal(numeric.status, 400);
    assert.match(((await numeric.json()) as { error: { message: string } }).error.message, /model must be a string/);
  });

  it('accepts the standard sampling fields: presence_penalty and frequency_penalty in [-2, 2]; logit_bias refused with a precise message', async () => {
    const defaults = await post(running.base, { model: 'counter', messages: user('hi'), max_tokens: 2, presence_penalty: 0, frequency_penalty: 0 });
    assert.equal(defaults.status, 200);
    const set = await post(running.base, {
      model: 'counter',
      messages: user('hi'),
      max_tokens: 2,
      presence_penalty: 1.5,
      frequency_penalty: -0.5,
      logit_bias: {},
    });
    assert.equal(set.status, 200);
    const far = await post(running.base, { model: 'counter', messages: user('hi'), presence_penalty: 3 });
    assert.equal(far.status, 400);
    assert.equal(((await far.json()) as { error: { param: string } }).error.param, 'presence_penalty');
    const bias = await post(running.base, { model: 'counter', messages: user('hi'), logit_bias: { '50256': -100 } });
    assert.equal(bias.status, 400);
    const { error } = (await bias.json()) as { error: { param: string; message: string } };
    assert.equal(error.param, 'logit_bias');
    assert.match(error.message, /logit_bias is not supported/);
  });

  it('accepts the OpenAI fields clients send with their defaults (logprobs false, tool_choice none, store, metadata...) and refuses by name a value these models cannot honour', async () => {
    const defaults = {
      logprobs: false,
      top_logprobs: 0,
      tools: [],
      tool_choice: 'none',
      parallel_tool_calls: true,
      function_call: 'auto',
      store: false,
      metadata: { team: 'search' },
      service_tier: 'auto',
      prompt_cache_key: 'k',
      safety_identifier: 'user-1',
      reasoning_effort: 'low',
      verbosity: 'medium',
      prediction: { type: 'content', content: 'x' },
      modalities: ['text'],
      audio: null,
      stream_options: { include_usage: true },
    };
    const accepted = await post(running.base, { model: 'counter', messages: user('hi'), max_tokens: 2, ...defaults });
    assert.equal(accepted.status, 200, await accepted.clone().text());
    const refused: [Record<string, unknown>, string, string][] = [
      [{ logprobs: true }, 'logprobs', 'unsupported_parameter'],
      [{ top_logprobs: 5 }, 'top_logprobs', 'unsupported_parameter'],
      [{ tools: [{ type: 'function', function: { name: 'f' } }] }, 'tools', 'unsupported_parameter'],
      [{ tool_choice: 'required' }, 'tool_choice', 'unsupported_value'],
      [{ tool_choice: { type: 'function', function: { name: 'f' } } }, 'tool_choice', 'unsupported_value'],
      [{ modalities: ['text', 'audio'] }, 'modalities', 'unsupported_value'],
      [{ audio: { voice: 'alloy', format: 'mp3' } }, 'audio', 'unsupported_parameter'],
      [{ web_search_options: {} }, 'web_search_options', 'unsupported_parameter'],
      [{ logprobs: 'yes' }, 'logprobs', 'invalid_value'],
      [{ service_tier: 'fastest' }, 'service_tier', 'invalid_value'],
      [{ metadata: { n: 1 } }, 'metadata.n', 'invalid_value'],
    ];
    for (const [field, param, code] of refused) {
      const answer = await post(running.base, { model: 'counter', messages: user('hi'), ...field });
      assert.equal(answer.status, 400, param);
      const { error } = (await answer.json()) as { error: { param: string; code: string; message: string } };
      assert.deepEqual([error.param, error.code], [param, code], JSON.stringify(field));
      if (code !== 'invalid_value') assert.match(error.message, new RegExp(`'${param}'.*with this model`));
    }
  });

  it('refuses a body larger than maxBodyBytes with 413 without reading it, even when chunked', async () => {
    const status = await new Promise<number>((resolve, reject) => {
      const req = httpRequest(`${running.base}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' } }, (res) => {
        res.resume();
        resolve(res.statusCode ?? 0);
      });
      req.on('error', reject);
      req.write('{"model":"counter","messages":[{"role":"user","content":"');
      req.write('y'.repeat(8192));
      req.end('"}]}');
    });
    assert.equal(status, 413);
  });

  it('aborts the generation when the client disconnects mid-stream: the signal fires and no more steps run', async () => {
    const before = worker.generations.length;
    const controller = new AbortController();
    const response = await fetch(`${running.base}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'counter', messages: user('go on forever'), stream: true }),
      signal: controller.signal,
    });
    const reader = response.body!.getReader();
    const parser = new SseParser();
    let contentChunks = 0;
    while (contentChunks < 5) {
      const { value } = await reader.read();
      contentChunks += parser.push(value!).filter((d) => d.includes('"content":"t')).length;
    }
    controller.abort();
    await reader.cancel().catch(() => {});
    const signal = worker.generations[before]!.signal!;
    await quiescent(() => worker.steps);
    assert.equal(signal.aborted, true, 'the worker saw the abort');
    const stepsAfterAbort = worker.steps;
    await quiescent(() => worker.steps);
    assert.equal(worker.steps, stepsAfterAbort, 'no step ran after the abort');
    assert.ok(worker.steps < 1_000_000);
    assert.equal(running.handler.inFlight, 0);
  });

  it('counts requests, generations and stage timings in /metrics', async () => {
    const text = await (await fetch(`${running.base}/metrics`)).text();
    assert.ok((sample(text, 'sluice_http_requests_total', 'route="/v1/chat/completions",code="2xx"') ?? 0) >= 3);
    assert.ok((sample(text, 'sluice_http_requests_total', 'route="/v1/chat/completions",code="4xx"') ?? 0) >= 9);
    assert.ok((sample(text, 'sluice_http_requests_total', 'route="other",code="4xx"') ?? 0) >= 1, 'unknown paths share one label value');
    assert.ok((sample(text, 'gen_ai_server_time_to_first_token_seconds_count', 'gen_ai_operation_name="chat",gen_ai_request_model="counter"') ?? 0) >= 3);
    assert.ok((sample(text, 'gen_ai_server_time_per_output_token_seconds_count', 'gen_ai_operation_name="chat",gen_ai_request_model="counter"') ?? 0) >= 3);
    assert.ok((sample(text, 'sluice_stage_service_seconds_count', 'stage="generate"') ?? 0) >= 3);
    assert.ok((sample(text, 'sluice_stage_queue_wait_seconds_count', 'stage="generate"') ?? 0) >= 3);
    assert.ok((sample(text, 'sluice_generated_tokens_total', 'gen_ai_request_model="counter"') ?? 0) >= 7);
    assert.ok(
      (sample(text, 'gen_ai_server_request_duration_seconds_count', 'gen_ai_operation_name="chat",gen_ai_request_model="counter",error_type="ABORTED"') ?? 0) >=
        1,
      'the disconnected request is recorded as aborted',
    );
    assert.doesNotMatch(text, /chatcmpl-|go on forever/, 'no request id or prompt in labels');
  });
});

describe('max_tokens is enforced by the server, whatever the worker does', () => {
  const unruly = unrulyWorker();
  let running: Running;
  before(async () => {
    running = await start({ workers: { unruly } });
  });
  after(() => stop(running));

  it('a worker that ignores max_tokens: 50 tokens, finish_reason length, streamed or not', async () => {
    const whole = await post(running.base, { model: 'unruly', messages: user('hi'), max_tokens: 50 });
    assert.equal(whole.status, 200);
    const body = (await whole.json()) as { choices: { message: { content: string }; finish_reason: string }[]; usage: { completion_tokens: number } };
    assert.equal(body.choices[0]!.message.content, 'x'.repeat(50));
    assert.equal(body.choices[0]!.finish_reason, 'length');
    assert.equal(body.usage.completion_tokens, 50);
    const streamed = await events(await post(running.base, { model: 'unruly', messages: user('hi'), max_completion_tokens: 50, stream: true }));
    const chunks = streamed
      .filter((d) => d !== '[DONE]')
      .map((d) => JSON.parse(d) as { choices: { delta: { content?: string }; finish_reason: string | null }[] });
    assert.equal(chunks.map((c) => c.choices[0]?.delta.content ?? '').join(''), 'x'.repeat(50));
    assert.equal(chunks.at(-1)!.choices[0]!.finish_reason, 'length');
    assert.ok(unruly.steps <= 2 * 51, `the worker was stepped ${unruly.steps} times for two requests of 50`);
  });
});

describe('backpressure on a slow SSE reader', () => {
  const worker = countingWorker('wide', 1024);
  const metrics = new SluiceMetrics({ defaultMetrics: false });
  let running: Running;
  before(async () => {
    running = await start({ worker, metrics, maxTokens: 20_000 });
  });
  after(async () => {
    await stop(running);
    metrics.close();
  });

  it('stops decoding while the client does not read, and resumes when it does', async () => {
    const maxTokens = 20_000;
    let received = 0;
    let response: IncomingMessage | undefined;
    const finished = new Promise<string>((resolve, reject) => {
      const req = httpRequest(`${running.base}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' } }, (res) => {
        response = res;
        res.pause();
        let tail = '';
        res.on('data', (chunk: Buffer) => {
          received += chunk.length;
          tail = (tail + chunk.toString('latin1')).slice(-64);
        });
        res.on('end', () => resolve(tail));
      });
      req.on('error', reject);
      req.end(JSON.stringify({ model: 'wide', messages: user('hi'), stream: true, max_tokens: maxTokens }));
    });
    const stalledAt = await quiescent(() => worker.steps);
    assert.ok(stalledAt > 0 && stalledAt < maxTokens, `decoding stalled at ${stalledAt} of ${maxTokens} steps`);
    assert.equal(received, 0);
    response!.resume();
    const tail = await finished;
    assert.match(tail, /data: \[DONE\]\n\n$/);
    assert.equal(worker.steps, maxTokens);
    const text = (await metrics.scrape()).body;
    assert.ok((sample(text, 'sluice_stage_paused_seconds_total', 'stage="generate"') ?? 0) > 0, 'time paused by backpressure is counted');
  });
});

describe('chaining: sluice OpenAIWorker → this server → CharLmWorker', () => {
  let dir: string;
  let generated: GeneratedModels | undefined;
  let charLm: CharLmWorker;
  let running: Running;
  before(async () => {
    dir = (generated = await generatedModels('http')).dir;
    charLm = await CharLmWorker.load(join(dir, MODEL_FILES.charLm));
    running = await start({ workers: { charlm: charLm }, auth: (req) => req.headers.authorization === 'Bearer secret' });
  });
  after(async () => {
    await stop(running);
    await charLm.release();
    await generated?.remove();
  });

  it('streams the same text the model generates in process, with usage', async () => {
    const client = new OpenAIWorker({ baseUrl: `${running.base}/v1`, model: 'charlm', apiKey: 'secret' });
    const request = generateRequest({ messages: [{ role: 'user', content: 'the stream ' }], max_tokens: 24, temperature: 0.8, seed: 7 });
    const local = await charLm.infer(request);
    const streamed = await client.completeStreaming(request);
    assert.equal(streamed.text, local.text);
    assert.ok(streamed.text.length > 0);
    assert.equal(streamed.finishReason, 'length');
    assert.deepEqual(streamed.usage, local.usage);
    const tokens = await firstValueFrom(client.generate(request).pipe(toArray()));
    assert.equal(tokens.map((t) => t.text).join(''), local.text);
    assert.ok(tokens.length > 1, 'tokens arrive one by one');
  });

  it('answers non-streaming requests and honours stop sequences', async () => {
    const client = new OpenAIWorker({ baseUrl: `${running.base}/v1`, model: 'charlm', apiKey: 'secret' });
    const request = generateRequest({ prompt: 'the ', max_tokens: 40, temperature: 0, stop: [' '] });
    const local = await charLm.infer(request);
    const remote = await client.infer(request);
    assert.deepEqual(remote, local);
    assert.ok(!remote.text.includes(' '));
  });

  it('rejects a client without the API key (401) and an unknown model (404) as typed errors', async () => {
    const anonymous = new OpenAIWorker({ baseUrl: `${running.base}/v1`, model: 'charlm' });
    await assert.rejects(anonymous.infer(generateRequest({ prompt: 'x' })), (err: unknown) => err instanceof HttpStatusError && err.status === 401);
    const wrong = new OpenAIWorker({ baseUrl: `${running.base}/v1`, model: 'nope', apiKey: 'secret' });
    await assert.rejects(wrong.infer(generateRequest({ prompt: 'x' })), (err: unknown) => err instanceof HttpStatusError && err.status === 404);
  });
});

describe('GET /metrics', () => {
  const metrics = new SluiceMetrics();
  const stats = new StageStats();
  const cache = new CacheStats();
  const breaker = new CircuitBreaker({ name: 'gpu-a', failureThreshold: 1, window: 60_000, cooldown: 60_000 });
  let running: Running;
  before(async () => {
    metrics.registerStage('embed', stats).registerCache('responses', cache).registerBreaker(breaker);
    running = await start({ worker: countingWorker('counter'), metrics });
  });
  after(async () => {
    await stop(running);
    metrics.close();
    breaker.reset();
  });

  const scrape = async () => {
    const response = await fetch(`${running.base}/metrics`);
    assert.equal(response.status, 200);
    assert.match(response.headers.get('content-type') ?? '', /^text\/plain; version=0\.0\.4/);
    return response.text();
  };

  it('reads stage, cache and breaker gauges at scrape time, so they follow the live values', async () => {
    const outputs = await firstValueFrom(
      fromIterable([1, 2, 3, 4, 5]).pipe(
        stage(async (x: number) => x * 2, { name: 'embed', stats }),
        toArray(),
      ),
    );
    assert.equal(outputs.length, 5);
    // Two elements held in flight by real work (the in-flight gauge is summed over the stage's live runs).
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const held = fromIterable([10, 20])
      .pipe(
        stage(async (x: number) => (await gate, x), { name: 'embed', stats, concurrency: 2 }),
        toArray(),
      )
      .subscribe();
    await eventually(() => assert.equal(stats.inFlight, 2));
    stats.buffered = 3;
    stats.shed['buffer-full'] = 4;
    stats.lateArrivals = 2;
    cache.hits = 3;
    cache.misses = 1;
    let text = await scrape();
    assert.equal(sample(text, 'sluice_stage_received_total', 'stage="embed"'), 7);
    assert.equal(sample(text, 'sluice_stage_delivered_total', 'stage="embed"'), 5);
    assert.equal(sample(text, 'sluice_stage_buffered', 'stage="embed"'), 3);
    assert.equal(sample(text, 'sluice_stage_in_flight', 'stage="embed"'), 2);
    assert.equal(sample(text, 'sluice_stage_shed_total', 'stage="embed",reason="buffer-full"'), 4);
    assert.equal(sample(text, 'sluice_stage_late_arrivals_total', 'stage="embed"'), 2);
    assert.equal(sample(text, 'sluice_cache_hits_total', 'cache="responses"'), 3);
    assert.equal(sample(text, 'sluice_cache_hit_ratio', 'cache="responses"'), 0.75);
    assert.equal(sample(text, 'sluice_circuit_breaker_state', 'breaker="gpu-a"'), 0);
    assert.ok(sample(text, 'sluice_event_loop_delay_seconds', 'stat="p99"') !== undefined);
    assert.ok(sample(text, 'process_cpu_user_seconds_total') !== undefined, 'default metrics are on the own registry');

    stats.buffered = 0;
    release();
    await eventually(() => assert.equal(stats.delivered, 7));
    assert.equal(held.closed, true);
    stats.shed['buffer-full'] = 6;
    cache.hits = 4;
    breaker.acquire().failure(new Error('boom'));
    text = await scrape();
    assert.equal(sample(text, 'sluice_stage_buffered', 'stage="embed"'), 0);
    assert.equal(sample(text, 'sluice_stage_in_flight', 'stage="embed"'), 0);
    assert.equal(sample(text, 'sluice_stage_shed_total', 'stage="embed",reason="buffer-full"'), 6);
    assert.equal(sample(text, 'sluice_cache_hit_ratio', 'cache="responses"'), 0.8);
    assert.equal(sample(text, 'sluice_circuit_breaker_state', 'breaker="gpu-a"'), 2);
  });

  it('passes promtool check metrics after real traffic', async (t) => {
    for (let i = 0; i < 3; i++) {
      const response = await post(running.base, { model: 'counter', messages: user('hi'), max_tokens: 3, stream: i % 2 === 0 });
      assert.equal(response.status, 200);
      await response.text();
    }
    const text = await scrape();
    assert.ok(
      (sample(text, 'gen_ai_client_token_usage_count', 'gen_ai_operation_name="chat",gen_ai_request_model="counter",gen_ai_token_type="output"') ?? 0) >= 3,
    );
    const promtool = spawnSync('promtool', ['--version'], { encoding: 'utf8' });
    if (promtool.error !== undefined) {
      // CI installs prometheus; there a missing promtool is a failure, locally it is reported.
      assert.notEqual(process.env.CI, 'true', 'promtool is required under CI=true (apt-get install prometheus)');
      t.diagnostic('promtool not found: install the Debian package "prometheus" to lint the exposition');
      return;
    }
    const file = join(tmpdir(), `sluice-metrics-${process.pid}.prom`);
    await writeFile(file, text);
    const check = spawnSync('sh', ['-c', `promtool check metrics < "${file}"`], { encoding: 'utf8' });
    await rm(file, { force: true });
    assert.equal(check.status, 0, `promtool check metrics failed:\n${check.stdout}${check.stderr}`);
  });
});

describe('health and readiness', () => {
  it('/healthz answers while up; /readyz follows ready() and turns 503 when draining, after which completions are refused', async () => {
    let loaded = false;
    const worker = countingWorker('counter');
    const running = await start({ worker, ready: () => loaded });
    try {
      assert.equal((await fetch(`${running.base}/healthz`)).status, 200);
      assert.equal((await fetch(`${running.base}/readyz`)).status, 503);
      loaded = true;
      assert.equal((await fetch(`${running.base}/readyz`)).status, 200);

      const streaming = await post(running.base, { model: 'counter', messages: user('hi'), stream: true, max_tokens: 50 });
      assert.equal(running.handler.inFlight, 1);
      let drained = false;
      const draining = running.handler.drain().then(() => (drained = true));
      const ready = await fetch(`${running.base}/readyz`);
      assert.equal(ready.status, 503);
      assert.deepEqual(await ready.json(), { status: 'draining' });
      const refused = await post(running.base, { model: 'counter', messages: user('hi') });
      assert.equal(refused.status, 503);
      assert.equal(drained, false, 'drain waits for the stream in flight');
      const data = await events(streaming);
      assert.equal(data.at(-1), '[DONE]');
      await draining;
      assert.equal(running.handler.inFlight, 0);
      assert.equal((await fetch(`${running.base}/metrics`)).status, 404, 'no metrics configured');
    } finally {
      await stop(running);
    }
  });

  it('validates its options, naming the bad field', () => {
    assert.throws(() => createHttpHandler({}), /workers/);
    assert.throws(() => createHttpHandler({ worker: countingWorker('x'), maxBodyBytes: 0 }), /maxBodyBytes/);
    assert.throws(() => createHttpHandler({ worker: countingWorker('x'), maxTokens: 0 }), /maxTokens/);
    assert.throws(() => new SluiceMetrics({ prefix: 'bad-prefix' }), /prefix/);
  });
});
