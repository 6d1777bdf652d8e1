import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { firstValueFrom, toArray } from 'rxjs';
import { infer } from '../../src/ai/stages/infer.js';
import { SluiceError } from '../../src/core/errors.js';
import { fromIterable } from '../../src/flow/sources.js';
import { ModelSignatureError } from '../../src/ai/models/errors.js';
import { SIGNATURES, loadModel } from '../../src/ai/models/load.js';
import { GraphBuilder, ModelBuilder } from '../../src/ai/models/onnx/index.js';
import { embedder, tensorRows, textFeeds } from '../../src/ai/pool/embedder.js';
import { InferencePool } from '../../src/ai/pool/pool.js';
import { planPooling, poolOutputs } from '../../src/ai/models/pooling.js';
import { seededRandom } from '../../src/core/random.js';
import { DEFAULT_HASH_TOKENIZER, HashTokenizer } from '../../src/ai/models/tokenizer.js';
import { invalidPaths } from '../support/invalid-options.js';

// A stand-in for a Hugging Face sentence-transformer export: token vectors out, no pooling in the graph.
const tokenizer = new HashTokenizer({ ...DEFAULT_HASH_TOKENIZER, buckets: 97 });
const DIM = 8;
const random = seededRandom(11);
// Row 0 (the padding id) is non-zero on purpose: a pooling that ignored the mask would show.
const wordTable = Float32Array.from({ length: 97 * DIM }, () => random() * 2 - 1);
const typeTable = Float32Array.from({ length: 2 * DIM }, () => random() * 2 - 1);

/** `last_hidden_state[b, s] = wordTable[input_ids[b, s]] + typeTable[token_type_ids[b, s]]`, as BERT's embedding layer sums them. */
function tokenModel(outputs: 'last_hidden_state' | 'logits' = 'last_hidden_state'): Uint8Array {
  const graph = new GraphBuilder('token-vectors');
  const ids = graph.input('input_ids', 'int64', ['batch', 'seq']);
  graph.input('attention_mask', 'int64', ['batch', 'seq']);
  const types = graph.input('token_type_ids', 'int64', ['batch', 'seq']);
  const words = graph.op('Gather', [graph.initializer('word.weight', wordTable, [97, DIM]), ids], { axis: 0 });
  const typeVectors = graph.op('Gather', [graph.initializer('type.weight', typeTable, [2, DIM]), types], { axis: 0 });
  graph.node('Add', [words, typeVectors], [outputs]);
  graph.output(outputs, 'float32', ['batch', 'seq', DIM]);
  return new ModelBuilder(graph).toBytes();
}

/** The reference: `mode` over the text's own tokens (type 0), then L2 normalisation, in float64. */
function reference(text: string, mode: 'mean' | 'cls'): number[] {
  const ids = tokenizer.encode(text);
  const kept = mode === 'cls' ? ids.slice(0, 1) : ids;
  const vector = Array.from({ length: DIM }, (_, d) => kept.reduce((sum, id) => sum + wordTable[id * DIM + d]! + typeTable[d]!, 0) / Math.max(kept.length, 1));
  const norm = Math.hypot(...vector);
  return vector.map((x) => x / norm);
}

function assertClose(actual: Float32Array, expected: readonly number[], what: string): void {
  assert.equal(actual.length, expected.length, what);
  for (let i = 0; i < actual.length; i++) assert.ok(Math.abs(actual[i]! - expected[i]!) < 1e-5, `${what}: [${i}] ${actual[i]} vs ${expected[i]}`);
}

// Different lengths, so the batch is padded and the mask matters.
const texts = ['backpressure', 'a pull based stream of tokens', 'workers batch tensors off the event loop'];

let dir: string;
let tokenPath: string;
let logitsPath: string;

before(async () => {
  dir = await mkdtemp(join(tmpdir(), 'sluice-pooling-'));
  tokenPath = join(dir, 'last-hidden-state.onnx');
  logitsPath = join(dir, 'logits.onnx');
  await writeFile(tokenPath, tokenModel());
  await writeFile(logitsPath, tokenModel('logits'));
});

after(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('embedder options', () => {
  it('are checked before the pool is asked, naming each bad field', () => {
    assert.deepEqual(
      invalidPaths(() => embedder({} as InferencePool, {} as Parameters<typeof embedder>[1], { pooling: 'max', normalise: true } as never)),
      ['normalise', 'pooling'],
    );
  });
});

describe('pooling a sentence-transformer export that outputs last_hidden_state', () => {
  it('chooses the output and pooling from the output names', () => {
    assert.deepEqual(planPooling(['embeddings']), { output: 'embeddings', pooling: 'none', normalize: false });
    assert.deepEqual(planPooling(['last_hidden_state', 'sentence_embedding']), { output: 'sentence_embedding', pooling: 'none', normalize: false });
    assert.deepEqual(planPooling(['last_hidden_state', 'pooler_output']), { output: 'last_hidden_state', pooling: 'mean', normalize: true });
    assert.deepEqual(planPooling(['last_hidden_state', 'sentence_embedding'], { pooling: 'cls' }), {
      output: 'last_hidden_state',
      pooling: 'cls',
      normalize: true,
    });
    assert.deepEqual(planPooling(['pooler_output'], { output: 'pooler_output' }), { output: 'pooler_output', pooling: 'none', normalize: false });
    assert.deepEqual(planPooling(['last_hidden_state'], { normalize: false }), { output: 'last_hidden_state', pooling: 'mean', normalize: false });
  });

  it('embedder(pool, tokenizer) mean-pools over the attention mask in the worker and L2-normalises, feeding token_type_ids', async () => {
    const pool = await InferencePool.create({ model: tokenPath, size: 1 });
    try {
      assert.deepEqual(pool.describe().inputNames, ['input_ids', 'attention_mask', 'token_type_ids']);
      const vectors = await embedder(pool, tokenizer)(texts);
      assert.equal(vectors.length, texts.length);
      for (const [i, vector] of vectors.entries()) assertClose(vector, reference(texts[i]!, 'mean'), `text ${i}`);
      const cls = await embedder(pool, tokenizer, { pooling: 'cls' })(texts);
      for (const [i, vector] of cls.entries()) assertClose(vector, reference(texts[i]!, 'cls'), `cls text ${i}`);
      // The worker answers with the pooled [batch, dim] tensor alone.
      const outputs = await pool.run(textFeeds(tokenizer, texts, pool.describe().inputNames), { pooling: planPooling(pool.describe().outputNames) });
      assert.deepEqual(Object.keys(outputs), ['embeddings']);
      assert.deepEqual(outputs.embeddings!.dims, [texts.length, DIM]);
    } finally {
      await pool.close();
    }
  });

  it('infer({ pooling }) micro-batches the export and pools each run in the worker', async () => {
    const pool = await InferencePool.create({ model: tokenPath, size: 1 });
    try {
      const results = await firstValueFrom(
        fromIterable(texts).pipe(
          infer({
            pool,
            toFeeds: (batch) => textFeeds(tokenizer, batch.items, pool.describe().inputNames),
            fromOutputs: (outputs) => tensorRows(outputs.embeddings!),
            pooling: planPooling(pool.describe().outputNames),
            maxBatch: 8,
            maxWait: 5,
          }),
          toArray(),
        ),
      );
      assert.ok(
        results.some(({ trace }) => Number(trace.notes?.['infer.batchSize']) > 1),
        'batches of more than one',
      );
      for (const { value, trace } of results) assertClose(value, reference(texts[trace.seq]!, 'mean'), `text ${trace.seq}`);
    } finally {
      await pool.close();
    }
  });

  it('loadModel accepts it as an embedding model, and poolOutputs pools a main-thread run the same way', async () => {
    const model = await loadModel(tokenPath, { signature: SIGNATURES.embedding });
    try {
      const feeds = textFeeds(tokenizer, texts, model.inputNames);
      const { embeddings } = poolOutputs(await model.run(feeds), feeds, planPooling(model.outputNames));
      const data = embeddings.data as Float32Array;
      texts.forEach((text, i) => assertClose(data.subarray(i * DIM, (i + 1) * DIM), reference(text, 'mean'), `text ${i}`));
    } finally {
      await model.release();
    }
  });

  it('a model with no embedding output is MODEL_SIGNATURE naming the outputs it has, from loadModel and from embedder', async () => {
    const loading = await loadModel(logitsPath, { signature: SIGNATURES.embedding }).then(
      () => assert.fail('expected ModelSignatureError'),
      (error: unknown) => error,
    );
    assert.ok(loading instanceof ModelSignatureError, String(loading));
    assert.equal(loading.code, 'MODEL_SIGNATURE');
    assert.match(loading.message, /no output to take embeddings from.*the model's outputs are "logits"/);

    const pool = await InferencePool.create({ model: logitsPath, size: 1 });
    try {
      const expectSignature = (make: () => unknown, ...mentions: string[]) =>
        assert.throws(make, (error: unknown) => {
          assert.ok(error instanceof ModelSignatureError && error instanceof SluiceError, String(error));
          for (const mention of [...mentions, '"logits"', `inference pool "${pool.name}"`])
            assert.ok(error.message.includes(mention), `${mention} in:\n${error.message}`);
          return true;
        });
      expectSignature(() => embedder(pool, tokenizer), 'no output to take embeddings from');
      expectSignature(() => embedder(pool, tokenizer, { output: 'last_hidden_state' }), 'no output "last_hidden_state"');
      expectSignature(() => embedder(pool, tokenizer, { pooling: 'mean' }), 'pooling "mean" reads one of "last_hidden_state", "token_embeddings"');
    } finally {
      await pool.close();
    }
  });

  it('a pooling that does not fit the output rank fails the run with a message saying which to choose', async () => {
    const pool = await InferencePool.create({ model: tokenPath, size: 1 });
    try {
      const embed = embedder(pool, tokenizer, { output: 'last_hidden_state', pooling: 'none' });
      await assert.rejects(embed(texts), (error: unknown) => {
        assert.ok(error instanceof SluiceError, String(error));
        assert.match(
          error.message,
          /"last_hidden_state" is float32 \[3, \d+, 8\]; expected \[batch, dim\] for pooling "none" \(token vectors need "mean" or "cls"\)/,
        );
        return true;
      });
    } finally {
      await pool.close();
    }
  });
});
