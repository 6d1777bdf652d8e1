/**
 * `ModelWorker`s over ONNX language models: a causal LM without a cache (the bundled
 * character trigram model) and a decoder with a KV cache (`past_key_values.N.*` in,
 * `present.N.*` out, Hugging Face / Optimum layout).
 *
 * Every model call goes through one `run(feeds, signal)` function. `load()` defaults
 * it to the session on the main thread; pass your own (a worker-thread pool) to move
 * inference off the event loop — onnxruntime's `run()` blocks the thread it runs on.
 * A running step cannot be interrupted, so the signal is checked between steps.
 */
import { readFile } from 'node:fs/promises';
import type { Flow } from '../../flow/demand.js';
import { SIGNATURES, loadModel, type LoadedModel } from '../models/load.js';
import { ContextLengthExceededError, EmptyPromptError } from './errors.js';
import { lazySchema, type ZodModule } from '../../core/zod.js';
import { functionSchema, parseOptions, positiveInt } from '../../flow/options.js';
import { seededRandom } from '../../resilience/random.js';
import { sampleToken } from './sampling.js';
import { StepBatcher, type StepBatcherOptions, type StepBatcherStats } from './step-batcher.js';
import { kvBatcher, kvBytes, ownCache, presentAsPast, type CachedResult, type CachedStep, type DecoderBatchOptions, type KvCache } from './kv-batch.js';
import { ResidentDecoder, type ResidentKvOptions } from './resident-decoder.js';
import { emptyCache } from '../pool/kv-stack.js';
import { int64, lastRow, type DecoderShape, type RunModel } from './lm-tensors.js';

export type { DecoderShape, RunModel };
import { CacheBudget, type CacheBudgetStats } from './cache-budget.js';
import {
  complete,
  decode,
  generateRequest,
  promptText,
  type Completion,
  type DecodeStep,
  type Decoding,
  type GenerateOptions,
  type GenerateRequest,
  type InferOptions,
  type ModelWorker,
  type Token,
} from './worker.js';

/** Text to token ids and back, one token at a time. */
export interface TokenCodec {
  /** The token ids of `text`. */
  encode(text: string): number[];
  /** The text of one token id. */
  decode(id: number): string;
  /**
   * A decoder for one generation, when a token's text depends on its neighbours (byte-level
   * BPE splitting a character, SentencePiece spaces): `push` gives the text each id adds,
   * `end` what is still held. `context` is the prompt's ids. Without it, `decode` per id.
   */
  stream?(context: readonly number[]): {
    /** The text `id` adds (may be empty while a character is incomplete). */
    push(id: number): string;
    /** The text still held back, at the end of the stream. */
    end(): string;
  };
}

interface LmWorkerOptions {
  /** Names the worker in traces and errors. */
  readonly name?: string;
  /** Tokens generated when the request does not say (`max_tokens`). Default 256. */
  readonly maxTokens?: number;
  /** How a chat becomes text to continue. Default: the contents, one per line. */
  readonly template?: (request: GenerateRequest) => string;
}

/** The fields of `LmWorkerOptions`, for the workers' strict schemas. */
const lmFields = (z: ZodModule) => ({
  name: z.string({ error: 'name must be a string' }).min(1, { error: 'name must not be empty' }).optional(),
  maxTokens: positiveInt('maxTokens').optional(),
  template: functionSchema<(request: GenerateRequest) => string>().optional(),
  run: functionSchema<RunModel>(),
});

/** A session's run as a `RunModel`: on the main thread, blocking it for the step. */
function sessionRunner(model: LoadedModel): RunModel {
  return (feeds) => model.run(feeds);
}

abstract class LmWorker implements ModelWorker<GenerateRequest, Completion> {
  abstract readonly name: string;
  protected abstract readonly maxTokens: number;
  protected abstract readonly template: (request: GenerateRequest) => string;
  protected abstract open(request: GenerateRequest): Decoding;

  generate(request: GenerateRequest, options: GenerateOptions = {}): Flow<Token> {
    const valid = generateRequest(request);
    return decode(valid, options, { name: this.name, maxTokens: valid.max_tokens ?? this.maxTokens }, () => this.open(valid));
  }

  /** The whole completion, generated with `generate`. */
  infer(request: GenerateRequest, options: InferOptions = {}): Promise<Completion> {
    return complete((onDone) => this.generate(request, { ...options, onDone }));
  }
}

/** Options of `CharLmWorker`. */
export interface CharLmWorkerOptions extends LmWorkerOptions {
  /** The model's characters by id; id 0 is beginning-of-text (`charlm.vocab.json`). */
  readonly vocab: readonly string[];
  readonly run: RunModel;
  /** Characters of context fed per step. The trigram model reads two; more costs only time. Default 8. */
  readonly window?: number;
  /**
   * Batch the steps of concurrent generations (`StepBatcher`): the steps asked together run as
   * one model call, by context length, each row as it would alone. Default: each step its own call.
   */
  readonly batch?: StepBatcherOptions;
}

const charLmSchema = lazySchema((z) =>
  z.strictObject({
    ...lmFields(z),
    vocab: z.array(z.string(), { error: 'vocab must be an array of strings' }),
    window: positiveInt('window').optional(),
    batch: z.strictObject({ maxBatch: positiveInt('batch.maxBatch').optional(), concurrency: positiveInt('batch.concurrency').optional() }).optional(),
  }),
);
const charLmLoadSchema = lazySchema((z) =>
  charLmSchema()
    .partial()
    .extend({ vocabPath: z.string({ error: 'vocabPath must be a string' }).optional() }),
);

/**
 * The character language model (`charlm.onnx`: `input_ids` → `logits`). It has no
 * cache: each step feeds the last `window` characters and reads the last position's
 * logits. It has no end-of-text either, so a generation ends at `max_tokens` or a stop
 * sequence. Characters outside its vocabulary are dropped from the prompt.
 *
 * ## Example
 * ```ts
 * const lm = await CharLmWorker.load('models/charlm.onnx');   // reads models/charlm.vocab.json
 * lm.generate(generateRequest({ prompt: 'The stage', max_tokens: 80, temperature: 0.8, seed: 1 })).subscribe((t) => process.stdout.write(t.text));
 * ```
 */
export class CharLmWorker extends LmWorker {
  readonly name: string;
  protected readonly maxTokens: number;
  protected readonly template: (request: GenerateRequest) => string;
  private readonly index: Map<string, number>;

  /** Bad options throw `InvalidOptionsError` naming the field. */
  constructor(private readonly options: CharLmWorkerOptions) {
    super();
    parseOptions(charLmSchema(), options, 'CharLmWorker options');
    this.name = options.name ?? 'charlm';
    this.maxTokens = options.maxTokens ?? 256;
    this.template = options.template ?? promptText;
    this.index = new Map(options.vocab.map((ch, id) => [ch, id]));
    const run = options.run;
    // A batch is shared: no one generation's signal may abort it (a cancelled one leaves before its call).
    const never = new AbortController().signal;
    this.batcher =
      options.batch === undefined
        ? undefined
        : new StepBatcher<readonly number[], Float32Array>(
            async (contexts) => {
              const length = contexts[0]!.length;
              const { logits } = await run({ input_ids: int64(contexts.flat(), [contexts.length, length]) }, never);
              const vocab = logits!.dims[2]!;
              const data = logits!.data as Float32Array;
              return contexts.map((_, b) => data.slice(((b + 1) * length - 1) * vocab, (b + 1) * length * vocab));
            },
            (context) => String(context.length),
            options.batch,
          );
  }

  private readonly batcher: StepBatcher<readonly number[], Float32Array> | undefined;

  /** Model calls and steps of the batched steps (`batch`), when on. */
  get batchStats(): StepBatcherStats | undefined {
    return this.batcher?.stats;
  }

  /** Loads `path` (checked against `SIGNATURES.causalLm`) and its vocabulary (`vocabPath`, default `<name>.vocab.json` beside it). */
  static async load(path: string, options: Partial<CharLmWorkerOptions> & { readonly vocabPath?: string } = {}): Promise<CharLmWorker> {
    parseOptions(charLmLoadSchema(), options, 'CharLmWorker.load options');
    const { vocabPath: _, ...workerOptions } = options;
    const vocab = options.vocab ?? (JSON.parse(await readFile(options.vocabPath ?? `${path.replace(/\.onnx$/, '')}.vocab.json`, 'utf8')) as string[]);
    const model = options.run === undefined ? await loadModel(path, { signature: SIGNATURES.causalLm }) : undefined;
    const worker = new CharLmWorker({ ...workerOptions, vocab, run: options.run ?? sessionRunner(model!) });
    worker.model = model;
    return worker;
  }

  private model: LoadedModel | undefined;

  /** Releases the session `load` created (not an injected runner's). */
  async release(): Promise<void> {
    await this.model?.release();
    this.model = undefined;
  }

  protected open(request: GenerateRequest): Decoding {
    const ids = Array.from(this.template(request)).flatMap((ch) => {
      const id = this.index.get(ch);
      return id === undefined || id === 0 ? [] : [id];
    });
    const { vocab, run } = this.options;
    const batcher = this.batcher;
    const window = this.options.window ?? 8;
    const random = request.seed === undefined ? Math.random : seededRandom(request.seed);
    const inputTokens = ids.length;
    return {
      inputTokens,
      async step(signal): Promise<DecodeStep> {
        // An empty context is the start of a text: the model reads id 0 as beginning-of-text.
        const context = ids.length === 0 ? [0] : ids.slice(-window);
        const scores =
          batcher === undefined
            ? Float32Array.from(lastRow((await run({ input_ids: int64(context, [1, context.length]) }, signal)).logits!))
            : await batcher.step(context, signal);
        scores[0] = -Infinity; // beginning-of-text is context, never a prediction
        const { id, logprob } = sampleToken(scores, request, random, ids, inputTokens);
        ids.push(id);
        return { text: vocab[id] ?? '', logprob };
      },
      close() {},
    };
  }
}

/** Options of `DecoderLmWorker`: the model's shape, its codec and its end-of-sequence tokens. */
export interface DecoderLmWorkerOptions extends LmWorkerOptions {
  readonly shape: DecoderShape;
  readonly run: RunModel;
  /** Default: one token per character code below 128 (the bundled decoder's vocabulary). */
  readonly codec?: TokenCodec;
  /** The token that ends a generation (`stop`). Default: none. */
  readonly eosTokenId?: number;
  /** More tokens that end a generation (a chat model's end of turn beside its end of text). */
  readonly eosTokenIds?: readonly number[];
  /** Ids the codec can decode, `[0, vocabSize)`: a model whose logits are padded past its tokenizer never samples the rest. */
  readonly vocabSize?: number;
  /**
   * Batch the decode steps of concurrent generations (`StepBatcher`): steps asked together whose
   * caches have the same length run as one model call, their caches stacked, each row as it would
   * alone. A prompt's first step runs alone. Default: each step its own call.
   */
  readonly batch?: DecoderBatchOptions;
  /**
   * Bytes the KV caches of its generations may hold together between steps. Past it, the caches of
   * the generations stepped least recently (a reader that stopped reading) are dropped, and each
   * recomputes its cache from its tokens at its next step. Default: no bound.
   */
  readonly cacheBytes?: number;
  /**
   * Keep each generation's KV cache in the pool worker thread that computed it: a step sends its
   * token ids and gets logits back, and runs on that thread, batched (`batch`) with the other
   * generations there (`batch.concurrency` does not apply: each thread runs one call at a time). `run`
   * is then not used. Default: caches live on this thread and travel with every step.
   */
  readonly resident?: ResidentKvOptions;
}

/** Characters with codes below 128, one token each; others are dropped. */
export const ASCII_CODEC: TokenCodec = {
  encode: (text) => Array.from(text, (ch) => ch.charCodeAt(0)).filter((code) => code < 128),
  decode: (id) => String.fromCharCode(id),
};

const decoderLmSchema = lazySchema((z) => {
  const tokenId = (what: string) =>
    z
      .number({ error: `${what} must be a number` })
      .int({ error: `${what} must be an integer` })
      .min(0, { error: `${what} must be ≥ 0` });
  return z.strictObject({
    ...lmFields(z),
    shape: z.object(
      {
        layers: positiveInt('shape.layers'),
        heads: positiveInt('shape.heads'),
        headDim: positiveInt('shape.headDim'),
        maxPositions: positiveInt('shape.maxPositions').optional(),
      },
      { error: 'shape must be { layers, heads, headDim, maxPositions? }' },
    ),
    codec: z
      .custom<TokenCodec>(
        (v) => typeof v === 'object' && v !== null && typeof (v as TokenCodec).encode === 'function' && typeof (v as TokenCodec).decode === 'function',
        {
          error: 'codec must have encode() and decode()',
        },
      )
      .optional(),
    eosTokenId: tokenId('eosTokenId').optional(),
    eosTokenIds: z.array(tokenId('eosTokenIds[]'), { error: 'eosTokenIds must be an array of token ids' }).optional(),
    vocabSize: positiveInt('vocabSize').optional(),
    cacheBytes: positiveInt('cacheBytes').optional(),
    resident: z
      .strictObject(
        {
          pool: z.custom<ResidentKvOptions['pool']>((v) => typeof (v as { runResident?: unknown } | null)?.runResident === 'function', {
            error: 'resident.pool must be an InferencePool',
          }),
          model: z.string({ error: 'resident.model must be a string' }).min(1, { error: 'resident.model must not be empty' }).optional(),
        },
        { error: 'resident must be { pool, model? }' },
      )
      .optional(),
    batch: z
      .strictObject({
        maxBatch: positiveInt('batch.maxBatch').optional(),
        concurrency: positiveInt('batch.concurrency').optional(),
        lengthBucket: positiveInt('batch.lengthBucket').optional(),
        tokenBudget: positiveInt('batch.tokenBudget').optional(),
      })
      .optional(),
  });
});

/**
 * A decoder with a KV cache (`decoder.onnx`). The first step feeds the whole prompt
 * with an empty cache; every later step feeds only the new token, its position and the
 * `present.N.*` tensors of the step before as `past_key_values.N.*`, so a step costs
 * one position, not the whole text.
 *
 * ## Example
 * ```ts
 * const decoder = await DecoderLmWorker.load('models/decoder.onnx');
 * const { text } = await decoder.infer(generateRequest({ prompt: 'Hello, ', max_tokens: 16, temperature: 0 }));
 * ```
 */
export class DecoderLmWorker extends LmWorker {
  readonly name: string;
  protected readonly maxTokens: number;
  protected readonly template: (request: GenerateRequest) => string;
  private model: LoadedModel | undefined;

  /** `shape.maxPositions`: a prompt that leaves no room, or no room for the `max_tokens` asked, is refused before decoding. */
  readonly contextLength: number | undefined;

  /** Bad options throw `InvalidOptionsError` naming the field. */
  constructor(private readonly options: DecoderLmWorkerOptions) {
    super();
    parseOptions(decoderLmSchema(), options, 'DecoderLmWorker options');
    this.name = options.name ?? 'decoder';
    this.contextLength = options.shape.maxPositions;
    this.maxTokens = options.maxTokens ?? 256;
    this.template = options.template ?? promptText;
    this.resident = options.resident === undefined ? undefined : new ResidentDecoder(options.resident, options.shape, options.batch ?? { maxBatch: 1 });
    this.batcher = options.batch === undefined || this.resident !== undefined ? undefined : kvBatcher(options.shape, options.run, options.batch);
    this.budget = options.cacheBytes === undefined ? undefined : new CacheBudget(options.cacheBytes);
  }

  private readonly budget: CacheBudget | undefined;

  /** The caches' bytes now and how many were dropped (`cacheBytes`), when bounded. */
  get cacheStats(): CacheBudgetStats | undefined {
    return this.budget?.stats;
  }

  private readonly batcher: StepBatcher<CachedStep, CachedResult> | undefined;
  private readonly resident: ResidentDecoder | undefined;

  /** Model calls and steps of the batched decode steps (`batch`, or `resident`), when on. */
  get batchStats(): StepBatcherStats | undefined {
    return this.resident?.stats ?? this.batcher?.stats;
  }

  /**
   * Loads `path` (checked against `SIGNATURES.decoderWithPast`) and reads the cache shape
   * from its inputs; `maxPositions` comes from `<name>.json` beside it when present.
   * With an injected `run`, the session is still opened here to read the shape, then released.
   */
  static async load(path: string, options: Partial<DecoderLmWorkerOptions> = {}): Promise<DecoderLmWorker> {
    parseOptions(decoderLmSchema().partial(), options, 'DecoderLmWorker.load options');
    const model = await loadModel(path, { signature: SIGNATURES.decoderWithPast });
    const shape = options.shape ?? (await readShape(model, path));
    if (options.run !== undefined) await model.release();
    const worker = new DecoderLmWorker({ ...options, shape, run: options.run ?? sessionRunner(model) });
    if (options.run === undefined) worker.model = model;
    return worker;
  }

  /** Releases the session `load` created (not an injected runner's). */
  async release(): Promise<void> {
    await this.model?.release();
    this.model = undefined;
  }

  protected open(request: GenerateRequest): Decoding {
    const { shape, run, vocabSize } = this.options;
    const batcher = this.batcher;
    const codec = this.options.codec ?? ASCII_CODEC;
    const eos = new Set(this.options.eosTokenIds ?? []);
    if (this.options.eosTokenId !== undefined) eos.add(this.options.eosTokenId);
    const ids = codec.encode(this.template(request));
    if (ids.length === 0) throw new EmptyPromptError("the prompt has no token the model's vocabulary covers");
    const limit = this.contextLength;
    // A prompt filling the context would end at once with `length` and no text: refused instead, as is one without room for the max_tokens asked.
    if (limit !== undefined && (ids.length >= limit || (request.max_tokens !== undefined && ids.length + request.max_tokens > limit))) {
      const param = request.prompt === undefined ? 'messages' : 'prompt';
      throw new ContextLengthExceededError(this.name, limit, ids.length, ids.length >= limit ? undefined : request.max_tokens, param);
    }
    const random = request.seed === undefined ? Math.random : seededRandom(request.seed);
    const sequence = this.resident?.sequence();
    let past: KvCache = emptyCache(shape);
    let input = [...ids];
    // Dropped to fit the budget: the next step feeds every token again (a prefill) to rebuild it.
    const hold = this.budget?.hold(() => {
      if (sequence !== undefined) return sequence.drop();
      past = emptyCache(shape);
      input = [...ids];
    });
    const inputTokens = ids.length;
    const text = codec.stream?.(ids);
    /** Set once the model ended while `text` still held an incomplete character: it is emitted first. */
    let ending: 'stop' | 'length' | undefined;
    const end = (reason: 'stop' | 'length'): DecodeStep => {
      const rest = text?.end() ?? '';
      if (rest.length === 0) return { end: reason };
      ending = reason;
      return { text: rest, tokens: 0 };
    };
    return {
      inputTokens,
      async step(signal): Promise<DecodeStep> {
        if (ending !== undefined) return { end: ending };
        if (shape.maxPositions !== undefined && ids.length >= shape.maxPositions) return end('length');
        let scores: Float32Array;
        if (sequence !== undefined) {
          const result = await sequence.step(ids, signal);
          hold?.used(result.bytes);
          scores = result.logits;
        } else if (batcher !== undefined) {
          const result = await batcher.step({ past, ids: input, position: ids.length - input.length }, signal);
          hold?.used(kvBytes(result.past));
          past = result.past;
          scores = result.logits;
        } else {
          const start = ids.length - input.length;
          const out = await run(
            {
              ...ownCache(past, shape),
              input_ids: int64(input, [1, input.length]),
              attention_mask: int64(new Array<number>(ids.length).fill(1), [1, ids.length]),
              position_ids: int64(
                input.map((_, i) => start + i),
                [1, input.length],
              ),
            },
            signal,
          );
          past = presentAsPast(out, shape.layers);
          hold?.used(kvBytes(past));
          scores = lastRow(out.logits!);
        }
        // Padding rows of the embedding table (no token of the tokenizer) are never sampled.
        if (vocabSize !== undefined && vocabSize < scores.length) scores.fill(-Infinity, vocabSize);
        const { id, logprob } = sampleToken(scores, request, random, ids, inputTokens);
        ids.push(id);
        input = [id];
        if (eos.has(id)) return end('stop');
        return { text: text === undefined ? codec.decode(id) : text.push(id), logprob };
      },
      close() {
        past = {};
        sequence?.drop();
        hold?.release();
      },
    };
  }
}

async function readShape(model: LoadedModel, path: string): Promise<DecoderShape> {
  const keys = model.session.inputMetadata.filter((m) => /^past_key_values\.\d+\.key$/.test(m.name));
  const first = keys[0];
  const dims = first?.isTensor ? first.shape : [];
  const heads = dims[1];
  const headDim = dims[3];
  if (typeof heads !== 'number' || typeof headDim !== 'number') {
    throw new TypeError(`${path}: past_key_values.0.key must declare fixed heads and head size (axes 1 and 3); pass options.shape`);
  }
  let maxPositions: number | undefined;
  try {
    const config = JSON.parse(await readFile(`${path.replace(/\.onnx$/, '')}.json`, 'utf8')) as { maxPositions?: unknown };
    if (typeof config.maxPositions === 'number') maxPositions = config.maxPositions;
  } catch {
    // no sidecar config: positions are unbounded as far as the worker knows
  }
  return maxPositions === undefined ? { layers: keys.length, heads, headDim } : { layers: keys.length, heads, headDim, maxPositions };
}
