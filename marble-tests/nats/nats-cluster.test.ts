/**
 * A link with `replicas: 3` on a three-node JetStream cluster (real nats-server processes on
 * loopback, started here): a node is SIGKILLed in the middle of a run of two worker processes.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { connect } from '@nats-io/transport-node';
import type { NatsConnection } from '@nats-io/nats-core';
import { lastValueFrom, take, toArray } from 'rxjs';
import { fromIterable, untraced } from '../../src/index.js';
import { LinkReceiverStats, fromLink, openLink, toLink } from '../../src/nats.js';
import { seededRandom } from '../../src/core/random.js';
import { workerPool } from '../support/worker-pool.js';
import { startNatsCluster, type NatsCluster } from '../support/nats-cluster.js';
import { startScript } from '../support/child-script.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe('sluice/nats on a three-node JetStream cluster', () => {
  let cluster: NatsCluster;
  let nc: NatsConnection;

  before(async () => {
    cluster = await startNatsCluster();
    nc = await connect({ servers: [...cluster.urls], reconnectTimeWait: 100, maxReconnectAttempts: -1 });
  });

  after(async () => {
    await nc?.close();
    await cluster?.close();
  });

  it('replicas: 3 — the leader of the jobs stream SIGKILLed under load: nothing lost, nothing stored twice downstream, the link goes on on the other two', {
    timeout: 150_000,
  }, async () => {
    const total = 300;
    // The cluster elects its JetStream leader a moment after it starts: opening the link is what waits for it.
    let jobs: Awaited<ReturnType<typeof openLink>> | undefined;
    for (let tries = 0; jobs === undefined; tries++) {
      try {
        jobs = await openLink(nc, { name: 'jobs', capacity: 64, ackWait: 1_500, creditInterval: 50, replicas: 3 });
      } catch (error) {
        if (tries > 100) throw error;
        await sleep(100);
      }
    }
    const results = await openLink(nc, { name: 'results', capacity: 1_000, ackWait: 1_500, creditInterval: 50, replicas: 3 });
    const urls = cluster.urls.join(',');
    const a = await startScript('./stage-worker.ts', [urls, 'jobs', 'results', '5', '--replicas=3']);
    const b = await startScript('./stage-worker.ts', [urls, 'jobs', 'results', '5', '--replicas=3']);
    try {
      const producing = toLink(fromIterable(Array.from({ length: total }, (_, i) => i)), jobs, { producerId: 'jobs' });
      const stored = async (): Promise<number> => {
        for (;;) {
          try {
            return (await results.jsm.streams.info(results.stream)).state.messages;
          } catch {
            await sleep(100); // no leader for a moment after the kill
          }
        }
      };
      let deadline = Date.now() + 30_000;
      while ((await stored()) < 80 && Date.now() < deadline) await sleep(10);
      const leader = (await jobs.jsm.streams.info(jobs.stream)).cluster?.leader;
      const victim = cluster.names.indexOf(leader ?? 'n0');
      assert.ok(victim >= 0, `the jobs stream has a leader (${leader})`);
      await cluster.kill(victim);

      const summary = await producing;
      assert.equal(summary.published, total, 'the producer went on');
      deadline = Date.now() + 60_000;
      while ((await stored()) < total && Date.now() < deadline) await sleep(50);
      await sleep(2_500); // past ackWait: whatever a worker held in the election has been redone by now
      assert.equal(await stored(), total, 'each result stored once');
      // An acknowledgement sent to the killed leader is lost: that job is delivered again after ackWait and acknowledged as a copy.
      const left = async (): Promise<number> => (await jobs.jsm.streams.info(jobs.stream)).state.messages;
      deadline = Date.now() + 20_000;
      while ((await left()) > 0 && Date.now() < deadline) await sleep(100);
      const stuck = async (): Promise<string> => {
        const [stream, consumer] = await Promise.all([jobs.jsm.streams.info(jobs.stream), jobs.jsm.consumers.info(jobs.stream, jobs.durable)]);
        return `stream seqs ${stream.state.first_seq}..${stream.state.last_seq} (${stream.state.messages} stored); consumer delivered ${consumer.delivered.stream_seq}, ack floor ${consumer.ack_floor.stream_seq}, ${consumer.num_ack_pending} unacknowledged, ${consumer.num_pending} pending`;
      };
      if ((await left()) !== 0) assert.fail(`every job acknowledged: ${await stuck()}`);
      const values = await lastValueFrom(fromLink<number>(results).pipe(untraced(), take(total), toArray()));
      assert.deepEqual(
        values.sort((x, y) => x - y),
        Array.from({ length: total }, (_, i) => i * 2),
      );
      const newLeader = (await jobs.jsm.streams.info(jobs.stream)).cluster?.leader;
      assert.ok(newLeader !== undefined && newLeader !== leader, `a new leader took over (${newLeader})`);
    } finally {
      a.child.kill('SIGKILL');
      b.child.kill('SIGKILL');
    }
  });

  it('replicas: 3 — any node SIGKILLed under load, counted downstream by job id: each job reaches the consumer once, both queues drain, survivors lead', {
    timeout: 150_000,
  }, async (t) => {
    // Randomized (a seed to replay): which node dies — the jobs stream's leader, the results stream's, or any.
    const seed = Number(process.env.SLUICE_CHAOS_SEED ?? Math.floor(Math.random() * 2 ** 31));
    const random = seededRandom(seed);
    const own = await startNatsCluster();
    const connection = await connect({ servers: [...own.urls], reconnectTimeWait: 100, maxReconnectAttempts: -1 });
    let workers: ReturnType<typeof workerPool> | undefined;
    let subscription: { unsubscribe(): void } | undefined;
    try {
      const total = 400;
      const jobs = await openWhenElected(() =>
        openLink<number>(connection, { name: 'any-jobs', capacity: 64, ackWait: 1_500, creditInterval: 50, replicas: 3 }),
      );
      const results = await openLink<number>(connection, { name: 'any-results', capacity: 1_000, ackWait: 1_500, creditInterval: 50, replicas: 3 });
      // Started once the links are open: a worker opening them before the cluster elected its leader would exit.
      workers = workerPool(() => [own.urls.join(','), 'any-jobs', 'any-results', '5', '--replicas=3'], 2);
      await workers.ready;
      const leaderOf = async (stream: string) => (await jobs.jsm.streams.info(stream)).cluster?.leader;
      const stats = new LinkReceiverStats();
      const seen = new Map<number, number>();
      let killed: Promise<string> | undefined;
      const kill = async (): Promise<string> => {
        const role = ['jobs leader', 'results leader', 'any'][Math.floor(random() * 3)]!;
        const leader = role === 'jobs leader' ? await leaderOf(jobs.stream) : role === 'results leader' ? await leaderOf(results.stream) : undefined;
        const index = leader === undefined ? Math.floor(random() * own.names.length) : own.names.indexOf(leader);
        await own.kill(index);
        return `${own.names[index]} (${role === 'any' ? 'drawn at random' : `the ${role}`})`;
      };
      subscription = fromLink<number>(results, { stats, maxBatch: 16 })
        .pipe(untraced())
        .subscribe((value) => {
          seen.set(value / 2, (seen.get(value / 2) ?? 0) + 1);
          if (seen.size === 150 && killed === undefined) killed = kill();
        });
      const producing = toLink(fromIterable(Array.from({ length: total }, (_, i) => i)), jobs, { producerId: 'jobs' });
      const queued = async () => (await jobs.jsm.streams.info(jobs.stream)).state.messages + (await results.jsm.streams.info(results.stream)).state.messages;
      const deadline = Date.now() + 60_000;
      while (seen.size < total && Date.now() < deadline) await sleep(100);
      const replay = `seed ${seed}: killed ${await killed} (SLUICE_CHAOS_SEED=${seed} replays it)`;
      t.diagnostic(replay);
      await producing;
      const drained = Date.now() + 10_000;
      while ((await queued().catch(() => 1)) > 0 && Date.now() < drained) await sleep(100);
      await sleep(3_000); // past ackWait twice: a late copy would arrive by now
      const missing = Array.from({ length: total }, (_, i) => i).filter((i) => !seen.has(i));
      const twice = [...seen].filter(([, times]) => times > 1).map(([job]) => job);
      // Where the missing jobs are, for a failure's message: still queued, held unacknowledged, or gone.
      const where = async (stream: string, durable: string) => {
        const info = await jobs.jsm.consumers.info(stream, durable).catch((error: unknown) => String(error));
        const state = await jobs.jsm.streams
          .info(stream)
          .then((i) => i.state.messages)
          .catch((error: unknown) => String(error));
        return typeof info === 'string'
          ? `${stream}: ${state} stored, consumer: ${info}`
          : `${stream}: ${state} stored, ${info.num_pending} pending, ${info.num_ack_pending} unacknowledged, ${info.num_redelivered} redelivered`;
      };
      const state =
        missing.length === 0
          ? ''
          : `; ${await where(jobs.stream, jobs.durable)}; ${await where(results.stream, results.durable)}; dead letters ${await jobs.jsm.streams
              .info(jobs.deadStream)
              .then((i) => i.state.messages)
              .catch(String)}; producer ${JSON.stringify(await producing)}`;
      assert.deepEqual(missing, [], `every job reached the consumer; ${replay}${state}`);
      assert.deepEqual(twice, [], `no job reached it twice; ${replay}`);
      assert.equal(await queued(), 0, `both queues drained; ${replay}`);
      const dead = own.names.find((name) => replay.includes(`killed ${name} `))!;
      for (const stream of [jobs.stream, results.stream]) {
        const info = await jobs.jsm.streams.info(stream);
        assert.ok(info.cluster?.leader !== undefined && info.cluster.leader !== dead, `${stream} is led by a survivor (${info.cluster?.leader}); ${replay}`);
      }
    } finally {
      subscription?.unsubscribe();
      workers?.close();
      await connection.close();
      await own.close();
    }
  });
});

/** The cluster elects its JetStream leader a moment after it starts: opening a link is what waits for it. */
async function openWhenElected<T>(open: () => Promise<T>): Promise<T> {
  for (let tries = 0; ; tries++) {
    try {
      return await open();
    } catch (error) {
      if (tries > 100) throw error;
      await sleep(100);
    }
  }
}
