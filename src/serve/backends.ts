/**
 * What a sluice server serves: the embedded models (generated ONNX models in a worker-thread
 * pool, `sluice-rag` and `charlm`), or upstream OpenAI-compatible servers (gateway mode),
 * optionally with the embedded embedding and guard models beside them (retrieval for an
 * upstream model, the guard on every prompt). Either way the server gets named workers,
 * the stage counters to export, and a release.
 */
import { InvalidOptionsError, errorMessage } from '../core/errors.js';
import { StageStats } from '../flow/stats.js';
import { CacheStats } from '../cache/stats.js';
import type { CircuitBreaker } from '../resilience/breaker.js';
import { Gateway, type GatewayOptions, type UpstreamOptions } from '../ai/inference/gateway.js';
import type { UpstreamView } from '../ai/inference/upstream-stats.js';
import { CharLmWorker } from '../ai/inference/onnx-lm.js';
import type { StepBatcherStats } from '../ai/inference/step-batcher.js';
import { LocalModel, LocalModelError } from '../ai/inference/local-model.js';
import { openAiEncodingOf, openAiTokenCounter } from '../ai/inference/openai-tokens.js';
import type { PromptTokenizer } from '../ai/models/prompt-tokenizer.js';
import type { ModelWorker } from '../ai/inference/worker.js';
import { BUNDLED_DATA } from '../ai/models/bundled.js';
import { generateModels, MODEL_FILES } from '../ai/models/generate.js';
import { loadTokenizer } from '../ai/models/load.js';
import { loadEmbeddingDir } from '../ai/models/embedding-dir.js';
import { WORD_VECTORS_PACKAGE, WordVectors } from '../ai/rag/word-vectors.js';
import { BatchedClassifier } from '../ai/pipelines/batched-classifier.js';
import { embedder } from '../ai/pool/embedder.js';
import { InferencePool, type InferencePoolStats } from '../ai/pool/pool.js';
import { BatchedEmbedder } from '../ai/pipelines/batched-embedder.js';
import type { Classifier } from '../ai/models/classifier.js';
import { indexPassages, loadCorpus } from '../ai/rag/corpus.js';
import type { RetrievalMode } from '../ai/rag/retriever.js';
import { CorpusSkips } from '../ai/rag/corpus-skips.js';
import type { Passage } from '../ai/rag/passage.js';
import { RAG_STAGES, ragWorker, type RagStage } from '../ai/pipelines/rag-worker.js';
import type { Intake } from '../ai/pipelines/intake.js';

/** The name `/v1/embeddings` serves the generated embedding model under. */
export const EMBEDDING_MODEL = 'sluice-embed';

/** The name the RAG worker is served under. */
export const RAG_MODEL = 'sluice-rag';

export interface Backend {
  /** By the name clients put in `model`; the first is the default. */
  readonly workers: Readonly<Record<string, ModelWorker>>;
  /** Models `/v1/embeddings` serves, by name. */
  readonly embeddings?: Readonly<Record<string, BatchedEmbedder>>;
  /** Cache counters to export as metrics, by cache name. */
  readonly caches?: Readonly<Record<string, CacheStats>>;
  /** Circuit breakers to export as metrics from the start (gateway mode: one per upstream). */
  readonly breakers?: readonly CircuitBreaker[];
  /** Stage counters to export as metrics, by stage name. */
  readonly stages: Readonly<Record<string, StageStats>>;
  /** The inference pool, when models run in this process. */
  readonly pool?: InferencePool;
  /** Each decoder's batched decode steps, by served model name (`undefined` while it steps alone). */
  readonly batchers?: Readonly<Record<string, () => StepBatcherStats | undefined>>;
  /** The prompt-injection classifier, when the guard model is loaded. */
  readonly classify?: Classifier;
  /** The workers that guard their own prompts (the RAG pipeline), by name. */
  readonly guarded?: ReadonlySet<string>;
  /** The indexed passages with this source (`file › heading`), for a reader following a citation. */
  passages?(source: string): readonly Passage[];
  /** Embeddings of upstream models, forwarded (gateway mode). */
  upstreamEmbeddings?(model: string, body: Readonly<Record<string, unknown>>, signal: AbortSignal): Promise<unknown> | undefined;
  /** Each upstream's circuit state, in gateway mode. */
  circuits?(): Record<string, string>;
  /** Gateway mode: each upstream's circuit, attempts in flight, failures by code, retries and fallbacks. */
  upstreams?(): readonly UpstreamView[];
  release(): Promise<void>;
}

/** A model directory to serve (`sluice serve --model DIR`), under its directory's name unless `name` says. */
export type LocalModelSpec = string | { readonly dir: string; readonly name?: string };

export interface EmbeddedOptions {
  readonly models: string;
  /** The user's own exported decoders, served first (the first is the default model) and answering sluice-rag. */
  readonly localModels?: readonly LocalModelSpec[];
  readonly corpus: string;
  /** Documents of the corpus left out, in `.gitignore` syntax, beside its `.sluiceignore`. */
  readonly corpusIgnore?: readonly string[];
  /** Corpus files larger than this many bytes are skipped (`too-large`). Default 8 MiB. */
  readonly corpusMaxFileBytes?: number;
  readonly poolSize: number;
  /** The pool threads' `nice` value. */
  readonly poolNiceness: number;
  readonly languageModel: ModelWorker | undefined;
  readonly log: (line: string) => void;
  readonly shared: SharedPipeline;
  /** A user's embedding model directory, in place of the generated one. */
  readonly embedModel?: string;
  /** How `sluice-rag` ranks passages. Default `hybrid`. */
  readonly retrieval?: RetrievalMode;
}

/**
 * The embedding and guard models in a pool (and the character LM, when asked), generated into
 * `models` when missing; the user's own decoders in the same pool.
 */
async function localModels(options: {
  readonly models: string;
  readonly poolSize: number;
  /** The pool threads' `nice` value. */
  readonly poolNiceness: number;
  readonly charLm: boolean;
  /** The character LM's decode steps per batched call; 1 runs each step alone. */
  readonly maxBatch?: number;
  /** Tokens one batched call of a user decoder feeds at most. */
  readonly stepTokens?: number;
  /** A user decoder's decode steps share a call when their contexts fall in one window of this many positions. */
  readonly lengthBucket?: number;
  /** Bytes each user decoder's KV caches may hold together. */
  readonly kvCacheBytes?: number;
  readonly users?: readonly LocalModelSpec[] | undefined;
  /** A user's embedding model directory, in place of the generated one (`--embed-model`). */
  readonly embedModel?: string | undefined;
  readonly log: (line: string) => void;
}) {
  if (BUNDLED_DATA === undefined) throw new Error('the bundled data/ folder is missing from the package');
  // The user's models first: a bad directory fails the start before anything is generated.
  const users = await loadLocalModels(options.users ?? []);
  const ownEmbedder = options.embedModel === undefined ? undefined : await loadEmbeddingDir(options.embedModel);
  if (ownEmbedder !== undefined) options.log(`embedding model ${ownEmbedder.name}: ${ownEmbedder.modelPath} (${ownEmbedder.tokenizer.vocabSize} tokens)`);
  for (const user of users) {
    options.log(
      `model ${user.name}: ${user.modelPath} (${user.shape.layers} layers, ${user.tokenizer.vocabSize} tokens, ${user.chatTemplate === undefined ? 'no chat template' : 'chat template'})`,
    );
  }
  const dir = options.models;
  const written = await generateModels({ outDir: dir, dataDir: BUNDLED_DATA });
  const fresh = written.filter((f) => f.written).length;
  if (fresh > 0) options.log(`generated ${fresh} model files into ${dir}/`);
  const pool = await InferencePool.create({
    name: 'serve',
    models: {
      embed: ownEmbedder?.modelPath ?? `${dir}/${MODEL_FILES.embedding}`,
      guard: `${dir}/${MODEL_FILES.guard}`,
      ...(options.charLm && { charlm: `${dir}/${MODEL_FILES.charLm}` }),
      // Prefixed, so a user's directory name never collides with the pool's own models.
      ...Object.fromEntries(users.map((user) => [`local:${user.name}`, user.modelPath])),
    },
    size: options.poolSize,
    niceness: options.poolNiceness,
  });
  try {
    const tokenizer = await loadTokenizer(`${dir}/${MODEL_FILES.embeddingTokenizer}`);
    // Prompts classified at once (sluice-rag's questions in flight, --guard's) share runs of the guard model.
    const guardModel = new BatchedClassifier(pool, tokenizer, { model: 'guard' });
    // The guard keeps the generated hashed tokenizer; a user's embedding model brings its own, and its pooling.
    const embedTokenizer = ownEmbedder?.tokenizer ?? tokenizer;
    const pooling = ownEmbedder?.pooling ?? {};
    return {
      pool,
      /** A user's embedding model: its ranking is as good a witness as BM25's. */
      ownEmbedding: ownEmbedder !== undefined,
      embed: embedder(pool, embedTokenizer, { model: 'embed', ...pooling }),
      guardModel,
      classify: guardModel.classify,
      // The embedding model also answers /v1/embeddings, its requests micro-batched together.
      embeddings: new BatchedEmbedder(pool, embedTokenizer, { model: 'embed', pooling }),
      charLm: options.charLm
        ? await CharLmWorker.load(`${dir}/${MODEL_FILES.charLm}`, {
            run: (feeds, signal) => pool.run(feeds, { model: 'charlm', signal }),
            // Concurrent generations' steps share model calls, as many at once as the pool has threads.
            ...((options.maxBatch ?? 1) > 1 && { batch: { maxBatch: options.maxBatch!, concurrency: options.poolSize } }),
          })
        : undefined,
      users,
      userWorkers: users.map((user) =>
        user.worker({
          run: (feeds, signal) => pool.run(feeds, { model: `local:${user.name}`, signal }),
          ...((options.maxBatch ?? 1) > 1 && {
            batch: {
              maxBatch: options.maxBatch!,
              concurrency: options.poolSize,
              ...(options.stepTokens !== undefined && { tokenBudget: options.stepTokens }),
              ...(options.lengthBucket !== undefined && { lengthBucket: options.lengthBucket }),
            },
          }),
          ...(options.kvCacheBytes !== undefined && { cacheBytes: options.kvCacheBytes }),
          // Each generation's KV cache stays in the pool thread that computed it: a step moves token ids, not caches.
          resident: { pool, model: `local:${user.name}` },
        }),
      ),
    };
  } catch (err) {
    await pool.close();
    throw err;
  }
}

type LocalModels = Awaited<ReturnType<typeof localModels>>;

/** The corpus indexed, and `sluice-rag` over it: extractive without `lm`, else written by `lm`. */
async function ragOver(
  local: LocalModels,
  corpus: string,
  lm: ModelWorker | undefined,
  log: (line: string) => void,
  shared: SharedPipeline,
  tokenizer: PromptTokenizer | undefined,
  how: {
    readonly retrieval?: RetrievalMode | undefined;
    readonly corpusIgnore?: readonly string[] | undefined;
    readonly corpusMaxFileBytes?: number | undefined;
  },
) {
  const { retrieval } = how;
  const skipped = new CorpusSkips();
  const loaded = await loadCorpus(corpus, {
    onSkip: (skip) => skipped.add(skip),
    ...(how.corpusIgnore !== undefined && { ignore: how.corpusIgnore }),
    ...(how.corpusMaxFileBytes !== undefined && { maxFileBytes: how.corpusMaxFileBytes }),
  });
  const index = await indexPassages(loaded, (texts, signal) => local.embed(texts, signal), { onSkip: (skip) => skipped.add(skip), corpus });
  if (skipped.total > 0) log(`corpus ${corpus}: ${skipped.summary()}`);
  // Word meanings stand in for a real embedding model: shipped in the package, or read from the devDependency in a checkout.
  const wordVectors = local.ownEmbedding ? undefined : await WordVectors.load();
  if (wordVectors !== undefined) log(`word vectors: ${wordVectors.size} words`);
  else if (!local.ownEmbedding)
    log(`word vectors: none (in a checkout, npm ci installs ${WORD_VECTORS_PACKAGE}): questions worded otherwise than the documents are refused`);
  const passages = loaded.filter((passage) => index.has(passage.id));
  const stages = Object.fromEntries(RAG_STAGES.map((name) => [name, new StageStats()])) as Record<RagStage, StageStats>;
  const cache = new CacheStats();
  const rag = ragWorker({
    name: RAG_MODEL,
    // Questions embedded at once share one pool run.
    embedder: local.embeddings.embedder,
    intake: shared.intake,
    streams: shared.streams,
    capacity: shared.capacity,
    index,
    ...(local.ownEmbedding && { denseWeight: 1 }),
    ...(wordVectors !== undefined && { wordVectors }),
    classify: local.classify,
    stats: stages,
    cacheStats: cache,
    ...(lm !== undefined && { lm }),
    ...(tokenizer !== undefined && { tokenizer }),
    ...(retrieval !== undefined && { retrieval }),
  });
  log(`indexed ${passages.length} passages from ${corpus}${lm === undefined ? '' : `; ${RAG_MODEL} answers with ${lm.name}`}`);
  const bySource = new Map<string, Passage[]>();
  for (const passage of passages) bySource.set(passage.source, [...(bySource.get(passage.source) ?? []), passage]);
  // Exported under the name of the stage that reads it.
  return { rag, stages, caches: { embed: cache }, passages: (source: string) => bySource.get(source) ?? [] };
}

/** The server's door and the sizes of the pipelines behind it. */
export interface SharedPipeline {
  readonly intake: Intake;
  /** Generations streaming at once, per model. */
  readonly streams: number;
  /** Requests each stage buffers. */
  readonly capacity: number;
  /** Decode steps of concurrent generations per model call (the character LM's). */
  readonly maxBatch: number;
  /** Tokens one batched call of a user decoder feeds at most. */
  readonly stepTokens?: number;
  /** A user decoder's decode steps share a call when their contexts fall in one window of this many positions. */
  readonly lengthBucket?: number;
  /** Bytes the KV caches of a decoder's generations may hold together between steps. */
  readonly kvCacheBytes: number;
}

/** The generated models (written into `models` when missing), the corpus indexed, `sluice-rag` and its language model. */
export async function embeddedBackend(options: EmbeddedOptions): Promise<Backend> {
  const local = await localModels({
    models: options.models,
    poolSize: options.poolSize,
    poolNiceness: options.poolNiceness,
    charLm: options.languageModel === undefined,
    maxBatch: options.shared.maxBatch,
    ...(options.shared.stepTokens !== undefined && { stepTokens: options.shared.stepTokens }),
    ...(options.shared.lengthBucket !== undefined && { lengthBucket: options.shared.lengthBucket }),
    kvCacheBytes: options.shared.kvCacheBytes,
    users: options.localModels,
    embedModel: options.embedModel,
    log: options.log,
  });
  try {
    // sluice-rag answers with the retrieved sentences themselves (cited); the character LM is served on its own, as the toy it is.
    // With a model of the user's, sluice-rag answers with it, the prompt's budget counted by its tokenizer and template.
    const { rag, stages, caches, passages } = await ragOver(local, options.corpus, local.userWorkers[0], options.log, options.shared, local.users[0], options);
    const lm = options.languageModel ?? local.charLm!;
    return {
      workers: { ...Object.fromEntries(local.userWorkers.map((w) => [w.name, w])), [rag.name]: rag, [lm.name]: lm },
      embeddings: { [EMBEDDING_MODEL]: local.embeddings },
      stages: { ...stages, embeddings: local.embeddings.stats, classifier: local.guardModel.stats },
      caches,
      pool: local.pool,
      batchers: Object.fromEntries(
        [...local.userWorkers, ...(options.languageModel === undefined ? [local.charLm!] : [])].map((w) => [w.name, () => w.batchStats]),
      ),
      classify: local.classify,
      guarded: new Set([rag.name]),
      passages,
      release: async () => {
        rag.close();
        local.embeddings.close();
        local.guardModel.close();
        await local.charLm?.release();
        await local.pool.close();
      },
    };
  } catch (err) {
    await local.pool.close();
    throw err;
  }
}

/** Loads and checks every directory before anything starts; a failure is a `LocalModelError` naming the directory. */
async function loadLocalModels(specs: readonly LocalModelSpec[]): Promise<LocalModel[]> {
  const taken = new Set(['sluice-rag', 'charlm', EMBEDDING_MODEL]);
  const locals: LocalModel[] = [];
  for (const spec of specs) {
    const { dir, name } = typeof spec === 'string' ? { dir: spec, name: undefined } : spec;
    let local: LocalModel;
    try {
      local = await LocalModel.load(dir, name === undefined ? {} : { name });
    } catch (err) {
      if (err instanceof LocalModelError || (err as { code?: unknown }).code === 'MISSING_PEER') throw err;
      const message = errorMessage(err);
      const hint = (err as { hint?: unknown }).hint;
      // The cause's own hint is about generated models; the directory's layout is what to fix here.
      throw new LocalModelError(dir, typeof hint === 'string' && message.endsWith(hint) ? message.slice(0, -hint.length).trim() : message, err);
    }
    if (taken.has(local.name)) throw new LocalModelError(dir, `the name "${local.name}" is already served: give the model another name.`);
    taken.add(local.name);
    locals.push(local);
  }
  return locals;
}

/** What gateway mode runs here beside the upstreams: retrieval over a corpus, the guard. */
export interface GatewayLocal {
  readonly models: string;
  readonly poolSize: number;
  /** The pool threads' `nice` value. */
  readonly poolNiceness: number;
  /** Index this corpus and serve `sluice-rag` over it, written by an upstream model. */
  readonly corpus?: string | undefined;
  /** Documents of the corpus left out, in `.gitignore` syntax, beside its `.sluiceignore`. */
  readonly corpusIgnore?: readonly string[];
  /** Corpus files larger than this many bytes are skipped (`too-large`). Default 8 MiB. */
  readonly corpusMaxFileBytes?: number;
  /** The upstream model that writes `sluice-rag`'s answers. Default: the first model listed. */
  readonly ragModel?: string | undefined;
  /** Load the guard model (to classify every prompt). */
  readonly guard: boolean;
  readonly shared: SharedPipeline;
  /** A user's embedding model directory, in place of the generated one. */
  readonly embedModel?: string | undefined;
  /** How `sluice-rag` ranks passages. Default `hybrid`. */
  readonly retrieval?: RetrievalMode;
}

/** Upstream servers' models, through the gateway's `upstream` stage; the embedded models too when `local` needs them. */
export async function gatewayBackend(
  upstreams: readonly UpstreamOptions[],
  tuning: Omit<GatewayOptions, 'upstreams'>,
  local: GatewayLocal,
  log: (line: string) => void,
): Promise<Backend> {
  const gateway = await Gateway.start({
    ...tuning,
    upstreams,
    onBreakerChange: (upstream, change) => {
      log(`upstream ${upstream}: circuit ${change.from} → ${change.to}`);
      tuning.onBreakerChange?.(upstream, change);
    },
  });
  log(`gateway: ${gateway.models.length} models from ${upstreams.length} upstream${upstreams.length === 1 ? '' : 's'} (${gateway.models.join(', ')})`);
  const upstreamWorkers: Record<string, ModelWorker> = gateway.modelWorkers();
  const base = {
    stages: { upstream: gateway.stats },
    ...(tuning.cache !== undefined || tuning.singleFlight === true ? { caches: { upstream: gateway.cacheStats } } : {}),
    breakers: [...gateway.breakers.values()],
    circuits: () => gateway.circuits(),
    upstreams: () => gateway.upstreams(),
    upstreamEmbeddings: (model: string, body: Readonly<Record<string, unknown>>, signal: AbortSignal) => gateway.embeddings(model, body, signal),
  };
  if (local.corpus === undefined && !local.guard) return { ...base, workers: upstreamWorkers, release: async () => gateway.close() };
  // Checked before any model is loaded: a wrong name fails the start at once.
  const lm = local.corpus === undefined ? undefined : ragLanguageModel(gateway.models, upstreamWorkers, local.ragModel);
  const models = await localModels({
    models: local.models,
    poolSize: local.poolSize,
    poolNiceness: local.poolNiceness,
    charLm: false,
    embedModel: local.embedModel,
    log,
  }).catch((err: unknown) => {
    gateway.close();
    throw err;
  });
  try {
    if (local.corpus === undefined || lm === undefined) {
      return {
        ...base,
        ...servedLocally(models, gateway),
        workers: upstreamWorkers,
        stages: { ...base.stages, embeddings: models.embeddings.stats, classifier: models.guardModel.stats },
        classify: models.classify,
      };
    }
    if (gateway.models.includes(RAG_MODEL)) log(`gateway: the upstream's ${RAG_MODEL} is not served; this server's ${RAG_MODEL} answers from ${local.corpus}`);
    const { rag, stages, caches, passages } = await ragOver(models, local.corpus, lm, log, local.shared, openAiCounter(lm.name, log), local);
    const { [RAG_MODEL]: _shadowed, ...others } = upstreamWorkers;
    return {
      ...base,
      ...servedLocally(models, gateway),
      workers: { [rag.name]: rag, ...others },
      stages: { ...base.stages, ...stages, embeddings: models.embeddings.stats, classifier: models.guardModel.stats },
      caches: { ...base.caches, ...caches },
      classify: models.classify,
      guarded: new Set([rag.name]),
      passages,
      release: async () => {
        rag.close();
        await servedLocally(models, gateway).release();
      },
    };
  } catch (err) {
    gateway.close();
    await models.pool.close();
    throw err;
  }
}

/**
 * The upstream model that writes `sluice-rag`'s answers: the one named, else the first listed.
 * An upstream that is itself a sluice server serves a `sluice-rag` of its own, never the writer.
 */
function ragLanguageModel(served: readonly string[], workers: Readonly<Record<string, ModelWorker>>, name: string | undefined): ModelWorker {
  const chosen = name ?? served.find((m) => m !== RAG_MODEL);
  const lm = chosen === undefined || chosen === RAG_MODEL ? undefined : workers[chosen];
  if (lm === undefined)
    throw ragModelError(
      `${chosen === undefined ? 'the upstreams serve no model to answer with' : `"${chosen}" is not an upstream model`} (models: ${served.join(', ')})`,
    );
  return lm;
}

/** Exact counts for an OpenAI model's prompt budget (`js-tiktoken`); other models keep the estimate. */
function openAiCounter(model: string, log: (line: string) => void): PromptTokenizer | undefined {
  try {
    return openAiEncodingOf(model) === undefined ? undefined : openAiTokenCounter(model);
  } catch (err) {
    if ((err as { code?: unknown }).code !== 'MISSING_PEER') throw err;
    log(`${RAG_MODEL}: prompt budgets for ${model} are estimated (install js-tiktoken to count them exactly)`);
    return undefined;
  }
}

function ragModelError(message: string): InvalidOptionsError {
  return new InvalidOptionsError('serve options', [{ path: 'ragModel', message }]);
}

/** What the embedded models add to a gateway: `sluice-embed` on /v1/embeddings, the pool, their release (the gateway's too). */
function servedLocally(models: LocalModels, gateway: Gateway) {
  return {
    embeddings: { [EMBEDDING_MODEL]: models.embeddings },
    pool: models.pool,
    release: async () => {
      gateway.close();
      models.embeddings.close();
      models.guardModel.close();
      await models.pool.close();
    },
  };
}

export type { InferencePoolStats };
