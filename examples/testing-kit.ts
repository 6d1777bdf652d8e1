/**
 * The demand test kit: drive a stage step by step and see exactly what it asks upstream.
 * Run: node --conditions=sluice-source --import tsx examples/testing-kit.ts
 */
import { stage, StageStats, fromIterable } from 'sluice';
import { TestSource, TestSink, verify, expectAccounted } from 'sluice/testing';

const source = new TestSource<number>();
const stats = new StageStats();
const sink = TestSink.subscribe(source.pipe(stage((x: number) => x * 10, { capacity: 2, stats })));

source.expectDemand(3); // capacity 2 + concurrency 1, before the sink asks for anything
source.emit(1, 2, 3);
source.expectDemand(0); // full: a 4th emit would throw "emitted without demand (§1.1)"
sink.request(1);
sink.expectNext(10);
source.expectDemand(1); // exactly one more unit of demand reached the source
sink.request(2);
sink.expectNext(20, 30);
source.complete();
sink.expectComplete();
expectAccounted(stats);
console.log('TestSource/TestSink: demand checked step by step; accounting', stats.received, '=', stats.delivered, '+', stats.shedTotal, '+', stats.failed);

await verify(fromIterable(['a', 'b', 'c']).pipe(stage(async (s: string) => s.toUpperCase(), { capacity: 1 })))
  .request(2)
  .expectNext('A', 'B')
  .thenRequest(1)
  .expectNext('C')
  .expectComplete()
  .run();
console.log('verify: request(2) → A, B; request(1) → C; complete');
