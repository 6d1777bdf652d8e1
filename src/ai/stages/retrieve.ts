import { lazySchema, literalOr } from '../../core/zod.js';
import { functionSchema, parseOptions, positiveInt } from '../../flow/options.js';
import { VectorIndex } from '../rag/vector-index.js';
import type { PassageMetadata, RetrievedPassage } from '../rag/passage.js';
import { LexicalIndex } from '../rag/lexical-index.js';
import { MeaningIndex } from '../rag/meaning-index.js';
import { LEXICAL_GRANULARITIES, RETRIEVAL_MODES, retrievePassages, type LexicalGranularity, type RetrievalMode } from '../rag/retriever.js';
import type { FeedbackOptions } from '../rag/query-expansion.js';
import { supportsAnswer, type AbstainOptions, type Evidence } from '../rag/abstain.js';
import { stage, type StageOperator, type StageOptions } from '../../../operators/stage.js';

/** What `retrieve` emits: the input and the passages found for it, best first. */
export interface Retrieved<I> {
  readonly input: I;
  readonly passages: readonly RetrievedPassage[];
  /** What the passages found tell of whether the documents answer the query. */
  readonly evidence: Evidence;
  /** True when `abstain` judged the evidence too weak: then `passages` is empty. */
  readonly abstained: boolean;
}

export interface RetrieveOptions<I, M extends PassageMetadata = PassageMetadata> extends StageOptions<I> {
  /** Passage vectors, with each passage's text and source as metadata. */
  index: VectorIndex<M>;
  /** Passages per query at most. */
  k: number;
  /** Passages below this cosine similarity are left out. */
  minScore?: number;
  /** Keeps only passages whose metadata passes (e.g. a tenant or a document type). */
  filter?: (metadata: M) => boolean;
  /** Selects the query vector. Default: the value's `vector` (what `embed` emits). */
  query?: (value: I) => ArrayLike<number>;
  /** BM25 over the same passages (e.g. `LexicalIndex.of(index.entries())`): lexical ranking and evidence. */
  lexical?: LexicalIndex<M>;
  /** The rankings used: `hybrid` (both, fused), `dense` or `lexical`. Default `hybrid` with `lexical`, else `dense`. */
  retrieval?: RetrievalMode;
  /** The passages' word-vector meanings (`MeaningIndex`): evidence that the corpus speaks of what a question asks in other words. Default: none. */
  meaning?: MeaningIndex;
  /** Selects the query text the lexical index searches. Default: the value's `text` (what `embed` emits). */
  text?: (value: I) => string;
  /**
   * How much the dense ranking's scores count in hybrid fusion, BM25's counting 1. Default 0.5: the
   * generated embedder hashes words; give a real embedding model 1 or more.
   */
  denseWeight?: number;
  /** What BM25 ranks: single `passage`s, heading `section`s (each standing for its best-covered passages), or `both`, fused. Default `passage`. */
  granularity?: LexicalGranularity;
  /** Pseudo-relevance feedback (RM3): search BM25 again with the words the first passages share, at a lower weight. Default: none. */
  feedback?: FeedbackOptions;
  /** Return no passage when the evidence is too weak (`supportsAnswer`); `true` for the default thresholds. Default: never. */
  abstain?: boolean | AbstainOptions;
}

/** What BM25 ranks (`retrieve`'s and `ragWorker`'s `granularity`). @internal */
export const granularitySchema = lazySchema((z) => z.enum(LEXICAL_GRANULARITIES, { error: `granularity must be one of ${LEXICAL_GRANULARITIES.join(', ')}` }));

/** Pseudo-relevance feedback (`retrieve`'s and `ragWorker`'s `feedback`). @internal */
export const feedbackSchema = lazySchema((z) =>
  z
    .object({
      passages: positiveInt('feedback.passages'),
      terms: positiveInt('feedback.terms'),
      weight: z.number({ error: 'feedback.weight must be a number' }).positive({ error: 'feedback.weight must be > 0' }),
    })
    .strict(),
);

const retrieveOptionsSchema = lazySchema((z) =>
  z
    .object({
      index: z.instanceof(VectorIndex, { error: 'index must be a VectorIndex' }),
      k: positiveInt('k'),
      minScore: z.number({ error: 'minScore must be a number' }).min(-1).max(1).optional(),
      filter: functionSchema<(metadata: unknown) => boolean>().optional(),
      query: functionSchema<(value: unknown) => ArrayLike<number>>().optional(),
      lexical: z.instanceof(LexicalIndex, { error: 'lexical must be a LexicalIndex' }).optional(),
      meaning: z.custom<MeaningIndex>((v) => v instanceof MeaningIndex, { error: 'meaning must be a MeaningIndex' }).optional(),
      retrieval: z.enum(RETRIEVAL_MODES, { error: `retrieval must be one of ${RETRIEVAL_MODES.join(', ')}` }).optional(),
      text: functionSchema<(value: unknown) => string>().optional(),
      denseWeight: z.number({ error: 'denseWeight must be a number' }).positive({ error: 'denseWeight must be > 0' }).optional(),
      granularity: granularitySchema().optional(),
      feedback: feedbackSchema().optional(),
      abstain: literalOr(
        [true, false],
        z
          .object({
            coverage: z.number().min(0).max(1).optional(),
            passageCoverage: z.number().min(0).max(1).optional(),
            partialCoverage: z.number().min(0).max(1).optional(),
            dense: z.number().optional(),
            specificity: z.number().min(0).optional(),
            specificCoverage: z.number().min(0).max(1).optional(),
            meaning: z.number().min(-1).max(1).optional(),
            meaningCoverage: z.number().min(0).max(1).optional(),
            names: z.boolean().optional(),
          })
          .strict(),
      ).optional(),
    })
    .strict()
    .refine((o) => o.lexical !== undefined || (o.retrieval ?? 'dense') === 'dense', {
      error: 'lexical and hybrid retrieval need a lexical index',
      path: ['lexical'],
    }),
);

/**
 * Finds the `k` passages most similar to each element's query vector in a
 * `VectorIndex`, as a stage (bounded buffer, policies, cancellation, traces).
 *
 * ```
 * source:  --q1--q2--|          (each carrying a query vector, e.g. from embed)
 * retrieve({ index, k: 3 })
 * output:  --R1--R2--|          R = { input: q, passages: [{ id, score, text, source }, ...] }, best first
 * ```
 *
 * Search is exact (every passage is scored) and synchronous, its time growing with
 * the index (figures in docs/ai.md), so a large index is best given its own stage
 * with a small capacity. Each trace notes `retrieve.hits` (passages returned) and
 * `retrieve.top` (the best score). A query vector of the wrong dimension fails the
 * element with `InvalidVectorError`; one of all zeros (an embedder found nothing it
 * knows in the question, e.g. punctuation only) retrieves no passages.
 *
 * ## Example
 * ```ts
 * questions.pipe(
 *   embed({ embedder }),
 *   retrieve({ index, k: 5, minScore: 0.25, filter: (m) => m.source.startsWith('docs/') }),
 *   assemble({ template: 'Context:\n{{context}}\n\nQuestion: {{question}}', ... }),
 * );
 * ```
 *
 * Invalid options throw `InvalidOptionsError` naming each bad field.
 *
 * @see withCitations to turn the passages into a cited context block; embed; assemble.
 */
export function retrieve<I extends { readonly vector: ArrayLike<number> }, M extends PassageMetadata = PassageMetadata>(
  options: RetrieveOptions<I, M> & { query?: undefined },
): StageOperator<I, Retrieved<I>>;
export function retrieve<I, M extends PassageMetadata = PassageMetadata>(
  options: RetrieveOptions<I, M> & { query: (value: I) => ArrayLike<number> },
): StageOperator<I, Retrieved<I>>;
export function retrieve<I, M extends PassageMetadata>(options: RetrieveOptions<I, M>): StageOperator<I, Retrieved<I>> {
  const { index, k, minScore, filter, query, lexical, meaning, retrieval, text, abstain, denseWeight, granularity, feedback, ...stageOptions } =
    options ?? ({} as RetrieveOptions<I, M>);
  const name = stageOptions.name ?? 'retrieve';
  parseOptions(
    retrieveOptionsSchema(),
    { index, k, minScore, filter, query, lexical, meaning, retrieval, text, abstain, denseWeight, granularity, feedback },
    `retrieve "${name}" options`,
  );
  const select = query ?? ((value: I) => (value as unknown as { vector: ArrayLike<number> }).vector);
  const words = text ?? ((value: I) => String((value as unknown as { text?: unknown }).text ?? ''));
  const plan = {
    index,
    k,
    mode: retrieval ?? (lexical === undefined ? 'dense' : 'hybrid'),
    ...(lexical !== undefined && { lexical }),
    ...(meaning !== undefined && { meaning }),
    ...(minScore !== undefined && { minScore }),
    ...(filter !== undefined && { filter }),
    ...(denseWeight !== undefined && { denseWeight }),
    ...(granularity !== undefined && { granularity }),
    ...(feedback !== undefined && { feedback }),
  };
  const thresholds = abstain === true ? {} : abstain === false ? undefined : abstain;

  return stage<I, Retrieved<I>>(
    (value, context) => {
      // A query with no direction (a question of punctuation only embeds to zeros) finds nothing densely.
      const found = retrievePassages(plan, lexical === undefined ? '' : words(value), plan.mode === 'lexical' ? undefined : select(value));
      const abstained = thresholds !== undefined && !supportsAnswer(found.evidence, thresholds);
      context.note('hits', abstained ? 0 : found.passages.length);
      if (found.passages.length > 0) context.note('top', found.passages[0]!.score);
      if (abstained) context.note('abstain', 1);
      return { input: value, passages: abstained ? [] : found.passages, evidence: found.evidence, abstained };
    },
    { ...stageOptions, name },
  );
}

/** One numbered source of a cited context. */
export interface Citation {
  /** The number in the `[n]` marker. */
  readonly marker: number;
  readonly source: string;
  /** The passages cited under this marker, in the order they appear. */
  readonly ids: readonly string[];
}

/** The retrieved passages as prompt context, with the citation of each. */
export interface CitedContext {
  /** The passages, each after its `[n]` marker, then a `Sources:` list. Empty when there are no passages. */
  readonly text: string;
  readonly citations: readonly Citation[];
}

/**
 * The context block to inject into a prompt: each passage after a `[n]` marker,
 * then the list of sources, so a model can cite `[n]` and a reader can follow it.
 * Passages keep their order (retrieve's: best first); passages from the same source
 * share its marker, so a citation names a document, not a fragment of one.
 *
 * ```
 * [1] Demand flows upstream: a stage asks before every element.
 *
 * [2] A policy says which element goes when a buffer is full.
 *
 * Sources:
 * [1] backpressure.md › Demand
 * [2] policies.md › Overflow
 * ```
 *
 * ## Example
 * ```ts
 * const { text, citations } = withCitations(retrieved.passages);
 * const prompt = `Answer from the context, citing [n].\n\n${text}\n\nQuestion: ${question}`;
 * ```
 */
export function withCitations(passages: readonly { readonly id: string; readonly text: string; readonly source: string }[]): CitedContext {
  if (passages.length === 0) return { text: '', citations: [] };
  const bySource = new Map<string, { marker: number; source: string; ids: string[] }>();
  const blocks: string[] = [];
  for (const passage of passages) {
    let citation = bySource.get(passage.source);
    if (citation === undefined) bySource.set(passage.source, (citation = { marker: bySource.size + 1, source: passage.source, ids: [] }));
    citation.ids.push(passage.id);
    blocks.push(`[${citation.marker}] ${passage.text.trim()}`);
  }
  const citations = [...bySource.values()];
  const list = citations.map((c) => `[${c.marker}] ${c.source}`).join('\n');
  return { text: `${blocks.join('\n\n')}\n\nSources:\n${list}`, citations };
}
