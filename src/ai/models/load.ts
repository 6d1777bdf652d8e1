import { readFile } from 'node:fs/promises';
import type * as ort from 'onnxruntime-node';
import { onnxruntime } from '../../core/peers.js';
import type * as z from 'zod';
import { lazySchema } from '../../core/zod.js';
import { ModelCorruptError, ModelNotFoundError, ModelSignatureError, UnsupportedTokenizerError } from './errors.js';
import { embeddingOutputProblem } from './pooling.js';
import { HashTokenizer, type Tokenizer } from './tokenizer.js';
import { HfTokenizer } from './hf-tokenizer.js';
import { errorMessage } from '../../core/errors.js';

const ortRuntime = onnxruntime();

/** What an adapter requires of one input or output. */
export interface TensorSpec {
  readonly type: ort.Tensor.Type;
  /** One entry per axis: a size the model must fix, or `null` for any (fixed or symbolic). */
  readonly dims: readonly (number | null)[];
  /** An input the adapter feeds, or an output it reads, when the model has it (`check` can require one of several). */
  readonly optional?: boolean;
}

/** The inputs and outputs an adapter feeds and reads, by name. */
export interface ModelSignature {
  readonly kind: string;
  readonly inputs: Readonly<Record<string, TensorSpec>>;
  readonly outputs: Readonly<Record<string, TensorSpec>>;
  /** Further inputs the adapter can feed, recognised by name (e.g. one per layer of a KV cache). */
  readonly extraInputs?: { readonly pattern: RegExp; readonly spec: TensorSpec };
  readonly extraOutputs?: { readonly pattern: RegExp; readonly spec: TensorSpec };
  /** Cross-checks between names, returning the problems found. */
  readonly check?: (inputs: readonly string[], outputs: readonly string[]) => string[];
}

const ids: TensorSpec = { type: 'int64', dims: [null, null] };
const kvCache: TensorSpec = { type: 'float32', dims: [null, null, null, null] };

/** The signatures of the models sluice's adapters run; sentence-transformer and decoder-LLM export names. */
export const SIGNATURES = {
  /**
   * Pooled exports (`embeddings`, `sentence_embedding` [batch, dim]) and token-level ones
   * (`last_hidden_state`, `token_embeddings` [batch, seq, dim], pooled by `planPooling`/`embedder`):
   * at least one of the four.
   */
  embedding: {
    kind: 'embedding',
    inputs: { input_ids: ids, attention_mask: ids, token_type_ids: { ...ids, optional: true } },
    outputs: {
      embeddings: { type: 'float32', dims: [null, null], optional: true },
      sentence_embedding: { type: 'float32', dims: [null, null], optional: true },
      last_hidden_state: { type: 'float32', dims: [null, null, null], optional: true },
      token_embeddings: { type: 'float32', dims: [null, null, null], optional: true },
    },
    /** Lists what is wrong with the session's inputs and outputs (empty when it fits). */
    check: (_, outputs) => {
      const problem = embeddingOutputProblem(outputs);
      return problem === undefined ? [] : [problem];
    },
  },
  classifier: {
    kind: 'classifier',
    inputs: { input_ids: ids, attention_mask: ids, token_type_ids: { ...ids, optional: true } },
    outputs: { scores: { type: 'float32', dims: [null, null] } },
  },
  causalLm: {
    kind: 'causal language',
    inputs: { input_ids: ids, attention_mask: { ...ids, optional: true }, position_ids: { ...ids, optional: true } },
    outputs: { logits: { type: 'float32', dims: [null, null, null] } },
  },
  decoderWithPast: {
    kind: 'decoder-with-past',
    inputs: { input_ids: ids, attention_mask: ids, position_ids: { ...ids, optional: true } },
    outputs: { logits: { type: 'float32', dims: [null, null, null] } },
    extraInputs: { pattern: /^past_key_values\.\d+\.(key|value)$/, spec: kvCache },
    extraOutputs: { pattern: /^present\.\d+\.(key|value)$/, spec: kvCache },
    /** Lists what is wrong with the session's inputs and outputs (empty when it fits). */
    check: (inputs, outputs) => {
      const past = inputs.filter((n) => n.startsWith('past_key_values.')).map((n) => n.slice('past_key_values.'.length));
      const present = new Set(outputs.filter((n) => n.startsWith('present.')).map((n) => n.slice('present.'.length)));
      const problems = past.filter((n) => !present.has(n)).map((n) => `input "past_key_values.${n}" has no matching output "present.${n}"`);
      if (past.length === 0) problems.push('no "past_key_values.N.key"/"past_key_values.N.value" inputs: this model has no KV cache');
      return problems;
    },
  },
} as const satisfies Record<string, ModelSignature>;

/** Options of `loadModel`: the signature to check and the onnxruntime session options. */
export interface LoadModelOptions {
  /** Checked against the model's inputs and outputs; a mismatch throws `ModelSignatureError` listing every problem. */
  readonly signature?: ModelSignature;
  /** Defaults to the CPU execution provider. */
  readonly sessionOptions?: ort.InferenceSession.SessionOptions;
}

/** An InferenceSession with the path it came from; reuse it, since creating sessions repeatedly leaks (onnxruntime#25325). */
export class LoadedModel {
  readonly inputNames: readonly string[];
  readonly outputNames: readonly string[];

  constructor(
    readonly path: string,
    readonly session: ort.InferenceSession,
  ) {
    this.inputNames = session.inputNames;
    this.outputNames = session.outputNames;
  }

  /** Runs the model once on `feeds`, on the main thread (use `InferencePool` to keep the event loop free). */
  run(feeds: Readonly<Record<string, ort.Tensor>>): Promise<Record<string, ort.Tensor>> {
    return this.session.run(feeds) as Promise<Record<string, ort.Tensor>>;
  }

  /** Frees the onnxruntime session. */
  release(): Promise<void> {
    return this.session.release();
  }
}

/**
 * Loads an ONNX model from `path`. A missing file throws `ModelNotFoundError`, bytes onnxruntime cannot load
 * `ModelCorruptError` (with onnxruntime's reason), a signature mismatch `ModelSignatureError`.
 */
export async function loadModel(path: string, options: LoadModelOptions = {}): Promise<LoadedModel> {
  const bytes = await readBytes(path, 'Model');
  if (bytes.length === 0) throw new ModelCorruptError(path, 'the file is empty.');
  let session: ort.InferenceSession;
  try {
    session = await ortRuntime.InferenceSession.create(bytes, options.sessionOptions ?? { executionProviders: ['cpu'] });
  } catch (cause) {
    throw new ModelCorruptError(path, `onnxruntime rejected it as an ONNX model (${firstLine(cause)}).`, cause);
  }
  if (options.signature) {
    const problems = signatureProblems(session, options.signature);
    if (problems.length > 0) {
      await session.release();
      throw new ModelSignatureError(path, options.signature.kind, problems);
    }
  }
  return new LoadedModel(path, session);
}

/** Every way the session's inputs and outputs differ from `signature`. */
export function signatureProblems(session: Pick<ort.InferenceSession, 'inputMetadata' | 'outputMetadata'>, signature: ModelSignature): string[] {
  const problems: string[] = [];
  const compare = (
    side: 'input' | 'output',
    actual: readonly ort.InferenceSession.ValueMetadata[],
    expected: Readonly<Record<string, TensorSpec>>,
    extra: ModelSignature['extraInputs'],
  ) => {
    const byName = new Map(actual.map((m) => [m.name, m]));
    for (const [name, spec] of Object.entries(expected)) {
      const meta = byName.get(name);
      if (meta === undefined) {
        if (!spec.optional)
          problems.push(`missing ${side} "${name}" (${describeSpec(spec)}); the model's ${side}s are ${actual.map((m) => `"${m.name}"`).join(', ') || 'none'}`);
        continue;
      }
      problems.push(...specProblems(side, meta, spec));
    }
    for (const meta of actual) {
      if (name(meta) in expected) continue;
      if (extra?.pattern.test(meta.name)) problems.push(...specProblems(side, meta, extra.spec));
      // An output nobody reads is harmless; an input nobody feeds makes every run fail.
      else if (side === 'input') problems.push(`unexpected input "${meta.name}": a ${signature.kind} adapter does not feed it`);
    }
  };
  compare('input', session.inputMetadata, signature.inputs, signature.extraInputs);
  compare('output', session.outputMetadata, signature.outputs, signature.extraOutputs);
  if (problems.length === 0 && signature.check) {
    problems.push(...signature.check(session.inputMetadata.map(name), session.outputMetadata.map(name)));
  }
  return problems;
}

function name(meta: ort.InferenceSession.ValueMetadata): string {
  return meta.name;
}

function specProblems(side: string, meta: ort.InferenceSession.ValueMetadata, spec: TensorSpec): string[] {
  if (!meta.isTensor) return [`${side} "${meta.name}" is not a tensor; expected ${describeSpec(spec)}`];
  const problems: string[] = [];
  if (meta.type !== spec.type) problems.push(`${side} "${meta.name}" has type ${meta.type}; expected ${spec.type}`);
  // An empty shape means the model left the shape undeclared: nothing to check.
  if (meta.shape.length > 0) {
    if (meta.shape.length !== spec.dims.length) {
      problems.push(`${side} "${meta.name}" has shape [${meta.shape.join(', ')}] (rank ${meta.shape.length}); expected rank ${spec.dims.length}`);
    } else {
      spec.dims.forEach((dim, axis) => {
        const actual = meta.shape[axis];
        if (dim !== null && typeof actual === 'number' && actual !== dim)
          problems.push(`${side} "${meta.name}" has size ${actual} on axis ${axis}; expected ${dim}`);
      });
    }
  }
  return problems;
}

function describeSpec(spec: TensorSpec): string {
  return `${spec.type} [${spec.dims.map((d) => d ?? '?').join(', ')}]`;
}

const hfTokenizerSchema = lazySchema((z) => {
  const id = z.number().int().nonnegative();
  return z.looseObject({
    truncation: z.looseObject({ max_length: z.number().int().positive() }).nullish(),
    padding: z.looseObject({ pad_id: id }).nullish(),
    added_tokens: z.array(z.looseObject({ id, content: z.string() })).optional(),
    model: z.looseObject({ type: z.string() }),
  });
});

/** The vocabulary of each model type the library runs. */
const hfModelSchemas = lazySchema((z) => {
  const id = z.number().int().nonnegative();
  return z.discriminatedUnion('type', [
    z.looseObject({ type: z.literal('WordPiece'), vocab: z.record(z.string(), id), unk_token: z.string().optional() }),
    z.looseObject({ type: z.literal('BPE'), vocab: z.record(z.string(), id), merges: z.array(z.union([z.string(), z.tuple([z.string(), z.string()])])) }),
    z.looseObject({ type: z.literal('Unigram'), vocab: z.array(z.tuple([z.string(), z.number()])) }),
  ]);
});

const hashSchema = lazySchema((z) =>
  z.strictObject({
    type: z.literal('sluice-hash'),
    buckets: z.number().int().min(2),
    seed: z.number().int(),
    maxLength: z.number().int().positive(),
    charNgram: z.number().int().positive(),
  }),
);

/** Options of `loadTokenizer`. */
export interface LoadTokenizerOptions {
  /** The model's `tokenizer_config.json`, parsed (special tokens, `model_max_length`...). */
  readonly config?: Readonly<Record<string, unknown>>;
}

/**
 * Loads a Hugging Face `tokenizer.json` — BPE (GPT-2, Llama 3, Qwen), WordPiece (BERT,
 * all-MiniLM-L6-v2) or Unigram (T5, XLM-R) — run by the optional peer `@huggingface/tokenizers`,
 * or a sluice hashed-tokenizer config. Errors: `ModelNotFoundError`, `ModelCorruptError` (not
 * JSON, or a field of the wrong shape, named by its path), `UnsupportedTokenizerError` (another
 * model type or a pipeline step the library does not know), `MissingPeerError`.
 */
export async function loadTokenizer(path: string, options: LoadTokenizerOptions = {}): Promise<Tokenizer> {
  const json = await readJson(path, 'Tokenizer');
  if (typeof json === 'object' && json !== null && (json as { type?: unknown }).type === 'sluice-hash') {
    return new HashTokenizer(parseWith(hashSchema(), json, path));
  }
  return hfTokenizerFrom(json, path, options);
}

/** A parsed `tokenizer.json` as an `HfTokenizer`; `path` names the file in errors. */
export function hfTokenizerFrom(json: unknown, path: string, options: LoadTokenizerOptions = {}): HfTokenizer {
  const parsed = parseWith(hfTokenizerSchema(), json, path);
  const type = parsed.model.type;
  if (type !== 'WordPiece' && type !== 'BPE' && type !== 'Unigram') throw new UnsupportedTokenizerError(path, `model.type "${type}"`);
  const tokenizerModel = parseWith(hfModelSchemas(), parsed.model, path, 'model');
  if (tokenizerModel.type === 'WordPiece') {
    const unk = tokenizerModel.unk_token ?? '[UNK]';
    if (!(unk in tokenizerModel.vocab)) throw new ModelCorruptError(path, `model.unk_token "${unk}" is not in model.vocab.`);
  }
  let model = parsed as Record<string, unknown>;
  // The library requires every pipeline key; a file may leave out the steps it does not use.
  for (const key of ['normalizer', 'pre_tokenizer', 'post_processor', 'decoder']) if (!(key in model)) model = { ...model, [key]: null };
  if (!('added_tokens' in model)) model = { ...model, added_tokens: [] };
  try {
    return HfTokenizer.fromJson(model, options.config === undefined ? {} : { config: options.config });
  } catch (cause) {
    if ((cause as { code?: unknown }).code === 'MISSING_PEER') throw cause;
    throw new UnsupportedTokenizerError(path, `its pipeline (${firstLine(cause)})`);
  }
}

/** A JSON file; `what` names it in a not-found error. */
export async function readJson(path: string, what: string): Promise<unknown> {
  const text = new TextDecoder().decode(await readBytes(path, what));
  try {
    return JSON.parse(text);
  } catch (cause) {
    throw new ModelCorruptError(path, `it is not JSON (${firstLine(cause)}).`, cause);
  }
}

function parseWith<S extends z.ZodType>(schema: S, json: unknown, path: string, under?: string): z.output<S> {
  const result = schema.safeParse(json);
  if (result.success) return result.data;
  const fields = result.error.issues
    .map((issue) => `${[...(under === undefined ? [] : [under]), ...issue.path.map(String)].join('.') || '(root)'}: ${issue.message}`)
    .join('; ');
  throw new ModelCorruptError(path, `it is not a valid tokenizer file (${fields}).`);
}

async function readBytes(path: string, what: string): Promise<Uint8Array> {
  try {
    return await readFile(path);
  } catch (cause) {
    const code = (cause as NodeJS.ErrnoException).code;
    if (code === 'ENOENT' || code === 'EISDIR' || code === 'ENOTDIR') throw new ModelNotFoundError(path, what);
    throw new ModelCorruptError(path, `it could not be read (${firstLine(cause)}).`, cause);
  }
}

function firstLine(cause: unknown): string {
  const message = errorMessage(cause);
  return message.split('\n')[0]!.trim();
}
