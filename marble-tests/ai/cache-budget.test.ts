/** `CacheBudget` and `DecoderLmWorker({ cacheBytes })`: paused generations keep their KV caches up to a byte budget; past it the idlest is dropped and rebuilt on resume. */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { TestSink, eventually } from 'sluice/testing';
import { MODEL_FILES } from '../../src/ai/models/generate.js';
import { CacheBudget } from '../../src/ai/inference/cache-budget.js';
import { DecoderLmWorker } from '../../src/ai/inference/onnx-lm.js';
import { generateRequest, type Token } from '../../src/ai/inference/worker.js';
import { generatedModels, type GeneratedModels } from '../support/models.js';

let generated: GeneratedModels;
before(async () => {
  generated = await generatedModels('cache-budget');
});
after(async () => {
  await generated.remove();
});

describe('CacheBudget', () => {
  it('drops the least recently stepped caches, never the one just stepped, until the rest fit', () => {
    const budget = new CacheBudget(100);
    const evicted: string[] = [];
    const a = budget.hold(() => evicted.push('a'));
    const b = budget.hold(() => evicted.push('b'));
    const c = budget.hold(() => evicted.push('c'));
    a.used(40);
    b.used(40);
    a.used(45); // a is now the most recent
    assert.deepEqual(evicted, []);
    c.used(40); // 125 > 100: b (stepped longest ago) goes
    assert.deepEqual(evicted, ['b']);
    assert.deepEqual(budget.stats, { bytes: 85, evictions: 1 });
    c.used(200); // c alone is over: everyone else goes, c stays
    assert.deepEqual(evicted, ['b', 'a']);
    c.release();
    b.release();
    assert.equal(budget.stats.bytes, 0);
  });
});

describe('DecoderLmWorker({ cacheBytes })', () => {
  it("a paused generation's cache is dropped when others need the room, rebuilt on resume: same tokens as alone", async () => {
    const path = join(generated.dir, MODEL_FILES.decoder);
    const alone = await DecoderLmWorker.load(path);
    // Room for about one generation's cache of ~40 positions (2 layers × 2 × 4 heads × 16 dims × 4 bytes per position).
    const bounded = await DecoderLmWorker.load(path, { cacheBytes: 40 * 1024 });
    const request = generateRequest({ prompt: 'The stage pauses', max_tokens: 24, temperature: 0 });
    const expected = (await alone.infer(request)).text;

    const paused = TestSink.subscribe(bounded.generate(request));
    paused.request(5);
    await eventually(() => assert.equal(paused.received.length, 5));
    // Another generation steps on while the first waits for its reader.
    const other = await bounded.infer(generateRequest({ prompt: 'Backpressure keeps memory bounded', max_tokens: 40, temperature: 0 }));
    assert.ok(other.text.length > 0);
    assert.ok(bounded.cacheStats!.evictions >= 1, `evictions ${bounded.cacheStats!.evictions}`);
    paused.request(100);
    await eventually(() => assert.ok(paused.completed, 'the paused generation completed'));
    assert.equal(paused.received.map((t: Token) => t.text).join(''), expected);
    assert.equal(bounded.cacheStats!.bytes, 0, 'every cache released at the end');
    await alone.release();
    await bounded.release();
  });
});
