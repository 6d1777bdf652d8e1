/**
 * The inspector's model: a running pipeline seen as a graph of its stages (registered by
 * themselves while they run), each sampled for its queue, work, demand and state; the slow
 * stage found as the bottleneck; nothing left behind when it stops.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { VirtualAction, VirtualTimeScheduler, lastValueFrom, map, toArray } from 'rxjs';
import { fromIterable } from '../../src/flow/sources.js';
import { subscribeWithDemand } from '../../src/flow/demand.js';
import { eventually } from '../../src/testing/index.js';
import { stage } from '../../operators/stage.js';
import { batch, unbatch } from '../../operators/batch.js';
import { balance } from '../../operators/balance.js';
import { StageStats } from '../../src/flow/stats.js';
import { activeIntrospector } from '../../src/flow/introspection.js';
import { PipelineGraph, bottleneckOf, stateOf } from '../../src/serve/inspect/pipeline-graph.js';
import { RequestRegistry } from '../../src/serve/inspect/requests.js';
import { buildSnapshot } from '../../src/serve/inspect/snapshot.js';
import type { Traced } from '../../src/core/trace.js';
import { invalidPaths } from '../support/invalid-options.js';
import { decode, generateRequest, type Token } from '../../src/ai/inference/worker.js';

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

describe('PipelineGraph and RequestRegistry options', () => {
  it('bad options fail at construction, naming each field', () => {
    assert.deepEqual(
      invalidPaths(() => new PipelineGraph({ interval: 0, maxNodes: 2.5, retain: -1, scheduler: {}, windw: 4 } as never)),
      ['interval', 'maxNodes', 'retain', 'scheduler', 'windw'],
    );
    assert.deepEqual(
      invalidPaths(() => new RequestRegistry({ content: 'yes', contents: true } as never)),
      ['content', 'contents'],
    );
  });
});

describe('PipelineGraph', () => {
  it('draws a pipeline as its stages, each feeding the next, while it runs; accounts for every element', async () => {
    // Frames up to 40 s: the sampler's timer repeats forever, a flush stops there.
    const clock = new VirtualTimeScheduler(VirtualAction, 40_000);
    const graph = new PipelineGraph({ scheduler: clock }).start();
    try {
      let release: () => void = () => {};
      const gate = new Promise<void>((resolve) => (release = resolve));
      const run = lastValueFrom(
        fromIterable(Array.from({ length: 20 }, (_, i) => i)).pipe(
          stage((n: number) => n + 1, { name: 'parse', capacity: 4 }),
          stage(
            async (n: number) => {
              await gate;
              return n * 2;
            },
            { name: 'model', capacity: 8, concurrency: 2 },
          ),
          stage((n: number) => n - 1, { name: 'format' }),
          map((t) => t.value),
          toArray(),
        ),
      );
      await sleep(10);
      graph.sample();
      const live = graph.snapshot();
      const byName = new Map(live.nodes.map((n) => [n.name, n]));
      assert.deepEqual([...byName.keys()].sort(), ['format', 'model', 'parse']);
      const id = (name: string) => byName.get(name)!.id;
      assert.deepEqual(live.edges.map((e) => `${e.from}->${e.to}`).sort(), [`${id('parse')}->${id('model')}`, `${id('model')}->${id('format')}`].sort());
      const model = byName.get('model')!;
      assert.deepEqual([model.kind, model.capacity, model.concurrency, model.policy, model.runs], ['stage', 8, 2, 'pause', 1]);
      assert.equal(model.inFlight, 2, 'its two slots are busy');
      assert.equal(model.buffered, 8, 'and its buffer full, waiting on the gate');
      for (const node of live.nodes) assert.equal(node.unaccounted, 0, `${node.name}: received = delivered + shed + failed + buffered + in flight`);
      assert.equal(model.shares.working, 1);
      assert.equal(byName.get('format')!.shares.starved, 1, 'the stage after it waits for it');
      assert.equal(byName.get('parse')!.shares.backpressured, 1, 'the stage before it cannot hand on');
      assert.equal(live.bottleneck, model.id);

      release();
      assert.equal((await run).length, 20);
      const ended = graph.snapshot();
      assert.ok(ended.nodes.every((n) => n.runs === 0 && n.endedAt !== undefined && n.unaccounted === 0));
      assert.equal(ended.nodes.find((n) => n.name === 'model')!.delivered, 20);
      // Kept a while after they end, then dropped.
      clock.flush();
      assert.equal(graph.snapshot().nodes.length, 0);
    } finally {
      graph.stop();
    }
  });

  it('one node per stage however many runs it has (a per-request pipeline), with its runs counted', async () => {
    const graph = new PipelineGraph({ scheduler: new VirtualTimeScheduler() }).start();
    try {
      const shared = new StageStats();
      let open: () => void = () => {};
      const gate = new Promise<void>((resolve) => (open = resolve));
      const request = (q: string) =>
        lastValueFrom(
          fromIterable([q]).pipe(
            stage(
              async (s: string) => {
                await gate;
                return s.length;
              },
              { name: 'answer', stats: shared },
            ),
          ),
        );
      const running = [request('a'), request('bb'), request('ccc')];
      await sleep(5);
      const nodes = graph.snapshot().nodes;
      assert.equal(nodes.length, 1);
      assert.equal(nodes[0]!.runs, 3);
      assert.equal(nodes[0]!.inFlight, 3);
      open();
      await Promise.all(running);
      assert.equal(graph.snapshot().nodes[0]!.runs, 0);
    } finally {
      graph.stop();
    }
  });

  it('service-time percentiles come from sampled elements (HDR histogram), and they fill the waterfall', async () => {
    const graph = new PipelineGraph({ scheduler: new VirtualTimeScheduler(), waterfall: 5 }).start();
    try {
      const out = await lastValueFrom(
        fromIterable(Array.from({ length: 12 }, (_, i) => i)).pipe(
          stage(
            async (n: number) => {
              await sleep(n < 6 ? 2 : 20);
              return n;
            },
            { name: 'slow-half', sampleRate: 1 },
          ),
          toArray(),
        ),
      );
      for (const element of out as Traced<number>[]) graph.observeTrace(element.trace);
      const node = graph.snapshot().nodes[0]!;
      assert.equal(node.serviceMs.count, 12);
      assert.ok(node.serviceMs.p50 >= 1 && node.serviceMs.p50 < node.serviceMs.p99, JSON.stringify(node.serviceMs));
      assert.ok(node.serviceMs.p99 >= 15, JSON.stringify(node.serviceMs));
      const waterfall = graph.snapshot().waterfall;
      assert.equal(waterfall.length, 5, 'the newest five');
      assert.equal(waterfall[0]!.records[0]!.stage, 'slow-half');
    } finally {
      graph.stop();
    }
  });

  it('sees batchers and fan-outs too: a balance node feeds each replica, the replicas feed what follows', async () => {
    const graph = new PipelineGraph({ scheduler: new VirtualTimeScheduler() }).start();
    try {
      let open: () => void = () => {};
      const gate = new Promise<void>((resolve) => (open = resolve));
      const run = lastValueFrom(
        fromIterable(Array.from({ length: 10 }, (_, i) => i)).pipe(
          batch({ name: 'batcher', maxSize: 2, maxWait: 5 }),
          unbatch(),
          balance({
            name: 'replicas',
            workers: 2,
            worker: (flow, replica) =>
              flow.pipe(
                stage(
                  async (n: number) => {
                    await gate;
                    return n;
                  },
                  { name: `replica-${replica}` },
                ),
              ),
          }),
          stage((n: number) => n, { name: 'after' }),
          toArray(),
        ),
      );
      await sleep(20);
      const live = graph.snapshot();
      const id = (name: string) => live.nodes.find((n) => n.name === name)?.id;
      const edges = new Set(live.edges.map((e) => `${e.from}->${e.to}`));
      assert.equal(live.nodes.find((n) => n.name === 'batcher')?.kind, 'batch');
      assert.equal(live.nodes.find((n) => n.name === 'replicas')?.kind, 'balance');
      assert.equal(live.nodes.find((n) => n.name === 'replicas')?.runs, 1, 'its lanes are parts of its run, not runs');
      for (const replica of ['replica-0', 'replica-1']) {
        assert.ok(edges.has(`${id('replicas')}->${id(replica)}`), `replicas -> ${replica}: ${[...edges].join(' ')}`);
        assert.ok(edges.has(`${id(replica)}->${id('after')}`), `${replica} -> after: ${[...edges].join(' ')}`);
      }
      open();
      assert.equal((await run).length, 10);
    } finally {
      graph.stop();
    }
  });

  it("a model's generations are a node of their own, feeding the stage that streams them", async () => {
    const graph = new PipelineGraph({ scheduler: new VirtualTimeScheduler() }).start();
    try {
      let open: () => void = () => {};
      const gate = new Promise<void>((resolve) => (open = resolve));
      const model = (prompt: string) =>
        decode(generateRequest({ prompt }), {}, { name: 'toy-lm', maxTokens: 3 }, () => {
          let i = 0;
          return { inputTokens: 1, step: () => gate.then(() => (i < 3 ? { text: `t${i++}` } : { end: 'stop' as const })), close() {} };
        });
      const run = lastValueFrom(
        fromIterable(['a', 'b']).pipe(
          stage((p: string) => model(p), { name: 'generate' }),
          stage((t: Token) => t.text, { name: 'post' }),
          toArray(),
        ),
      );
      await sleep(5);
      const live = graph.snapshot();
      const lm = live.nodes.find((n) => n.name === 'toy-lm')!;
      const generate = live.nodes.find((n) => n.name === 'generate')!;
      assert.equal(lm.kind, 'model');
      assert.equal(lm.inFlight, 1, 'one generation running');
      assert.ok(
        live.edges.some((e) => e.from === lm.id && e.to === generate.id),
        JSON.stringify(live.edges),
      );
      assert.ok(live.edges.some((e) => e.from === generate.id && e.to === live.nodes.find((n) => n.name === 'post')!.id));
      open();
      assert.equal((await run).length, 6);
      const ended = graph.snapshot().nodes.find((n) => n.name === 'toy-lm')!;
      assert.deepEqual([ended.received, ended.delivered, ended.inFlight, ended.unaccounted], [2, 2, 0, 0]);
    } finally {
      graph.stop();
    }
  });

  it('a run feeding a consumer it cannot know (a plain subscriber) is sampled again and again without harm', async () => {
    const graph = new PipelineGraph({ scheduler: new VirtualTimeScheduler() }).start();
    try {
      let open: () => void = () => {};
      const gate = new Promise<void>((resolve) => (open = resolve));
      const values: number[] = [];
      const subscription = subscribeWithDemand(fromIterable([1, 2]).pipe(stage(async (n: number) => gate.then(() => n), { name: 'to-a-socket' })), {
        next: (t) => values.push((t as Traced<number>).value),
      });
      subscription.request(10);
      await sleep(5);
      for (let i = 0; i < 3; i++) graph.sample();
      assert.equal(graph.snapshot().nodes.length, 1);
      open();
      await eventually(() => assert.equal(values.length, 2));
    } finally {
      graph.stop();
    }
  });

  it('keeps the latest failed elements with their stage and error code, never the element', async () => {
    const graph = new PipelineGraph({ scheduler: new VirtualTimeScheduler(), failures: 3 }).start();
    try {
      const out = await lastValueFrom(
        fromIterable([1, 2, 3, 4, 5, 6]).pipe(
          stage(
            (n: number) => {
              if (n % 2 === 0) throw new TypeError(`secret-${n}`);
              return n;
            },
            { name: 'picky', errorPolicy: 'skip' },
          ),
          toArray(),
        ),
      );
      assert.equal(out.length, 3);
      const failures = graph.snapshot().failures;
      assert.deepEqual(
        failures.map((f) => [f.stage, f.seq, f.code, f.cause]),
        [
          ['picky', 1, 'WORK_FAILED', 'TypeError'],
          ['picky', 3, 'WORK_FAILED', 'TypeError'],
          ['picky', 5, 'WORK_FAILED', 'TypeError'],
        ],
      );
      assert.ok(!JSON.stringify(failures).includes('secret'), 'no element or message');
    } finally {
      graph.stop();
    }
  });

  it('costs nothing when not started, and leaves no hook or timer when stopped', async () => {
    assert.equal(activeIntrospector(), undefined);
    const clock = new VirtualTimeScheduler();
    const graph = new PipelineGraph({ scheduler: clock, interval: 100 }).start();
    assert.equal(activeIntrospector(), graph);
    assert.equal(clock.actions.length, 1, 'one sampling timer');
    graph.stop();
    assert.equal(activeIntrospector(), undefined);
    assert.equal(clock.actions.length, 0);
    await lastValueFrom(
      fromIterable([1, 2]).pipe(
        stage((n: number) => n, { name: 'unseen' }),
        toArray(),
      ),
    );
    assert.equal(graph.snapshot().nodes.length, 0, 'a stopped graph sees no new run');
  });

  it('stays bounded: past maxNodes, ended nodes are dropped first, then new ones are counted as omitted', async () => {
    const graph = new PipelineGraph({ scheduler: new VirtualTimeScheduler(), maxNodes: 3 }).start();
    try {
      for (let i = 0; i < 5; i++) await lastValueFrom(fromIterable([i]).pipe(stage((n: number) => n, { name: `s${i}` })));
      const names = graph.snapshot().nodes.map((n) => n.name);
      assert.equal(names.length, 3);
      assert.deepEqual(names, ['s2', 's3', 's4']);
      assert.equal(graph.snapshot().omitted, 0);
      // Three running stages (nothing ended to drop after the first) in a graph of three.
      let open: () => void = () => {};
      const gate = new Promise<void>((resolve) => (open = resolve));
      const held = ['r0', 'r1', 'r2', 'r3'].map((name) => lastValueFrom(fromIterable([1]).pipe(stage(() => gate, { name }))));
      await sleep(5);
      assert.deepEqual(
        graph.snapshot().nodes.map((n) => n.name),
        ['r0', 'r1', 'r2'],
      );
      assert.equal(graph.snapshot().omitted, 1);
      open();
      await Promise.all(held);
    } finally {
      graph.stop();
    }
  });

  it('a stage holding an output its consumer refused reads backpressured until resumed, though room has freed below the resume mark', async () => {
    const graph = new PipelineGraph({ scheduler: new VirtualTimeScheduler() }).start();
    const gates: (() => void)[] = [];
    try {
      const run = lastValueFrom(
        fromIterable(Array.from({ length: 30 }, (_, i) => i)).pipe(
          stage((n: number) => n, { name: 'A', capacity: 4 }),
          // B resumes its producer only once 2 slots are free (a quarter of its room of 9).
          stage((n: number) => new Promise<number>((resolve) => gates.push(() => resolve(n))), { name: 'B', capacity: 8, concurrency: 1 }),
          toArray(),
        ),
      );
      await sleep(5);
      const node = (name: string) => graph.snapshot().nodes.find((n) => n.name === name)!;
      graph.sample();
      assert.deepEqual([node('A').buffered, node('A').demand, node('A').shares.backpressured], [4, 0, 1], 'B full: A held back');
      gates.shift()!(); // one slot frees: below B's resume mark, A is not resumed
      await sleep(5);
      graph.sample();
      assert.equal(node('B').inFlight, 1);
      assert.equal(node('A').demand, 0, 'the demand A can act on');
      assert.equal(node('A').shares.backpressured, 1, 'A still waits for downstream, not working');
      while ((await Promise.race([run.then(() => true), sleep(1).then(() => false)])) === false) gates.splice(0).forEach((open) => open());
    } finally {
      graph.stop();
    }
  });

  it('states: working, starved, backpressured and idle; the bottleneck is the node busy most of the window', () => {
    assert.equal(stateOf(0, 1, 1), 'working');
    assert.equal(stateOf(0, 0, 3), 'starved');
    assert.equal(stateOf(2, 1, 0), 'backpressured');
    assert.equal(stateOf(0, 0, 0), 'idle');
    assert.equal(stateOf(0, 3, 5, 16), 'starved', '3 of 16 slots busy, nothing waiting: it could take more');
    assert.equal(stateOf(0, 16, 5, 16), 'working', 'every slot busy');
    assert.equal(stateOf(1, 3, 5, 16), 'working', 'an element waits');
    const node = (id: string, working: number) =>
      ({ id, runs: 1, capacity: 4, buffered: 0, shares: { working, starved: 1 - working, backpressured: 0, idle: 0 } }) as never;
    assert.equal(bottleneckOf([node('a', 0.2), node('b', 0.9), node('c', 0.6)]), 'b');
    assert.equal(bottleneckOf([node('a', 0.2), node('b', 0.4)]), undefined, 'nothing busy most of the time: no bottleneck');
  });
});

describe('a snapshot stays readable and bounded, however big the server', () => {
  it('300 stages and 5,000 requests of 100 tenants: the busiest stages, the oldest requests, counts of all, one bounded message', async () => {
    const graph = new PipelineGraph({ scheduler: new VirtualTimeScheduler(), maxNodes: 1000 }).start();
    const requests = new RequestRegistry();
    try {
      for (let i = 0; i < 300; i++) await lastValueFrom(fromIterable([i]).pipe(stage((n: number) => n, { name: `stage-${i}` })));
      const handles = Array.from({ length: 5000 }, (_, i) => requests.add({ transport: 'http', model: i % 3 === 0 ? 'a' : 'b', tenant: `t${i % 100}` }));
      const snapshot = buildSnapshot({ graph, requests }, 1, { nodes: 200, rows: 50 });
      assert.equal(snapshot.graph.nodes.length, 200);
      assert.equal(snapshot.graph.omitted, 100);
      const page = snapshot.requests!;
      assert.equal(page.total, 5000);
      assert.deepEqual(
        page.shown.map((r) => r.id),
        handles.slice(0, 50).map((h) => h.id),
        'the oldest first',
      );
      assert.deepEqual(page.byModel, { a: 1667, b: 3333 });
      assert.equal(Object.keys(page.byTenant).length, 21, 'the 20 tenants with most, the rest as (others)');
      assert.equal(page.byTenant['(others)'], 80 * 50);
      assert.ok(JSON.stringify(snapshot).length < 200_000, `one message of ${JSON.stringify(snapshot).length} bytes`);
      for (const handle of handles) handle.end();
      assert.equal(requests.size, 0);
    } finally {
      graph.stop();
    }
  });
});
