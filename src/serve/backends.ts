/**
 * What a sluice server serves: the embedded models (generated ONNX models in a worker-thread
 * pool, `sluice-rag` and `charlm`), or upstream OpenAI-compatible servers (gateway mode).
 * Either way the server gets named workers, the stage counters to export, and a release.
 */
import { StageStats } from '../flow/stats.js';
import type { CacheStats } from '../cache/stats.js';
import { Gateway, type GatewayOptions, type UpstreamOptions } from '../ai/inference/gateway.js';
import { CharLmWorker } from '../ai/inference/onnx-lm.js';
import { LocalModel, LocalModelError } from '../ai/inference/local-model.js';
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

/** A model directory to serve (`sluice serve --model DIR`), under its directory's name unless `name` says. */
export type LocalModelSpec = string | { readonly dir: string; readonly name?: string };

export interface EmbeddedOptions {
  readonly models: string;
  /** The user's own exported decoders, served first (the first is the default model) and answering sluice-rag. */
  readonly localModels?: readonly LocalModelSpec[];
  readonly corpus: string;
  readonly poolSize: number;
  readonly languageModel: ModelWorker | undefined;
  readonly log: (line: string) => void;
}

/** The generated models (written into `models` when missing), the corpus indexed, `sluice-rag` and its language model. */
export async function embeddedBackend(options: EmbeddedOptions): Promise<Backend> {
  if (BUNDLED_DATA === undefined) throw new Error('the bundled data/ folder is missing from the package');
  // The user's models first: a bad directory fails the start before anything is generated.
  const locals = await loadLocalModels(options.localModels ?? []);
  for (const local of locals) {
    options.log(
      `model ${local.name}: ${local.modelPath} (${local.shape.layers} layers, ${local.tokenizer.vocabSize} tokens, ${local.chatTemplate === undefined ? 'no chat template' : 'chat template'})`,
    );
  }
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
      // Prefixed, so a user's directory name never collides with the pool's own models.
      ...Object.fromEntries(locals.map((local) => [`local:${local.name}`, local.modelPath])),
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
    const localWorkers = locals.map((model) => model.worker({ run: (feeds, signal) => pool.run(feeds, { model: `local:${model.name}`, signal }) }));
    // The embedding model also answers /v1/embeddings, its requests micro-batched together.
    const embeddings = new BatchedEmbedder(pool, tokenizer, { model: 'embed' });
    const stages = Object.fromEntries(RAG_STAGES.map((name) => [name, new StageStats()])) as Record<RagStage, StageStats>;
    // sluice-rag answers with the retrieved sentences themselves (cited); the character LM is served on its own, as the toy it is.
    // With a model of the user's, sluice-rag answers with it, the prompt's budget counted by its tokenizer and template.
    const answering = locals[0] === undefined ? {} : { lm: localWorkers[0]!, tokenizer: locals[0] };
    const rag = ragWorker({ embedder: embed, index, classify: poolClassifier(pool, tokenizer, { model: 'guard' }), stats: stages, ...answering });
    options.log(`indexed ${passages.length} passages from ${options.corpus}`);
    return {
      workers: { ...Object.fromEntries(localWorkers.map((w) => [w.name, w])), [rag.name]: rag, [lm.name]: lm },
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
      const message = err instanceof Error ? err.message : String(err);
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
