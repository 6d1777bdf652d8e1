/** `Intake`: the shared door — priority order, bounded queue, shedding the lowest class, retry hints, and every request accounted. */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { VirtualTimeScheduler } from 'rxjs';
import { TestSink } from 'sluice/testing';
import { AdmissionRejectedError, InvalidOptionsError, type SluiceError } from '../../src/core/errors.js';
import { traced } from '../../src/core/trace.js';
import { Intake, PRIORITY_CLASSES, type PriorityClass } from '../../src/ai/pipelines/intake.js';

interface Offered {
  readonly id: number;
  refused?: SluiceError;
  withdraw?: () => void;
}

function offer(intake: Intake, lane: string, id: number, priority: PriorityClass = 'default', tenant = 't'): Offered {
  const offered: Offered = { id };
  offered.withdraw = intake.offer<number>(lane, { job: id, tenant, priority, trace: traced(id).trace, refuse: (err) => (offered.refused = err) });
  return offered;
}

describe('Intake', () => {
  it('hands requests to its pipeline highest class first, then in arrival order, only as demanded', () => {
    const intake = new Intake({ maxQueue: 10 });
    const sink = TestSink.subscribe(intake.lane<number>('a'));
    offer(intake, 'a', 1, 'low');
    offer(intake, 'a', 2, 'default');
    offer(intake, 'a', 3, 'high');
    offer(intake, 'a', 4, 'default');
    assert.equal(sink.received.length, 0);
    sink.request(3);
    assert.deepEqual(sink.received, [3, 2, 4]);
    assert.equal(intake.waiting, 1);
    sink.request(1);
    assert.equal(sink.received.at(-1), 1);
    assert.equal(intake.stats.delivered, 4);
  });

  it('when full, refuses the arriving request of the lowest class, or evicts the newest waiting one below it', () => {
    const intake = new Intake({ maxQueue: 2 });
    TestSink.subscribe(intake.lane<number>('a'));
    const a = offer(intake, 'a', 1);
    const b = offer(intake, 'a', 2);
    const c = offer(intake, 'a', 3, 'low');
    assert.ok(c.refused instanceof AdmissionRejectedError);
    assert.equal((c.refused as AdmissionRejectedError).reason, 'queue-full');
    const d = offer(intake, 'a', 4, 'high');
    assert.equal(d.refused, undefined);
    assert.equal((b.refused as AdmissionRejectedError).reason, 'evicted');
    assert.equal(a.refused, undefined);
    assert.equal(intake.stats.shed['buffer-full'], 1);
    assert.equal(intake.stats.shed.evicted, 1);
    assert.equal(intake.waiting, 2);
  });

  it('bounds the queue across lanes: a full lane sheds the lowest class of any lane', () => {
    const intake = new Intake({ maxQueue: 2 });
    TestSink.subscribe(intake.lane<number>('a'));
    TestSink.subscribe(intake.lane<number>('b'));
    const low = offer(intake, 'a', 1, 'low');
    offer(intake, 'b', 2);
    offer(intake, 'b', 3);
    assert.equal((low.refused as AdmissionRejectedError).reason, 'evicted');
  });

  it('a withdrawn request leaves the queue, counted cancelled, and frees its place', () => {
    const intake = new Intake({ maxQueue: 1 });
    TestSink.subscribe(intake.lane<number>('a'));
    const a = offer(intake, 'a', 1);
    a.withdraw!();
    a.withdraw!();
    assert.equal(intake.stats.shed.cancelled, 1);
    const b = offer(intake, 'a', 2);
    assert.equal(b.refused, undefined);
  });

  it('draining refuses every new request with SHUTDOWN; waiting ones still go through', () => {
    const intake = new Intake({ maxQueue: 4 });
    const sink = TestSink.subscribe(intake.lane<number>('a'));
    offer(intake, 'a', 1);
    intake.drain();
    const late = offer(intake, 'a', 2);
    assert.equal(late.refused?.code, 'SHUTDOWN');
    sink.request(5);
    assert.deepEqual(sink.received, [1]);
  });

  it('computes Retry-After from the drain rate: the queue ahead at the recent departures per second', () => {
    const scheduler = new VirtualTimeScheduler();
    const intake = new Intake({ maxQueue: 4, scheduler });
    const sink = TestSink.subscribe(intake.lane<number>('a'));
    assert.equal(intake.retryAfter(), 1000, 'nothing left yet: 1 s');
    for (let i = 0; i < 10; i++) {
      offer(intake, 'a', i);
      sink.request(1);
      scheduler.schedule(() => {}, 500);
      scheduler.flush();
    }
    // 10 departures 500 ms apart: 2 per second. 4 waiting + this one: 2.5 s.
    for (let i = 0; i < 4; i++) offer(intake, 'a', 100 + i);
    const refused = offer(intake, 'a', 200, 'low').refused as AdmissionRejectedError;
    assert.ok(Math.abs(refused.retryAfter - 2500) <= 300, `retryAfter ${refused.retryAfter}`);
  });

  it('with maxWait, holds no more than drains in that time at the rate it drained while busy; the lowest class goes first', () => {
    const scheduler = new VirtualTimeScheduler();
    const intake = new Intake({ maxQueue: 16, maxWait: 1000, scheduler });
    const sink = TestSink.subscribe(intake.lane<number>('a'));
    // Before any request has waited nothing is known of the drain: maxQueue bounds it.
    const early = Array.from({ length: 6 }, (_, i) => offer(intake, 'a', i));
    assert.ok(early.every((o) => o.refused === undefined));
    // The pipeline takes one every 500 ms while they wait: 2 per second.
    for (let i = 0; i < 6; i++) {
      scheduler.schedule(() => {}, 500);
      scheduler.flush();
      sink.request(1);
    }
    assert.equal(intake.waiting, 0);
    // 1 s of waiting drains 2: a third waiting request would start later than that.
    const high = offer(intake, 'a', 10, 'high');
    const rest = [offer(intake, 'a', 11), offer(intake, 'a', 12, 'low'), offer(intake, 'a', 13)];
    assert.equal(intake.waiting, 2);
    assert.equal(high.refused, undefined);
    assert.deepEqual(
      rest.map((o) => o.refused?.code),
      [undefined, 'ADMISSION_REJECTED', 'ADMISSION_REJECTED'],
      'the low one was evicted, the newest default refused',
    );
    assert.throws(
      () => new Intake({ maxQueue: 1, maxWait: 0 }),
      (err: unknown) => err instanceof InvalidOptionsError && err.issues[0]?.path === 'maxWait',
    );
  });

  it('with maxWait, a request that waited that long already closes the door; with no wait yet, the rate all left bounds it', () => {
    const scheduler = new VirtualTimeScheduler();
    const late = new Intake({ maxQueue: 16, maxWait: 1000, scheduler });
    TestSink.subscribe(late.lane<number>('a'));
    const first = offer(late, 'a', 1);
    scheduler.schedule(() => {}, 1000);
    scheduler.flush();
    // Nothing has left yet, so no rate is known: the first request's wait says the queue drains slower than maxWait.
    assert.equal(offer(late, 'a', 2).refused?.code, 'ADMISSION_REJECTED');
    assert.equal(first.refused, undefined);
    assert.equal(late.waiting, 1);

    const fresh = new Intake({ maxQueue: 16, maxWait: 1000, scheduler: new VirtualTimeScheduler() });
    const clock = (fresh as unknown as { scheduler: VirtualTimeScheduler }).scheduler;
    const sink = TestSink.subscribe(fresh.lane<number>('a'));
    // Three taken as they arrived, 500 ms apart: none waited, but they left at 2 per second.
    for (let i = 0; i < 3; i++) {
      sink.request(1);
      offer(fresh, 'a', i);
      clock.schedule(() => {}, 500);
      clock.flush();
    }
    const queued = [offer(fresh, 'a', 10), offer(fresh, 'a', 11), offer(fresh, 'a', 12)];
    assert.deepEqual(
      queued.map((o) => o.refused?.code),
      [undefined, undefined, 'ADMISSION_REJECTED'],
    );
  });

  it('gate: a lane’s requests stay at the door while its pipeline cannot start one, whatever it asks; wake hands them on', () => {
    const intake = new Intake({ maxQueue: 1 });
    const sink = TestSink.subscribe(intake.lane<number>('a'));
    let open = false;
    intake.gate('a', () => open);
    sink.request(5);
    offer(intake, 'a', 1);
    assert.equal(intake.waiting, 1, 'asked for, but held: the gate is shut');
    assert.deepEqual(sink.received, []);
    assert.ok((intake.turnAway('a', 't') ?? 0) >= 1000, 'a full door and a shut gate refuse before parsing');
    open = true;
    assert.equal(intake.waiting, 1, 'nothing moves until woken');
    intake.wake('a');
    assert.deepEqual(sink.received, [1]);
    assert.equal(intake.turnAway('a', 't'), undefined, 'the gate open and demand left: it may enter');
    assert.throws(() => intake.gate('nowhere', () => true), /no lane "nowhere"/);

    // With no room at the door at all, a request enters only when its pipeline can start it.
    const none = new Intake({ maxQueue: 0 });
    const started = TestSink.subscribe(none.lane<number>('a'));
    started.request(5);
    let free = false;
    none.gate('a', () => free);
    assert.equal(offer(none, 'a', 1).refused?.code, 'ADMISSION_REJECTED');
    free = true;
    assert.equal(offer(none, 'a', 2).refused, undefined);
    assert.deepEqual(started.received, [2]);
  });

  it('turns away without queueing exactly the requests offer would refuse, and counts them shed', () => {
    const intake = new Intake({ maxQueue: 1 });
    const sink = TestSink.subscribe(intake.lane<number>('a'));
    intake.lane<number>('cold'); // no pipeline yet: its first request starts one
    assert.equal(intake.turnAway('a', 't'), undefined, 'room at the door');
    offer(intake, 'a', 1);
    assert.equal(intake.turnAway('nowhere', 't'), undefined, 'no such lane: offer answers');
    assert.equal(intake.turnAway('cold', 't'), undefined, 'a lane whose pipeline has not started');
    sink.request(1);
    offer(intake, 'a', 2);
    assert.equal(intake.turnAway('a', 't', 'high'), undefined, 'a higher class would evict the waiting one');
    const before = { received: intake.stats.received, shed: intake.stats.shed['buffer-full'] };
    assert.ok((intake.turnAway('a', 't') ?? 0) >= 1000);
    assert.ok((intake.turnAway('a', 't', 'low') ?? 0) >= 1000);
    assert.equal(intake.stats.received - before.received, 2);
    assert.equal(intake.stats.shed['buffer-full'] - before.shed, 2);
    assert.equal(intake.waiting, 1);
    // What offer does with the same request: refused as it arrives.
    assert.equal(offer(intake, 'a', 3).refused?.code, 'ADMISSION_REJECTED');
    sink.request(1);
    assert.equal(intake.turnAway('a', 't'), undefined, 'room again once the pipeline took one');
  });

  it('fails at construction naming the bad field', () => {
    assert.throws(
      () => new Intake({ maxQueue: -1 }),
      (err: unknown) => err instanceof InvalidOptionsError && err.issues[0]?.path === 'maxQueue',
    );
  });

  it('property: every request ends exactly once (delivered, refused or withdrawn), the queue never passes its bound, and no waiting request outranks a delivered one', () => {
    const op = fc.oneof(
      fc.record({ kind: fc.constant('offer' as const), lane: fc.constantFrom('a', 'b'), priority: fc.constantFrom(...PRIORITY_CLASSES) }),
      fc.record({ kind: fc.constant('request' as const), lane: fc.constantFrom('a', 'b'), n: fc.integer({ min: 1, max: 3 }) }),
      fc.record({ kind: fc.constant('withdraw' as const), pick: fc.nat() }),
    );
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 5 }), fc.array(op, { maxLength: 80 }), (maxQueue, ops) => {
        const intake = new Intake({ maxQueue });
        const sinks = { a: TestSink.subscribe(intake.lane<number>('a')), b: TestSink.subscribe(intake.lane<number>('b')) };
        const offered: (Offered & { lane: 'a' | 'b'; priority: PriorityClass })[] = [];
        const outcomes = new Map<number, string[]>();
        const seen = { a: 0, b: 0 };
        const end = (id: number, how: string) => outcomes.set(id, [...(outcomes.get(id) ?? []), how]);
        for (const o of ops) {
          if (o.kind === 'offer') {
            const id = offered.length;
            const entry = Object.assign(offer(intake, o.lane, id, o.priority), { lane: o.lane as 'a' | 'b', priority: o.priority });
            offered.push(entry);
          } else if (o.kind === 'request') {
            sinks[o.lane as 'a' | 'b'].request(o.n);
          } else if (offered.length > 0) {
            const victim = offered[o.pick % offered.length]!;
            const waitingBefore = intake.waiting;
            victim.withdraw!();
            if (intake.waiting < waitingBefore) end(victim.id, 'withdrawn');
          }
          for (const lane of ['a', 'b'] as const) {
            const got = sinks[lane].received;
            for (; seen[lane] < got.length; seen[lane]++) {
              const id = got[seen[lane]]!;
              end(id, 'delivered');
              const rank = PRIORITY_CLASSES.indexOf(offered[id]!.priority);
              // Nothing still waiting in that lane is of a higher class than what was handed over.
              for (const other of offered)
                if (other.lane === lane && !outcomes.has(other.id) && other.refused === undefined) assert.ok(PRIORITY_CLASSES.indexOf(other.priority) <= rank);
            }
          }
          assert.ok(intake.waiting <= maxQueue);
        }
        for (const entry of offered) if (entry.refused !== undefined) end(entry.id, 'refused');
        const waiting = offered.filter((e) => !outcomes.has(e.id)).length;
        assert.equal(waiting, intake.waiting);
        for (const [id, hows] of outcomes) assert.equal(hows.length, 1, `request ${id} ended ${hows.join(', ')}`);
        const s = intake.stats;
        assert.equal(s.received, s.delivered + s.shed['buffer-full'] + s.shed.evicted + s.shed.cancelled + s.buffered);
      }),
      { numRuns: 300 },
    );
  });
});
