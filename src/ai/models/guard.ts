import { lazySchema, zod } from '../../core/zod.js';
import { SluiceError } from '../../core/errors.js';
import { addEmbeddingLayers, embedIds, type EmbeddingModelConfig } from './embedding.js';
import { GraphBuilder, ModelBuilder } from './onnx/index.js';
import { shuffled } from '../../core/random.js';
import { HashTokenizer } from './tokenizer.js';

/** Label order of the classifier's `scores` output. */
export const GUARD_LABELS = ['benign', 'injection'] as const;
export type GuardLabel = (typeof GUARD_LABELS)[number];

export interface GuardExample {
  readonly text: string;
  readonly label: GuardLabel;
}

const exampleSchema = lazySchema((z) => z.strictObject({ text: z.string().min(1), label: z.enum(GUARD_LABELS) }));

/** Parses JSON Lines of `{ "text", "label" }`; a bad line fails with its line number. */
export function parseGuardExamples(jsonl: string, source = 'guard.jsonl'): GuardExample[] {
  return jsonl.split('\n').flatMap((line, i) => {
    if (line.trim() === '') return [];
    let parsed: unknown;
    try {
      parsed = JSON.parse(line);
    } catch (cause) {
      throw new SluiceError('DATA_INVALID', `${source}:${i + 1} is not JSON.`, { cause });
    }
    const result = exampleSchema().safeParse(parsed);
    if (!result.success) throw new SluiceError('DATA_INVALID', `${source}:${i + 1}: ${zod().prettifyError(result.error)}`);
    return [result.data];
  });
}

export interface GuardSplit {
  readonly train: readonly GuardExample[];
  readonly test: readonly GuardExample[];
}

/** Stratified, seeded split: each label contributes `testShare` of its examples to the held-out set. */
export function splitGuardExamples(examples: readonly GuardExample[], seed: number, testShare = 0.25): GuardSplit {
  const train: GuardExample[] = [];
  const test: GuardExample[] = [];
  GUARD_LABELS.forEach((label, i) => {
    const ofLabel = shuffled(
      examples.filter((e) => e.label === label),
      seed + i,
    );
    const cut = Math.round(ofLabel.length * testShare);
    test.push(...ofLabel.slice(0, cut));
    train.push(...ofLabel.slice(cut));
  });
  return { train, test };
}

export interface LogisticRegression {
  readonly weights: Float64Array;
  readonly bias: number;
}

export interface TrainOptions {
  readonly epochs?: number;
  readonly learningRate?: number;
  readonly l2?: number;
}

/**
 * Full-batch gradient descent on the log loss: no sampling, so the weights are a pure function of the data.
 * The features are unit vectors with small coordinates, hence the large default learning rate.
 */
export function trainLogisticRegression(features: readonly Float64Array[], labels: readonly number[], options: TrainOptions = {}): LogisticRegression {
  const { epochs = 3000, learningRate = 4, l2 = 1e-4 } = options;
  const dim = features[0]?.length ?? 0;
  const weights = new Float64Array(dim);
  const gradient = new Float64Array(dim);
  let bias = 0;
  const n = features.length;
  for (let epoch = 0; epoch < epochs; epoch++) {
    gradient.fill(0);
    let biasGradient = 0;
    for (let i = 0; i < n; i++) {
      const x = features[i]!;
      const error = sigmoid(dot(weights, x) + bias) - labels[i]!;
      for (let d = 0; d < dim; d++) gradient[d]! += error * x[d]!;
      biasGradient += error;
    }
    for (let d = 0; d < dim; d++) weights[d]! -= learningRate * (gradient[d]! / n + l2 * weights[d]!);
    bias -= (learningRate * biasGradient) / n;
  }
  return { weights, bias };
}

export function predictInjection(model: LogisticRegression, x: Float64Array): number {
  return sigmoid(dot(model.weights, x) + model.bias);
}

export interface GuardTraining {
  readonly model: LogisticRegression;
  readonly split: GuardSplit;
  readonly trainAccuracy: number;
  readonly heldOutAccuracy: number;
}

/** Embeds every example with the embedding model's own table, trains, and measures on the held-out split. */
export function trainGuard(examples: readonly GuardExample[], table: Float32Array, config: EmbeddingModelConfig, seed: number): GuardTraining {
  const tokenizer = new HashTokenizer(config.tokenizer);
  const featuresOf = (set: readonly GuardExample[]) => set.map((e) => embedIds(tokenizer.encode(e.text), table, config.dim));
  const labelsOf = (set: readonly GuardExample[]) => set.map((e) => (e.label === 'injection' ? 1 : 0));
  const split = splitGuardExamples(examples, seed);
  const trainFeatures = featuresOf(split.train);
  const model = trainLogisticRegression(trainFeatures, labelsOf(split.train));
  const accuracy = (features: readonly Float64Array[], labels: readonly number[]) =>
    features.filter((x, i) => (predictInjection(model, x) >= 0.5 ? 1 : 0) === labels[i]).length / Math.max(1, features.length);
  return {
    model,
    split,
    trainAccuracy: accuracy(trainFeatures, labelsOf(split.train)),
    heldOutAccuracy: accuracy(featuresOf(split.test), labelsOf(split.test)),
  };
}

/**
 * Embedding layers + linear + softmax → `scores` `[batch, 2]` in `GUARD_LABELS` order. The benign column's
 * weights are zero, so the softmax equals `[1 − σ(z), σ(z)]` of the trained logistic regression.
 */
export function buildGuardModel(
  model: LogisticRegression,
  table: Float32Array,
  config: EmbeddingModelConfig,
  metadata: Readonly<Record<string, string>> = {},
): Uint8Array {
  const graph = new GraphBuilder('sluice-guard');
  const embedding = addEmbeddingLayers(graph, table, config);
  const weights = new Float32Array(config.dim * 2);
  for (let d = 0; d < config.dim; d++) weights[d * 2 + 1] = model.weights[d]!;
  const w = graph.initializer('classifier.weight', weights, [config.dim, 2]);
  const b = graph.floats('classifier.bias', [0, model.bias]);
  const logits = graph.op('Add', [graph.op('MatMul', [embedding, w]), b], {}, 'logits');
  graph.node('Softmax', [logits], ['scores'], { axis: -1 });
  graph.output('scores', 'float32', ['batch', GUARD_LABELS.length]);
  return new ModelBuilder(graph, {
    docString: 'Prompt-injection guard: hashed n-gram embedding + logistic regression.',
    metadata: { ...metadata, 'sluice.kind': 'classifier', 'sluice.labels': JSON.stringify(GUARD_LABELS), 'sluice.tokenizer': JSON.stringify(config.tokenizer) },
  }).toBytes();
}

function sigmoid(z: number): number {
  return 1 / (1 + Math.exp(-z));
}

function dot(a: Float64Array, b: Float64Array): number {
  let sum = 0;
  for (let i = 0; i < a.length; i++) sum += a[i]! * b[i]!;
  return sum;
}
