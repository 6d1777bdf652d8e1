/**
 * A link with `replicas: 3` on a three-node JetStream cluster (real nats-server processes on
 * loopback, started here): a node is SIGKILLed in the middle of a run of two worker processes.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { connect } from '@nats-io/transport-node';
import type { NatsConnection } from '@nats-io/nats-core';
import { lastValueFrom, take, toArray } from 'rxjs';
import { fromIterable, untraced } from '../src/index.js';
import { fromLink, openLink, toLink } from '../src/nats.js';
import { startNatsCluster, type NatsCluster } from './support/nats-cluster.js';
import { startScript } from './support/child-script.js';

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
    const results = await openLink(nc, { name: 'results', capacity: 1_000, creditInterval: 50, replicas: 3 });
    const urls = cluster.urls.join(',');
    const a = await startScript('./stage-worker.ts', [urls, 'jobs', 'results', '5', '3']);
    const b = await startScript('./stage-worker.ts', [urls, 'jobs', 'results', '5', '3']);
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
      const left = (await jobs.jsm.streams.info(jobs.stream)).state.messages;
      assert.equal(left, 0, 'every job acknowledged');
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
});
