/**
 * Dynamic micro-batching: requests for two models are gathered into per-model batches
 * (at most 8 items or 5 ms), "run" as one call per batch, and split back into one result
 * per request, each with its own trace.
 * Run: node --conditions=sluice-source --import tsx examples/micro-batching.ts
 */
import { lastValueFrom, toArray } from 'rxjs';
import { batch, fromIterable, stage, unbatch, type Batch } from 'sluice';

interface Request {
  id: number;
  model: 'small' | 'large';
  prompt: string;
}

const requests: Request[] = Array.from({ length: 40 }, (_, id) => ({ id, model: id % 3 === 0 ? 'large' : 'small', prompt: `question ${id}` }));
const batchSizes: string[] = [];

/** One call per batch, as a batched model would take it. */
async function runModel(b: Batch<Request>): Promise<Batch<string>> {
  batchSizes.push(`${b.key}×${b.size}`);
  await new Promise((resolve) => setImmediate(resolve));
  return b.withResults(b.items.map((r) => `${r.model}: answer to ${r.prompt}`));
}

const results = await lastValueFrom(
  fromIterable(requests).pipe(batch({ maxSize: 8, maxWait: 5, key: (r) => r.model }), stage(runModel, { name: 'infer', concurrency: 2 }), unbatch(), toArray()),
);

console.log(`${results.length} results from ${batchSizes.length} model calls: ${batchSizes.join(', ')}`);
console.log(`first: "${results[0]!.value}" (trace ${results[0]!.trace.traceId})`);
if (results.length !== requests.length) throw new Error('a request was lost');
