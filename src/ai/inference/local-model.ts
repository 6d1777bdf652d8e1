/**
 * A decoder a user exported themselves, from its directory in the common ONNX LLM
 * layout (Optimum / transformers.js): `model.onnx` or `onnx/model.onnx` with a KV cache,
 * `tokenizer.json`, `tokenizer_config.json` (chat template, special tokens), and
 * optionally `config.json` and `generation_config.json`. Everything is checked at load,
 * so a bad directory fails before serving, naming the file.
 */
import { stat } from 'node:fs/promises';
import { basename, join, resolve } from 'node:path';
import type * as ort from 'onnxruntime-node';
import { SluiceError, errorMessage } from '../../core/errors.js';
import { lazySchema } from '../../core/zod.js';
import { functionSchema, parseOptions, positiveInt } from '../../flow/options.js';
import { onnxruntime } from '../../core/peers.js';
import { ChatTemplate, specialToken } from '../models/chat-template.js';
import { ModelCorruptError, ModelNotFoundError, ModelSignatureError } from '../models/errors.js';
import type { HfTokenizer } from '../models/hf-tokenizer.js';
import { SIGNATURES, hfTokenizerFrom, readJson, signatureProblems } from '../models/load.js';
import { TokenTextStream } from './detokenize.js';
import { DecoderLmWorker, type DecoderShape, type RunModel, type TokenCodec } from './onnx-lm.js';
import type { ResidentKvOptions } from './resident-decoder.js';
import type { ChatMessage, GenerateRequest } from './worker.js';
import type { DecoderBatchOptions } from './kv-batch.js';

/** A model directory that cannot be served as it is; the message names the file. */
export class LocalModelError extends SluiceError {
  constructor(
    readonly path: string,
    reason: string,
    cause?: unknown,
  ) {
    super('LOCAL_MODEL_INVALID', `${path}: ${reason}`, {
      hint: 'A model directory holds model.onnx (or onnx/model.onnx) exported with its KV cache (e.g. optimum-cli export onnx --task text-generation-with-past), tokenizer.json and tokenizer_config.json.',
      cause,
    });
  }
}

/** Options of `LocalModel`: its name and its model file. */
export interface LocalModelOptions {
  /** The name clients ask for (`model`). Default: the directory's name. */
  readonly name?: string;
  /** The ONNX file, relative to the directory. Default `model.onnx`, else `onnx/model.onnx`. */
  readonly modelFile?: string;
}

/** Options of the worker a `LocalModel` makes: how to run the model and the token limit. */
export interface LocalWorkerOptions {
  /** Runs the model once (e.g. on an `InferencePool`). Default: a session on the main thread, opened by `worker()`. */
  readonly run: RunModel;
  /** Tokens generated when a request does not say. Default 256. */
  readonly maxTokens?: number;
  /** Batch the decode steps of concurrent generations (see `DecoderLmWorkerOptions.batch`). Default: each step alone. */
  readonly batch?: DecoderBatchOptions;
  /** Bytes its generations' KV caches may hold together (see `DecoderLmWorkerOptions.cacheBytes`). Default: no bound. */
  readonly cacheBytes?: number;
  /** Keep the KV caches in the pool's worker threads (see `DecoderLmWorkerOptions.resident`). Default: they travel with each step. */
  readonly resident?: ResidentKvOptions;
}

const loadSchema = lazySchema((z) =>
  z.strictObject({
    name: z.string({ error: 'name must be a string' }).min(1, { error: 'name must not be empty' }).optional(),
    modelFile: z.string({ error: 'modelFile must be a string' }).min(1, { error: 'modelFile must not be empty' }).optional(),
  }),
);
const workerSchema = lazySchema((z) =>
  z.strictObject({
    run: functionSchema<RunModel>(),
    maxTokens: positiveInt('maxTokens').optional(),
    cacheBytes: positiveInt('cacheBytes').optional(),
    resident: z.custom<ResidentKvOptions>((v) => typeof v === 'object' && v !== null, { error: 'resident must be { pool, model? }' }).optional(),
    batch: z
      .strictObject({
        maxBatch: positiveInt('batch.maxBatch').optional(),
        concurrency: positiveInt('batch.concurrency').optional(),
        tokenBudget: positiveInt('batch.tokenBudget').optional(),
        lengthBucket: positiveInt('batch.lengthBucket').optional(),
      })
      .optional(),
  }),
);

/** The model files looked for, in order, when `modelFile` is not given. */
const MODEL_FILES = ['model.onnx', join('onnx', 'model.onnx')];

const ortRuntime = onnxruntime();

/**
 * A loaded, checked model directory: its tokenizer, chat template, end-of-sequence tokens
 * and cache shape, ready to make `DecoderLmWorker`s whose `run` you choose.
 *
 * ## Example
 * ```ts
 * const local = await LocalModel.load('./qwen3-0.6b-onnx');
 * const pool = await InferencePool.create({ models: { [local.name]: local.modelPath } });
 * const lm = local.worker({ run: (feeds, signal) => pool.run(feeds, { model: local.name, signal }) });
 * const { text } = await lm.infer(generateRequest({ messages: [{ role: 'user', content: 'Hi' }], max_tokens: 64 }));
 * ```
 */
export class LocalModel {
  private constructor(
    readonly name: string,
    readonly dir: string,
    /** The ONNX file, for `InferencePool` (which reads external data files beside it). */
    readonly modelPath: string,
    readonly tokenizer: HfTokenizer,
    /** Undefined when the config has none: chats are then their contents, one per line. */
    readonly chatTemplate: ChatTemplate | undefined,
    readonly eosTokenIds: readonly number[],
    readonly shape: DecoderShape,
    /** Prepended to a plain `prompt` when the tokenizer config says `add_bos_token`. */
    private readonly bos: string,
  ) {}

  /**
   * Reads and checks `dir`. Throws `LocalModelError` (no model file, no end-of-sequence token,
   * a vocabulary larger than the model's logits), `ModelNotFoundError` (a required file missing),
   * `ModelCorruptError` (not JSON, not ONNX), `ModelSignatureError` (not a decoder with a KV cache),
   * `UnsupportedTokenizerError`, or `MissingPeerError` for `@huggingface/tokenizers` / `@huggingface/jinja`.
   */
  static async load(dir: string, options: LocalModelOptions = {}): Promise<LocalModel> {
    parseOptions(loadSchema(), options, 'LocalModel.load options');
    const root = resolve(dir);
    const info = await stat(root).catch(() => undefined);
    if (info === undefined || !info.isDirectory()) throw new LocalModelError(dir, 'is not a directory.');
    const modelPath = await findModel(root, options.modelFile);
    const config = await optionalJson(join(root, 'config.json'));
    const generation = await optionalJson(join(root, 'generation_config.json'));
    const tokenizerConfig = asRecord(await readJson(join(root, 'tokenizer_config.json'), 'Tokenizer config'), join(root, 'tokenizer_config.json'));
    const tokenizerPath = join(root, 'tokenizer.json');
    const tokenizer = hfTokenizerFrom(await readJson(tokenizerPath, 'Tokenizer'), tokenizerPath, { config: tokenizerConfig });
    let chatTemplate: ChatTemplate | undefined;
    try {
      chatTemplate = ChatTemplate.fromConfig(tokenizerConfig);
    } catch (cause) {
      if ((cause as { code?: unknown }).code === 'MISSING_PEER') throw cause;
      throw new LocalModelError(join(root, 'tokenizer_config.json'), `its chat_template does not parse (${errorMessage(cause)}).`);
    }

    const session = await openSession(modelPath);
    let shape: DecoderShape;
    let logitsVocab: number | undefined;
    try {
      const problems = signatureProblems(session, SIGNATURES.decoderWithPast);
      if (problems.length > 0) throw new ModelSignatureError(modelPath, SIGNATURES.decoderWithPast.kind, problems);
      shape = cacheShape(session, config, modelPath);
      const logits = session.outputMetadata.find((m) => m.name === 'logits');
      const last = logits?.isTensor ? logits.shape[2] : undefined;
      logitsVocab = typeof last === 'number' ? last : undefined;
    } finally {
      await session.release();
    }
    if (logitsVocab !== undefined && tokenizer.vocabSize > logitsVocab)
      throw new LocalModelError(
        tokenizerPath,
        `it has ${tokenizer.vocabSize} tokens but ${modelPath} has logits for ${logitsVocab}: they are not from the same model.`,
      );

    const eosTokenIds = endTokens(tokenizer, tokenizerConfig, config, generation);
    if (eosTokenIds.length === 0)
      throw new LocalModelError(root, 'no end-of-sequence token: set eos_token in tokenizer_config.json or eos_token_id in generation_config.json.');
    const bos = tokenizerConfig.add_bos_token === true ? (specialToken(tokenizerConfig.bos_token) ?? '') : '';
    return new LocalModel(options.name ?? basename(root), root, modelPath, tokenizer, chatTemplate, eosTokenIds, shape, bos);
  }

  /** The text the model continues: the chat through the template (ending where the answer begins), or the prompt. */
  promptText(request: Pick<GenerateRequest, 'prompt' | 'messages'>): string {
    if (request.messages === undefined) return this.bos + (request.prompt ?? '');
    if (this.chatTemplate !== undefined) return this.chatTemplate.render(request.messages);
    return request.messages.map((m) => m.content).join('\n');
  }

  /** Exact prompt tokens of a chat, template included: what a token budget for this model should count. */
  countPromptTokens(messages: readonly ChatMessage[]): number {
    return this.tokenizer.encodePlain(this.promptText({ messages })).length;
  }

  /** Tokens of a text with this model's tokenizer (no special tokens added). */
  countTokens(text: string): number {
    return this.tokenizer.countTokens(text);
  }

  /** A worker generating with this model through `run`; streams text whole characters at a time. */
  worker(options: LocalWorkerOptions): DecoderLmWorker {
    parseOptions(workerSchema(), options, 'LocalModel worker options');
    const tokenizer = this.tokenizer;
    const codec: TokenCodec = {
      encode: (text) => tokenizer.encodePlain(text),
      decode: (id) => tokenizer.decode([id]),
      stream: (context) => new TokenTextStream((ids) => tokenizer.decode(ids), context),
    };
    return new DecoderLmWorker({
      name: this.name,
      shape: this.shape,
      run: options.run,
      codec,
      eosTokenIds: this.eosTokenIds,
      vocabSize: tokenizer.vocabSize,
      template: (request) => this.promptText(request),
      ...(options.maxTokens !== undefined && { maxTokens: options.maxTokens }),
      ...(options.batch !== undefined && { batch: options.batch }),
      ...(options.cacheBytes !== undefined && { cacheBytes: options.cacheBytes }),
      ...(options.resident !== undefined && { resident: options.resident }),
    });
  }
}

async function findModel(root: string, file: string | undefined): Promise<string> {
  const candidates = file === undefined ? MODEL_FILES : [file];
  for (const candidate of candidates) {
    const path = join(root, candidate);
    const info = await stat(path).catch(() => undefined);
    if (info?.isFile()) {
      if (info.size === 0) throw new ModelCorruptError(path, 'the file is empty.');
      return path;
    }
  }
  throw new LocalModelError(root, `no model file: expected ${candidates.join(' or ')} in it.`);
}

async function openSession(path: string): Promise<ort.InferenceSession> {
  try {
    // By path, so onnxruntime finds external data (model.onnx_data) beside it.
    return await ortRuntime.InferenceSession.create(path, { executionProviders: ['cpu'] });
  } catch (cause) {
    const message = errorMessage(cause).split('\n')[0]!.trim();
    throw new ModelCorruptError(path, `onnxruntime rejected it as an ONNX model (${message}).`, cause);
  }
}

async function optionalJson(path: string): Promise<Record<string, unknown>> {
  try {
    return asRecord(await readJson(path, 'Config'), path);
  } catch (err) {
    if (err instanceof ModelNotFoundError) return {};
    throw err;
  }
}

function asRecord(json: unknown, path: string): Record<string, unknown> {
  if (typeof json !== 'object' || json === null || Array.isArray(json)) throw new ModelCorruptError(path, 'it is not a JSON object.');
  return json as Record<string, unknown>;
}

/** Layers, heads and head size from the cache inputs (as exports fix them), positions from config.json. */
function cacheShape(session: ort.InferenceSession, config: Record<string, unknown>, path: string): DecoderShape {
  const keys = session.inputMetadata.filter((m) => /^past_key_values\.\d+\.key$/.test(m.name));
  const first = keys[0];
  const dims = first?.isTensor ? first.shape : [];
  const heads = typeof dims[1] === 'number' ? dims[1] : numberIn(config, 'num_key_value_heads', 'num_attention_heads');
  const hidden = numberIn(config, 'hidden_size');
  const attentionHeads = numberIn(config, 'num_attention_heads');
  const headDim =
    typeof dims[3] === 'number'
      ? dims[3]
      : (numberIn(config, 'head_dim') ?? (hidden !== undefined && attentionHeads !== undefined ? hidden / attentionHeads : undefined));
  if (heads === undefined || headDim === undefined)
    throw new LocalModelError(path, 'past_key_values.0.key leaves its heads or head size open (axes 1 and 3), and config.json does not give them.');
  const maxPositions = numberIn(config, 'max_position_embeddings', 'n_positions');
  return { layers: keys.length, heads, headDim, ...(maxPositions !== undefined && { maxPositions }) };
}

function numberIn(record: Record<string, unknown>, ...keys: string[]): number | undefined {
  for (const key of keys) if (typeof record[key] === 'number' && Number.isInteger(record[key])) return record[key];
  return undefined;
}

/** End-of-sequence ids: generation_config's, config.json's, and the tokenizer config's `eos_token`, together. */
function endTokens(
  tokenizer: HfTokenizer,
  tokenizerConfig: Record<string, unknown>,
  config: Record<string, unknown>,
  generation: Record<string, unknown>,
): number[] {
  const ids = new Set<number>();
  for (const value of [generation.eos_token_id, config.eos_token_id]) {
    for (const id of Array.isArray(value) ? value : [value]) if (typeof id === 'number' && Number.isInteger(id) && id >= 0) ids.add(id);
  }
  const eos = specialToken(tokenizerConfig.eos_token);
  const eosId = eos === undefined ? undefined : tokenizer.tokenId(eos);
  if (eosId !== undefined) ids.add(eosId);
  return [...ids];
}
