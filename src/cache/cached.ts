import { lazySchema } from '../core/zod.js';
import { Observable, defer, from, of, switchMap } from 'rxjs';
import { fromIterable } from '../flow/sources.js';
import { functionSchema, parseOptions } from '../flow/options.js';
import { InvalidOptionsError, SluiceError } from '../core/errors.js';
import { CacheStats } from './stats.js';
import { LruCache, type LruCacheOptions } from './lru.js';
import { SemanticCache, type SemanticCacheOptions } from './semantic.js';
import { Flight, SingleFlight, type FlightOutcome, type FlightWork } from './flight.js';
import { cacheKey, hashKey, isCacheRequest } from './key.js';
import { estimateSize } from './size.js';
import type { StageContext, Work, WorkResult } from '../flow/work.js';

/**
 * A complete answer as the caches hold it: one output (`streamed: false`, the work
 * returned a value or a Promise) or every output of a stream that completed, in
 * order (`streamed: true`, the work returned an Observable or an AsyncIterable).
 */
export interface CachedAnswer<O> {
  readonly streamed: boolean;
  readonly items: readonly O[];
}

/** Response-cache options of {@link cached}; `sizeOf` measures one output (one token, one answer). */
export type ResponseCacheOptions<O> = Omit<LruCacheOptions<CachedAnswer<O>>, 'sizeOf' | 'stats'> & {
  /** Measures one output in bytes (default `estimateSize`). */
  sizeOf?: (output: O) => number;
};

/** Semantic-cache options of {@link cached}; `sizeOf` measures one output. */
export type SemanticOptions<O> = Omit<SemanticCacheOptions<CachedAnswer<O>>, 'sizeOf' | 'stats'> & {
  /** Measures one output in bytes (default `estimateSize`). */
  sizeOf?: (output: O) => number;
};

/** What a cache decided for one request, noted in its trace as `"<stage>.cache"`. */
export type CacheOutcome = 'hit' | 'semantic-hit' | 'miss' | 'joined';

/** Options of `cached`: the response cache, the semantic cache and single flight, each optional. */
export interface CachedOptions<I, O> {
  /** Exact-match cache (LRU, bounded in bytes, optional TTL): options, or an `LruCache` to share between works. */
  response?: ResponseCacheOptions<O> | LruCache<CachedAnswer<O>>;
  /** Similarity cache over prompt embeddings: options, or a `SemanticCache` to share. */
  semantic?: SemanticOptions<O> | SemanticCache<CachedAnswer<O>>;
  /** Share one inference between concurrent requests with the same key: `true`, or a `SingleFlight` to share. */
  singleFlight?: boolean | SingleFlight<O>;
  /**
   * The request's key. Default: {@link cacheKey} for a {@link CacheRequest}-shaped value
   * (model, prompt or messages, params — nothing else), else the sha-256 of the
   * whole value's canonical JSON.
   */
  key?: (value: I) => string;
  /** The text the semantic cache embeds. Default: a string value itself, or a request's prompt or messages. */
  text?: (value: I) => string;
  /**
   * Semantic entries match only within one scope. Default: the model and params of a
   * request (an answer at temperature 1 is no answer for temperature 0), else one scope.
   */
  scope?: (value: I) => string;
  /** Counters (hits, semanticHits, misses, joins) and, for caches built here, their evictions and sizes. */
  stats?: CacheStats;
}

const cachedOptionsSchema = lazySchema((z) =>
  z
    .object({
      response: z.unknown().optional(),
      semantic: z.unknown().optional(),
      singleFlight: z
        .custom<boolean | SingleFlight<unknown>>((v) => typeof v === 'boolean' || v instanceof SingleFlight, {
          error: 'singleFlight must be true, false or a SingleFlight',
        })
        .optional(),
      key: functionSchema<(value: unknown) => string>().optional(),
      text: functionSchema<(value: unknown) => string>().optional(),
      scope: functionSchema<(value: unknown) => string>().optional(),
      stats: z.instanceof(CacheStats, { error: 'stats must be a CacheStats' }).optional(),
    })
    .strict()
    .refine((o) => o.response !== undefined || o.semantic !== undefined || (o.singleFlight !== undefined && o.singleFlight !== false), {
      error: 'nothing to do: give response, semantic or singleFlight',
    }),
);

/**
 * Wraps a stage's work with caches: an exact response cache, a semantic cache, and
 * single-flight sharing of identical requests in flight. Use the result as any work:
 * `stage(cached(generate, options), stageOptions)`.
 *
 * For each request, in order:
 * 1. **response cache** — the key's answer, if stored and live: `hit`;
 * 2. **single-flight** — an identical request is in flight: share it, `joined`
 *    (every token from the first one, then live);
 * 3. **semantic cache** — the prompt embeds close enough (≥ `threshold`) to a stored
 *    one: that answer, `semantic-hit`, with the similarity;
 * 4. otherwise the work runs: `miss`.
 *
 * The decision is noted in the element's trace (`"<stage>.cache"`, and
 * `"<stage>.similarity"` for a semantic hit) and counted in `stats`. A streamed
 * answer (Observable or AsyncIterable of tokens) is stored only once it completes —
 * never one that failed or was cancelled — and a hit replays it as a paced stream
 * of the same tokens. Shared work gets its own `signal`, which fires only when every
 * request waiting on it has gone; the rest of the context (trace, notes) is the first
 * request's.
 *
 * ```
 * requests:  --a----a--------a--|
 * cached(llm, { response })
 * work runs: --a--------------------     (one call; the two later ones are hits)
 * notes:       miss  hit      hit
 * ```
 *
 * ## Example
 * ```ts
 * const stats = new CacheStats();
 * const answer = cached(generate, {
 *   response: { maxBytes: 64 << 20, ttl: 10 * 60_000 },
 *   semantic: { embed: (text, signal) => embedder.embed(text, signal), threshold: 0.95, maxEntries: 2000 },
 *   singleFlight: true,
 *   stats,
 * });
 * requests.pipe(stage(answer, { name: 'infer', concurrency: 8 }));
 * ```
 *
 * Invalid options throw `InvalidOptionsError` naming each bad field (`response.maxBytes`...).
 *
 * @see LruCache, SemanticCache, SingleFlight, CacheStats, cacheKey.
 */
export function cached<I, O>(work: Work<I, O>, options: CachedOptions<I, O>): Work<I, O> {
  const parsed = parseOptions(cachedOptionsSchema(), options, 'cached options');
  const stats = parsed.stats ?? new CacheStats();
  const response = nested('response', parsed.response, LruCache, (o: ResponseCacheOptions<O>) => new LruCache({ ...o, sizeOf: answerSize(o.sizeOf), stats }));
  const semantic = nested(
    'semantic',
    parsed.semantic,
    SemanticCache,
    (o: SemanticOptions<O>) => new SemanticCache({ ...o, sizeOf: answerSize(o.sizeOf), stats }),
  );
  const flights =
    parsed.singleFlight instanceof SingleFlight ? (parsed.singleFlight as SingleFlight<O>) : parsed.singleFlight ? new SingleFlight<O>() : undefined;
  const keyOf = (options.key ?? defaultKey) as (value: I) => string;
  const textOf = (options.text ?? defaultText) as (value: I) => string;
  const scopeOf = (options.scope ?? defaultScope) as (value: I) => string;
  const needsKey = response !== undefined || flights !== undefined;

  const wrapped = (value: I, context: StageContext): WorkResult<O> => {
    const key = needsKey ? keyOf(value) : '';
    const stored = response?.get(key);
    if (stored !== undefined) {
      stats.hits++;
      context.note('cache', 'hit' satisfies CacheOutcome);
      // A Flow: the stage that runs us paces the replay by its own demand.
      return stored.streamed ? fromIterable(stored.items) : (stored.items[0] as O);
    }
    const meta: Resolution = { streamed: false, vector: undefined, semanticHit: false };
    const text = semantic === undefined ? '' : textOf(value);
    const scope = semantic === undefined ? '' : scopeOf(value);
    const resolve: FlightWork<O> = (signal) => {
      const run = (): Observable<O> => {
        stats.misses++;
        context.note('cache', 'miss' satisfies CacheOutcome);
        return toObservable(work(value, shareContext(context, signal)), meta);
      };
      if (semantic === undefined) return defer(run);
      return from(semantic.lookup(text, { scope, signal })).pipe(
        switchMap((found) => {
          meta.vector = found.vector;
          if (found.hit === undefined) return run();
          meta.semanticHit = true;
          meta.streamed = found.hit.value.streamed;
          stats.semanticHits++;
          context.note('cache', 'semantic-hit' satisfies CacheOutcome);
          context.note('similarity', found.hit.similarity);
          return from(found.hit.value.items);
        }),
      );
    };
    const onEnd = (outcome: FlightOutcome<O>): void => {
      // Only a complete answer the work produced for this request is worth keeping.
      if (outcome.kind !== 'complete' || meta.semanticHit) return;
      const answer: CachedAnswer<O> = { streamed: meta.streamed, items: outcome.items };
      response?.set(key, answer);
      if (semantic !== undefined && meta.vector !== undefined) semantic.store(meta.vector, answer, scope);
    };
    if (flights === undefined) return new Flight(resolve, onEnd).output;
    return flights.join(key, resolve, {
      onJoin: () => {
        stats.joins++;
        context.note('cache', 'joined' satisfies CacheOutcome);
      },
      onEnd,
    });
  };
  // The stage names itself after its work: keep the wrapped work's name.
  Object.defineProperty(wrapped, 'name', { value: work.name });
  return wrapped;
}

interface Resolution {
  streamed: boolean;
  vector: Float32Array | undefined;
  semanticHit: boolean;
}

function nested<T, P>(field: string, given: unknown, instance: abstract new (...args: never[]) => T, build: (options: P) => T): T | undefined {
  if (given === undefined || given instanceof instance) return given as T | undefined;
  if (typeof given !== 'object' || given === null) {
    throw new InvalidOptionsError('cached options', [{ path: field, message: `${field} must be options or a ${instance.name}` }]);
  }
  try {
    return build(given as P);
  } catch (err) {
    if (!(err instanceof InvalidOptionsError)) throw err;
    // The cache's own validation knows the field but not where it sits in ours.
    throw new InvalidOptionsError(
      'cached options',
      err.issues.map((issue) => ({ path: issue.path ? `${field}.${issue.path}` : field, message: issue.message })),
    );
  }
}

function answerSize<O>(sizeOf: ((output: O) => number) | undefined): (answer: CachedAnswer<O>) => number {
  const measure = sizeOf ?? estimateSize;
  return (answer) => {
    let total = 16;
    for (const item of answer.items) total += 8 + measure(item);
    return total;
  };
}

function shareContext(context: StageContext, signal: AbortSignal): StageContext {
  return { stage: context.stage, seq: context.seq, trace: context.trace, signal, note: (key, value) => context.note(key, value) };
}

function defaultKey(value: unknown): string {
  return isCacheRequest(value) ? cacheKey(value) : hashKey(value);
}

function defaultText(value: unknown): string {
  if (typeof value === 'string') return value;
  if (isCacheRequest(value)) return value.prompt ?? value.messages!.map((m) => `${m.role}: ${m.content}`).join('\n');
  throw new SluiceError('CACHE_TEXT', 'The semantic cache cannot tell which text of this request to embed.', {
    hint: 'Pass `text: (value) => ...` to cached(), or send strings or { model, prompt | messages } requests.',
  });
}

function defaultScope(value: unknown): string {
  return isCacheRequest(value) ? hashKey({ model: value.model, params: value.params ?? {} }) : '';
}

/** The work's result as an Observable, noting in `meta` whether it was a stream. */
function toObservable<O>(result: WorkResult<O>, meta: Resolution): Observable<O> {
  if (result instanceof Observable) {
    meta.streamed = true;
    return result;
  }
  if (result !== null && (typeof result === 'object' || typeof result === 'function')) {
    if (typeof (result as PromiseLike<O>).then === 'function') return from(result as PromiseLike<O>);
    if (typeof (result as AsyncIterable<O>)[Symbol.asyncIterator] === 'function') {
      meta.streamed = true;
      return fromAsync(result as AsyncIterable<O>);
    }
  }
  return of(result as O);
}

/** Reads an AsyncIterable eagerly; unsubscribing calls `return()` at once, not after the next item. */
function fromAsync<O>(iterable: AsyncIterable<O>): Observable<O> {
  return new Observable<O>((subscriber) => {
    const iterator = iterable[Symbol.asyncIterator]();
    let finished = false;
    const step = (): void => {
      iterator.next().then(
        (result) => {
          if (subscriber.closed) return;
          if (result.done) {
            finished = true;
            subscriber.complete();
            return;
          }
          subscriber.next(result.value);
          step();
        },
        (error: unknown) => {
          finished = true;
          subscriber.error(error);
        },
      );
    };
    step();
    return () => {
      if (!finished) iterator.return?.()?.then(undefined, () => {});
    };
  });
}
