/** `probeSegment`: which chains get probes, and what the probes report to the link. */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { Observable, delay, filter, map, type MonoTypeOperatorFunction } from 'rxjs';
import { TestScheduler } from 'rxjs/testing';
import { fromIterable } from '../../src/flow/sources.js';
import { withLink, type DemandLink } from '../../src/flow/demand.js';
import { probeSegment } from '../../src/flow/segment-probe.js';

/** A link that always wants more and records what the probes tell it. */
class RecordingLink implements DemandLink {
  drops = 0;
  moves = 0;
  wants = () => true;
  demand = () => Number.POSITIVE_INFINITY;
  beforeEmit = () => 0;
  afterEmit() {}
  attach() {}
  detach() {}
  dropped() {
    this.drops++;
  }
  moved() {
    this.moves++;
  }
}

/** An operator written as a plain `new Observable`, not through `lift`. */
const handWritten: MonoTypeOperatorFunction<number> = (source) => new Observable<number>((subscriber) => source.subscribe(subscriber));

function runProbed(build: (scheduler: TestScheduler) => Observable<number>, link: RecordingLink): number[] {
  const out: number[] = [];
  const scheduler = new TestScheduler((a, b) => assert.deepEqual(a, b));
  scheduler.run(({ flush }) => {
    const source = build(scheduler);
    withLink(link, () => probeSegment(source, link).subscribe((x) => out.push(x)));
    flush();
  });
  return out;
}

describe('probeSegment', () => {
  it('probes two operators down to a Flow; leaves a Flow, a single operator and a chain through a hand-written Observable as they are', () => {
    const link = new RecordingLink();
    const flow = fromIterable([1, 2, 3]);
    assert.equal(probeSegment(flow, link), flow);
    const one = flow.pipe(map((x) => x));
    assert.equal(probeSegment(one, link), one);
    const through = flow.pipe(
      map((x) => x),
      handWritten,
      filter(() => true),
    );
    assert.equal(probeSegment(through, link), through);
    const two = flow.pipe(
      map((x) => x),
      filter(() => true),
    );
    assert.notEqual(probeSegment(two, link), two, 'two operators down to a Flow are probed');
  });

  it('after a deferral, reports each element a filter shown synchronous drops, and none before its first pass', () => {
    const link = new RecordingLink();
    const values = Array.from({ length: 20 }, (_, i) => i);
    // The filter's first pass is 5: 0–4 are dropped before anything shows the filter answers.
    const out = runProbed(
      () =>
        fromIterable(values).pipe(
          delay(1),
          filter((x) => x >= 5 && x % 5 === 0),
        ),
      link,
    );
    assert.deepEqual(out, [5, 10, 15]);
    assert.equal(link.drops, 20 - 5 - 3, 'the drops after the first pass');
    assert.ok(link.moves >= 20, `${link.moves} moves`);
  });

  it('never reports an element a deferring operator holds as dropped', () => {
    const link = new RecordingLink();
    const out = runProbed(
      () =>
        fromIterable([1, 2, 3, 4]).pipe(
          delay(1),
          delay(3),
          map((x) => x * 2),
        ),
      link,
    );
    assert.deepEqual(out, [2, 4, 6, 8]);
    assert.equal(link.drops, 0);
  });

  it('the probed chain delivers what the chain alone does', () => {
    const chain = (source: Observable<number>) =>
      source.pipe(
        delay(2),
        filter((x) => x % 3 !== 0),
        map((x) => x + 1),
        delay(1),
      );
    const values = Array.from({ length: 30 }, (_, i) => i);
    const plain: number[] = [];
    const scheduler = new TestScheduler((a, b) => assert.deepEqual(a, b));
    scheduler.run(({ flush }) => {
      chain(fromIterable(values)).subscribe((x) => plain.push(x));
      flush();
    });
    assert.deepEqual(
      runProbed(() => chain(fromIterable(values)), new RecordingLink()),
      plain,
    );
  });
});
