/**
 * A user's own sentence-embedding model, from its directory in the sentence-transformers / Optimum
 * ONNX layout: `model.onnx` or `onnx/model.onnx`, `tokenizer.json` (with `tokenizer_config.json`
 * when present), and the pooling the model was trained with: `1_Pooling/config.json`, and
 * `modules.json` naming a `Normalize` module. Checked at load, so a bad directory fails before
 * anything is served, naming the file.
 */
import { stat } from 'node:fs/promises';
import { basename, join, resolve } from 'node:path';
import { SluiceError } from '../../core/errors.js';
import { ModelCorruptError, ModelNotFoundError } from './errors.js';
import type { HfTokenizer } from './hf-tokenizer.js';
import { hfTokenizerFrom, readJson } from './load.js';
import type { Pooling, PoolingOptions } from './pooling.js';

/** An embedding directory that cannot be used as it is; the message names the file. */
export class EmbeddingDirError extends SluiceError {
  constructor(
    readonly path: string,
    reason: string,
    cause?: unknown,
  ) {
    super('EMBEDDING_MODEL_INVALID', `${path}: ${reason}`, {
      hint: 'An embedding model directory holds model.onnx (or onnx/model.onnx, e.g. from optimum-cli export onnx --task feature-extraction), tokenizer.json, and the sentence-transformers files 1_Pooling/config.json and modules.json.',
      cause,
    });
  }
}

/** What `loadEmbeddingDir` found: the model to run, its tokenizer, and how its outputs become one vector per text. */
export interface EmbeddingDir {
  /** The directory's name. */
  readonly name: string;
  readonly modelPath: string;
  readonly tokenizer: HfTokenizer;
  /** From `1_Pooling/config.json` and `modules.json`; empty when the directory has neither (the pooling defaults apply). */
  readonly pooling: PoolingOptions;
}

const MODEL_FILES = ['model.onnx', join('onnx', 'model.onnx')];

/** The sentence-transformers pooling modes sluice can apply, by their `1_Pooling/config.json` key. */
const MODES: Readonly<Record<string, Pooling | undefined>> = {
  pooling_mode_cls_token: 'cls',
  pooling_mode_mean_tokens: 'mean',
  pooling_mode_max_tokens: undefined,
  pooling_mode_mean_sqrt_len_tokens: undefined,
  pooling_mode_weightedmean_tokens: undefined,
  pooling_mode_lasttoken: undefined,
};

/** Loads and checks an embedding model directory. */
export async function loadEmbeddingDir(dir: string): Promise<EmbeddingDir> {
  const root = resolve(dir);
  const info = await stat(root).catch(() => undefined);
  if (info === undefined || !info.isDirectory()) throw new EmbeddingDirError(dir, 'is not a directory.');
  const modelPath = await findModel(root);
  const config = await optionalJson(join(root, 'tokenizer_config.json'));
  const tokenizer = hfTokenizerFrom(await readJson(join(root, 'tokenizer.json'), 'Tokenizer'), join(root, 'tokenizer.json'), { config });
  return { name: basename(root), modelPath, tokenizer, pooling: await poolingOf(root) };
}

async function findModel(root: string): Promise<string> {
  for (const candidate of MODEL_FILES) {
    const path = join(root, candidate);
    const info = await stat(path).catch(() => undefined);
    if (info?.isFile()) {
      if (info.size === 0) throw new ModelCorruptError(path, 'the file is empty.');
      return path;
    }
  }
  throw new EmbeddingDirError(root, `holds no ${MODEL_FILES.join(' or ')}.`);
}

/** The pooling of `1_Pooling/config.json`, and normalisation when `modules.json` lists a `Normalize` module. */
async function poolingOf(root: string): Promise<PoolingOptions> {
  const poolingPath = join(root, '1_Pooling', 'config.json');
  const config = await optionalJson(poolingPath);
  const on = Object.keys(MODES).filter((key) => config[key] === true);
  if (on.length > 1) throw new EmbeddingDirError(poolingPath, `sets more than one pooling mode (${on.join(', ')}).`);
  if (on.length === 1 && MODES[on[0]!] === undefined)
    throw new EmbeddingDirError(poolingPath, `${on[0]} is not supported: sluice pools by the CLS token or the mean of the tokens.`);
  const modulesPath = join(root, 'modules.json');
  const modules = await optionalJson(modulesPath, true);
  const pooling: PoolingOptions = on.length === 1 ? { pooling: MODES[on[0]!]! } : {};
  if (!Array.isArray(modules.list)) return pooling;
  const normalize = modules.list.some(
    (m: unknown) => typeof (m as { type?: unknown } | null)?.type === 'string' && /\.Normalize$/.test((m as { type: string }).type),
  );
  return { ...pooling, normalize };
}

/** A JSON object file, `{}` when it does not exist; `list` wraps a top-level array as `{ list }`. */
async function optionalJson(path: string, list = false): Promise<Record<string, unknown>> {
  let json: unknown;
  try {
    json = await readJson(path, 'Config');
  } catch (err) {
    if (err instanceof ModelNotFoundError) return {};
    throw err;
  }
  if (list && Array.isArray(json)) return { list: json };
  if (typeof json !== 'object' || json === null || Array.isArray(json)) throw new ModelCorruptError(path, 'it is not a JSON object.');
  return json as Record<string, unknown>;
}
