import { readFile } from 'node:fs/promises';
import type * as ort from 'onnxruntime-node';
import { onnxruntime } from '../../core/peers.js';
import type * as z from 'zod';
import { lazySchema } from '../../core/zod.js';
import { ModelCorruptError, ModelNotFoundError, ModelSignatureError, UnsupportedTokenizerError } from './errors.js';
import { embeddingOutputProblem } from './pooling.js';
import { HashTokenizer, type Tokenizer } from './tokenizer.js';
import { WordPieceTokenizer } from './wordpiece.js';

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
    check: (inputs, outputs) => {
      const past = inputs.filter((n) => n.startsWith('past_key_values.')).map((n) => n.slice('past_key_values.'.length));
      const present = new Set(outputs.filter((n) => n.startsWith('present.')).map((n) => n.slice('present.'.length)));
      const problems = past.filter((n) => !present.has(n)).map((n) => `input "past_key_values.${n}" has no matching output "present.${n}"`);
      if (past.length === 0) problems.push('no "past_key_values.N.key"/"past_key_values.N.value" inputs: this model has no KV cache');
      return problems;
    },
  },
} as const satisfies Record<string, ModelSignature>;

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

  run(feeds: Readonly<Record<string, ort.Tensor>>): Promise<Record<string, ort.Tensor>> {
    return this.session.run(feeds) as Promise<Record<string, ort.Tensor>>;
  }

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

const wordPieceSchema = lazySchema((z) =>
  z.looseObject({
    truncation: z.looseObject({ max_length: z.number().int().positive() }).nullish(),
    padding: z.looseObject({ pad_id: z.number().int().nonnegative() }).nullish(),
    normalizer: z
      .looseObject({
        type: z.string(),
        lowercase: z.boolean().optional(),
        strip_accents: z.boolean().nullish(),
        clean_text: z.boolean().optional(),
        handle_chinese_chars: z.boolean().optional(),
      })
      .nullish(),
    pre_tokenizer: z.looseObject({ type: z.string() }).nullish(),
    post_processor: z
      .looseObject({
        type: z.string(),
        single: z.array(z.record(z.string(), z.looseObject({ id: z.string() }))).optional(),
        special_tokens: z.record(z.string(), z.looseObject({ ids: z.array(z.number().int()) })).optional(),
        cls: z.tuple([z.string(), z.number().int()]).optional(),
        sep: z.tuple([z.string(), z.number().int()]).optional(),
      })
      .nullish(),
    model: z.looseObject({
      type: z.string(),
      vocab: z.record(z.string(), z.number().int().nonnegative()).optional(),
      unk_token: z.string().optional(),
      continuing_subword_prefix: z.string().optional(),
      max_input_chars_per_word: z.number().int().positive().optional(),
    }),
  }),
);

const hashSchema = lazySchema((z) =>
  z.strictObject({
    type: z.literal('sluice-hash'),
    buckets: z.number().int().min(2),
    seed: z.number().int(),
    maxLength: z.number().int().positive(),
    charNgram: z.number().int().positive(),
  }),
);

/**
 * Loads a HuggingFace `tokenizer.json` (WordPiece, as all-MiniLM-L6-v2 and other BERT exports ship it) or a
 * sluice hashed-tokenizer config. Errors: `ModelNotFoundError`, `ModelCorruptError` (not JSON, or a field of
 * the wrong shape, named by its path), `UnsupportedTokenizerError` (another model type or pipeline step).
 */
export async function loadTokenizer(path: string): Promise<Tokenizer> {
  const text = new TextDecoder().decode(await readBytes(path, 'Tokenizer'));
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (cause) {
    throw new ModelCorruptError(path, `it is not JSON (${firstLine(cause)}).`, cause);
  }
  if (typeof json === 'object' && json !== null && (json as { type?: unknown }).type === 'sluice-hash') {
    return new HashTokenizer(parseWith(hashSchema(), json, path));
  }
  return wordPieceFrom(parseWith(wordPieceSchema(), json, path), path);
}

function wordPieceFrom(config: z.output<ReturnType<typeof wordPieceSchema>>, path: string): WordPieceTokenizer {
  const { model } = config;
  if (model.type !== 'WordPiece') throw new UnsupportedTokenizerError(path, `model.type "${model.type}"`);
  if (model.vocab === undefined) throw new ModelCorruptError(path, 'model.vocab is missing.');
  const normalizer = config.normalizer;
  if (normalizer && normalizer.type !== 'BertNormalizer') throw new UnsupportedTokenizerError(path, `normalizer.type "${normalizer.type}"`);
  const preTokenizer = config.pre_tokenizer;
  if (preTokenizer && preTokenizer.type !== 'BertPreTokenizer' && preTokenizer.type !== 'Whitespace') {
    throw new UnsupportedTokenizerError(path, `pre_tokenizer.type "${preTokenizer.type}"`);
  }
  const vocab = new Map(Object.entries(model.vocab));
  const { prefixIds, suffixIds } = template(config.post_processor, vocab, path);
  const lowercase = normalizer?.lowercase ?? false;
  const unkToken = model.unk_token ?? '[UNK]';
  if (!vocab.has(unkToken)) throw new ModelCorruptError(path, `model.unk_token "${unkToken}" is not in model.vocab.`);
  return new WordPieceTokenizer({
    vocab,
    unkToken,
    continuingSubwordPrefix: model.continuing_subword_prefix ?? '##',
    maxInputCharsPerWord: model.max_input_chars_per_word ?? 100,
    lowercase,
    // HuggingFace: strip_accents null means "follow lowercase".
    stripAccents: normalizer?.strip_accents ?? lowercase,
    cleanText: normalizer?.clean_text ?? false,
    handleChineseChars: normalizer?.handle_chinese_chars ?? false,
    prefixIds,
    suffixIds,
    // BERT's position table is 512 long; the truncation setting, when present, is the export's own limit.
    maxLength: config.truncation?.max_length ?? 512,
    padId: config.padding?.pad_id ?? vocab.get('[PAD]') ?? 0,
  });
}

function template(
  processor: z.output<ReturnType<typeof wordPieceSchema>>['post_processor'],
  vocab: ReadonlyMap<string, number>,
  path: string,
): { prefixIds: number[]; suffixIds: number[] } {
  if (!processor) return { prefixIds: [], suffixIds: [] };
  if (processor.type === 'BertProcessing' && processor.cls && processor.sep) return { prefixIds: [processor.cls[1]], suffixIds: [processor.sep[1]] };
  if (processor.type === 'TemplateProcessing' && processor.single) {
    const prefixIds: number[] = [];
    const suffixIds: number[] = [];
    let seenSequence = false;
    for (const step of processor.single) {
      if ('Sequence' in step) {
        seenSequence = true;
        continue;
      }
      const token = step.SpecialToken?.id;
      if (token === undefined) throw new UnsupportedTokenizerError(path, `post_processor.single step ${JSON.stringify(step)}`);
      const tokenIds = processor.special_tokens?.[token]?.ids ?? [vocab.get(token) ?? -1];
      if (tokenIds.some((id) => id < 0)) throw new ModelCorruptError(path, `special token "${token}" of post_processor is not in the vocabulary.`);
      (seenSequence ? suffixIds : prefixIds).push(...tokenIds);
    }
    return { prefixIds, suffixIds };
  }
  throw new UnsupportedTokenizerError(path, `post_processor.type "${processor.type}"`);
}

function parseWith<S extends z.ZodType>(schema: S, json: unknown, path: string): z.output<S> {
  const result = schema.safeParse(json);
  if (result.success) return result.data;
  const fields = result.error.issues.map((issue) => `${issue.path.map(String).join('.') || '(root)'}: ${issue.message}`).join('; ');
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
  const message = cause instanceof Error ? cause.message : String(cause);
  return message.split('\n')[0]!.trim();
}
