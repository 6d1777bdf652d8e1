/**
 * A RAG pipeline as a `ModelWorker`: `generate(request)` runs the question through
 * guard → embed → retrieve → assemble → the language model, and streams the model's
 * tokens. Every request goes through one long-lived pipeline (`pipelineWorker`): it waits
 * at the door (`Intake`), then the stages take it with the other requests in flight, so
 * their queues, batches and sheds are the load's; the last stage hands it its own token
 * stream. Unsubscribing a request withdraws it wherever it is and stops its model.
 *
 * This is what `sluice serve` answers with; it is also the smallest complete example
 * of composing the AI stages into a worker the HTTP and WebSocket servers accept.
 */
import { catchError, concat, defer, filter as filter_, map, of, throwError, type Observable } from 'rxjs';
import { InvalidOptionsError } from '../../core/errors.js';
import { lazySchema, literalOr, type ZodModule } from '../../core/zod.js';
import { parseOptions, positiveInt } from '../../flow/options.js';
import type { Flow } from '../../flow/demand.js';
import type { StageStats } from '../../flow/stats.js';
import type { Traced } from '../../core/trace.js';
import { EmbeddingCache } from '../rag/embedding-cache.js';
import { CacheStats } from '../../cache/stats.js';
import type { VectorIndex } from '../rag/vector-index.js';
import type { PassageMetadata } from '../rag/passage.js';
import { stage } from '../../../operators/stage.js';
import { embed, type Embedded, type Embedder } from '../stages/embed.js';
import { feedbackSchema, granularitySchema, retrieve, type Citation, type Retrieved } from '../stages/retrieve.js';
import { NO_ANSWER, answerPieces, candidatesOf, composeAnswer, quotablesOf, type ExtractOptions, type ExtractedAnswer } from '../rag/extract.js';
import { TextMemo } from '../rag/text-memo.js';
import { LexicalIndex, lexicalTerms, lexicalTokens } from '../rag/lexical-index.js';
import { asksHowTo, expectedAnswer } from '../rag/answer-kind.js';
import { MeaningIndex } from '../rag/meaning-index.js';
import { WordVectors } from '../rag/word-vectors.js';
import { Sections } from '../rag/sections.js';
import { CitationFilter } from '../rag/citations.js';
import { RETRIEVAL_MODES, type LexicalGranularity, type RetrievalMode } from '../rag/retriever.js';
import type { FeedbackOptions } from '../rag/query-expansion.js';
import type { AbstainOptions } from '../rag/abstain.js';
import { PromptTemplate, type AssembledPrompt } from '../stages/assemble.js';
import { Intake } from './intake.js';
import { streamStage, pipelineWorker, type PipelineJob, type PipelineWorker } from './pipeline-worker.js';
import { guard } from '../stages/guard.js';
import type { Classifier } from '../models/classifier.js';
import { GUARD_THRESHOLDS } from '../models/guard.js';
import type { PromptTokenizer } from '../models/prompt-tokenizer.js';
import { ContextLengthExceededError } from '../inference/errors.js';
import { PromptOverBudgetError } from '../rag/errors.js';
import { decode, generateRequest, questionOf, type GenerateRequest, type ModelWorker, type Token } from '../inference/worker.js';

/** The extractive answer also reads the section neighbours of this many top passages: an answer often sits in the paragraph beside the one retrieved. */
const NEIGHBOURED = 2;
/** Neighbours read on each side of such a passage. */
const REACH = 3;
/** Passages whose sentences are kept split, by text, per generation (see `TextMemo`). */
const SPLIT_PASSAGES = 2048;
/** Sentences and headings whose indexed terms are kept, by text, per generation. */
const TOKENIZED_TEXTS = 8192;
/** The stages of a RAG worker, as named in traces, stats and metrics. */
export const RAG_STAGES = ['guard', 'embed', 'retrieve', 'assemble', 'generate'] as const;
/** One stage of a `ragWorker` (one of `RAG_STAGES`), as named in traces and metrics. */
export type RagStage = (typeof RAG_STAGES)[number];

/** Options of `ragWorker`: the index, the embedder, the generator and the prompt budget. */
export interface RagWorkerOptions {
  /** The worker's name (the `model` clients ask for). Default `sluice-rag`. */
  readonly name?: string;
  /**
   * Generates the answer from the assembled prompt. Without it the answer is extractive: the
   * retrieved sentences closest to the question, each cited `[n]`, then the sources. With a
   * `contextLength`, the prompt's budget shrinks to leave `maxTokens` of it for the answer.
   */
  readonly lm?: Pick<ModelWorker, 'generate' | 'contextLength'>;
  /** Extractive answers: sentences at most, and the least similarity to the question. Default 3 and 0.2. */
  readonly extract?: ExtractOptions;
  /** Turns texts into vectors (e.g. `embedder(pool, tokenizer)`). */
  readonly embedder: Embedder;
  readonly index: VectorIndex<PassageMetadata>;
  /** Scores questions for prompt injection; without it there is no guard stage. */
  readonly classify?: Classifier;
  /** Guard thresholds. Default `GUARD_THRESHOLDS` (flag 0.5, block 0.8), what the generated guard is calibrated for. */
  readonly thresholds?: { readonly flag: number; readonly block: number };
  /** Passages retrieved per question: the answer is chosen among their sentences and their section neighbours'. Default 6. */
  readonly k?: number;
  /** The rankings retrieval fuses: `hybrid` (dense and BM25, their scores fused), `dense` or `lexical`. Default `hybrid`. */
  readonly retrieval?: RetrievalMode;
  /** How much the dense ranking counts in hybrid fusion, BM25's counting 1 (see `retrieve`). Default 0.5, for the generated embedder. */
  readonly denseWeight?: number;
  /** BM25 over the index's passages. Default: built from `index.entries()` when the worker is made. */
  readonly lexical?: LexicalIndex;
  /**
   * Pre-trained word vectors (`WordVectors.load`), for a generated (word-hashing) embedder: the
   * passages' meanings rank them beside the embedding, are evidence that a reworded question is
   * answered (`Evidence.meaning`), and score the answer's sentences in the embedder's place. Default: none.
   */
  readonly wordVectors?: WordVectors;
  /** What BM25 ranks: `passage`s, heading `section`s or `both`, fused (see `retrieve`). Default `passage`. */
  readonly granularity?: LexicalGranularity;
  /** Pseudo-relevance feedback for the BM25 ranking (see `retrieve`). Default: none. */
  readonly feedback?: FeedbackOptions;
  /**
   * When to answer `NO_ANSWER` instead: the evidence thresholds (`supportsAnswer`), or `false` to
   * always answer from what was retrieved. Default: the default thresholds.
   */
  readonly abstain?: false | AbstainOptions;
  /** Passages below this cosine similarity are left out. Default: none. */
  readonly minScore?: number;
  /** Token budget of the assembled prompt. Default 300, or less: what `lm.contextLength` leaves beside `maxTokens`. */
  readonly budget?: number;
  /** Counts the budget as `lm` does (e.g. the `LocalModel` it runs). Default: an estimate. */
  readonly tokenizer?: PromptTokenizer;
  /** The system prompt. */
  readonly system?: string;
  /** Tokens generated when the request does not say. Default 120. */
  readonly maxTokens?: number;
  /** Vectors of questions kept, by text. Default 1024. */
  readonly cacheCapacity?: number;
  /**
   * Extractive answers: vectors of the retrieved passages' sentences kept, by text. The same
   * passages come back question after question, so their sentences are embedded once. Default 8192.
   */
  readonly sentenceCacheCapacity?: number;
  /** Hits, misses and evictions of that cache, e.g. to export with `SluiceMetrics.registerCache`. */
  readonly cacheStats?: CacheStats;
  /** Statistics per stage (shared by every request), e.g. to export with `SluiceMetrics.registerStage`. */
  readonly stats?: Partial<Record<RagStage, StageStats>>;
  /** The door of its pipeline, shared with a server's other models. Default: its own, 256 requests deep. */
  readonly intake?: Intake;
  /** Questions guarded, embedded and assembled at once (a batched embedder runs them together). Default 16. */
  readonly batch?: number;
  /** Answers streaming at once. Default 16. */
  readonly streams?: number;
  /** Requests each stage buffers. Default 16. */
  readonly capacity?: number;
}

/** An optional number in [min, max], its error naming the field and the range. */
const between = (z: ZodModule, name: string, min: number, max: number) =>
  z
    .number({ error: `${name} must be a number` })
    .min(min, { error: `${name} must be in [${min}, ${max}]` })
    .max(max, { error: `${name} must be in [${min}, ${max}]` })
    .optional();

const optionsSchema = lazySchema((z) =>
  z
    .object({
      name: z.string().min(1, { error: 'name must not be empty' }).default('sluice-rag'),
      lm: z
        .custom<Pick<ModelWorker, 'generate' | 'contextLength'>>(
          (v) => typeof v === 'object' && v !== null && typeof (v as ModelWorker).generate === 'function',
          {
            error: 'lm must be a ModelWorker',
          },
        )
        .optional(),
      extract: z
        .object({
          sentences: z.number().int().min(1, { error: 'sentences must be ≥ 1' }).optional(),
          minScore: z.number().min(-1).max(1).optional(),
          context: z.number().int({ error: 'context must be an integer' }).min(0, { error: 'context must be ≥ 0' }).optional(),
        })
        .strict()
        .optional(),
      embedder: z.custom<Embedder>((v) => typeof v === 'function', { error: 'embedder must be a function' }),
      index: z.custom<VectorIndex<PassageMetadata>>((v) => typeof v === 'object' && v !== null && typeof (v as VectorIndex).search === 'function', {
        error: 'index must be a VectorIndex',
      }),
      classify: z.custom<Classifier>((v) => typeof v === 'function', { error: 'classify must be a function' }).optional(),
      thresholds: z
        .object({ flag: z.number().min(0).max(1), block: z.number().min(0).max(1) })
        .strict()
        .default(GUARD_THRESHOLDS),
      k: z.number().int({ error: 'k must be an integer' }).min(1, { error: 'k must be ≥ 1' }).default(6),
      retrieval: z.enum(RETRIEVAL_MODES, { error: `retrieval must be one of ${RETRIEVAL_MODES.join(', ')}` }).default('hybrid'),
      denseWeight: z.number({ error: 'denseWeight must be a number' }).positive({ error: 'denseWeight must be > 0' }).optional(),
      lexical: z.instanceof(LexicalIndex, { error: 'lexical must be a LexicalIndex' }).optional(),
      wordVectors: z.custom<WordVectors>((v) => v instanceof WordVectors, { error: 'wordVectors must be WordVectors' }).optional(),
      granularity: granularitySchema().optional(),
      feedback: feedbackSchema().optional(),
      abstain: literalOr(
        [false],
        z
          .object({
            coverage: between(z, 'coverage', 0, 1),
            passageCoverage: between(z, 'passageCoverage', 0, 1),
            partialCoverage: between(z, 'partialCoverage', 0, 1),
            dense: z.number({ error: 'dense must be a number' }).optional(),
            specificity: z.number({ error: 'specificity must be a number' }).min(0, { error: 'specificity must be ≥ 0' }).optional(),
            specificCoverage: between(z, 'specificCoverage', 0, 1),
            meaning: between(z, 'meaning', -1, 1),
            meaningCoverage: between(z, 'meaningCoverage', 0, 1),
            names: z.boolean({ error: 'names must be a boolean' }).optional(),
          })
          .strict(),
      ).default({}),
      minScore: z.number().min(-1).max(1).optional(),
      budget: z.number().int({ error: 'budget must be an integer' }).min(16, { error: 'budget must be ≥ 16 tokens' }).default(300),
      tokenizer: z
        .custom<PromptTokenizer>((v) => typeof (v as PromptTokenizer | undefined)?.countTokens === 'function', {
          error: 'tokenizer must have countTokens(text)',
        })
        .optional(),
      system: z.string().default('Answer from the context only and cite sources as [n].'),
      maxTokens: z.number().int({ error: 'maxTokens must be an integer' }).min(1, { error: 'maxTokens must be ≥ 1' }).default(120),
      cacheCapacity: z.number().int().min(1, { error: 'cacheCapacity must be ≥ 1' }).default(1024),
      sentenceCacheCapacity: z.number().int().min(1, { error: 'sentenceCacheCapacity must be ≥ 1' }).default(8192),
      cacheStats: z.instanceof(CacheStats, { error: 'cacheStats must be a CacheStats' }).optional(),
      stats: z
        .record(
          z.enum(RAG_STAGES),
          z.custom<StageStats>((v) => typeof v === 'object' && v !== null),
        )
        .optional(),
      intake: z.instanceof(Intake, { error: 'intake must be an Intake' }).optional(),
      batch: positiveInt('batch').default(16),
      streams: positiveInt('streams').default(16),
      capacity: positiveInt('capacity').default(16),
    })
    .strict(),
);

const variables = lazySchema((z) => z.object({ question: z.string().min(1) }));

/**
 * Builds the worker. The question is the request's `prompt`, or the last `user`
 * message of its `messages`. Generation parameters (temperature, top_p, max_tokens,
 * stop, seed...) pass through to the language model.
 *
 * A question the guard blocks fails the request with `GuardBlockedError`
 * (`GUARD_BLOCKED`); the WebSocket server answers it with an `error` frame.
 *
 * ## Example
 * ```ts
 * const rag = ragWorker({ lm, embedder: embedder(pool, tokenizer), index, classify: poolClassifier(pool, tokenizer, { model: 'guard' }) });
 * rag.generate(generateRequest({ prompt: 'How does a stage pause a fast producer?' })).subscribe((t) => process.stdout.write(t.text));
 * ```
 */
export function ragWorker(options: RagWorkerOptions): PipelineWorker {
  const rag = ragPipeline(options);
  return pipelineWorker({
    name: rag.name,
    intake: options.intake ?? new Intake({ name: `${rag.name}-intake`, maxQueue: 256 }),
    pipeline: rag.pipeline,
    stages: rag.stages,
  });
}

/** What `ragWorker` runs its requests through: its name, its stages and the function that builds them. */
export interface RagPipeline {
  /** The worker's name. */
  readonly name: string;
  /** Its stages' names: `RAG_STAGES`, without `guard` when there is no classifier. */
  readonly stages: readonly RagStage[];
  /**
   * Builds guard → embed → retrieve → assemble → generate over `jobs`: each call builds its own
   * stages, while the caches and indexes are made once, with the `RagPipeline`, and shared.
   */
  readonly pipeline: (jobs: Flow<Traced<PipelineJob>>) => Observable<unknown>;
}

/**
 * The pipeline of `ragWorker`, to run through a `pipelineWorker` of one's own (`ragWorker` is
 * `pipelineWorker({ name, intake, pipeline, stages })` over it). Bad options throw
 * `InvalidOptionsError` naming the field, as `ragWorker`'s do.
 *
 * ## Example
 * ```ts
 * const rag = ragPipeline({ embedder: embedder(pool, tokenizer), index });
 * const shared = pipelineWorker({ name: rag.name, intake: new Intake({ maxQueue: 64 }), pipeline: rag.pipeline, stages: rag.stages });
 * ```
 */
export function ragPipeline(options: RagWorkerOptions): RagPipeline {
  const config = parseOptions(optionsSchema(), options, 'ragWorker options');
  const budget = promptBudget(config.budget, config.lm?.contextLength, config.maxTokens);
  const cache = new EmbeddingCache(config.cacheCapacity, config.cacheStats);
  const stats: Partial<Record<RagStage, StageStats>> = config.stats ?? {};
  const { batch, streams } = config;
  // A request that fails in a stage ends alone; the pipeline every request shares goes on.
  const shared = {
    capacity: config.capacity,
    errorPolicy: 'skip' as const,
    onFailure: ({ value, error }: { value: PipelineJob; error: unknown }) => value.fail(error),
  };
  const template = new PromptTemplate({
    template: 'Context:\n{{context}}\n\nQuestion: {{question}}',
    schema: variables(),
    budget,
    system: config.system,
    ...(config.tokenizer !== undefined && { tokenizer: config.tokenizer }),
  });
  const questionText = (job: PipelineJob) => questionOf(job.request);
  const lexical = config.lexical ?? LexicalIndex.of(config.index.entries());
  const sections = Sections.of(config.index.entries());
  const meaning =
    config.wordVectors === undefined
      ? undefined
      : MeaningIndex.of(
          [...config.index.entries()].map((e) => ({ ...e.metadata, id: e.id })),
          config.wordVectors,
        );
  // What the answer reads of a passage is per corpus: each passage split, each sentence's terms found, each sentence embedded once.
  const sentences = new TextMemo(quotablesOf, SPLIT_PASSAGES);
  const tokens = new TextMemo(lexicalTokens, TOKENIZED_TEXTS);
  const sentenceVectors = new EmbeddingCache(config.sentenceCacheCapacity);
  const termsOf = (text: string) => tokens.get(text);
  const queryTerms = (text: string) => {
    const expects = expectedAnswer(text);
    return {
      terms: lexicalTerms(text),
      weight: (term: string) => lexical.idf(term),
      termsOf,
      howTo: asksHowTo(text),
      ...(expects !== undefined && { expects }),
    };
  };

  const pipeline = (jobs: Flow<Traced<PipelineJob>>): Observable<unknown> => {
    const guarded: Observable<Traced<PipelineJob>> =
      config.classify === undefined
        ? jobs
        : jobs.pipe(
            guard<PipelineJob>({
              name: 'guard',
              classify: config.classify,
              thresholds: config.thresholds,
              text: questionText,
              concurrency: batch,
              ...shared,
              stats: stats.guard,
            }),
          );
    const retrieved = guarded.pipe(
      embed<PipelineJob>({ name: 'embed', embedder: config.embedder, cache, text: questionText, concurrency: batch, ...shared, stats: stats.embed }),
      retrieve<Embedded<PipelineJob>>({
        name: 'retrieve',
        index: config.index,
        k: config.k,
        lexical,
        ...(meaning !== undefined && { meaning }),
        retrieval: config.retrieval,
        ...(config.denseWeight !== undefined && { denseWeight: config.denseWeight }),
        ...(config.granularity !== undefined && { granularity: config.granularity }),
        ...(config.feedback !== undefined && { feedback: config.feedback }),
        abstain: config.abstain === false ? false : config.abstain,
        ...(config.minScore !== undefined && { minScore: config.minScore }),
        ...shared,
        onFailure: ({ value, error }) => value.input.fail(error),
        stats: stats.retrieve,
      }),
    );
    const lm = config.lm;
    if (lm === undefined) {
      // Extractive: rank the retrieved sentences with the embedding model, then stream the answer they make.
      return retrieved.pipe(
        stage(
          async (r: Retrieved<Embedded<PipelineJob>>, context) => {
            const placed = sections.widen(r.passages, NEIGHBOURED, REACH);
            const passages = placed.map((p) => p.passage);
            const candidates = candidatesOf(passages, placed, (text) => sentences.get(text));
            const words = queryTerms(r.input.text);
            if (meaning !== undefined) {
              // Word vectors read what a sentence means where the generated embedder hashes its words: they score the sentences.
              const none = new Float32Array(config.wordVectors!.dim);
              const vectors = candidates.map((c) => meaning.centred(c.text) ?? none);
              const question = meaning.centred(r.input.text) ?? none;
              return { job: r.input.input, answer: composeAnswer(question, passages, candidates, vectors, config.extract, words) };
            }
            const vectors =
              candidates.length === 0
                ? []
                : await sentenceVectors.embed(
                    candidates.map((c) => c.text),
                    config.embedder,
                    context.signal,
                    'assemble',
                  );
            return { job: r.input.input, answer: composeAnswer(r.input.vector, passages, candidates, vectors, config.extract, words) };
          },
          { name: 'assemble', concurrency: batch, ...shared, onFailure: ({ value, error }) => value.input.input.fail(error), stats: stats.assemble },
        ),
        streamStage<{ readonly job: PipelineJob; readonly answer: ExtractedAnswer }>(({ job, answer }) => streamAnswer(job, answer, config.name), {
          concurrency: streams,
          capacity: config.capacity,
          ...(stats.generate !== undefined && { stats: stats.generate }),
        }),
      );
    }
    return retrieved.pipe(
      stage(
        (r: Retrieved<Embedded<PipelineJob>>, context): { job: PipelineJob; prompt?: AssembledPrompt } => {
          if (r.abstained) {
            // Nothing retrieved supports an answer: the model is not asked to make one up. A question too long is still refused.
            template.render({ question: r.input.text }, []);
            return { job: r.input.input };
          }
          const prompt = template.render({ question: r.input.text }, r.passages);
          context.note('tokens', prompt.tokens);
          if (prompt.dropped.length > 0) context.note('dropped', prompt.dropped.join(','));
          if (prompt.truncated !== undefined) context.note('truncated', prompt.truncated);
          return { job: r.input.input, prompt };
        },
        {
          name: 'assemble',
          ...shared,
          onFailure: ({ value, error }) => value.input.input.fail(overLong(error, config.name, value.input.input.request)),
          stats: stats.assemble,
        },
      ),
      streamStage<{ readonly job: PipelineJob; readonly prompt?: AssembledPrompt }>(
        ({ job, prompt }) => {
          if (prompt === undefined) return streamAnswer(job, { text: NO_ANSWER, sources: [] }, config.name);
          const { prompt: _prompt, messages: _messages, ...params } = job.request;
          return withSources(
            // A chat model gets the system prompt and the question as their own messages.
            lm.generate(generateRequest({ max_tokens: config.maxTokens, ...params, messages: prompt.messages }), { ...job.options, stage: 'generate' }),
            prompt.citations,
          ).pipe(catchError((err: unknown) => throwError(() => overLong(err, config.name, job.request))));
        },
        { concurrency: streams, capacity: config.capacity, ...(stats.generate !== undefined && { stats: stats.generate }) },
      ),
    );
  };

  return { name: config.name, pipeline, stages: config.classify === undefined ? RAG_STAGES.filter((name) => name !== 'guard') : RAG_STAGES };
}

/** An answer written here (extractive, or the abstain answer), streamed as a model's tokens word by word. */
function streamAnswer(job: PipelineJob, answer: ExtractedAnswer, name: string): Observable<Token> {
  const question = questionOf(job.request);
  const pieces = answerPieces(answer.text);
  let next = 0;
  const { prompt: _prompt, messages: _messages, ...params } = job.request;
  return decode(generateRequest({ ...params, prompt: question }), { ...job.options, stage: 'generate' }, { name, maxTokens: job.request.max_tokens }, () => ({
    inputTokens: answerPieces(question).length,
    step: () => Promise.resolve(next < pieces.length ? { text: pieces[next++]! } : { end: 'stop' as const }),
    close() {},
  }));
}

/** The assembled prompt's budget: what the model's context leaves beside the answer, when it has a limit. */
function promptBudget(budget: number, contextLength: number | undefined, maxTokens: number): number {
  if (contextLength === undefined || budget + maxTokens <= contextLength) return budget;
  if (contextLength - maxTokens < 16)
    throw new InvalidOptionsError('ragWorker options', [
      { path: 'maxTokens', message: `lm's context of ${contextLength} tokens leaves fewer than 16 for the prompt beside maxTokens ${maxTokens}` },
    ]);
  return contextLength - maxTokens;
}

/** A question too long for the prompt's budget, or a prompt too long for the model, as this worker's `ContextLengthExceededError`. */
function overLong(err: unknown, name: string, request: GenerateRequest): unknown {
  const param = request.prompt === undefined ? 'messages' : 'prompt';
  if (err instanceof PromptOverBudgetError) return new ContextLengthExceededError(name, err.budget, err.tokens, undefined, param);
  if (err instanceof ContextLengthExceededError) return new ContextLengthExceededError(name, err.contextLength, err.promptTokens, err.completionTokens, param);
  return err;
}

/**
 * The model's tokens with its citations checked (a `[n]` naming no passage of the context is left
 * out: see `CitationFilter`), then the sources it cited (all of the context's when it cited none),
 * as the extractive answer lists them: what a reader follows a citation with.
 */
export function withSources(tokens: Observable<Token>, citations: readonly Citation[]): Observable<Token> {
  if (citations.length === 0) return tokens;
  return defer(() => {
    const filter = new CitationFilter(new Set(citations.map((c) => c.marker)));
    let next = 0;
    return concat(
      tokens.pipe(
        map((token) => {
          next = token.index + 1;
          return { ...token, text: filter.push(token.text) };
        }),
        // A token made only of a marker held back, or left out, has nothing to show yet.
        filter_((token) => token.text.length > 0),
      ),
      defer(() => {
        const cited = filter.cited;
        const listed = citations.some((c) => cited.has(c.marker)) ? citations.filter((c) => cited.has(c.marker)) : citations;
        return of<Token>({ text: `${filter.flush()}\n\nSources:\n${listed.map((c) => `[${c.marker}] ${c.source}`).join('\n')}`, index: next });
      }),
    );
  });
}
