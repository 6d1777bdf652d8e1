import { lazySchema } from '../../core/zod.js';
import { functionSchema, parseOptions, positiveInt } from '../../flow/options.js';
import { EmbeddingCache } from '../rag/embedding-cache.js';
import { EmbedderOutputError } from '../rag/errors.js';
import { stage, type StageOperator, type StageOptions, type WorkResult } from '../../../operators/stage.js';

/** Turns texts into vectors, one per text, in order. Must honour `signal` (unsubscribe, timeout). */
export type Embedder = (texts: string[], signal: AbortSignal) => Promise<Float32Array[]>;

/** What `embed` emits: the input, the text that was embedded and its vector. */
export interface Embedded<I> {
  readonly input: I;
  readonly text: string;
  /** Shared with the cache when it came from there: do not mutate. */
  readonly vector: Float32Array;
}

export interface EmbedOptions<I> extends StageOptions<I> {
  embedder: Embedder;
  /** Selects the text to embed. Default: the value itself, which must then be a string. */
  text?: (value: I) => string;
  /**
   * An LRU cache of vectors by text: `{ capacity }`, or an `EmbeddingCache` to read its
   * counters or share it between stages using the same embedder.
   */
  cache?: { capacity: number } | EmbeddingCache;
}

const embedOptionsSchema = lazySchema((z) =>
  z
    .object({
      embedder: functionSchema<Embedder>(),
      text: functionSchema<(value: unknown) => string>().optional(),
      cache: z
        .union([z.instanceof(EmbeddingCache), z.object({ capacity: positiveInt('cache.capacity') }).strict()], {
          error: 'cache must be { capacity } or an EmbeddingCache',
        })
        .optional(),
    })
    .strict(),
);

/**
 * Embeds each element's text with an injected `embedder`, through an optional LRU
 * cache, as a stage (bounded buffer, policies, cancellation, traces).
 *
 * ```
 * source:  --a--b--a--|
 * embed({ embedder, cache: { capacity: 100 } })
 * output:  --A--B--A--|      A = { input: a, text: a, vector }; the second `a` is a cache hit
 * ```
 *
 * Each element's trace notes `embed.cache` = `hit` or `miss` (with a cache); a hit
 * skips the embedder and is emitted synchronously. The cache counts `hits`, `misses`
 * and `evictions`. The embedder is called with one text per element and the
 * element's `AbortSignal`; its output is checked (one finite `Float32Array` per
 * text, every vector of one dimension) and a bad one fails the element with
 * `EmbedderOutputError` (a `SluiceError`, so the stage passes it on as it is).
 *
 * ## Example
 * ```ts
 * const cache = new EmbeddingCache(10_000);
 * questions.pipe(
 *   embed({ embedder: (texts, signal) => model.embed(texts, { signal }), cache, concurrency: 4 }),
 *   retrieve({ index, k: 5 }),
 * );
 * ```
 *
 * Invalid options throw `InvalidOptionsError` naming each bad field.
 *
 * @see retrieve; `EmbeddingCache`.
 */
export function embed(options: EmbedOptions<string> & { text?: undefined }): StageOperator<string, Embedded<string>>;
export function embed<I>(options: EmbedOptions<I> & { text: (value: I) => string }): StageOperator<I, Embedded<I>>;
export function embed<I>(options: EmbedOptions<I>): StageOperator<I, Embedded<I>> {
  const { embedder, text, cache, ...stageOptions } = options ?? ({} as EmbedOptions<I>);
  const name = stageOptions.name ?? 'embed';
  parseOptions(embedOptionsSchema(), { embedder, text, cache }, `embed "${name}" options`);
  const store = cache === undefined ? undefined : cache instanceof EmbeddingCache ? cache : new EmbeddingCache(cache.capacity);
  const select = text ?? ((value: I) => value as unknown as string);
  let dim: number | undefined;

  const check = (vectors: unknown): Float32Array => {
    if (!Array.isArray(vectors) || vectors.length !== 1) {
      throw new EmbedderOutputError(name, `returned ${Array.isArray(vectors) ? `${vectors.length} vectors` : String(vectors)} for 1 text`);
    }
    const vector: unknown = vectors[0];
    if (!(vector instanceof Float32Array) || vector.length === 0) throw new EmbedderOutputError(name, 'returned something other than a non-empty Float32Array');
    if (dim !== undefined && vector.length !== dim)
      throw new EmbedderOutputError(name, `returned a vector of dimension ${vector.length} after ones of dimension ${dim}`);
    for (let j = 0; j < vector.length; j++) {
      if (!Number.isFinite(vector[j])) throw new EmbedderOutputError(name, `returned a vector whose component ${j} is ${vector[j]}`);
    }
    dim = vector.length;
    return vector;
  };

  return stage<I, Embedded<I>>(
    (value, context): WorkResult<Embedded<I>> => {
      const input = select(value);
      if (typeof input !== 'string') throw new TypeError(`the text to embed must be a string, got ${typeof input}${text ? '' : ' (pass a `text` selector)'}`);
      if (store !== undefined) {
        const cached = store.get(input);
        context.note('cache', cached === undefined ? 'miss' : 'hit');
        if (cached !== undefined) return { input: value, text: input, vector: cached };
      }
      return embedder([input], context.signal).then((vectors) => {
        const vector = check(vectors);
        store?.set(input, vector);
        return { input: value, text: input, vector };
      });
    },
    { ...stageOptions, name },
  );
}
