/**
 * Links through nats-server restarts, at a size the tests do not run: N jobs go through two stage
 * worker processes (marble-tests/support/stage-worker.ts: 5 ms of async work, concurrency 4) to a
 * consumer in this process, while the server is stopped K times (SIGTERM, then SIGKILL: a crash)
 * and restarted on the same port and store. Every job is counted downstream by its id.
 *
 *     node --conditions=sluice-source --import tsx bench/nats-chaos.ts
 *     # BENCH_CHAOS_N=2000 jobs, BENCH_CHAOS_RESTARTS=2 per run, BENCH_CHAOS_ROUNDS=3 runs per signal
 *
 * Per run it prints: jobs lost (never reached the consumer once the queues drained, or after 120 s),
 * jobs reached twice, copies the consumer dropped (`stats.duplicates`), stranded messages it put
 * back (`stats.requeued`), messages left in either queue, and the wall time.
 */
import { connect } from '@nats-io/transport-node';
import { fromIterable, untraced } from 'sluice';
import { LinkReceiverStats, fromLink, openLink, toLink } from 'sluice/nats';
import { startNatsServer } from '../marble-tests/support/nats-server.js';
import { workerPool } from '../marble-tests/support/worker-pool.js';
import { envInt } from './harness.js';

const total = envInt('BENCH_CHAOS_N', 2_000);
const restartsPerRun = envInt('BENCH_CHAOS_RESTARTS', 2);
const rounds = envInt('BENCH_CHAOS_ROUNDS', 3);
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

interface Run {
  readonly signal: 'SIGTERM' | 'SIGKILL';
  readonly lost: number;
  readonly twice: number;
  readonly dropped: number;
  readonly requeued: number;
  readonly left: number;
  readonly seconds: number;
}

async function run(signal: 'SIGTERM' | 'SIGKILL'): Promise<Run> {
  const server = await startNatsServer();
  const connection = await connect({ servers: server.url, reconnectTimeWait: 100, maxReconnectAttempts: -1 });
  const workers = workerPool(() => [server.url, 'chaos-jobs', 'chaos-results', '5'], 2);
  const started = performance.now();
  try {
    const jobs = await openLink<number>(connection, { name: 'chaos-jobs', capacity: 64, ackWait: 1_500, creditInterval: 50 });
    const results = await openLink<number>(connection, { name: 'chaos-results', capacity: 1_000, ackWait: 1_500, creditInterval: 50 });
    await workers.ready;
    const stats = new LinkReceiverStats();
    const seen = new Map<number, number>();
    // Restarts at evenly spaced counts of distinct jobs seen, one after the other.
    const marks = Array.from({ length: restartsPerRun }, (_, k) => Math.round(((k + 1) * total) / (restartsPerRun + 1)));
    let restarting: Promise<void> = Promise.resolve();
    const subscription = fromLink<number>(results, { stats, maxBatch: 16 })
      .pipe(untraced())
      .subscribe((value) => {
        const job = value / 2;
        seen.set(job, (seen.get(job) ?? 0) + 1);
        if (seen.get(job) === 1 && marks[0] === seen.size) {
          marks.shift();
          restarting = restarting.then(() => server.restart(signal));
        }
      });
    const producing = toLink(fromIterable(Array.from({ length: total }, (_, i) => i)), jobs, { producerId: 'jobs' });
    const queued = async () => (await jobs.jsm.streams.info(jobs.stream)).state.messages + (await results.jsm.streams.info(results.stream)).state.messages;
    const deadline = Date.now() + 120_000;
    while ((seen.size < total || (await queued()) > 0) && Date.now() < deadline) await sleep(200);
    await restarting;
    await producing;
    await sleep(3_000); // past ackWait twice: a late copy would arrive by now
    subscription.unsubscribe();
    return {
      signal,
      lost: total - seen.size,
      twice: [...seen.values()].filter((times) => times > 1).length,
      dropped: stats.duplicates,
      requeued: stats.requeued,
      left: await queued(),
      seconds: (performance.now() - started) / 1000,
    };
  } finally {
    workers.close();
    await connection.close();
    await server.close();
  }
}

console.log(`${total} jobs, 2 worker processes, ${restartsPerRun} restarts of nats-server per run`);
console.log('signal   lost  twice  copies dropped  requeued  left in queues  wall s');
for (const signal of ['SIGTERM', 'SIGKILL'] as const) {
  for (let round = 0; round < rounds; round++) {
    const r = await run(signal);
    console.log(
      `${r.signal.padEnd(7)}  ${String(r.lost).padStart(4)}  ${String(r.twice).padStart(5)}  ${String(r.dropped).padStart(14)}  ${String(r.requeued).padStart(8)}  ${String(r.left).padStart(14)}  ${r.seconds.toFixed(1).padStart(6)}`,
    );
  }
}
