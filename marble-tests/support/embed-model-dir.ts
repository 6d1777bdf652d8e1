/**
 * A sentence-embedding model directory as a user exports one (sentence-transformers / Optimum
 * layout): `onnx/model.onnx` giving token vectors (`last_hidden_state`), a WordPiece
 * `tokenizer.json`, `1_Pooling/config.json` and `modules.json`. The model looks each token's row up
 * in a seeded random table, so what it should give is computed here too (`expected`).
 */
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { GraphBuilder, ModelBuilder } from '../../src/ai/models/onnx/index.js';
import { seededRandom } from '../../src/core/random.js';
import { wordPieceJson } from './wordpiece.js';

export const EMBED_DIM = 16;

export interface EmbedModelDirOptions {
  /** Words of the vocabulary (besides the special tokens). */
  readonly words: readonly string[];
  /** `1_Pooling/config.json`'s mode key set to true. Default `pooling_mode_mean_tokens`. */
  readonly mode?: string;
  /** Whether `modules.json` lists a Normalize module. Default true. */
  readonly normalize?: boolean;
  /** Files left out. */
  readonly without?: readonly string[];
}

export interface EmbedModelDir {
  readonly dir: string;
  /** The vector the model and its pooling give for these token ids (with [CLS] and [SEP]). */
  expected(ids: readonly number[]): Float32Array;
  readonly vocab: readonly string[];
  remove(): Promise<void>;
}

export async function embedModelDir(name: string, options: EmbedModelDirOptions): Promise<EmbedModelDir> {
  const parent = await mkdtemp(join(tmpdir(), 'sluice-embed-model-'));
  const dir = join(parent, name);
  const without = new Set(options.without ?? []);
  const vocab = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', ...options.words];
  const random = seededRandom(11);
  const table = new Float32Array(vocab.length * EMBED_DIM).map(() => random() * 2 - 1);
  await mkdir(join(dir, 'onnx'), { recursive: true });
  await mkdir(join(dir, '1_Pooling'), { recursive: true });
  if (!without.has('model')) {
    const graph = new GraphBuilder('user-embed');
    const ids = graph.input('input_ids', 'int64', ['batch', 'seq']);
    const mask = graph.input('attention_mask', 'int64', ['batch', 'seq']);
    const weights = graph.initializer('embeddings.word', table, [vocab.length, EMBED_DIM]);
    // The mask times zero keeps the input used, as a real encoder's attention does.
    const zero = graph.op('Mul', [graph.op('Cast', [mask], { to: 1 }), graph.floats('zero', [0], [])]);
    const tokens = graph.op('Add', [graph.op('Gather', [weights, ids], { axis: 0 }), graph.op('Unsqueeze', [zero, graph.int64s('axes.last', [-1])])]);
    graph.node('Identity', [tokens], ['last_hidden_state']);
    graph.output('last_hidden_state', 'float32', ['batch', 'seq', EMBED_DIM]);
    await writeFile(join(dir, 'onnx', 'model.onnx'), new ModelBuilder(graph, { docString: 'token rows of a random table' }).toBytes());
  }
  // No padding: the embedder pads a batch itself.
  if (!without.has('tokenizer.json')) await writeFile(join(dir, 'tokenizer.json'), JSON.stringify(wordPieceJson(vocab, { padding: null })));
  const mode = options.mode ?? 'pooling_mode_mean_tokens';
  if (!without.has('1_Pooling/config.json'))
    await writeFile(
      join(dir, '1_Pooling', 'config.json'),
      JSON.stringify({
        word_embedding_dimension: EMBED_DIM,
        pooling_mode_cls_token: false,
        pooling_mode_mean_tokens: false,
        pooling_mode_max_tokens: false,
        [mode]: true,
      }),
    );
  const normalize = options.normalize ?? true;
  if (!without.has('modules.json'))
    await writeFile(
      join(dir, 'modules.json'),
      JSON.stringify([
        { idx: 0, name: '0', path: '', type: 'sentence_transformers.models.Transformer' },
        { idx: 1, name: '1', path: '1_Pooling', type: 'sentence_transformers.models.Pooling' },
        ...(normalize ? [{ idx: 2, name: '2', path: '2_Normalize', type: 'sentence_transformers.models.Normalize' }] : []),
      ]),
    );
  const expected = (ids: readonly number[]): Float32Array => {
    const rows = mode === 'pooling_mode_cls_token' ? ids.slice(0, 1) : ids;
    const out = new Float32Array(EMBED_DIM);
    for (const id of rows) for (let d = 0; d < EMBED_DIM; d++) out[d]! += table[id * EMBED_DIM + d]! / rows.length;
    if (!normalize) return out;
    const norm = Math.sqrt(out.reduce((a, v) => a + v * v, 0));
    return out.map((v) => v / norm);
  };
  return { dir, expected, vocab, remove: () => rm(parent, { recursive: true, force: true }) };
}
