/**
 * What a sluice server serves: the embedded models (generated ONNX models in a worker-thread
 * pool, `sluice-rag` and `charlm`), or upstream OpenAI-compatible servers (gateway mode).
 * Either way the server gets named workers, the stage counters to export, and a release.
 */
import { StageStats } from '../flow/stats.js';
import type { CacheStats } from '../cache/stats.js';
import { Gateway, type GatewayOptions, type UpstreamOptions } from '../ai/inference/gateway.js';
import { CharLmWorker } from '../ai/inference/onnx-lm.js';
import type { ModelWorker } from '../ai/inference/worker.js';
import { BUNDLED_DATA } from '../ai/models/bundled.js';
import { generateModels, MODEL_FILES } from '../ai/models/generate.js';
import { loadTokenizer } from '../ai/models/load.js';
import { poolClassifier } from '../ai/models/pool-classifier.js';
import { embedder } from '../ai/models/pool-embedder.js';
import { InferencePool, type InferencePoolStats } from '../ai/models/pool.js';
import { BatchedEmbedder } from '../ai/models/batched-embedder.js';

/** The name `/v1/embeddings` serves the generated embedding model under. */
export const EMBEDDING_MODEL = 'sluice-embed';
import { indexPassages, loadCorpus } from '../ai/rag/corpus.js';
import { RAG_STAGES, ragWorker, type RagStage } from '../ai/rag/worker.js';

export interface Backend {
  /** By the name clients put in `model`; the first is the default. */
  readonly workers: Readonly<Record<string, ModelWorker>>;
  /** Models `/v1/embeddings` serves, by name. */
  readonly embeddings?: Readonly<Record<string, BatchedEmbedder>>;
  /** Cache counters to export as metrics, by cache name. */
  readonly caches?: Readonly<Record<string, CacheStats>>;
  /** Stage counters to export as metrics, by stage name. */
  readonly stages: Readonly<Record<string, StageStats>>;
  /** The inference pool, when models run in this process. */
  readonly pool?: InferencePool;
  /** Each upstream's circuit state, in gateway mode. */
  circuits?(): Record<string, string>;
  release(): Promise<void>;
}

export interface EmbeddedOptions {
  readonly models: string;
  readonly corpus: string;
  readonly poolSize: number;
  readonly languageModel: ModelWorker | undefined;
  readonly log: (line: string) => void;
}

/** The generated models (written into `models` when missing), the corpus indexed, `sluice-rag` and its language model. */
export async function embeddedBackend(options: EmbeddedOptions): Promise<Backend> {
  if (BUNDLED_DATA === undefined) throw new Error('the bundled data/ folder is missing from the package');
  const dir = options.models;
  const written = await generateModels({ outDir: dir, dataDir: BUNDLED_DATA });
  const fresh = written.filter((f) => f.written).length;
  if (fresh > 0) options.log(`generated ${fresh} model files into ${dir}/`);

  const pool = await InferencePool.create({
    name: 'serve',
    models: {
      embed: `${dir}/${MODEL_FILES.embedding}`,
      guard: `${dir}/${MODEL_FILES.guard}`,
      ...(options.languageModel === undefined && { charlm: `${dir}/${MODEL_FILES.charLm}` }),
    },
    size: options.poolSize,
  });
  try {
    const tokenizer = await loadTokenizer(`${dir}/${MODEL_FILES.embeddingTokenizer}`);
    const embed = embedder(pool, tokenizer, { model: 'embed' });
    const passages = await loadCorpus(options.corpus);
    const index = await indexPassages(passages, (texts, signal) => embed(texts, signal));
    const local =
      options.languageModel === undefined
        ? await CharLmWorker.load(`${dir}/${MODEL_FILES.charLm}`, { run: (feeds, signal) => pool.run(feeds, { model: 'charlm', signal }) })
        : undefined;
    const lm = options.languageModel ?? local!;
    // The embedding model also answers /v1/embeddings, its requests micro-batched together.
    const embeddings = new BatchedEmbedder(pool, tokenizer, { model: 'embed' });
    const stages = Object.fromEntries(RAG_STAGES.map((name) => [name, new StageStats()])) as Record<RagStage, StageStats>;
    // sluice-rag answers with the retrieved sentences themselves (cited); the character LM is served on its own, as the toy it is.
    const rag = ragWorker({ embedder: embed, index, classify: poolClassifier(pool, tokenizer, { model: 'guard' }), stats: stages });
    options.log(`indexed ${passages.length} passages from ${options.corpus}`);
    return {
      workers: { [rag.name]: rag, [lm.name]: lm },
      embeddings: { [EMBEDDING_MODEL]: embeddings },
      stages: { ...stages, embeddings: embeddings.stats },
      pool,
      release: async () => {
        embeddings.close();
        await local?.release();
        await pool.close();
      },
    };
  } catch (err) {
    await pool.close();
    throw err;
  }
}

/** Upstream servers' models, through the gateway's `upstream` stage. */
export async function gatewayBackend(
  upstreams: readonly UpstreamOptions[],
  tuning: Omit<GatewayOptions, 'upstreams'>,
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
  return {
    workers: gateway.modelWorkers(),
    stages: { upstream: gateway.stats },
    ...(tuning.cache !== undefined || tuning.singleFlight === true ? { caches: { upstream: gateway.cacheStats } } : {}),
    circuits: () => gateway.circuits(),
    release: async () => {},
  };
}

export type { InferencePoolStats };
