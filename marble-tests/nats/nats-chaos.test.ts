import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { connect } from '@nats-io/transport-node';
import { AckPolicy, DeliverPolicy } from '@nats-io/jetstream';
import { lastValueFrom, take, toArray } from 'rxjs';
import { fromIterable, untraced } from '../../src/index.js';
import { seededRandom } from '../../src/core/random.js';
import { type Link, LinkReceiverStats, fromLink, openLink, toLink } from '../../src/nats.js';
import { StrandedMessages } from '../../src/nats/reclaim.js';
import { natsServerFixture, startNatsServer } from '../support/nats-server.js';
import { workerPool } from '../support/worker-pool.js';

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

describe('sluice/nats under crashes: worker processes and nats-server killed by the test', () => {
  const fixture = natsServerFixture();

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
    const jobs = await openLink(fixture.nc, { name: 'poison-jobs', capacity: 64, ackWait: 1_500, creditInterval: 50, maxDeliver });
    const results = await openLink(fixture.nc, { name: 'poison-results', capacity: 1_000, ackWait: 1_500, creditInterval: 50 });
    const args = [
      fixture.server.url,
      jobs.config.name,
      results.config.name,
      '5',
      `--poison=${poison}`,
      `--max-deliver=${maxDeliver}`,
      `--max-batch=${maxBatch}`,
      `--concurrency=${concurrency}`,
    ];
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

  for (const signal of ['SIGTERM', 'SIGKILL'] as const) {
    it(`nats-server restarted twice (${signal}) under two worker processes: every job's result reaches the consumer once, and the queues drain`, async () => {
      const own = await startNatsServer();
      const connection = await connect({ servers: own.url, reconnectTimeWait: 100, maxReconnectAttempts: -1 });
      const workers = workerPool(() => [own.url, 'restart-jobs', 'restart-results', '5'], 2);
      let subscription: { unsubscribe(): void } | undefined;
      try {
        const total = 400;
        const jobs = await openLink<number>(connection, { name: 'restart-jobs', capacity: 64, ackWait: 1_500, creditInterval: 50 });
        const results = await openLink<number>(connection, { name: 'restart-results', capacity: 1_000, ackWait: 1_500, creditInterval: 50 });
        await workers.ready;
        const stats = new LinkReceiverStats();
        const seen = new Map<number, number>();
        const restarts: Promise<void>[] = [];
        subscription = fromLink<number>(results, { stats, maxBatch: 16 })
          .pipe(untraced())
          .subscribe((value) => {
            seen.set(value / 2, (seen.get(value / 2) ?? 0) + 1);
            if (seen.size === 120 && restarts.length === 0) restarts.push(own.restart(signal));
            if (seen.size === 260 && restarts.length === 1) restarts.push(restarts[0]!.then(() => own.restart(signal)));
          });
        const producing = toLink(fromIterable(Array.from({ length: total }, (_, i) => i)), jobs, { producerId: 'jobs' });
        const deadline = Date.now() + 50_000;
        while (seen.size < total && Date.now() < deadline) await sleep(100);
        await Promise.all(restarts);
        await producing;
        // Stranded messages are put back after two looks (every ackWait / 2): the queues drain within a few ackWaits.
        const queued = async () => (await jobs.jsm.streams.info(jobs.stream)).state.messages + (await results.jsm.streams.info(results.stream)).state.messages;
        const drained = Date.now() + 10_000;
        while ((await queued()) > 0 && Date.now() < drained) await sleep(100);
        await sleep(3_000); // past ackWait twice: whatever a restart sent again has come by now
        const missing = Array.from({ length: total }, (_, i) => i).filter((i) => !seen.has(i));
        const twice = [...seen].filter(([, times]) => times > 1).map(([job]) => job);
        assert.deepEqual(missing, [], 'every job reached the consumer');
        assert.deepEqual(twice, [], 'no job reached it twice');
        assert.equal(restarts.length, 2);
        assert.equal((await jobs.jsm.streams.info(jobs.stream)).state.messages, 0, 'the jobs queue drained');
        assert.equal((await results.jsm.streams.info(results.stream)).state.messages, 0, 'the results queue drained');
      } finally {
        subscription?.unsubscribe();
        workers.close();
        await connection.close();
        await own.close();
      }
    });
  }

  it('ids settled before a server restart are remembered by the link: a copy the restarted server stores again is dropped by a new receiver', async () => {
    const own = await startNatsServer();
    const connection = await connect({ servers: own.url, reconnectTimeWait: 100, maxReconnectAttempts: -1 });
    try {
      const link = await openLink<number>(connection, { name: 'remembered', capacity: 16, creditInterval: 50 });
      await toLink(fromIterable([1, 2, 3]), link, { producerId: 'p' });
      assert.deepEqual(await lastValueFrom(fromLink<number>(link).pipe(untraced(), take(3), toArray())), [1, 2, 3]);
      await sleep(100); // the acknowledgements and the record reach the server
      await own.restart();
      // The same ids again (a producer redoing its run): the restarted server only knows ids it still stores.
      const again = await toLink(fromIterable([1, 2, 3]), link, { producerId: 'p' });
      assert.equal(again.duplicates, 0, 'the server stored the copies');
      const stats = new LinkReceiverStats();
      const seen: number[] = [];
      const subscription = fromLink<number>(link, { stats })
        .pipe(untraced())
        .subscribe((value) => seen.push(value));
      const deadline = Date.now() + 5_000;
      while (stats.duplicates < 3 && Date.now() < deadline) await sleep(20);
      subscription.unsubscribe();
      assert.deepEqual(seen, [], 'no copy handed on');
      assert.equal(stats.duplicates, 3);
      // An ack is sent, not awaited: the work queue deletes the copies a moment later.
      const stored = async () => (await link.jsm.streams.info(link.stream)).state.messages;
      const acked = Date.now() + 5_000;
      while ((await stored()) > 0 && Date.now() < acked) await sleep(20);
      assert.equal(await stored(), 0, 'the copies were acknowledged');
    } finally {
      await connection.close();
      await own.close();
    }
  });

  it('messages the consumer will never deliver though the stream keeps them are put back under their ids, by one receiver, after two looks', async () => {
    // Such a state follows an unclean stop (the consumer's state ahead of the stream); a consumer started
    // past a stream's first messages has it too. A work queue refuses such a consumer: a limits stream stands in.
    const link = await openLink<number>(fixture.nc, { name: 'stranded', capacity: 16, creditInterval: 50 });
    const stream = 'STRANDED_STAND_IN';
    await link.jsm.streams.add({ name: stream, subjects: ['stranded.stand-in'] });
    for (let i = 1; i <= 5; i++) await link.js.publish('stranded.stand-in', String(i), { msgID: `p-${i}` });
    await link.jsm.consumers.add(stream, {
      durable_name: 'stand-in',
      ack_policy: AckPolicy.Explicit,
      deliver_policy: DeliverPolicy.StartSequence,
      opt_start_seq: 4,
    });
    const standIn = { ...link, stream, subject: 'stranded.stand-in', durable: 'stand-in' };
    const one = new StrandedMessages(standIn);
    const other = new StrandedMessages(standIn);
    assert.deepEqual(await Promise.all([one.look(), other.look()]), [0, 0], 'a first look only notes them');
    const requeued = await Promise.all([one.look(), other.look()]);
    assert.equal(requeued[0]! + requeued[1]!, 3, `put back once each (${requeued})`);
    const info = await link.jsm.streams.info(stream);
    assert.equal(info.state.first_seq, 4, 'the stranded ones left their places');
    const back: string[] = [];
    for (let seq = 6; seq <= info.state.last_seq; seq++) {
      const message = await link.jsm.streams.getMessage(stream, { seq });
      back.push(`${message!.string()}:${message!.header.get('sluice-id')}`);
    }
    assert.deepEqual(back.sort(), ['1:p-1', '2:p-2', '3:p-3'], 'each at the end of the queue, under its id');
  });
});
