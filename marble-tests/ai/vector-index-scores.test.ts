/**
 * VectorIndex reuses a query's scores while the query and the rows stay the same (retrieval searches,
 * then weighs its evidence by the moments of the same scores): whatever ran before, every answer is
 * a fresh index's.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { VectorIndex } from '../../src/ai/rag/vector-index.js';

const vectorArb = (dim: number) => fc.array(fc.integer({ min: -4, max: 4 }), { minLength: dim, maxLength: dim }).filter((v) => v.some((x) => x !== 0));

describe('VectorIndex: scores reused', () => {
  it('search, scoreMoments and scoreAll answer as a fresh index does, whatever ran before them (scores are reused only while the query and the rows stay the same)', () => {
    const op = fc.oneof(
      fc.record({ kind: fc.constantFrom('search', 'moments', 'all'), query: fc.integer({ min: 0, max: 2 }) }),
      fc.record({ kind: fc.constant('add'), row: vectorArb(5) }),
      fc.record({ kind: fc.constant('remove'), at: fc.nat() }),
    );
    fc.assert(
      fc.property(
        fc.array(vectorArb(5), { minLength: 1, maxLength: 12 }),
        fc.array(vectorArb(5), { minLength: 3, maxLength: 3 }),
        fc.array(op, { maxLength: 30 }),
        (start, queries, ops) => {
          const index = new VectorIndex<number>(5, { capacity: 2 });
          const rows = new Map<string, number[]>();
          let next = 0;
          const add = (row: number[]) => {
            const id = `r${next++}`;
            rows.set(id, row);
            index.add(id, row, 0);
          };
          start.forEach(add);
          // Built in the live index's row order, so sums over rows run in the same order.
          const fresh = () => {
            const built = new VectorIndex<number>(5);
            for (const { id } of index.entries()) built.add(id, rows.get(id)!, 0);
            return built;
          };
          for (const o of ops) {
            if (o.kind === 'add') add(o.row);
            else if (o.kind === 'remove') {
              const ids = [...rows.keys()];
              if (ids.length === 0) continue;
              const id = ids[o.at % ids.length]!;
              rows.delete(id);
              assert.equal(index.remove(id), true);
            } else {
              const query = queries[o.query]!;
              if (o.kind === 'search') assert.deepEqual(index.search(query, { k: 3 }), fresh().search(query, { k: 3 }));
              else if (o.kind === 'moments') assert.deepEqual(index.scoreMoments(query), fresh().scoreMoments(query));
              else assert.deepEqual(index.scoreAll(query), fresh().scoreAll(query));
            }
          }
        },
      ),
      { numRuns: 150 },
    );
  });
});
