/**
 * Session affinity and load balancing: chat turns are partitioned by session over 3
 * lanes (the same session always reaches the same lane, in order), then balanced over
 * 2 workers that take whatever they have room for.
 * Run: node --conditions=sluice-source --import tsx examples/fan-out.ts
 */
import { lastValueFrom, map, toArray } from 'rxjs';
import { balance, fromIterable, laneOf, partition, stage } from 'sluice';

interface Turn {
  session: string;
  n: number;
}

const turns: Turn[] = Array.from({ length: 30 }, (_, i) => ({ session: `s${i % 5}`, n: i }));

const byLane = await lastValueFrom(
  fromIterable(turns).pipe(
    partition({
      lanes: 3,
      key: (t) => t.session,
      lane: (flow, index) => flow.pipe(stage((t: Turn) => ({ ...t, lane: index }), { name: `lane-${index}` })),
    }),
    map((t) => t.value),
    toArray(),
  ),
);
for (const session of ['s0', 's1', 's2', 's3', 's4']) {
  const lanes = new Set(byLane.filter((t) => t.session === session).map((t) => t.lane));
  console.log(`${session} → lane ${[...lanes].join(',')} (laneOf says ${laneOf(session, 3)})`);
}

const perWorker = [0, 0];
await lastValueFrom(
  fromIterable(turns).pipe(
    balance({
      workers: 2,
      worker: (flow, index) =>
        flow.pipe(
          stage(
            async (t: Turn) => {
              perWorker[index]!++;
              // worker 1 is three times slower
              for (let i = 0; i < (index === 1 ? 3 : 1); i++) await new Promise((resolve) => setImmediate(resolve));
              return t;
            },
            { name: `worker-${index}`, capacity: 1 },
          ),
        ),
    }),
    toArray(),
  ),
);
console.log(`balance: the fast worker took ${perWorker[0]} turns, the slow one ${perWorker[1]}`);
