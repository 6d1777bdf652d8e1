import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { filter, map } from 'rxjs';
import { asFlow } from '../../src/resilience/as-flow.js';
import { subscribeWithDemand } from '../../src/flow/demand.js';
import { fromIterable } from '../../src/flow/sources.js';
import { stage } from '../../operators/stage.js';

const turn = () => new Promise<void>((resolve) => setImmediate(resolve));

describe('asFlow', () => {
  it('returns a Flow as it is', () => {
    const flow = fromIterable([1, 2]);
    assert.equal(asFlow(flow), flow);
  });

  it('passes demand through a chain of operators over Flows: the source is read only as far as asked', async () => {
    let pulled = 0;
    let returned = false;
    function* numbers() {
      try {
        for (let i = 0; ; i++) {
          pulled++;
          yield i;
        }
      } finally {
        returned = true;
      }
    }
    const chain = fromIterable(numbers()).pipe(
      filter((n) => n % 2 === 0),
      stage((n: number) => n * 10, { name: 'times', capacity: 2 }),
      map((t) => t.value),
    );
    const got: number[] = [];
    const subscription = subscribeWithDemand(asFlow(chain), { next: (v) => got.push(v) });
    subscription.request(3);
    await turn();
    assert.deepEqual(got, [0, 20, 40]);
    // 3 delivered, the stage's buffer (2) and one in its work at most: bounded, not the endless source.
    assert.ok(pulled <= 2 * (3 + 2 + 1) + 1, `pulled ${pulled}`);
    const before = pulled;
    await turn();
    assert.equal(pulled, before, 'nothing is read without demand');
    subscription.request(2);
    await turn();
    assert.deepEqual(got, [0, 20, 40, 60, 80]);
    subscription.cancel();
    assert.equal(returned, true, 'cancelling the Flow unsubscribes the whole chain');
  });

  it('relays errors and completion', async () => {
    const errors: unknown[] = [];
    let completed = false;
    asFlow(fromIterable([1, 2, 3]).pipe(map((n) => n))).subscribe({ complete: () => (completed = true) });
    asFlow(
      fromIterable([1]).pipe(
        map(() => {
          throw new Error('boom');
        }),
      ),
    ).subscribe({ error: (e) => errors.push(e) });
    await turn();
    assert.equal(completed, true);
    assert.equal((errors[0] as Error).message, 'boom');
  });
});
