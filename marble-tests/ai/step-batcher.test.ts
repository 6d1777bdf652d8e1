/**
 * Continuous batching of decode steps (`StepBatcher`, `CharLmWorker({ batch })`): generations joining
 * and leaving at random steps get exactly the tokens they get alone; steps asked together share a
 * model call; a generation whose reader wants nothing asks no step; a cancel leaves before its call.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { TestSink, eventually } from 'sluice/testing';
import { InvalidOptionsError } from '../../src/core/errors.js';
import { MODEL_FILES } from '../../src/ai/models/generate.js';
import { loadModel } from '../../src/ai/models/load.js';
import { CharLmWorker, DecoderLmWorker } from '../../src/ai/inference/onnx-lm.js';
import { StepBatcher } from '../../src/ai/inference/step-batcher.js';
import { generateRequest } from '../../src/ai/inference/worker.js';
import { generatedModels, type GeneratedModels } from '../support/models.js';
import { joinLeaveProperty } from '../support/join-leave.js';

let generated: GeneratedModels;
let alone: CharLmWorker;
let batched: CharLmWorker;
let vocab: string[];

before(async () => {
  generated = await generatedModels('step-batcher');
  const path = join(generated.dir, MODEL_FILES.charLm);
  alone = await CharLmWorker.load(path);
  const model = await loadModel(path);
  batched = await CharLmWorker.load(path, { run: (feeds) => model.run(feeds), batch: { maxBatch: 8 } });
  vocab = JSON.parse(await (await import('node:fs/promises')).readFile(join(generated.dir, MODEL_FILES.charLmVocab), 'utf8')) as string[];
});
after(async () => {
  await alone.release();
  await generated.remove();
});

describe('StepBatcher on the character LM', () => {
  it('property: a generation that joins and leaves a batch at random steps gets the tokens it gets alone (greedy and sampled)', async () => {
    const prompts = ['The stage', 'A', 'Back', 'pressure is', 'Tokens flow', 'x'];
    await joinLeaveProperty(alone, batched, prompts, {
      maxTokens: 12,
      runs: { min: 1, max: 6 },
      numRuns: 25,
      temperatures: [0, 0.8, 1.2],
      maxStart: 4,
      maxGap: 3,
    });
    const { calls, steps, largest } = batched.batchStats!;
    assert.ok(largest > 1, `steps shared a call (largest ${largest})`);
    assert.ok(calls < steps, `${calls} calls for ${steps} steps`);
  });

  it('sixteen generations at once take far fewer model calls than steps', async () => {
    const path = join(generated.dir, MODEL_FILES.charLm);
    const model = await loadModel(path);
    const worker = await CharLmWorker.load(path, { run: (feeds) => model.run(feeds), batch: { maxBatch: 16 } });
    const texts = await Promise.all(Array.from({ length: 16 }, (_, i) => worker.infer(generateRequest({ prompt: `The stage ${i}`, max_tokens: 20, seed: i }))));
    assert.equal(texts.length, 16);
    const { calls, steps } = worker.batchStats!;
    assert.equal(steps, 16 * 20);
    assert.ok(calls <= steps / 4, `${calls} calls for ${steps} steps`);
    await model.release();
  });

  it('a model call that fails mid-batch ends every generation in it with that error, once; the next generation runs', async () => {
    const path = join(generated.dir, MODEL_FILES.charLm);
    const model = await loadModel(path);
    let calls = 0;
    const worker = await CharLmWorker.load(path, {
      run: (feeds) => (++calls === 6 ? Promise.reject(new Error('the worker thread died')) : model.run(feeds)),
      batch: { maxBatch: 8 },
    });
    const ends = await Promise.all(
      Array.from(
        { length: 4 },
        (_, i) =>
          new Promise<{ tokens: number; terminals: number; error: unknown }>((resolve) => {
            const seen = { tokens: 0, terminals: 0, error: undefined as unknown };
            worker.generate(generateRequest({ prompt: `The stage ${i}`, max_tokens: 40, seed: i })).subscribe({
              next: () => seen.tokens++,
              error: (error: unknown) => {
                seen.terminals++;
                seen.error = error;
                setImmediate(() => resolve(seen));
              },
              complete: () => {
                seen.terminals++;
                setImmediate(() => resolve(seen));
              },
            });
          }),
      ),
    );
    for (const end of ends) {
      assert.equal(end.terminals, 1);
      assert.ok(end.tokens < 40, 'it did not run to its end');
      assert.match(String((end.error as Error | undefined)?.message), /the worker thread died/);
    }
    assert.equal((await worker.infer(generateRequest({ prompt: 'after', max_tokens: 5 }))).usage.outputTokens, 5);
    await model.release();
  });

  it('asks no step for a reader that wants nothing, and drops a cancelled step before its call', async () => {
    const runs: number[] = [];
    const batcher = new StepBatcher<number, number>(
      async (inputs) => {
        runs.push(inputs.length);
        return inputs.map((x) => x * 2);
      },
      () => 'all',
    );
    const controller = new AbortController();
    const cancelled = batcher.step(1, controller.signal);
    const kept = batcher.step(2, new AbortController().signal);
    controller.abort();
    await assert.rejects(cancelled, /cancelled/);
    assert.equal(await kept, 4);
    assert.deepEqual(runs, [1]);
    // A paused reader: a generation stepped only on demand asks nothing while none is wanted.
    const sink = TestSink.subscribe(batched.generate(generateRequest({ prompt: 'The stage', max_tokens: 50 })));
    const before = batched.batchStats!.steps;
    await new Promise((resolve) => setTimeout(resolve, 20));
    assert.equal(batched.batchStats!.steps, before);
    sink.request(2);
    await eventually(() => assert.equal(sink.received.length, 2));
    await new Promise((resolve) => setTimeout(resolve, 20));
    assert.ok(batched.batchStats!.steps - before <= 3, `${batched.batchStats!.steps - before} steps for 2 tokens`);
    sink.cancel();
    assert.ok(vocab.length > 0);
  });

  it('property: the KV-cache decoder too — batched steps, stacked caches, the tokens each gets alone', async () => {
    const path = join(generated.dir, MODEL_FILES.decoder);
    const single = await DecoderLmWorker.load(path);
    const session = await loadModel(path);
    const decoder = await DecoderLmWorker.load(path, { run: (feeds) => session.run(feeds), batch: { maxBatch: 8 } });
    // Prompts of one length and of others: steps batch when their caches have the same length.
    const prompts = ['abcd', 'wxyz', 'Hello', 'Hi', 'stage'];
    await joinLeaveProperty(single, decoder, prompts, { maxTokens: 10, runs: { min: 1, max: 5 }, numRuns: 20 });
    assert.ok(decoder.batchStats!.largest > 1, `steps shared a call (largest ${decoder.batchStats!.largest})`);
    await single.release();
    await session.release();
  });

  it('prompts of one length joining together prefill in one call, within the token budget per call', async () => {
    const path = join(generated.dir, MODEL_FILES.decoder);
    const session = await loadModel(path);
    const run = (tokenBudget?: number) =>
      DecoderLmWorker.load(path, { run: (feeds) => session.run(feeds), batch: { maxBatch: 8, ...(tokenBudget !== undefined && { tokenBudget }) } });
    const prompts = ['abcde', 'fghij', 'klmno', 'pqrst'];
    const alone = await DecoderLmWorker.load(path);
    const expected = await Promise.all(prompts.map((prompt) => alone.infer(generateRequest({ prompt, max_tokens: 1, temperature: 0 }))));
    for (const [budget, calls, largest] of [
      [undefined, 1, 4],
      [10, 2, 2],
      [4, 4, 1],
    ] as const) {
      const decoder = await run(budget);
      const got = await Promise.all(prompts.map((prompt) => decoder.infer(generateRequest({ prompt, max_tokens: 1, temperature: 0 }))));
      assert.deepEqual(
        got.map((c) => c.text),
        expected.map((c) => c.text),
      );
      assert.deepEqual(decoder.batchStats, { calls, steps: 4, largest, waiting: 0, running: 0, maxBatch: 8 }, `token budget ${budget}`);
    }
    await alone.release();
    await session.release();
  });

  // Padded rows' logits differ from their lone ones by reduction rounding (≤ 1e-6 here, kv-batch-padding.test.ts bounds it):
  // a token could differ only where a draw or an argmax falls that close to a boundary.
  it('property: caches of different lengths in one call (left-padded, masked) give the tokens each gets alone', async () => {
    const path = join(generated.dir, MODEL_FILES.decoder);
    const single = await DecoderLmWorker.load(path);
    const session = await loadModel(path);
    let padded = 0;
    const run = (feeds: Parameters<typeof session.run>[0]) => {
      if ((feeds.attention_mask!.data as BigInt64Array).includes(0n)) padded++;
      return session.run(feeds);
    };
    const decoder = await DecoderLmWorker.load(path, { run, batch: { maxBatch: 8, lengthBucket: 64 } });
    const prompts = ['a', 'Hi', 'abcd', 'Hello', 'a longer prompt of words'];
    await joinLeaveProperty(single, decoder, prompts, { maxTokens: 12, runs: { min: 2, max: 6 }, numRuns: 30 });
    assert.ok(padded > 0, 'steps of different cache lengths shared a call');
    await single.release();
    await session.release();
  });

  it('a generation that asks while a call runs falls in step with the others: no lone call alternating with theirs', async () => {
    const sizes: number[] = [];
    // A call answers a loop turn later, as a pool thread's does.
    const batcher = new StepBatcher<number, number>(
      (inputs) => {
        sizes.push(inputs.length);
        return new Promise((resolve) => setImmediate(() => resolve(inputs.map((x) => x + 1))));
      },
      () => 'all',
    );
    const signal = new AbortController().signal;
    const steps = 20;
    // Between its answer and its next ask a generation takes a few microtask hops (sampling, emitting, its reader's demand).
    const generation = async (): Promise<void> => {
      for (let i = 0; i < steps; i++) {
        await batcher.step(i, signal);
        for (let hop = 0; hop < 6; hop++) await null;
      }
    };
    const first = [generation(), generation(), generation()];
    // The fourth asks while the first call runs.
    await new Promise((resolve) => setImmediate(resolve));
    await Promise.all([...first, generation()]);
    assert.equal(
      sizes.reduce((a, b) => a + b, 0),
      4 * steps,
    );
    assert.ok(sizes.length <= steps + 2, `${sizes.length} calls for 4 generations of ${steps} steps: ${sizes.join(' ')}`);
  });

  it('a step of another group (a request joining) runs at the next call, not after the running generations end', async () => {
    const calls: string[] = [];
    const batcher = new StepBatcher<string, string>(
      (inputs) => {
        calls.push(inputs[0]!);
        return new Promise((resolve) => setImmediate(() => resolve([...inputs])));
      },
      (input) => input,
    );
    const signal = new AbortController().signal;
    const running = Array.from({ length: 4 }, async () => {
      for (let i = 0; i < 30; i++) await batcher.step('decode', signal);
    });
    await new Promise((resolve) => setImmediate(resolve));
    const joined = batcher.step('prefill', signal).then(() => calls.length);
    await Promise.all(running);
    const at = await joined;
    assert.ok(at <= 3, `the prefill ran in call ${at} of ${calls.length}: ${calls.join(' ')}`);
  });

  it('checks its options, naming the bad field', () => {
    assert.throws(
      () =>
        new StepBatcher(
          async () => [],
          () => '',
          { maxBatch: 0 },
        ),
      (err: unknown) => err instanceof InvalidOptionsError && err.issues[0]?.path === 'maxBatch',
    );
  });
});
