import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { connect } from '@nats-io/transport-node';
import type { NatsConnection } from '@nats-io/nats-core';
import { fromIterable } from '../src/index.js';
import { seededRandom } from '../src/core/random.js';
import { type Link, openLink, toLink } from '../src/nats.js';
import { startNatsServer, type NatsServer } from './support/nats-server.js';
import { type ChildScript, startScript } from './support/child-script.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Every message a stream holds, in order: its body and headers (the stream is small). */
async function storedIn(link: Link<unknown>, stream = link.stream): Promise<{ body: string; reason: string | undefined }[]> {
  const info = await link.jsm.streams.info(stream);
  const stored: { body: string; reason: string | undefined }[] = [];
  for (let seq = info.state.first_seq; seq <= info.state.last_seq && info.state.messages > 0; seq++) {
    const message = await link.jsm.streams.getMessage(stream, { seq }).catch(() => null);
    if (message !== null) stored.push({ body: new TextDecoder().decode(message.data), reason: message.header?.get('sluice-reason') || undefined });
  }
  return stored;
}

/** Stage worker processes (support/stage-worker.ts) kept at `count`: one that dies is replaced, `deaths` counts them. */
function workerPool(args: () => string[], count: number) {
  const workers = new Set<ChildScript>();
  let deaths = 0;
  let closed = false;
  const start = async (): Promise<void> => {
    const worker = await startScript('./stage-worker.ts', args());
    workers.add(worker);
    worker.child.once('exit', () => {
      workers.delete(worker);
      if (closed) return;
      deaths++;
      void start();
    });
  };
  return {
    ready: Promise.all(Array.from({ length: count }, start)),
    get deaths() {
      return deaths;
    },
    close() {
      closed = true;
      for (const worker of workers) worker.child.kill('SIGKILL');
    },
  };
}

describe('sluice/nats under crashes: worker processes and nats-server killed by the test', () => {
  let server: NatsServer;
  let nc: NatsConnection;
  before(async () => {
    server = await startNatsServer();
    nc = await connect({ servers: server.url });
  });
  after(async () => {
    await nc?.close();
    await server?.close();
  });

  it('a message that kills its worker every time: it alone is dead-lettered, its reason says its worker stopped; every other job done once', async () => {
    // Randomized (a seed to replay): where the poison sits, and how much each worker holds beside it.
    const seed = Number(process.env.SLUICE_CHAOS_SEED ?? Math.floor(Math.random() * 2 ** 31));
    const random = seededRandom(seed);
    const total = 200;
    const poison = Math.floor(random() * total);
    const maxBatch = [1, 8, 16][Math.floor(random() * 3)]!;
    const concurrency = [1, 4, 8][Math.floor(random() * 3)]!;
    const maxDeliver = 3;
    const replay = `seed ${seed}: poison ${poison}, maxBatch ${maxBatch}, concurrency ${concurrency} (SLUICE_CHAOS_SEED=${seed} replays it)`;
    const jobs = await openLink(nc, { name: 'poison-jobs', capacity: 64, ackWait: 1_500, creditInterval: 50, maxDeliver });
    const results = await openLink(nc, { name: 'poison-results', capacity: 1_000, creditInterval: 50 });
    const args = [server.url, jobs.config.name, results.config.name, '5', String(poison), String(maxDeliver), String(maxBatch), String(concurrency)];
    const pool = workerPool(() => args, 2);
    try {
      await pool.ready;
      await toLink(fromIterable(Array.from({ length: total }, (_, i) => i)), jobs, { producerId: 'jobs' });
      const deadline = Date.now() + 40_000;
      const settled = async () =>
        (await results.jsm.streams.info(results.stream)).state.messages + (await jobs.jsm.streams.info(jobs.deadStream)).state.messages;
      while ((await settled()) < total && Date.now() < deadline) await sleep(100);
      await sleep(2_000); // past ackWait: anything still held by a dead worker has come back by now
      const dead = await storedIn(jobs, jobs.deadStream);
      assert.deepEqual(
        dead.map((letter) => letter.body),
        [String(poison)],
        `only the poison was dead-lettered; ${replay}`,
      );
      assert.match(dead[0]!.reason!, /worker stopped/, replay);
      assert.doesNotMatch(dead[0]!.reason!, /plain operator/, replay);
      const values = (await storedIn(results)).map((result) => Number(result.body) / 2).sort((a, b) => a - b);
      assert.deepEqual(
        values,
        Array.from({ length: total }, (_, i) => i).filter((i) => i !== poison),
        `every other job done once; ${replay}`,
      );
      assert.equal((await jobs.jsm.streams.info(jobs.stream)).state.messages, 0, `nothing left in the work queue; ${replay}`);
      assert.ok(pool.deaths <= maxDeliver, `the poison killed ${pool.deaths} workers; maxDeliver is ${maxDeliver}; ${replay}`);
    } finally {
      pool.close();
    }
  });
});
