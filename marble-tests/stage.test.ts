import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { TestScheduler } from 'rxjs/testing';
import { map } from 'rxjs';
import { stage } from '../operators/stage.js';

const values = map(<T>(t: { value: T }) => t.value);

function scheduler(): TestScheduler {
  return new TestScheduler((actual, expected) => assert.deepEqual(actual, expected));
}

describe('stage: marbles', () => {
  it('maps each element and keeps the timing of a synchronous stage', () => {
    scheduler().run(({ cold, expectObservable }) => {
      const source = cold('-a-b-c|', { a: 1, b: 2, c: 3 });
      expectObservable(source.pipe(stage((x: number) => x * 10), values)).toBe('-a-b-c|', { a: 10, b: 20, c: 30 });
    });
  });
});
