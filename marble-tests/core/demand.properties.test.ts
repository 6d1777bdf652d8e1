/**
 * `subscribeWithDemand` has a fast path for a bare Flow (`DirectDemandSubscriber`: the Flow's
 * outlet hands it every element itself, no `Inlet`). These properties prove it equal to the
 * general path (`LinkedDemandSubscriber`, which the same Flow takes behind a plain `map`): for
 * random sources and random demand, with requests and cancels made between signals and from
 * inside the observer, both deliver the same signals, report the same `outstanding` and `closed`
 * after every step, and pull the same elements from the source.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { map, type Observable } from 'rxjs';
import { fromIterable } from '../../src/flow/sources.js';
import { Flow, subscribeWithDemand, type DemandSubscription } from '../../src/flow/demand.js';
import { stage } from '../../operators/stage.js';
import { traced, type Traced } from '../../src/core/trace.js';

const numRuns = Number(process.env.SLUICE_PROPERTY_RUNS ?? 200);

/** `sync`: `fromIterable` over a generator; `stage`: a synchronous stage over it; `async`: a stage whose work is a Promise; `traced`: a stage over traced elements (handed over as parts). */
type SourceKind = 'sync' | 'stage' | 'async' | 'traced';

interface Plan {
  readonly kind: SourceKind;
  readonly length: number;
  /** The generator throws instead of yielding this element, if set. */
  readonly failAt: number | undefined;
  /** Requests (`Infinity` included) or cancels, one after another, each followed by a settle. */
  readonly steps: readonly (number | 'cancel')[];
  /** The observer requests this many more from inside `next` of the element with this index, if set. */
  readonly reenter: { readonly at: number; readonly n: number } | undefined;
}

const planArbitrary: fc.Arbitrary<Plan> = fc.record({
  kind: fc.constantFrom<SourceKind>('sync', 'stage', 'async', 'traced'),
  length: fc.integer({ min: 0, max: 12 }),
  failAt: fc.option(fc.integer({ min: 0, max: 12 }), { nil: undefined }),
  steps: fc.array(fc.oneof(fc.integer({ min: 1, max: 5 }), fc.constant(Number.POSITIVE_INFINITY), fc.constant<'cancel'>('cancel')), { maxLength: 8 }),
  reenter: fc.option(fc.record({ at: fc.integer({ min: 0, max: 12 }), n: fc.integer({ min: 1, max: 3 }) }), { nil: undefined }),
});

/** A fresh source for `plan`, and how many elements its generator was pulled for. */
function sourceOf(plan: Plan): { flow: Flow<unknown>; pulled: () => number } {
  let pulled = 0;
  function* generate(): Generator<number> {
    for (let i = 0; i < plan.length; i++) {
      if (i === plan.failAt) throw new Error(`failed at ${i}`);
      pulled++;
      yield i;
    }
  }
  const source = fromIterable(generate());
  const made: Observable<unknown> =
    plan.kind === 'sync'
      ? source
      : plan.kind === 'stage'
        ? source.pipe(stage((x: number) => x * 2, { name: 'double' }))
        : plan.kind === 'async'
          ? source.pipe(stage(async (x: number) => x * 2, { name: 'double', concurrency: 2 }))
          : source.pipe(
              map((x) => traced(x)),
              stage((x: number) => x + 1, { name: 'traced' }),
            );
  // A stage makes a Flow whatever its source (its type after a plain `map` says Observable): the fast path is taken.
  assert.ok(made instanceof Flow);
  const flow: Flow<unknown> = made;
  return { flow, pulled: () => pulled };
}

const settle = () => new Promise<void>((resolve) => setImmediate(resolve));

/** Runs `plan` against `subscribe` and returns everything an observer and the source could see. */
async function run(plan: Plan, subscribe: (flow: Flow<unknown>) => Observable<unknown>): Promise<string[]> {
  const { flow, pulled } = sourceOf(plan);
  const log: string[] = [];
  let index = 0;
  let subscription!: DemandSubscription;
  subscription = subscribeWithDemand(subscribe(flow), {
    next: (value) => {
      const shown = typeof value === 'object' && value !== null ? `traced ${(value as Traced<number>).value}` : String(value);
      log.push(`next ${shown}`);
      if (plan.reenter !== undefined && index === plan.reenter.at) subscription.request(plan.reenter.n);
      index++;
    },
    error: (err) => log.push(`error ${(err as Error).message}`),
    complete: () => log.push('complete'),
  });
  const state = (step: string) => log.push(`${step}: outstanding ${subscription.outstanding}, closed ${subscription.closed}, pulled ${pulled()}`);
  state('subscribed');
  for (const step of plan.steps) {
    if (step === 'cancel') subscription.cancel();
    else subscription.request(step);
    await settle();
    state(String(step));
  }
  return log;
}

describe('subscribeWithDemand: the bare-Flow fast path equals the general path', () => {
  it('same signals, same outstanding and closed after every step, same elements pulled', async () => {
    await fc.assert(
      fc.asyncProperty(planArbitrary, async (plan) => {
        const direct = await run(plan, (flow) => flow);
        const general = await run(plan, (flow) => flow.pipe(map((x) => x)));
        assert.deepEqual(direct, general);
      }),
      { numRuns },
    );
  });
});
