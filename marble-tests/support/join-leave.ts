/** The join/leave property of batched generation: generations that join and leave at random steps get the tokens they get alone. */
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { TestSink, eventually } from 'sluice/testing';
import { generateRequest, type ModelWorker, type Token, type GenerateRequest, type Completion } from '../../src/ai/inference/worker.js';

type Generator = Pick<ModelWorker<GenerateRequest, Completion>, 'generate'>;

/** All of a generation's tokens, read one at a time with a pause of `gaps[i]` turns before asking the i-th. */
async function readFrom(worker: Generator, request: Parameters<typeof generateRequest>[0], gaps: readonly number[] = [], maxTicks?: number): Promise<string[]> {
  const sink = TestSink.subscribe(worker.generate(generateRequest(request)));
  const texts: string[] = [];
  for (let i = 0; ; i++) {
    for (let g = 0; g < (gaps[i] ?? 0); g++) await new Promise((resolve) => setImmediate(resolve));
    sink.request(1);
    await eventually(
      () => assert.ok(sink.received.length > i || sink.completed || sink.error !== undefined, 'the next token or an end'),
      maxTicks === undefined ? {} : { maxTicks },
    );
    if (sink.received.length <= i) break;
    texts.push((sink.received[i] as Token).text);
  }
  assert.equal(sink.error, undefined);
  return texts;
}

/**
 * The join/leave property: generations of random prompts, lengths, temperatures and seeds join at
 * random turns and read with random pauses; each gets the tokens it gets alone from `single`.
 */
export async function joinLeaveProperty(
  single: Generator,
  decoder: Generator,
  prompts: readonly string[],
  sizes: {
    readonly maxTokens: number;
    readonly runs: { readonly min: number; readonly max: number };
    readonly numRuns: number;
    readonly temperatures?: readonly number[];
    readonly maxStart?: number;
    readonly maxGap?: number;
    /** Turns to wait for a token: a step in a pool thread takes more turns than one on this thread. */
    readonly maxTicks?: number;
  },
): Promise<void> {
  await fc.assert(
    fc.asyncProperty(
      fc.array(
        fc.record({
          prompt: fc.constantFrom(...prompts),
          maxTokens: fc.integer({ min: 1, max: sizes.maxTokens }),
          temperature: fc.constantFrom(...(sizes.temperatures ?? [0, 0.9])),
          seed: fc.integer({ min: 0, max: 1000 }),
          start: fc.integer({ min: 0, max: sizes.maxStart ?? 3 }),
          gaps: fc.array(fc.integer({ min: 0, max: sizes.maxGap ?? 2 }), { maxLength: sizes.maxTokens }),
        }),
        { minLength: sizes.runs.min, maxLength: sizes.runs.max },
      ),
      async (runs) => {
        const request = (r: (typeof runs)[number]) => ({ prompt: r.prompt, max_tokens: r.maxTokens, temperature: r.temperature, seed: r.seed });
        const expected = await Promise.all(runs.map((r) => readFrom(single, request(r))));
        const got = await Promise.all(
          runs.map(async (r) => {
            for (let g = 0; g < r.start; g++) await new Promise((resolve) => setImmediate(resolve));
            return readFrom(decoder, request(r), r.gaps, sizes.maxTicks);
          }),
        );
        assert.deepEqual(got, expected);
      },
    ),
    { numRuns: sizes.numRuns },
  );
}
