import { lazySchema, zod } from '../../core/zod.js';
import { SluiceError } from '../../core/errors.js';
import { GraphBuilder, ModelBuilder } from './onnx/index.js';
import { shuffled } from '../../core/random.js';
import { HashTokenizer, type HashTokenizerConfig } from './tokenizer.js';

/** Label order of the classifier's `scores` output. */
export const GUARD_LABELS = ['benign', 'injection'] as const;
export type GuardLabel = (typeof GUARD_LABELS)[number];

/**
 * The thresholds the generated guard is calibrated for, and the defaults of `ragWorker` and
 * `guardedWorker`: a score is the calibrated probability of an injection, flagged from `flag`, blocked from `block`.
 */
export const GUARD_THRESHOLDS: { readonly flag: number; readonly block: number } = Object.freeze({ flag: 0.5, block: 0.8 });

/** Share of each label held out of training to calibrate the scores on. */
export const GUARD_CALIBRATION_SHARE = 0.25;

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
  /** Held out of training; the scores are calibrated on it. */
  readonly calibration: readonly GuardExample[];
}

/** Stratified, seeded split: each label contributes `share` of its examples to the calibration set. */
export function splitGuardExamples(examples: readonly GuardExample[], seed: number, share = GUARD_CALIBRATION_SHARE): GuardSplit {
  const train: GuardExample[] = [];
  const calibration: GuardExample[] = [];
  GUARD_LABELS.forEach((label, i) => {
    const ofLabel = shuffled(
      examples.filter((e) => e.label === label),
      seed + i,
    );
    const cut = Math.round(ofLabel.length * share);
    calibration.push(...ofLabel.slice(0, cut));
    train.push(...ofLabel.slice(cut));
  });
  return { train, calibration };
}

/**
 * A linear model over the hashed features of a text: `z = bias + Σ weights[id] / √count`. Dividing by the
 * square root (not the count) keeps a short injection inside a longer text from being averaged away.
 */
export interface BagOfFeaturesModel {
  /** One weight per tokenizer bucket; id 0 (padding) stays 0. */
  readonly weights: Float64Array;
  readonly bias: number;
}

/** The ids of a text and the factor each of its features is pooled with. */
export interface GuardFeatures {
  readonly ids: readonly number[];
  readonly scale: number;
}

export function guardFeatures(tokenizer: HashTokenizer, text: string): GuardFeatures {
  const ids = tokenizer.encode(text);
  return { ids, scale: 1 / Math.sqrt(Math.max(1, ids.length)) };
}

export function guardLogit(model: BagOfFeaturesModel, features: GuardFeatures): number {
  let z = model.bias;
  for (const id of features.ids) z += model.weights[id]! * features.scale;
  return z;
}

export interface TrainOptions {
  readonly epochs?: number;
  readonly learningRate?: number;
  readonly l2?: number;
}

/**
 * Full-batch gradient descent on the log loss, each class weighted to half the total (there are fewer
 * injections than benign texts): no sampling, so the weights are a pure function of the data.
 */
export function trainBagOfFeatures(
  features: readonly GuardFeatures[],
  labels: readonly number[],
  buckets: number,
  options: TrainOptions = {},
): BagOfFeaturesModel {
  const { epochs = 2000, learningRate = 4, l2 = 1e-5 } = options;
  const n = features.length;
  const positives = labels.filter((y) => y === 1).length;
  const classWeight = [n / (2 * Math.max(1, n - positives)), n / (2 * Math.max(1, positives))] as const;
  const weights = new Float64Array(buckets);
  const gradient = new Float64Array(buckets);
  let bias = 0;
  for (let epoch = 0; epoch < epochs; epoch++) {
    gradient.fill(0);
    let biasGradient = 0;
    for (let i = 0; i < n; i++) {
      const x = features[i]!;
      const error = (sigmoid(guardLogit({ weights, bias }, x)) - labels[i]!) * classWeight[labels[i]!]!;
      for (const id of x.ids) gradient[id]! += error * x.scale;
      biasGradient += error;
    }
    for (let d = 1; d < buckets; d++) weights[d]! -= learningRate * (gradient[d]! / n + l2 * weights[d]!);
    bias -= (learningRate * biasGradient) / n;
  }
  return { weights, bias };
}

/** `p = σ(scale · z + shift)`: maps a raw logit to a calibrated probability. */
export interface PlattScaling {
  readonly scale: number;
  readonly shift: number;
}

/**
 * Platt scaling: fits `σ(scale · z + shift)` to held-out labels by Newton's method on the log loss, with
 * Platt's smoothed targets so that a perfectly separated calibration set still gives finite values.
 */
export function plattScaling(logits: readonly number[], labels: readonly number[]): PlattScaling {
  const positives = labels.filter((y) => y === 1).length;
  const negatives = labels.length - positives;
  const target = (y: number) => (y === 1 ? (positives + 1) / (positives + 2) : 1 / (negatives + 2));
  let scale = 1;
  let shift = 0;
  for (let iteration = 0; iteration < 50; iteration++) {
    let [ga, gb, haa, hab, hbb] = [0, 0, 1e-9, 0, 1e-9];
    logits.forEach((z, i) => {
      const p = sigmoid(scale * z + shift);
      const error = p - target(labels[i]!);
      const curvature = Math.max(p * (1 - p), 1e-12);
      ga += error * z;
      gb += error;
      haa += curvature * z * z;
      hab += curvature * z;
      hbb += curvature;
    });
    const determinant = haa * hbb - hab * hab;
    const stepA = (hbb * ga - hab * gb) / determinant;
    const stepB = (haa * gb - hab * ga) / determinant;
    scale -= stepA;
    shift -= stepB;
    if (Math.abs(stepA) + Math.abs(stepB) < 1e-10) break;
  }
  return { scale, shift };
}

/** How the guard's scores behave on a labelled set at `GUARD_THRESHOLDS`. */
export interface GuardRates {
  readonly benign: number;
  readonly injections: number;
  /** Benign texts scored at or above the block threshold. */
  readonly benignBlocked: number;
  /** Benign texts scored at or above the flag threshold. */
  readonly benignFlagged: number;
  /** Injections scored at or above the flag threshold. */
  readonly injectionsFlagged: number;
  /** Share of texts whose label is the one scored above 0.5. */
  readonly accuracy: number;
}

export function guardRates(examples: readonly GuardExample[], scores: readonly number[]): GuardRates {
  const count = (label: GuardLabel, from: number) => examples.filter((e, i) => e.label === label && scores[i]! >= from).length;
  const correct = examples.filter((e, i) => (scores[i]! > 0.5 ? 'injection' : 'benign') === e.label).length;
  return {
    benign: examples.filter((e) => e.label === 'benign').length,
    injections: examples.filter((e) => e.label === 'injection').length,
    benignBlocked: count('benign', GUARD_THRESHOLDS.block),
    benignFlagged: count('benign', GUARD_THRESHOLDS.flag),
    injectionsFlagged: count('injection', GUARD_THRESHOLDS.flag),
    accuracy: correct / Math.max(1, examples.length),
  };
}

export interface GuardTraining {
  /** Calibrated: its weights and bias already carry the Platt scaling. */
  readonly model: BagOfFeaturesModel;
  readonly split: GuardSplit;
  readonly platt: PlattScaling;
  readonly trainAccuracy: number;
  /** The calibration split's rates, with the calibrated scores. */
  readonly calibration: GuardRates;
  /** The calibrated probability of an injection, as the ONNX graph computes it (in float64). */
  score(text: string): number;
}

/** Trains on the training split, calibrates on the calibration split, and measures both. */
export function trainGuard(examples: readonly GuardExample[], config: HashTokenizerConfig, seed: number, options: TrainOptions = {}): GuardTraining {
  const tokenizer = new HashTokenizer(config);
  const labelsOf = (set: readonly GuardExample[]) => set.map((e) => (e.label === 'injection' ? 1 : 0));
  const split = splitGuardExamples(examples, seed);
  const trainFeatures = split.train.map((e) => guardFeatures(tokenizer, e.text));
  const raw = trainBagOfFeatures(trainFeatures, labelsOf(split.train), config.buckets, options);
  const platt = plattScaling(
    split.calibration.map((e) => guardLogit(raw, guardFeatures(tokenizer, e.text))),
    labelsOf(split.calibration),
  );
  const model = { weights: raw.weights.map((w) => w * platt.scale), bias: raw.bias * platt.scale + platt.shift };
  const score = (text: string) => sigmoid(guardLogit(model, guardFeatures(tokenizer, text)));
  const trainLabels = labelsOf(split.train);
  return {
    model,
    split,
    platt,
    trainAccuracy: trainFeatures.filter((x, i) => (guardLogit(model, x) > 0 ? 1 : 0) === trainLabels[i]).length / Math.max(1, trainFeatures.length),
    calibration: guardRates(
      split.calibration,
      split.calibration.map((e) => score(e.text)),
    ),
    score,
  };
}

/**
 * `input_ids`, `attention_mask` → `scores` `[batch, 2]` in `GUARD_LABELS` order: one weight per hashed
 * feature, summed over the unmasked ids and divided by the square root of their count, plus the bias; the
 * softmax of `[0, z]` equals `[1 − σ(z), σ(z)]` of the trained model.
 */
export function buildGuardModel(model: BagOfFeaturesModel, config: HashTokenizerConfig, metadata: Readonly<Record<string, string>> = {}): Uint8Array {
  const graph = new GraphBuilder('sluice-guard');
  const ids = graph.input('input_ids', 'int64', ['batch', 'seq']);
  const mask = graph.input('attention_mask', 'int64', ['batch', 'seq']);
  const weights = graph.initializer('feature.weight', Float32Array.from(model.weights), [config.buckets]);
  const seqAxis = graph.int64s('axes.seq', [1]);
  const one = graph.floats('one', [1], []);
  const maskFloat = graph.op('Cast', [mask], { to: 1 }); // [batch, seq]
  const perToken = graph.op('Mul', [graph.op('Gather', [weights, ids], { axis: 0 }), maskFloat]);
  const summed = graph.op('ReduceSum', [perToken, seqAxis], { keepdims: 1 }); // [batch, 1]
  // An empty text has no features; the floor of one keeps its logit at the bias.
  const count = graph.op('Max', [graph.op('ReduceSum', [maskFloat, seqAxis], { keepdims: 1 }), one]);
  const z = graph.op('Add', [graph.op('Div', [summed, graph.op('Sqrt', [count])]), graph.floats('bias', [model.bias], [])]);
  const logits = graph.op('MatMul', [z, graph.floats('columns', [0, 1], [1, 2])], {}, 'logits'); // [batch, 2] = [0, z]
  graph.node('Softmax', [logits], ['scores'], { axis: -1 });
  graph.output('scores', 'float32', ['batch', GUARD_LABELS.length]);
  return new ModelBuilder(graph, {
    docString: 'Prompt-injection guard: logistic regression over hashed word, word-pair and character n-gram features, Platt-calibrated.',
    metadata: { ...metadata, 'sluice.kind': 'classifier', 'sluice.labels': JSON.stringify(GUARD_LABELS), 'sluice.tokenizer': JSON.stringify(config) },
  }).toBytes();
}

function sigmoid(z: number): number {
  return 1 / (1 + Math.exp(-z));
}
