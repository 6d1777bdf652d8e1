import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { TestScheduler } from 'rxjs/testing';
import { Observable, config as rxjsConfig, VirtualTimeScheduler, catchError, map, mergeMap, of, throwError, type OperatorFunction } from 'rxjs';
import { stage, type StageContext } from '../../operators/stage.js';
import { retrying, retryAfterOf } from '../../src/resilience/retry.js';
import { RateLimitedError } from '../../src/ai/inference/errors.js';
import { withTimeouts } from '../../src/resilience/timeouts.js';
import { fallback } from '../../src/resilience/fallback.js';
import { admission, type RejectEvent } from '../../operators/admission.js';
import { StageStats } from '../../src/flow/stats.js';
import { route, type ShadowReport } from '../../src/resilience/route.js';
import { fromIterable } from '../../src/flow/sources.js';
import { type Traced, TraceContext } from '../../src/core/trace.js';
import { InvalidOptionsError, StageError } from '../../src/core/errors.js';
import { AdmissionRejectedError, CircuitOpenError, FallbackExhaustedError, StreamTimeoutError } from '../../src/resilience/errors.js';
import { CircuitBreaker, type CircuitStateChange } from '../../src/resilience/breaker.js';
import { seededRandom } from '../../src/resilience/random.js';

const values = <T>(): OperatorFunction<Traced<T>, T> => map((t) => t.value);

function scheduler(): TestScheduler {
  return new TestScheduler((actual, expected) => assert.deepEqual(actual, expected));
}

/** A context for calling a wrapped work function directly, outside a stage. */
function contextFor(name = 'test'): StageContext & { readonly controller: AbortController } {
  const controller = new AbortController();
  const trace = new TraceContext(0, false);
  return { stage: name, seq: 0, trace, signal: controller.signal, controller, note: (key, value) => trace.note(name, key, value) };
}

/** The error a stage wraps around a work failure. */
function _causeOf(err: unknown): unknown {
  return err instanceof StageError ? err.cause : err;
}

describe('withTimeouts: total and idle deadlines for token streams', () => {
  it('fails with an idle StreamTimeoutError when the stream goes quiet, and aborts the work', () => {
    const signals: AbortSignal[] = [];
    scheduler().run(({ cold, expectObservable, expectSubscriptions }) => {
      const tokens = cold('-a-b------c|');
      const work = withTimeouts(
        (_: string, { signal }: StageContext) => {
          signals.push(signal);
          return tokens;
        },
        { idle: 4 },
      );
      expectObservable(work('p', contextFor())).toBe('-a-b---#', undefined, new StreamTimeoutError('idle', 4, 'test'));
      expectSubscriptions(tokens.subscriptions).toBe('^------!');
    });
    assert.equal(signals.length, 1);
    assert.equal(signals[0]!.aborted, true);
    assert.ok(signals[0]!.reason instanceof StreamTimeoutError);
    assert.equal((signals[0]!.reason as StreamTimeoutError).kind, 'idle');
  });

  it('counts the wait for the first token as silence too', () => {
    scheduler().run(({ cold, expectObservable }) => {
      const work = withTimeouts(() => cold('-----a|'), { idle: 3 });
      expectObservable(work('p', contextFor())).toBe('---#', undefined, new StreamTimeoutError('idle', 3, 'test'));
    });
  });

  it('fails with a total StreamTimeoutError even while tokens keep coming', () => {
    const signals: AbortSignal[] = [];
    scheduler().run(({ cold, expectObservable }) => {
      const work = withTimeouts(
        (_: string, { signal }: StageContext) => {
          signals.push(signal);
          return cold('-a-b-c-d-e|');
        },
        { total: 6, idle: 3 },
      );
      expectObservable(work('p', contextFor())).toBe('-a-b-c#', undefined, new StreamTimeoutError('total', 6, 'test'));
    });
    assert.equal((signals[0]!.reason as StreamTimeoutError).kind, 'total');
  });

  it('lets a stream that keeps its deadlines through untouched, timers released', () => {
    const ts = scheduler();
    ts.run(({ cold, expectObservable }) => {
      const work = withTimeouts(() => cold('-a-b-c|'), { total: 10, idle: 3, scheduler: ts });
      expectObservable(cold('x|').pipe(stage(work, { name: 'infer' }), values())).toBe('-a-b-c|');
    });
    assert.equal(ts.actions.length, 0, 'no timer survives the run');
  });

  it('does not count time a token waits for downstream demand as silence', () => {
    scheduler().run(({ cold, expectObservable }) => {
      // The token Flow is paused by the stage below it: tokens wait for the slow consumer.
      const generate = withTimeouts(() => fromIterable(['a', 'b', 'c']), { idle: 3 });
      const slowConsumer = stage((t: string) => cold('-----(x|)', { x: t }), { name: 'slow', capacity: 1 });
      expectObservable(cold('p|').pipe(stage(generate, { name: 'infer' }), slowConsumer, values())).toBe('-----a----b----(c|)');
    });
  });

  it('aborts the work when the consumer unsubscribes, without an error', () => {
    const signals: AbortSignal[] = [];
    scheduler().run(({ cold, expectObservable }) => {
      const work = withTimeouts(
        (_: string, { signal }: StageContext) => {
          signals.push(signal);
          return cold('-a-b-c|');
        },
        { idle: 5 },
      );
      expectObservable(work('p', contextFor()), '^--!').toBe('-a-');
    });
    assert.equal(signals[0]!.aborted, true);
  });

  it('names the bad field of invalid options', () => {
    assert.throws(
      () => withTimeouts(() => 1, { idle: -1 }),
      (err: unknown) => err instanceof InvalidOptionsError && err.issues.some((i) => i.path === 'idle'),
    );
    assert.throws(
      () => withTimeouts(() => 1, {}),
      (err: unknown) => err instanceof InvalidOptionsError && err.issues.some((i) => i.path === 'total'),
    );
  });
});

describe('retrying: backoff with jitter, never after the first token', () => {
  it('retries failures before the first token after exponential delays (exact virtual times)', () => {
    const ts = scheduler();
    ts.run(({ cold, expectObservable }) => {
      const attempts = [cold('-#'), cold('--#'), cold('-a-b|')];
      let calls = 0;
      const work = retrying(() => attempts[calls++]!, { attempts: 3, baseDelay: 10, scheduler: ts });
      // attempt 1 fails at 1, waits 10 → attempt 2 at 11 fails at 13, waits 20 → attempt 3 at 33: a at 34, b at 36.
      expectObservable(work('p', contextFor())).toBe('34ms a-b|');
    });
  });

  it('takes a jitter share off each delay with a seeded random (exact virtual times)', () => {
    const ts = scheduler();
    const draws = seededRandom(7);
    const first = draws();
    const second = draws();
    const d1 = Math.round(100 * (1 - 0.5 * first));
    const d2 = Math.round(200 * (1 - 0.5 * second));
    ts.run(({ cold, expectObservable }) => {
      let calls = 0;
      const work = retrying(() => (calls++ < 2 ? cold('#') : cold('(a|)')), {
        attempts: 3,
        baseDelay: 100,
        jitter: 0.5,
        random: seededRandom(7),
        scheduler: ts,
      });
      expectObservable(work('p', contextFor())).toBe(`${d1 + d2}ms (a|)`);
    });
    assert.ok(d1 >= 50 && d1 <= 100 && d2 >= 100 && d2 <= 200);
  });

  it('full jitter with a pinned random, capped by maxDelay', () => {
    const ts = scheduler();
    const draws = [0.5, 0.25, 0];
    ts.run(({ cold, expectObservable }) => {
      let calls = 0;
      const work = retrying(() => (calls++ < 3 ? cold('#') : cold('(a|)')), {
        attempts: 4,
        baseDelay: 40,
        maxDelay: 100,
        jitter: 1,
        random: () => draws.shift()!,
        scheduler: ts,
      });
      // 40 × 0.5 = 20, then 80 × 0.75 = 60, then min(100, 160) × 1 = 100: 180 in all.
      expectObservable(work('p', contextFor())).toBe('180ms (a|)');
    });
  });

  it('propagates a failure after the first token instead of retrying', () => {
    scheduler().run(({ cold, expectObservable }) => {
      let _calls = 0;
      const work = retrying(
        () => {
          _calls++;
          return cold('-a-#', undefined, new Error('broke'));
        },
        { attempts: 5, baseDelay: 1 },
      );
      expectObservable(work('p', contextFor())).toBe('-a-#', undefined, new Error('broke'));
    });
  });

  it('gives up after `attempts`, with the last failure, and notes the retries in the trace', () => {
    const context = contextFor('infer');
    scheduler().run(({ cold, expectObservable }) => {
      let calls = 0;
      const work = retrying(() => cold('-#', undefined, new Error(`fail ${++calls}`)), { attempts: 3, baseDelay: 2 });
      expectObservable(work('p', context)).toBe('9ms #', undefined, new Error('fail 3'));
    });
    assert.equal(context.trace.notes?.['infer.retries'], 2);
  });

  it('asks retryOn, and stops when it says no', () => {
    scheduler().run(({ cold, expectObservable }) => {
      const fatal = new Error('fatal');
      const errors = [new Error('transient'), fatal];
      let calls = 0;
      const work = retrying(() => cold('-#', undefined, errors[calls++]), {
        attempts: 5,
        baseDelay: 3,
        retryOn: (err) => err !== fatal,
      });
      expectObservable(work('p', contextFor())).toBe('5ms #', undefined, fatal);
    });
  });

  it('gives each attempt its own signal, fired when the caller aborts, and starts no attempt after that', () => {
    const signals: AbortSignal[] = [];
    const context = contextFor();
    scheduler().run(({ cold, expectObservable }) => {
      const work = retrying(
        (_: string, { signal }: StageContext) => {
          signals.push(signal);
          return cold('-#');
        },
        { attempts: 5, baseDelay: 2 },
      );
      expectObservable(work('p', context), '^---!').toBe('----');
    });
    assert.equal(signals.length, 2);
    assert.equal(signals[0]!.aborted, false, 'a failed attempt is over, not aborted');
    assert.equal(signals[1]!.aborted, true, 'the running attempt is aborted on unsubscribe');
  });

  it('works inside a stage: retries counted in the notes of the element trace', () => {
    const notes: (Record<string, string | number | boolean> | undefined)[] = [];
    scheduler().run(({ cold, expectObservable }) => {
      const counts = new Map<string, number>();
      const work = retrying(
        (p: string) => {
          const n = counts.get(p) ?? 0;
          counts.set(p, n + 1);
          return n === 0 ? cold('-#') : cold('-x|', { x: p.toUpperCase() });
        },
        { attempts: 2, baseDelay: 1 },
      );
      const out = cold('ab|').pipe(
        stage(work, { name: 'infer' }),
        map((t) => {
          notes.push(t.trace.notes);
          return t.value;
        }),
      );
      expectObservable(out).toBe('---A---B|');
    });
    assert.deepEqual(notes, [{ 'infer.retries': 1 }, { 'infer.retries': 1 }]);
  });

  it('retries a synchronous throw and an AsyncIterable stream the same way', async () => {
    let calls = 0;
    const work = retrying(
      async function* () {
        if (calls++ === 0) throw new Error('cold start');
        yield 'a';
        yield 'b';
      },
      { attempts: 2, baseDelay: 0 },
    );
    const out: string[] = [];
    await new Promise<void>((resolve, reject) => work('p', contextFor()).subscribe({ next: (t) => out.push(t), error: reject, complete: resolve }));
    assert.deepEqual(out, ['a', 'b']);
    const throwing = retrying(
      () => {
        if (calls++ < 3) throw new Error('sync');
        return 'ok';
      },
      { attempts: 3, baseDelay: 0 },
    );
    const got: string[] = [];
    throwing('p', contextFor()).subscribe((t) => got.push(t));
    assert.deepEqual(got, ['ok']);
  });

  it('property: the output is one attempt’s tokens — never a repeated or spliced prefix', () => {
    const attemptArb = fc.record({
      tokens: fc.array(fc.constantFrom('x', 'y', 'z'), { maxLength: 5 }),
      // undefined: the attempt completes; n: it fails after min(n, tokens) tokens.
      failAfter: fc.option(fc.nat({ max: 5 }), { nil: undefined }),
    });
    fc.assert(
      fc.property(fc.array(attemptArb, { minLength: 1, maxLength: 5 }), fc.integer({ min: 1, max: 5 }), fc.nat({ max: 20 }), (plan, attempts, baseDelay) => {
        const virtual = new VirtualTimeScheduler();
        let calls = 0;
        const work = retrying(
          () => {
            const step = plan[Math.min(calls++, plan.length - 1)]!;
            return new Observable<string>((subscriber) => {
              const emit = step.failAfter === undefined ? step.tokens : step.tokens.slice(0, step.failAfter);
              // Tokens arrive over virtual time, so retries interleave with timers.
              let i = 0;
              return virtual.schedule(function () {
                if (i < emit.length) {
                  subscriber.next(emit[i++]!);
                  this.schedule(undefined, 1);
                } else if (step.failAfter === undefined) subscriber.complete();
                else subscriber.error(new Error('attempt failed'));
              }, 1);
            });
          },
          { attempts, baseDelay, scheduler: virtual },
        );
        const out: string[] = [];
        let failed = false;
        let completed = false;
        work('p', contextFor()).subscribe({ next: (t) => out.push(t), error: () => (failed = true), complete: () => (completed = true) });
        virtual.flush();
        // The model: attempts run until one answers (emits a token or completes) or the attempts run out.
        let expected: string[] = [];
        let expectFailure = true;
        for (let n = 0; n < attempts; n++) {
          const step = plan[Math.min(n, plan.length - 1)]!;
          const emitted = step.failAfter === undefined ? step.tokens : step.tokens.slice(0, step.failAfter);
          if (step.failAfter === undefined || emitted.length > 0 || n === attempts - 1) {
            expected = emitted;
            expectFailure = step.failAfter !== undefined;
            break;
          }
        }
        assert.deepEqual(out, expected);
        assert.equal(failed, expectFailure);
        assert.equal(completed, !expectFailure);
        assert.ok(calls <= attempts);
      }),
      { numRuns: 300 },
    );
  });

  it('waits max(backoff, retryAfter) after a RateLimitedError (exact virtual times), noting the wait asked for', () => {
    const context = contextFor('infer');
    const ts = scheduler();
    ts.run(({ cold, expectObservable }) => {
      const attempts = [cold('-#', undefined, new RateLimitedError('slow down', 30)), cold('-#', undefined, new RateLimitedError('slow down', 5)), cold('-a|')];
      let calls = 0;
      const work = retrying(() => attempts[calls++]!, { attempts: 3, baseDelay: 10, scheduler: ts });
      // Fails at 1, asked 30 > backoff 10 → attempt 2 at 31 fails at 32, backoff 20 > asked 5 → attempt 3 at 52: a at 53.
      expectObservable(work('p', context)).toBe('53ms a|');
    });
    assert.deepEqual(context.trace.notes, { 'infer.retryAfter': 5, 'infer.retries': 2 });
  });

  it('honours retryAfter on any error carrying one, jitter and maxDelay never shortening it', () => {
    const ts = scheduler();
    ts.run(({ cold, expectObservable }) => {
      let calls = 0;
      const busy = Object.assign(new Error('busy'), { retryAfter: 70 });
      const work = retrying(() => (calls++ === 0 ? cold('#', undefined, busy) : cold('(a|)')), {
        attempts: 2,
        baseDelay: 100,
        maxDelay: 60,
        jitter: 1,
        random: () => 0.5,
        scheduler: ts,
      });
      // Backoff min(60, 100) × 0.5 = 30, but the error asked for 70.
      expectObservable(work('p', contextFor())).toBe('70ms (a|)');
    });
    assert.equal(retryAfterOf(Object.assign(new Error('x'), { retryAfter: 0 })), 0);
    for (const ignored of [{ retryAfter: -1 }, { retryAfter: Infinity }, { retryAfter: NaN }, { retryAfter: '5' }, new Error('plain'), null, 'text']) {
      assert.equal(retryAfterOf(ignored), undefined, JSON.stringify(ignored));
    }
  });

  it('fails at once with the original error when retryAfter exceeds maxRetryAfter (default 60 s)', () => {
    const tooLong = new RateLimitedError('come back tomorrow', 86_400_000);
    let calls = 0;
    const context = contextFor('infer');
    scheduler().run(({ cold, expectObservable }) => {
      const work = retrying(
        () => {
          calls++;
          return cold('-#', undefined, tooLong);
        },
        { attempts: 5, baseDelay: 1 },
      );
      expectObservable(work('p', context)).toBe('-#', undefined, tooLong);
    });
    assert.equal(calls, 1, 'no second attempt');
    assert.deepEqual(context.trace.notes, { 'infer.retryAfter': 86_400_000 });
  });

  it('waits a retryAfter equal to maxRetryAfter, and gives up on one just over it', () => {
    const ts = scheduler();
    ts.run(({ cold, expectObservable }) => {
      const over = new RateLimitedError('slow down', 51);
      const errors = [new RateLimitedError('slow down', 50), over];
      let calls = 0;
      const work = retrying(() => cold('-#', undefined, errors[calls++]), { attempts: 5, baseDelay: 1, maxRetryAfter: 50, scheduler: ts });
      // Fails at 1, waits 50 → attempt 2 at 51 fails at 52 asking 51 > 50: its error ends the stream.
      expectObservable(work('p', contextFor())).toBe('52ms #', undefined, over);
    });
  });

  it('names the bad field of invalid options', () => {
    assert.throws(
      () => retrying(() => 1, { attempts: 0, baseDelay: 1, jitter: 2 }),
      (err: unknown) => err instanceof InvalidOptionsError && err.issues.some((i) => i.path === 'attempts') && err.issues.some((i) => i.path === 'jitter'),
    );
    assert.throws(
      () => retrying(() => 1, { attempts: 2, baseDelay: 1, maxRetryAfter: -1 }),
      (err: unknown) => err instanceof InvalidOptionsError && err.issues.some((i) => i.path === 'maxRetryAfter'),
    );
  });
});

describe('CircuitBreaker: closed → open → half-open → closed, with hysteresis', () => {
  /**
   * Calls made at the frames of `calls`: f fails at once, s succeeds at once, q fails
   * after 3 frames, p succeeds after 3 frames. Outcomes: F failed, S succeeded, x rejected.
   */
  function drive(
    breaker: CircuitBreaker,
    cold: (marbles: string, values?: Record<string, string>, error?: unknown) => Observable<string>,
    calls: Observable<string>,
    rejections: CircuitOpenError[] = [],
  ): Observable<string> {
    const worker = breaker.wrap((kind: string) => {
      if (kind === 'f') return throwError(() => new Error('down'));
      if (kind === 'q') return cold('---#', undefined, new Error('down'));
      if (kind === 'p') return cold('---(a|)');
      return of('ok');
    });
    return calls.pipe(
      mergeMap((kind) =>
        worker(kind, contextFor()).pipe(
          map(() => 'S'),
          catchError((err: unknown) => {
            if (!(err instanceof CircuitOpenError)) return of('F');
            rejections.push(err);
            return of('x');
          }),
        ),
      ),
    );
  }

  it('opens after failureThreshold failures within the window, rejects with retryAfter, probes after cooldown, closes after successThreshold successes', () => {
    const ts = scheduler();
    const changes: CircuitStateChange[] = [];
    const rejections: CircuitOpenError[] = [];
    ts.run(({ cold, expectObservable }) => {
      const breaker = new CircuitBreaker({ name: 'gpu', failureThreshold: 3, window: 10, cooldown: 8, successThreshold: 2, scheduler: ts });
      breaker.onStateChange((c) => changes.push(c));
      expectObservable(drive(breaker, cold, cold('-f-f-f--s-----s-----s'), rejections)).toBe('-F-F-F--x-----S-----S');
      expectObservable(breaker.state$).toBe('c----o-------h------c', { c: 'closed', o: 'open', h: 'half-open' });
    });
    assert.deepEqual(
      changes.map((c) => [c.from, c.to, c.at]),
      [
        ['closed', 'open', 5],
        ['open', 'half-open', 13],
        ['half-open', 'closed', 20],
      ],
    );
    assert.equal(rejections.length, 1);
    assert.equal(rejections[0]!.retryAfter, 5, 'opened at 5, cooldown 8, asked at 8');
    assert.equal(rejections[0]!.code, 'CIRCUIT_OPEN');
    assert.equal(rejections[0]!.state, 'open');
  });

  it('does not open on failures spread wider than the window', () => {
    const ts = scheduler();
    ts.run(({ cold, expectObservable }) => {
      const breaker = new CircuitBreaker({ failureThreshold: 3, window: 10, cooldown: 100, scheduler: ts });
      // 1, 5, 12: the oldest is 11 ms before the third. 5, 12, 14: within 10 → open at 14.
      expectObservable(drive(breaker, cold, cold('-f---f------f-f-s'))).toBe('-F---F------F-F-x');
      expectObservable(breaker.state$).toBe('c-------------o 99ms h', { c: 'closed', o: 'open', h: 'half-open' });
    });
  });

  it('close() leaves no timer: an open circuit keeps refusing until its cooldown, then half-opens when next asked', () => {
    const ts = new TestScheduler((actual, expected) => assert.deepEqual(actual, expected));
    const breaker = new CircuitBreaker({ failureThreshold: 1, window: 10, cooldown: 50, scheduler: ts });
    breaker.acquire().failure(new Error('down'));
    assert.equal(breaker.state, 'open');
    assert.equal(ts.actions.length, 1, 'the cooldown timer');
    breaker.close();
    assert.equal(ts.actions.filter((action) => !action.closed).length, 0, 'no timer left after close()');
    ts.flush();
    assert.equal(breaker.state, 'open', 'no timer half-opened it');
    assert.throws(() => breaker.acquire(), CircuitOpenError);
    ts.frame = 50;
    const probe = breaker.acquire();
    assert.equal(breaker.state, 'half-open');
    probe.failure(new Error('down'));
    assert.equal(breaker.state, 'open');
    assert.equal(ts.actions.filter((action) => !action.closed).length, 0, 'reopened without a timer');
  });

  it('half-open: lets `probes` calls through at once, reopens for a whole cooldown on a failed probe', () => {
    const ts = scheduler();
    const rejections: CircuitOpenError[] = [];
    ts.run(({ cold, expectObservable }) => {
      const breaker = new CircuitBreaker({ failureThreshold: 1, window: 10, cooldown: 5, scheduler: ts });
      expectObservable(drive(breaker, cold, cold('-f-----qs---s---p'), rejections)).toBe('-F------x-F-x------S');
      expectObservable(breaker.state$).toBe('co----h---o----h---c', { c: 'closed', o: 'open', h: 'half-open' });
    });
    assert.deepEqual(
      rejections.map((r) => [r.state, r.retryAfter]),
      [
        ['half-open', 5],
        ['open', 3],
      ],
    );
  });

  it('a cancelled probe counts as neither success nor failure, and frees its slot', () => {
    const ts = scheduler();
    ts.run(({ cold, expectObservable }) => {
      const breaker = new CircuitBreaker({ failureThreshold: 1, window: 10, cooldown: 2, scheduler: ts });
      const worker = breaker.wrap((kind: string) => (kind === 'f' ? throwError(() => new Error('down')) : cold('-----(a|)')));
      ts.schedule(() => worker('f', contextFor()).subscribe({ error: () => {} }), 0);
      // Half-open at 2: a probe starts at 3 and is cancelled at 4; the next call at 5 is a probe again.
      ts.schedule(() => {
        const probe = worker('p', contextFor()).subscribe();
        ts.schedule(() => probe.unsubscribe(), 1);
      }, 3);
      ts.schedule(() => worker('p', contextFor()).subscribe(), 5);
      expectObservable(breaker.state$).toBe('o-h-------c', { o: 'open', h: 'half-open', c: 'closed' });
    });
  });

  it('names the bad field of invalid options', () => {
    assert.throws(
      () => new CircuitBreaker({ failureThreshold: 0, window: 10, cooldown: -1 }),
      (err: unknown) =>
        err instanceof InvalidOptionsError && err.issues.some((i) => i.path === 'failureThreshold') && err.issues.some((i) => i.path === 'cooldown'),
    );
  });
});

describe('fallback: the next worker only before the first token', () => {
  it('moves to the next worker when one fails before its first token, and notes who answered', () => {
    const notes: (Record<string, string | number | boolean> | undefined)[] = [];
    scheduler().run(({ cold, expectObservable, expectSubscriptions }) => {
      const primary = cold<string>('--#');
      const secondary = cold('-a-b|');
      const generate = fallback([
        { name: 'gpu', work: () => primary },
        { name: 'cpu', work: () => secondary },
      ]);
      const out = cold('p|').pipe(
        stage(generate, { name: 'infer' }),
        map((t) => {
          notes.push(t.trace.notes);
          return t.value;
        }),
      );
      expectObservable(out).toBe('---a-b|');
      expectSubscriptions(primary.subscriptions).toBe('^-!');
      expectSubscriptions(secondary.subscriptions).toBe('--^---!');
    });
    assert.deepEqual(notes, [{ 'infer.worker': 'cpu' }, { 'infer.worker': 'cpu' }]);
  });

  it('propagates a failure after the first token: the secondary is never called', () => {
    let secondaryCalls = 0;
    scheduler().run(({ cold, expectObservable }) => {
      const generate = fallback([
        () => cold('--a-#', undefined, new Error('mid-stream')),
        () => {
          secondaryCalls++;
          return cold('x|');
        },
      ]);
      expectObservable(generate('p', contextFor())).toBe('--a-#', undefined, new Error('mid-stream'));
    });
    assert.equal(secondaryCalls, 0);
  });

  it('fails with FallbackExhaustedError listing every worker’s failure when all fail', () => {
    let error: unknown;
    scheduler().run(({ cold }) => {
      const generate = fallback<string, string>([
        { name: 'a', work: () => cold('-#', undefined, new Error('a down')) },
        { name: 'b', work: () => cold('-#', undefined, new Error('b down')) },
      ]);
      generate('p', contextFor()).subscribe({ error: (err: unknown) => (error = err) });
    });
    assert.ok(error instanceof FallbackExhaustedError);
    assert.equal(error.code, 'FALLBACK_EXHAUSTED');
    assert.deepEqual(
      error.failures.map((f) => [f.worker, (f.error as Error).message]),
      [
        ['a', 'a down'],
        ['b', 'b down'],
      ],
    );
  });

  it('lets `when` decline a failure, which then propagates as it is', () => {
    const invalid = new Error('invalid prompt');
    scheduler().run(({ cold, expectObservable }) => {
      const generate = fallback([() => cold<string>('-#', undefined, invalid), () => cold('a|')], { when: (err) => err !== invalid });
      expectObservable(generate('p', contextFor())).toBe('-#', undefined, invalid);
    });
  });

  it('property: the output is one worker’s tokens — never a repeated or spliced prefix', () => {
    const workerArb = fc.record({
      tokens: fc.array(fc.constantFrom('x', 'y', 'z'), { maxLength: 5 }),
      failAfter: fc.option(fc.nat({ max: 5 }), { nil: undefined }),
    });
    fc.assert(
      fc.property(fc.array(workerArb, { minLength: 1, maxLength: 4 }), (plan) => {
        const virtual = new VirtualTimeScheduler();
        const calls: number[] = [];
        const generate = fallback(
          plan.map((step, index) => ({
            name: `w${index}`,
            work: () => {
              calls.push(index);
              const emit = step.failAfter === undefined ? step.tokens : step.tokens.slice(0, step.failAfter);
              return new Observable<string>((subscriber) => {
                let i = 0;
                return virtual.schedule(function () {
                  if (i < emit.length) {
                    subscriber.next(emit[i++]!);
                    this.schedule(undefined, 1);
                  } else if (step.failAfter === undefined) subscriber.complete();
                  else subscriber.error(new Error(`w${index} failed`));
                }, 1);
              });
            },
          })),
          { scheduler: virtual },
        );
        const context = contextFor('infer');
        const out: string[] = [];
        let error: unknown;
        let completed = false;
        generate('p', context).subscribe({ next: (t) => out.push(t), error: (err: unknown) => (error = err), complete: () => (completed = true) });
        virtual.flush();
        const answering = plan.findIndex((step) => step.failAfter === undefined || step.tokens.slice(0, step.failAfter).length > 0);
        if (answering < 0) {
          assert.deepEqual(out, []);
          assert.ok(error instanceof FallbackExhaustedError);
          assert.deepEqual(
            calls,
            plan.map((_, i) => i),
          );
          return;
        }
        const step = plan[answering]!;
        assert.deepEqual(out, step.failAfter === undefined ? step.tokens : step.tokens.slice(0, step.failAfter));
        assert.equal(completed, step.failAfter === undefined);
        assert.deepEqual(
          calls,
          plan.slice(0, answering + 1).map((_, i) => i),
          'no worker after the one that answered',
        );
        assert.equal(context.trace.notes?.['infer.worker'], `w${answering}`);
      }),
      { numRuns: 300 },
    );
  });

  it('names the bad field of invalid arguments', () => {
    assert.throws(
      () => fallback([() => 1, { name: '', work: () => 2 }], { when: 3 as unknown as () => boolean }),
      (err: unknown) =>
        err instanceof InvalidOptionsError && err.issues.some((i) => i.path === 'workers.1.name') && err.issues.some((i) => i.path === 'options.when'),
    );
    assert.throws(
      () => fallback([]),
      (err: unknown) => err instanceof InvalidOptionsError && err.issues.some((i) => i.path === 'workers'),
    );
  });
});

describe('admission: per-tenant token buckets, priority, bounded queue', () => {
  interface Request {
    readonly id: string;
    readonly tenant: string;
    readonly priority?: number;
  }
  const req = (id: string, tenant = 't', priority = 0): Request => ({ id, tenant, priority });
  const ids = (): OperatorFunction<Traced<Request>, string> => map((t) => t.value.id);
  const base = { tenant: (r: Request) => r.tenant, priority: (r: Request) => r.priority ?? 0 };

  it('admits a burst at once, then one request per token interval', () => {
    const ts = scheduler();
    ts.run(({ cold, expectObservable }) => {
      const source = cold('(abcd)|', { a: req('a'), b: req('b'), c: req('c'), d: req('d') });
      const admit = admission({ ...base, rate: { perTenant: 100, burst: 2 }, maxQueue: 10, scheduler: ts });
      expectObservable(source.pipe(admit, ids())).toBe('(ab) 6ms c 9ms (d|)', { a: 'a', b: 'b', c: 'c', d: 'd' });
    });
    assert.equal(ts.actions.length, 0, 'no refill timer survives the run');
  });

  it('keeps tenants apart: one tenant out of tokens does not hold another back', () => {
    scheduler().run(({ cold, expectObservable }) => {
      const source = cold('(xyz)|', { x: req('x1', 'x'), y: req('x2', 'x'), z: req('y1', 'y') });
      const admit = admission({ ...base, rate: { perTenant: 100, burst: 1 }, maxQueue: 10 });
      expectObservable(source.pipe(admit, ids())).toBe('(ab) 6ms (c|)', { a: 'x1', b: 'y1', c: 'x2' });
    });
  });

  it('orders waiting requests by priority, then arrival', () => {
    scheduler().run(({ cold, expectObservable }) => {
      const source = cold('(abcd)|', { a: req('a', 't', 0), b: req('b', 't', 0), c: req('c', 't', 5), d: req('d', 't', 5) });
      const admit = admission({ ...base, rate: { perTenant: 100, burst: 1 }, maxQueue: 10 });
      expectObservable(source.pipe(admit, ids())).toBe('a 9ms c 9ms d 9ms (b|)', { a: 'a', b: 'b', c: 'c', d: 'd' });
    });
  });

  it('rejects beyond maxQueue with AdmissionRejectedError carrying tenant and retryAfter, and accounts for it', () => {
    const rejected: RejectEvent<Request>[] = [];
    const stats = new StageStats();
    scheduler().run(({ cold, expectObservable }) => {
      const source = cold('(abcd)|', { a: req('a'), b: req('b'), c: req('c'), d: req('d') });
      const admit = admission({ ...base, name: 'door', rate: { perTenant: 100, burst: 2 }, maxQueue: 1, stats, onReject: (e) => rejected.push(e) });
      expectObservable(source.pipe(admit, ids())).toBe('(ab) 6ms (c|)', { a: 'a', b: 'b', c: 'c' });
    });
    assert.deepEqual(
      rejected.map((e) => [e.value.id, e.tenant, e.stage]),
      [['d', 't', 'door']],
    );
    const error = rejected[0]!.error;
    assert.ok(error instanceof AdmissionRejectedError);
    assert.equal(error.code, 'ADMISSION_REJECTED');
    assert.equal(error.reason, 'queue-full');
    assert.equal(error.retryAfter, 20, 'c waits for the token at 10, d for the next at 20');
    assert.equal(stats.received, 4);
    assert.equal(stats.delivered, 3);
    assert.equal(stats.shed['buffer-full'], 1);
    assert.equal(stats.received, stats.delivered + stats.shedTotal + stats.failed);
  });

  it('a throwing onReject is reported as RxJS reports unhandled errors; the stream and its accounting go on', async () => {
    const reported: unknown[] = [];
    const previous = rxjsConfig.onUnhandledError;
    rxjsConfig.onUnhandledError = (err) => reported.push(err);
    try {
      const stats = new StageStats();
      const out: string[] = [];
      scheduler().run(({ cold, flush }) => {
        const source = cold('(abcd)|', { a: req('a'), b: req('b'), c: req('c'), d: req('d') });
        const admit = admission({
          ...base,
          rate: { perTenant: 100, burst: 2 },
          maxQueue: 1,
          stats,
          onReject: () => {
            throw new Error('hook failed');
          },
        });
        source.pipe(admit, ids()).subscribe((id) => out.push(id));
        flush();
      });
      await new Promise((resolve) => setTimeout(resolve, 5));
      assert.deepEqual(out, ['a', 'b', 'c']);
      assert.deepEqual(
        reported.map((err) => (err as Error).message),
        ['hook failed'],
      );
      assert.equal(stats.received, stats.delivered + stats.shedTotal + stats.failed);
    } finally {
      rxjsConfig.onUnhandledError = previous;
    }
  });

  it('evicts a waiting request of lower priority for an arriving one of higher priority', () => {
    const rejected: RejectEvent<Request>[] = [];
    scheduler().run(({ cold, expectObservable }) => {
      const source = cold('(abc)|', { a: req('a'), b: req('b', 't', 0), c: req('c', 't', 9) });
      const admit = admission({ ...base, rate: { perTenant: 100, burst: 1 }, maxQueue: 1, onReject: (e) => rejected.push(e) });
      expectObservable(source.pipe(admit, ids())).toBe('a 9ms (c|)', { a: 'a', c: 'c' });
    });
    assert.deepEqual(
      rejected.map((e) => [e.value.id, e.error.reason, e.error.retryAfter]),
      [['b', 'evicted', 20]],
    );
  });

  it('keeps the demand protocol: emits only what downstream asks for, so a pausing stage after it never overflows', () => {
    const stats = new StageStats();
    scheduler().run(({ cold, expectObservable }) => {
      const source = fromIterable([req('a'), req('b'), req('c')]);
      const admit = admission({ ...base, rate: { perTenant: 1000, burst: 10 }, maxQueue: 3, stats });
      const slow = stage((r: Request) => cold('-----(x|)', { x: r.id }), { name: 'slow', capacity: 1 });
      expectObservable(source.pipe(admit, slow, values())).toBe('-----a----b----(c|)');
    });
    assert.equal(stats.delivered, 3);
    assert.equal(stats.shedTotal, 0);
  });

  it('notes each admitted request’s wait in its trace', () => {
    const waits: unknown[] = [];
    scheduler().run(({ cold, expectObservable }) => {
      const source = cold('(ab)|', { a: req('a'), b: req('b') });
      const admit = admission({ ...base, name: 'door', rate: { perTenant: 50, burst: 1 }, maxQueue: 5 });
      expectObservable(
        source.pipe(
          admit,
          map((t) => {
            waits.push(t.trace.notes?.['door.wait']);
            return t.value.id;
          }),
        ),
      ).toBe('a 19ms (b|)', { a: 'a', b: 'b' });
    });
    assert.deepEqual(waits, [0, 20]);
  });

  it('names the bad field of invalid options', () => {
    assert.throws(
      () => admission({ tenant: () => 't', rate: { perTenant: 0, burst: 1 }, maxQueue: -1 }),
      (err: unknown) =>
        err instanceof InvalidOptionsError && err.issues.some((i) => i.path === 'rate.perTenant') && err.issues.some((i) => i.path === 'maxQueue'),
    );
  });
});

describe('route: weighted split, canary, shadow', () => {
  const constant = (name: string) => () => name;
  const variants = [
    { name: 'v1', weight: 7, worker: constant('v1') },
    { name: 'v2', weight: 3, worker: constant('v2') },
  ];

  /** Routes `n` inputs and counts the decisions noted in their traces. */
  function split(generate: (value: string, context: StageContext) => Observable<string>, n: number): Map<string, number> {
    const counts = new Map<string, number>();
    for (let i = 0; i < n; i++) {
      const context = contextFor('infer');
      let out: string | undefined;
      generate(`user-${i}`, context).subscribe((v) => (out = v));
      const decision = context.trace.notes?.['infer.route'];
      assert.equal(out, decision, 'the answer comes from the worker the trace names');
      counts.set(String(decision), (counts.get(String(decision)) ?? 0) + 1);
    }
    return counts;
  }

  it('splits by weight within 2 % over 20 000 keys, the same way every time', () => {
    const generate = route({ variants, key: (v: string) => v });
    const first = split(generate, 20_000);
    assert.ok(Math.abs(first.get('v1')! / 20_000 - 0.7) < 0.02, `v1 share ${first.get('v1')! / 20_000}`);
    assert.ok(Math.abs(first.get('v2')! / 20_000 - 0.3) < 0.02, `v2 share ${first.get('v2')! / 20_000}`);
    assert.deepEqual(split(route({ variants, key: (v: string) => v }), 20_000), first, 'deterministic by key');
  });

  it('sends a key to the same variant every time (sticky)', () => {
    const generate = route({ variants, key: (v: string) => v.split(':')[0]! });
    const decisions = ['alice:1', 'alice:2', 'alice:3'].map((v) => {
      const context = contextFor('infer');
      generate(v, context).subscribe();
      return context.trace.notes?.['infer.route'];
    });
    assert.equal(new Set(decisions).size, 1);
  });

  it('takes the canary percentage first, within 1 % over 20 000 keys', () => {
    const generate = route({ variants, canary: { worker: constant('canary'), percent: 5 }, key: (v: string) => v });
    const counts = split(generate, 20_000);
    assert.ok(Math.abs(counts.get('canary')! / 20_000 - 0.05) < 0.01, `canary share ${counts.get('canary')! / 20_000}`);
    const rest = counts.get('v1')! + counts.get('v2')!;
    assert.ok(Math.abs(counts.get('v1')! / rest - 0.7) < 0.02, 'the split of the rest keeps its weights');
  });

  /** Routes each key once and counts the decisions noted in their traces. */
  function splitKeys(generate: (value: string, context: StageContext) => Observable<string>, keys: readonly string[]): Map<string, number> {
    const counts = new Map<string, number>();
    for (const key of keys) {
      const context = contextFor('infer');
      generate(key, context).subscribe();
      const decision = String(context.trace.notes?.['infer.route']);
      counts.set(decision, (counts.get(decision) ?? 0) + 1);
    }
    return counts;
  }

  it('keys as short and alike as u0…u199 still split by the weights: a 10 % canary near 10 %, a 3:1 split near 3:1', () => {
    const keys = Array.from({ length: 200 }, (_, i) => `u${i}`);
    const counts = splitKeys(
      route({
        variants: [
          { name: 'v1', weight: 3, worker: constant('v1') },
          { name: 'v2', weight: 1, worker: constant('v2') },
        ],
        canary: { worker: constant('canary'), percent: 10 },
        key: (v: string) => v,
      }),
      keys,
    );
    const canary = (counts.get('canary') ?? 0) / 200;
    assert.ok(canary >= 0.04 && canary <= 0.16, `canary share ${canary}`);
    const v1 = (counts.get('v1') ?? 0) / ((counts.get('v1') ?? 0) + (counts.get('v2') ?? 0));
    assert.ok(v1 >= 0.67 && v1 <= 0.83, `v1 share of the rest ${v1}`);
  });

  it('keeps every share within a few percent of its target over short and similar key sets (fast-check)', () => {
    // Key sets as services make them: a short prefix or suffix around consecutive numbers, in decimal, base 36 or zero-padded.
    const keySet = fc.record({
      prefix: fc.constantFrom('', 'u', 'user-', 'k:', 'session_', 'a'),
      suffix: fc.constantFrom('', 'x', '@example.com', '-eu'),
      format: fc.constantFrom<'decimal' | 'base36' | 'padded' | 'hex'>('decimal', 'base36', 'padded', 'hex'),
      start: fc.nat({ max: 1_000_000 }),
      size: fc.integer({ min: 3_000, max: 5_000 }),
    });
    const split = fc.record({
      weights: fc.array(fc.integer({ min: 1, max: 9 }), { minLength: 2, maxLength: 4 }),
      canary: fc.option(fc.integer({ min: 1, max: 50 }), { nil: undefined }),
    });
    fc.assert(
      fc.property(keySet, split, ({ prefix, suffix, format, start, size }, { weights, canary }) => {
        const number = (i: number) =>
          format === 'decimal' ? String(i) : format === 'base36' ? i.toString(36) : format === 'hex' ? i.toString(16) : String(i).padStart(8, '0');
        const keys = Array.from({ length: size }, (_, i) => `${prefix}${number(start + i)}${suffix}`);
        const variants = weights.map((weight, i) => ({ name: `v${i}`, weight, worker: constant(`v${i}`) }));
        const counts = splitKeys(
          route({ variants, ...(canary !== undefined && { canary: { worker: constant('canary'), percent: canary } }), key: (v: string) => v }),
          keys,
        );
        const total = weights.reduce((a, b) => a + b, 0);
        const rest = 1 - (canary ?? 0) / 100;
        const targets = [
          ...variants.map((v) => [v.name, (rest * v.weight) / total] as const),
          ...(canary === undefined ? [] : [['canary', canary / 100] as const]),
        ];
        for (const [name, target] of targets) {
          const share = (counts.get(name) ?? 0) / size;
          // Five standard deviations of a fair draw: never reached by a uniform hash, far below the skew of one that is not.
          const tolerance = 5 * Math.sqrt((target * (1 - target)) / size);
          assert.ok(
            Math.abs(share - target) <= tolerance,
            `${name}: ${share.toFixed(4)} for ${target.toFixed(4)} (± ${tolerance.toFixed(4)}), keys ${keys[0]}…`,
          );
        }
      }),
      { numRuns: 40 },
    );
  });

  it('splits without a key by a seeded random: reproducible', () => {
    const a = split(route({ variants, random: seededRandom(3) }), 5_000);
    const b = split(route({ variants, random: seededRandom(3) }), 5_000);
    assert.deepEqual(a, b);
    assert.ok(Math.abs(a.get('v1')! / 5_000 - 0.7) < 0.03);
  });

  it('runs the shadow beside the primary without delaying it, and records both runs', () => {
    const ts = scheduler();
    const reports: ShadowReport<string, string>[] = [];
    let notes: Record<string, string | number | boolean> | undefined;
    ts.run(({ cold, expectObservable, expectSubscriptions }) => {
      const primary = cold('-a-b|');
      const shadow = cold('---------x|');
      const generate = route<string, string>({
        variants: [{ name: 'main', weight: 1, worker: () => primary }],
        shadow: { name: 'candidate', work: () => shadow },
        onShadow: (r) => reports.push(r),
        scheduler: ts,
      });
      const out = cold('p|').pipe(
        stage(generate, { name: 'infer' }),
        map((t) => {
          notes = t.trace.notes;
          return t.value;
        }),
      );
      expectObservable(out).toBe('-a-b|');
      // The shadow runs on after the primary completed.
      expectSubscriptions(shadow.subscriptions).toBe('^---------!');
    });
    assert.deepEqual(notes, {
      'infer.route': 'main',
      'infer.shadow': 'candidate',
      'infer.route.latency': 4,
      'infer.shadow.latency': 10,
      'infer.shadow.outcome': 'completed',
      'infer.shadow.outputs': 1,
    });
    assert.equal(reports.length, 1);
    assert.deepEqual(reports[0]!.primary, { worker: 'main', outputs: ['a', 'b'], latency: 4 });
    assert.deepEqual(reports[0]!.shadow, { worker: 'candidate', outputs: ['x'], latency: 10 });
  });

  it('never fails the element for a failing shadow', () => {
    const context = contextFor('infer');
    scheduler().run(({ cold, expectObservable }) => {
      const generate = route({ variants: [{ name: 'main', weight: 1, worker: () => cold('-a|') }], shadow: () => cold('#') });
      expectObservable(generate('p', context)).toBe('-a|');
    });
    assert.equal(context.trace.notes?.['infer.shadow.outcome'], 'failed');
  });

  it('names the bad field of invalid options', () => {
    assert.throws(
      () => route({ variants: [{ name: 'a', weight: -1, worker: () => 1 }], canary: { worker: () => 1, percent: 150 } }),
      (err: unknown) =>
        err instanceof InvalidOptionsError && err.issues.some((i) => i.path === 'variants.0.weight') && err.issues.some((i) => i.path === 'canary.percent'),
    );
  });
});
