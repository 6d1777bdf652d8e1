/** `CitationFilter`: a language model's `[n]` checked against the context, on whole and streamed text. */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { lastValueFrom, from, toArray } from 'rxjs';
import { CitationFilter } from '../../src/ai/rag/citations.js';
import { withSources } from '../../src/ai/pipelines/rag-worker.js';

const whole = (valid: readonly number[], text: string) => {
  const filter = new CitationFilter(new Set(valid));
  return { text: filter.push(text) + filter.flush(), cited: [...filter.cited], invalid: filter.invalid };
};

describe('CitationFilter', () => {
  it('lets a marker of the context through and leaves out one that names no passage', () => {
    assert.deepEqual(whole([1, 2], 'Stages pause [1] as queues fill [7], see [2][3].'), {
      text: 'Stages pause [1] as queues fill , see [2].',
      cited: [1, 2],
      invalid: 2,
    });
    assert.deepEqual(whole([1], 'an array [a] or [1234] or [] stays'), { text: 'an array [a] or [1234] or [] stays', cited: [], invalid: 0 });
    assert.deepEqual(whole([1], 'ends with [12'), { text: 'ends with [12', cited: [], invalid: 0 });
  });

  it('property: split into tokens anywhere, it lets out what it lets out of the whole text', () => {
    fc.assert(
      fc.property(
        fc.array(fc.constantFrom('[', ']', '1', '2', '7', '0', 'a', ' '), { maxLength: 40 }).map((cs) => cs.join('')),
        fc.array(fc.integer({ min: 0, max: 40 }), { maxLength: 8 }),
        (text, cuts) => {
          const at = [...new Set(cuts.filter((c) => c <= text.length))].sort((a, b) => a - b);
          const pieces = [0, ...at, text.length].slice(1).map((end, i, ends) => text.slice(i === 0 ? 0 : ends[i - 1], end));
          const filter = new CitationFilter(new Set([1, 2]));
          const streamed = pieces.map((p) => filter.push(p)).join('') + filter.flush();
          const expected = whole([1, 2], text);
          assert.equal(streamed, expected.text);
          assert.deepEqual([...filter.cited], expected.cited);
          assert.equal(filter.invalid, expected.invalid);
        },
      ),
      { numRuns: 500 },
    );
  });

  it("withSources: the model's made-up citation never reaches the client, and the sources list what it cited", async () => {
    const tokens = ['Bounded [', '1] queues; a made-up [', '9', '] source.'].map((text, index) => ({ text, index }));
    const out = await lastValueFrom(
      withSources(from(tokens), [
        { marker: 1, source: 'backpressure.md › Queues', ids: ['backpressure.md#queues-1'] },
        { marker: 2, source: 'policies.md › Shed', ids: ['policies.md#shed-1'] },
      ]).pipe(toArray()),
    );
    assert.equal(out.map((t) => t.text).join(''), 'Bounded [1] queues; a made-up  source.\n\nSources:\n[1] backpressure.md › Queues');
  });
});
