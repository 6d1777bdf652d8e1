import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { connect } from '@nats-io/transport-node';
import { fromIterable, untraced } from '../src/index.js';
import { seededRandom } from '../src/core/random.js';
import { LinkReceiverStats, fromLink, openLink, toLink } from '../src/nats.js';
import { startNatsCluster } from './support/nats-cluster.js';
import { workerPool } from './support/worker-pool.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe('sluice/nats on a three-node JetStream cluster (real nats-server processes with routes)', () => {
  it('links with replicas 3 survive a node SIGKILLed mid-run: nothing lost or duplicated downstream, the link resumes on the other two', async (t) => {
    // Randomized (a seed to replay): which node dies — the jobs stream's leader, the results stream's, or another.
    const seed = Number(process.env.SLUICE_CHAOS_SEED ?? Math.floor(Math.random() * 2 ** 31));
    const random = seededRandom(seed);
    const cluster = await startNatsCluster(3);
    const connection = await connect({ servers: cluster.urls.split(','), reconnectTimeWait: 100, maxReconnectAttempts: -1 });
    const workers = workerPool(() => [cluster.urls, 'r3-jobs', 'r3-results', '5', '--replicas=3'], 2);
    let subscription: { unsubscribe(): void } | undefined;
    try {
      const total = 400;
      const jobs = await openLink<number>(connection, { name: 'r3-jobs', capacity: 64, ackWait: 1_500, creditInterval: 50, replicas: 3 });
      const results = await openLink<number>(connection, { name: 'r3-results', capacity: 1_000, ackWait: 1_500, creditInterval: 50, replicas: 3 });
      await workers.ready;
      const leaderOf = async (stream: string) => (await jobs.jsm.streams.info(stream)).cluster?.leader;
      const stats = new LinkReceiverStats();
      const seen = new Map<number, number>();
      let killed: Promise<string> | undefined;
      const kill = async (): Promise<string> => {
        const role = ['jobs leader', 'results leader', 'any'][Math.floor(random() * 3)]!;
        const leader = role === 'jobs leader' ? await leaderOf(jobs.stream) : role === 'results leader' ? await leaderOf(results.stream) : undefined;
        const node = cluster.nodes.find((n) => n.name === leader) ?? cluster.nodes[Math.floor(random() * 3)]!;
        await node.kill('SIGKILL');
        return `${node.name} (${role === 'any' ? 'drawn at random' : `the ${role}`})`;
      };
      subscription = fromLink<number>(results, { stats, maxBatch: 16 })
        .pipe(untraced())
        .subscribe((value) => {
          seen.set(value / 2, (seen.get(value / 2) ?? 0) + 1);
          if (seen.size === 150 && killed === undefined) killed = kill();
        });
      const producing = toLink(fromIterable(Array.from({ length: total }, (_, i) => i)), jobs, { producerId: 'jobs' });
      const queued = async () => (await jobs.jsm.streams.info(jobs.stream)).state.messages + (await results.jsm.streams.info(results.stream)).state.messages;
      const deadline = Date.now() + 45_000;
      while (seen.size < total && Date.now() < deadline) await sleep(100);
      const victim = await killed;
      const replay = `seed ${seed}: killed ${victim} (SLUICE_CHAOS_SEED=${seed} replays it)`;
      t.diagnostic(replay);
      await producing;
      const drained = Date.now() + 10_000;
      while ((await queued()) > 0 && Date.now() < drained) await sleep(100);
      await sleep(3_000); // past ackWait twice: a late copy would arrive by now
      const missing = Array.from({ length: total }, (_, i) => i).filter((i) => !seen.has(i));
      const twice = [...seen].filter(([, times]) => times > 1).map(([job]) => job);
      assert.deepEqual(missing, [], `every job reached the consumer; ${replay}`);
      assert.deepEqual(twice, [], `no job reached it twice; ${replay}`);
      assert.equal(await queued(), 0, `both queues drained; ${replay}`);
      const survivors = cluster.nodes.filter((node) => node.running).map((node) => node.name);
      assert.equal(survivors.length, 2, replay);
      for (const stream of [jobs.stream, results.stream]) {
        const info = await jobs.jsm.streams.info(stream);
        assert.ok(survivors.includes(info.cluster!.leader!), `${stream} is led by a survivor (${info.cluster?.leader}); ${replay}`);
        assert.equal(info.config.num_replicas, 3);
      }
    } finally {
      subscription?.unsubscribe();
      workers.close();
      await connection.close();
      await cluster.close();
    }
  });
});
