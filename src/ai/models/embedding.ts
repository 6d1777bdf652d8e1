import { GraphBuilder, ModelBuilder } from './onnx/index.js';
import { seededRandom } from '../../core/random.js';
import type { HashTokenizerConfig } from './tokenizer.js';

/** How the generated embedding model is made: its tokenizer, its width and the seed of its table. */
export interface EmbeddingModelConfig {
  readonly tokenizer: HashTokenizerConfig;
  /** 384 mirrors all-MiniLM-L6-v2, so code written against this model runs unchanged against the real one. */
  readonly dim: number;
  readonly seed: number;
}

/**
 * The embedding table: row 0 (padding) is zero, every other row a random ±1/√dim vector. Mean-pooling such
 * rows is a random projection of the bag of hashed features, so cosine similarity of two embeddings
 * approximates the overlap of their word and n-gram features (Johnson–Lindenstrauss).
 */
export function embeddingTable(config: EmbeddingModelConfig): Float32Array {
  const { buckets } = config.tokenizer;
  const table = new Float32Array(buckets * config.dim);
  const random = seededRandom(config.seed);
  const scale = 1 / Math.sqrt(config.dim);
  for (let i = config.dim; i < table.length; i++) table[i] = random() < 0.5 ? -scale : scale;
  return table;
}

/** Adds `input_ids`, `attention_mask` and the pooling layers to `graph`; returns the name of the L2-normalised `[batch, dim]` embedding. */
export function addEmbeddingLayers(graph: GraphBuilder, table: Float32Array, config: EmbeddingModelConfig): string {
  const ids = graph.input('input_ids', 'int64', ['batch', 'seq']);
  const mask = graph.input('attention_mask', 'int64', ['batch', 'seq']);
  const weights = graph.initializer('embedding.weight', table, [config.tokenizer.buckets, config.dim]);
  const lastAxis = graph.int64s('axes.last', [-1]);
  const seqAxis = graph.int64s('axes.seq', [1]);
  const tiny = graph.floats('epsilon', [1e-12], []);

  const tokens = graph.op('Gather', [weights, ids], { axis: 0 }); // [batch, seq, dim]
  const maskFloat = graph.op('Unsqueeze', [graph.op('Cast', [mask], { to: 1 }), lastAxis]); // [batch, seq, 1]
  const summed = graph.op('ReduceSum', [graph.op('Mul', [tokens, maskFloat]), seqAxis], { keepdims: 0 });
  const count = graph.op('ReduceSum', [maskFloat, seqAxis], { keepdims: 0 }); // [batch, 1]
  const mean = graph.op('Div', [summed, graph.op('Max', [count, tiny])]);
  const squared = graph.op('ReduceSum', [graph.op('Mul', [mean, mean]), lastAxis], { keepdims: 1 });
  // A text with no features pools to zero; the floor keeps it zero rather than NaN.
  const norm = graph.op('Sqrt', [graph.op('Max', [squared, tiny])]);
  return graph.op('Div', [mean, norm], {}, 'embedding');
}

export function buildEmbeddingModel(config: EmbeddingModelConfig, table = embeddingTable(config)): Uint8Array {
  const graph = new GraphBuilder('sluice-embed');
  const embedding = addEmbeddingLayers(graph, table, config);
  graph.node('Identity', [embedding], ['embeddings']);
  graph.output('embeddings', 'float32', ['batch', config.dim]);
  return new ModelBuilder(graph, {
    docString: 'Hashed word and character n-gram features, random projection, mean pooling, L2 normalisation.',
    metadata: { 'sluice.kind': 'embedding', 'sluice.tokenizer': JSON.stringify(config.tokenizer), 'sluice.dim': String(config.dim) },
  }).toBytes();
}

/** The embedding the ONNX graph computes, in float64 TypeScript: the reference the generated model is checked against. */
export function embedIds(ids: readonly number[], table: Float32Array, dim: number): Float64Array {
  const out = new Float64Array(dim);
  for (const id of ids) {
    for (let d = 0; d < dim; d++) out[d]! += table[id * dim + d]!;
  }
  if (ids.length > 0) for (let d = 0; d < dim; d++) out[d]! /= ids.length;
  let norm = 0;
  for (let d = 0; d < dim; d++) norm += out[d]! * out[d]!;
  norm = Math.sqrt(Math.max(norm, 1e-12));
  for (let d = 0; d < dim; d++) out[d]! /= norm;
  return out;
}
