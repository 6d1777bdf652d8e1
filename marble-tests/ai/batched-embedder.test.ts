/**
 * BatchedEmbedder over the real generated embedding model in a worker pool: texts asked for at
 * once by many callers share pool runs, and each caller gets the vector the model gives its text
 * alone (to float rounding: a batch pads its texts to its longest, and onnxruntime sums a longer
 * row in another order); `embedder` is the same without the token count.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { MODEL_FILES } from '../../src/ai/models/generate.js';
import { loadTokenizer } from '../../src/ai/models/load.js';
import type { Tokenizer } from '../../src/ai/models/tokenizer.js';
import { BatchedEmbedder } from '../../src/ai/pipelines/batched-embedder.js';
import { embedder } from '../../src/ai/pool/embedder.js';
import { InferencePool } from '../../src/ai/pool/pool.js';
import { generatedModels, type GeneratedModels } from '../support/models.js';

/** Equal to float32 rounding, component by component. */
function assertClose(actual: Float32Array, expected: Float32Array, what: string): void {
  assert.equal(actual.length, expected.length, what);
  for (let i = 0; i < actual.length; i++) assert.ok(Math.abs(actual[i]! - expected[i]!) < 1e-6, `${what}: component ${i} ${actual[i]} ≠ ${expected[i]}`);
}

const TEXTS = [
  'How does a stage pause a fast producer?',
  'What happens when the buffer is full?',
  'shed-oldest drops the oldest element waiting',
  'tokens',
  'How are embeddings cached between requests of many tenants?',
];

describe('BatchedEmbedder', () => {
  let models: GeneratedModels;
  let pool: InferencePool;
  let tokenizer: Tokenizer;

  before(async () => {
    models = await generatedModels('batched-embedder');
    pool = await InferencePool.create({ model: join(models.dir, MODEL_FILES.embedding), size: 1 });
    tokenizer = await loadTokenizer(join(models.dir, MODEL_FILES.embeddingTokenizer));
  });
  after(async () => {
    await pool?.close();
    await models?.remove();
  });

  it("embedder: callers at once share pool runs, and each gets its text's vector as embed and a run of that text alone give it", async () => {
    const batched = new BatchedEmbedder(pool, tokenizer);
    try {
      const alone = await Promise.all(TEXTS.map((text) => embedder(pool, tokenizer)([text])));
      const before = pool.stats.submitted;
      const shared = await Promise.all(TEXTS.map((text) => batched.embedder([text])));
      assert.ok(pool.stats.submitted - before < TEXTS.length, `${pool.stats.submitted - before} runs for ${TEXTS.length} callers`);
      const counted = await batched.embed(TEXTS);
      TEXTS.forEach((text, i) => {
        assertClose(shared[i]![0]!, alone[i]![0]!, text);
        assertClose(counted.vectors[i]!, alone[i]![0]!, text);
      });
      assert.equal(
        counted.tokens,
        TEXTS.reduce((n, text) => n + tokenizer.encode(text).length, 0),
      );
      assert.deepEqual(await batched.embedder([]), []);
    } finally {
      batched.close();
    }
  });
});
