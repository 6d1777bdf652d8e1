import { createHash } from 'node:crypto';
import { access, mkdir, readFile, rename, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { buildCharLmModel, trainCharLm } from './charlm.js';
import { DEFAULT_DECODER, buildDecoderModel } from './decoder.js';
import { buildEmbeddingModel, type EmbeddingModelConfig } from './embedding.js';
import {
  GUARD_CALIBRATION_SHARE,
  GUARD_LABELS,
  GUARD_THRESHOLDS,
  buildGuardModel,
  guardRates,
  parseGuardExamples,
  trainGuard,
  type GuardExample,
  type GuardRates,
} from './guard.js';
import { SIGNATURES, loadModel, type ModelSignature } from './load.js';
import { DEFAULT_HASH_TOKENIZER } from './tokenizer.js';
import { lazySchema } from '../../core/zod.js';
import { InvalidOptionsError } from '../../core/errors.js';
import { BUNDLED_DATA } from './bundled.js';
import { functionSchema, parseOptions } from '../../flow/options.js';

/** The configuration of the generated embedding model (`embed.onnx`): its tokenizer, width and seed. */
export const EMBEDDING_CONFIG: EmbeddingModelConfig = { tokenizer: DEFAULT_HASH_TOKENIZER, dim: 384, seed: 0x5eed };
/** Seed of the guard's train/calibration split. */
export const GUARD_SPLIT_SEED = 1;

/** File names inside the models directory. */
export const MODEL_FILES = {
  embedding: 'embed.onnx',
  embeddingTokenizer: 'embed.tokenizer.json',
  guard: 'guard.onnx',
  guardMetadata: 'guard.json',
  charLm: 'charlm.onnx',
  charLmVocab: 'charlm.vocab.json',
  decoder: 'decoder.onnx',
  decoderConfig: 'decoder.json',
} as const;

/**
 * The recipe of each model group: bumped when the way a group is built changes, so a models folder
 * written by an older sluice is rewritten rather than kept (`recipes.json` in the folder records them).
 */
export const MODEL_RECIPES = { embedding: 1, guard: 2, charLm: 1, decoder: 1 } as const;
const RECIPES_FILE = 'recipes.json';

/** What `guard.json` records: how the classifier was trained and calibrated, and how it did on data it never saw. */
export interface GuardMetadata {
  readonly labels: readonly string[];
  /** The thresholds the rates below are measured at (`GUARD_THRESHOLDS`). */
  readonly thresholds: { readonly flag: number; readonly block: number };
  readonly trainSize: number;
  readonly trainAccuracy: number;
  /** The stratified, seeded share of `guard.jsonl` held out of training, on which the scores were Platt-scaled. */
  readonly calibration: GuardRates & {
    readonly split: { readonly seed: number; readonly share: number; readonly stratified: true };
    readonly platt: { readonly scale: number; readonly shift: number };
  };
  /** Measured on `guard-eval.jsonl` and `guard-redteam.jsonl` of the data folder, when it holds them: never trained or calibrated on. */
  readonly heldOut?: GuardRates;
  readonly dataSha256: string;
  readonly tokenizer: string;
}

/** Options of `generateModels`: where to write the models, where the training data is, and whether to overwrite and verify. */
export interface GenerateOptions {
  /** Where the models are written (made if missing). */
  readonly outDir: string;
  /**
   * Holds `guard.jsonl` (the guard's training data) and `corpus.txt`, and optionally the guard's held-out
   * `guard-eval.jsonl` and `guard-redteam.jsonl`, measured into `guard.json`. Default: the `data/` folder the package ships.
   */
  readonly dataDir?: string;
  /** Rewrite files that exist. */
  readonly force?: boolean;
  /** Load every model written in onnxruntime and check its signature. */
  readonly verify?: boolean;
  /** Receives one line per file written or skipped. */
  readonly log?: (line: string) => void;
}

const generateSchema = lazySchema((z) => {
  const folder = (what: string) =>
    z
      .string({ error: (issue) => (issue.input === undefined ? `${what} is required` : `${what} must be a string`) })
      .min(1, { error: `${what} must not be empty` });
  return z.strictObject({
    outDir: folder('outDir'),
    dataDir: folder('dataDir').optional(),
    force: z.boolean({ error: 'force must be a boolean' }).optional(),
    verify: z.boolean({ error: 'verify must be a boolean' }).optional(),
    log: functionSchema<(line: string) => void>().optional(),
  });
});

/** A model file `generateModels` wrote or found. */
export interface GeneratedFile {
  readonly path: string;
  readonly written: boolean;
}

/**
 * Writes the bundled models into `outDir`. Deterministic: the same data gives the same bytes on every run and
 * machine (weights come from seeded integer generators and float64 TypeScript, never from onnxruntime).
 * A group of files is skipped when all of them exist, unless `force`.
 */
export async function generateModels(given: GenerateOptions): Promise<GeneratedFile[]> {
  parseOptions(generateSchema(), given, 'generateModels options');
  const dataDir = given.dataDir ?? BUNDLED_DATA;
  if (dataDir === undefined)
    throw new InvalidOptionsError('generateModels options', [{ path: 'dataDir', message: "required: the package's data/ folder is missing" }]);
  const options = { ...given, dataDir };
  const log = options.log ?? (() => {});
  await mkdir(options.outDir, { recursive: true });
  const files: GeneratedFile[] = [];
  const recipes = await readRecipes(options.outDir);
  const group = async (recipe: keyof typeof MODEL_RECIPES, names: readonly string[], build: () => Promise<readonly Uint8Array[]> | readonly Uint8Array[]) => {
    const paths = names.map((name) => join(options.outDir, name));
    // A folder without recipes.json was written before recipes were recorded: version 1 of each.
    const current = (recipes[recipe] ?? 1) === MODEL_RECIPES[recipe];
    if (!options.force && current && (await Promise.all(paths.map(exists))).every(Boolean)) {
      files.push(...paths.map((path) => ({ path, written: false })));
      log(`kept     ${names.join(', ')} (exist; --force rewrites)`);
      return;
    }
    const contents = await build();
    for (const [i, path] of paths.entries()) {
      // Written aside and renamed, so an interrupted run never leaves a truncated file that later runs keep.
      await writeFile(`${path}.partial`, contents[i]!);
      await rename(`${path}.partial`, path);
      files.push({ path, written: true });
    }
    log(`wrote    ${names.map((name, i) => `${name} (${formatBytes(contents[i]!.length)})`).join(', ')}`);
    recipes[recipe] = MODEL_RECIPES[recipe];
    await writeFile(join(options.outDir, RECIPES_FILE), json(recipes));
  };
  await group('embedding', [MODEL_FILES.embedding, MODEL_FILES.embeddingTokenizer], () => [
    buildEmbeddingModel(EMBEDDING_CONFIG),
    json(EMBEDDING_CONFIG.tokenizer),
  ]);

  await group('guard', [MODEL_FILES.guard, MODEL_FILES.guardMetadata], async () => {
    const data = await readFile(join(options.dataDir, 'guard.jsonl'), 'utf8');
    const training = trainGuard(parseGuardExamples(data, 'data/guard.jsonl'), EMBEDDING_CONFIG.tokenizer, GUARD_SPLIT_SEED);
    const heldOutData = await Promise.all(['guard-eval.jsonl', 'guard-redteam.jsonl'].map((name) => readOptional(join(options.dataDir, name), name)));
    const heldOut = heldOutData.flatMap((set) => set ?? []);
    const metadata: GuardMetadata = {
      labels: GUARD_LABELS,
      thresholds: GUARD_THRESHOLDS,
      trainSize: training.split.train.length,
      trainAccuracy: round(training.trainAccuracy),
      calibration: {
        ...roundedRates(training.calibration),
        split: { seed: GUARD_SPLIT_SEED, share: GUARD_CALIBRATION_SHARE, stratified: true },
        platt: { scale: round(training.platt.scale), shift: round(training.platt.shift) },
      },
      ...(heldOut.length > 0 && {
        heldOut: roundedRates(
          guardRates(
            heldOut,
            heldOut.map((e) => training.score(e.text)),
          ),
        ),
      }),
      dataSha256: createHash('sha256').update(data).digest('hex'),
      tokenizer: MODEL_FILES.embeddingTokenizer,
    };
    log(`guard    calibration split: ${describeRates(metadata.calibration)}`);
    if (metadata.heldOut !== undefined) log(`guard    held out:          ${describeRates(metadata.heldOut)}`);
    return [
      buildGuardModel(training.model, EMBEDDING_CONFIG.tokenizer, { 'sluice.calibrationAccuracy': String(metadata.calibration.accuracy) }),
      json(metadata),
    ];
  });

  await group('charLm', [MODEL_FILES.charLm, MODEL_FILES.charLmVocab], async () => {
    const model = trainCharLm(await readFile(join(options.dataDir, 'corpus.txt'), 'utf8'));
    return [buildCharLmModel(model), json(model.vocab)];
  });

  await group('decoder', [MODEL_FILES.decoder, MODEL_FILES.decoderConfig], () => [buildDecoderModel(DEFAULT_DECODER), json(DEFAULT_DECODER)]);

  if (options.verify) {
    const checks: [string, ModelSignature][] = [
      [MODEL_FILES.embedding, SIGNATURES.embedding],
      [MODEL_FILES.guard, SIGNATURES.classifier],
      [MODEL_FILES.charLm, SIGNATURES.causalLm],
      [MODEL_FILES.decoder, SIGNATURES.decoderWithPast],
    ];
    for (const [name, signature] of checks) {
      const model = await loadModel(join(options.outDir, name), { signature });
      await model.release();
      log(`verified ${name}: loads in onnxruntime, signature of a ${signature.kind} model`);
    }
  }
  return files;
}

function json(value: unknown): Uint8Array {
  return new TextEncoder().encode(`${JSON.stringify(value, null, 2)}\n`);
}

/** The guard's rates as a log line: what is blocked of the benign, what is flagged of the injections. */
function describeRates(rates: GuardRates): string {
  return `benign blocked ${rates.benignBlocked}/${rates.benign}, injections flagged ${rates.injectionsFlagged}/${rates.injections}, accuracy ${(rates.accuracy * 100).toFixed(1)}%`;
}

function roundedRates(rates: GuardRates): GuardRates {
  return { ...rates, accuracy: round(rates.accuracy) };
}

/** The recipes recorded in `outDir`; none when it has no readable `recipes.json`. */
async function readRecipes(outDir: string): Promise<Partial<Record<keyof typeof MODEL_RECIPES, number>>> {
  try {
    const parsed: unknown = JSON.parse(await readFile(join(outDir, RECIPES_FILE), 'utf8'));
    return typeof parsed === 'object' && parsed !== null ? (parsed as Partial<Record<keyof typeof MODEL_RECIPES, number>>) : {};
  } catch {
    return {};
  }
}

/** The examples of an optional data file; `undefined` when there is none. */
async function readOptional(path: string, source: string): Promise<GuardExample[] | undefined> {
  if (!(await exists(path))) return undefined;
  return parseGuardExamples(await readFile(path, 'utf8'), source);
}

function round(x: number): number {
  return Math.round(x * 10_000) / 10_000;
}

function formatBytes(n: number): string {
  return n >= 1 << 20 ? `${(n / (1 << 20)).toFixed(1)} MB` : n >= 1024 ? `${(n / 1024).toFixed(1)} kB` : `${n} B`;
}

async function exists(path: string): Promise<boolean> {
  try {
    await access(path);
    return true;
  } catch {
    return false;
  }
}
