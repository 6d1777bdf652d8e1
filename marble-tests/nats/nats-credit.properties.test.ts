import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { lastValueFrom, take, toArray } from 'rxjs';
import { fromIterable, stage, untraced } from '../../src/index.js';
import { fromLink, openLink, toLink } from '../../src/nats.js';
import { natsServerFixture } from '../support/nats-server.js';

const numRuns = Number(process.env.SLUICE_NATS_PROPERTY_RUNS ?? 12);

describe("a producer's credit, on a real nats-server", () => {
  const fixture = natsServerFixture();

  it('a single producer is never refused by the server: it sends only into room it has seen, its publishes in flight counted', async () => {
    let serial = 0;
    await fc.assert(
      fc.asyncProperty(
        fc.record({
          capacity: fc.integer({ min: 1, max: 64 }),
          publishWindow: fc.integer({ min: 1, max: 64 }),
          maxBatch: fc.integer({ min: 1, max: 32 }),
          concurrency: fc.integer({ min: 1, max: 8 }),
          // how the receiver's work defers: not at all, a microtask, a timer
          work: fc.constantFrom('sync', 'promise', 'timer'),
          total: fc.integer({ min: 50, max: 250 }),
        }),
        async ({ capacity, publishWindow, maxBatch, concurrency, work, total }) => {
          const link = await openLink<number>(fixture.nc, { name: `credit-${++serial}`, capacity, publishWindow, creditInterval: 20 });
          const producing = toLink(fromIterable(Array.from({ length: total }, (_, i) => i)), link, { producerId: 'only' });
          const received = await lastValueFrom(
            fromLink<number>(link, { maxBatch }).pipe(
              stage(
                work === 'sync'
                  ? (value: number) => value
                  : work === 'promise'
                    ? async (value: number) => value
                    : (value: number) => new Promise<number>((resolve) => setTimeout(() => resolve(value), 1)),
                { concurrency },
              ),
              untraced(),
              take(total),
              toArray(),
            ),
          );
          const summary = await producing;
          assert.equal(summary.refusals, 0, `refused ${summary.refusals} times`);
          assert.ok(summary.peakBacklog <= capacity);
          assert.deepEqual(
            received.sort((a, b) => a - b),
            Array.from({ length: total }, (_, i) => i),
          );
        },
      ),
      { numRuns },
    );
  });
});
