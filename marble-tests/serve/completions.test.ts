/**
 * `POST /v1/completions`, OpenAI's legacy text completions (served by vLLM, llama.cpp and Ollama
 * too): a prompt continued as it is, through the official client, streamed and whole.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import OpenAI, { type APIError } from 'openai';
import { ScriptedWorker } from 'sluice/testing/ai';
import { createHttpHandler } from '../../src/serve/http.js';
import type { RequestLogEntry } from '../../src/serve/request-log.js';
import { startServer, type RunningServer } from '../../src/serve/app.js';

describe('POST /v1/completions', () => {
  // Tokens `t0 `, `t1 `..., one an event-loop turn; remembers the requests it was given.
  const worker = new ScriptedWorker({ name: 'counter', delay: 'turn', inputTokens: 2 });
  const log: RequestLogEntry[] = [];
  let server: Server;
  let base: string;
  let client: OpenAI;
  before(async () => {
    server = createServer(createHttpHandler({ workers: { counter: worker }, maxTokens: 64, requestLog: (e) => log.push(e) }));
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 });
  });
  after(async () => {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });

  const post = (body: unknown) =>
    fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });

  it('continues the prompt as it is (no chat messages), as a text_completion, through the official client', async () => {
    const answer = await client.completions.create({ model: 'counter', prompt: 'Once upon', max_tokens: 3 });
    assert.equal(answer.object, 'text_completion');
    assert.match(answer.id, /^cmpl-/);
    assert.equal(answer.choices[0]?.text, 't0 t1 t2 ');
    assert.equal(answer.choices[0]?.finish_reason, 'length');
    assert.deepEqual(answer.usage, { prompt_tokens: 2, completion_tokens: 3, total_tokens: 5 });
    const request = worker.requests.at(-1)!;
    assert.equal(request.prompt, 'Once upon');
    assert.equal(request.messages, undefined);
    assert.ok(
      log.some((e) => e.id === answer.id && e.outcome === 'completed'),
      'its log line has its id',
    );
  });

  it('streams text chunks, a finish_reason and usage through the official client', async () => {
    const stream = await client.completions.create({ model: 'counter', prompt: 'Once', max_tokens: 4, stream: true, stream_options: { include_usage: true } });
    let text = '';
    const finishes: string[] = [];
    let usage: OpenAI.CompletionUsage | undefined;
    for await (const chunk of stream) {
      assert.equal(chunk.object, 'text_completion');
      for (const choice of chunk.choices) {
        text += choice.text;
        if (choice.finish_reason) finishes.push(choice.finish_reason);
      }
      if (chunk.usage) usage = chunk.usage;
    }
    assert.equal(text, 't0 t1 t2 t3 ');
    assert.deepEqual(finishes, ['length']);
    assert.equal(usage?.completion_tokens, 4);
  });

  it('is 16 tokens long without max_tokens, as OpenAI’s and vLLM’s', async () => {
    const answer = await client.completions.create({ model: 'counter', prompt: 'x' });
    assert.equal(answer.usage?.completion_tokens, 16);
  });

  it('echo puts the prompt first, whole and streamed', async () => {
    const whole = await client.completions.create({ model: 'counter', prompt: 'Hi: ', max_tokens: 2, echo: true });
    assert.equal(whole.choices[0]?.text, 'Hi: t0 t1 ');
    const stream = await client.completions.create({ model: 'counter', prompt: 'Hi: ', max_tokens: 2, echo: true, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
    assert.equal(text, 'Hi: t0 t1 ');
  });

  it('takes a prompt array of one, sampling fields and stop; refuses what it cannot do by name', async () => {
    const one = await post({ model: 'counter', prompt: ['a'], max_tokens: 2, temperature: 0.5, stop: '\n', seed: 1, logprobs: 0, n: 1, best_of: 1 });
    assert.equal(one.status, 200, await one.clone().text());
    assert.deepEqual(worker.requests.at(-1)!.stop, ['\n']);
    const refused: [unknown, number, string | null, string][] = [
      [{ model: 'counter', prompt: [1, 2, 3] }, 400, 'prompt', 'invalid_value'],
      [{ model: 'counter', prompt: ['a', 'b'] }, 400, 'prompt', 'invalid_value'],
      [{ model: 'counter', prompt: '' }, 400, 'prompt', 'empty_prompt'],
      [{ model: 'counter' }, 400, 'prompt', 'invalid_value'],
      [{ model: 'counter', prompt: 'x', suffix: 'y' }, 400, 'suffix', 'unsupported_parameter'],
      [{ model: 'counter', prompt: 'x', logprobs: 2 }, 400, 'logprobs', 'unsupported_parameter'],
      [{ model: 'counter', prompt: 'x', n: 2 }, 400, 'n', 'invalid_value'],
      [{ model: 'counter', prompt: 'x', max_tokens: 65 }, 400, 'max_tokens', 'invalid_value'],
      [{ model: 'counter', prompt: 'x', messages: [] }, 400, 'messages', 'unrecognized_argument'],
      [{ model: 'nope', prompt: 'x' }, 404, 'model', 'model_not_found'],
    ];
    for (const [body, status, param, code] of refused) {
      const answer = await post(body);
      assert.equal(answer.status, status, JSON.stringify(body));
      const { error } = (await answer.json()) as { error: { param: string | null; code: string } };
      assert.deepEqual([error.param, error.code], [param, code], JSON.stringify(body));
    }
    const get = await fetch(`${base}/v1/completions`);
    assert.equal(get.status, 405);
    assert.equal(get.headers.get('allow'), 'POST');
  });
});

describe('POST /v1/completions through a gateway, to another sluice server', () => {
  let inner: RunningServer;
  let gateway: RunningServer;
  before(async () => {
    inner = await startServer({ port: 0, poolSize: 1 });
    gateway = await startServer({ port: 0, upstreams: [{ baseUrl: `${inner.url}/v1`, name: 'inner' }] });
  });
  after(async () => {
    await gateway?.shutdown(0);
    await inner?.shutdown(0);
  });

  it('forwards the body to the upstream’s /completions: its echo, its refusals, its stream', async () => {
    const client = new OpenAI({ baseURL: `${gateway.url}/v1`, apiKey: 'unused', maxRetries: 0 });
    const whole = await client.completions.create({ model: 'charlm', prompt: 'The stage ', max_tokens: 5, echo: true });
    assert.equal(whole.object, 'text_completion');
    assert.ok(whole.choices[0]!.text.startsWith('The stage '), whole.choices[0]!.text);
    assert.equal(whole.usage?.completion_tokens, 5);
    const stream = await client.completions.create({
      model: 'charlm',
      prompt: 'The stage ',
      max_tokens: 6,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = '';
    let usage: OpenAI.CompletionUsage | undefined;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.text ?? '';
      if (chunk.usage) usage = chunk.usage;
    }
    assert.ok(text.length > 0);
    assert.equal(usage?.completion_tokens, 6);
    // suffix is the upstream's to judge: the inner server refuses it, and the gateway passes its 400 on.
    await assert.rejects(
      client.completions.create({ model: 'charlm', prompt: 'x', suffix: 'y' }),
      (err: APIError) => err.status === 400 && err.param === 'suffix',
    );
  });
});
