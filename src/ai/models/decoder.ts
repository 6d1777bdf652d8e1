import { GraphBuilder, ModelBuilder } from './onnx/index.js';
import { seededRandom } from '../../core/random.js';

export interface DecoderConfig {
  readonly vocabSize: number;
  readonly hidden: number;
  readonly heads: number;
  readonly layers: number;
  readonly ffn: number;
  readonly maxPositions: number;
  readonly seed: number;
}

/** Small enough to generate in milliseconds, big enough to exercise every part of a KV-cache loop. */
export const DEFAULT_DECODER: DecoderConfig = { vocabSize: 128, hidden: 64, heads: 4, layers: 2, ffn: 128, maxPositions: 256, seed: 0xdec0de };

/**
 * A pre-LayerNorm GPT-style decoder with seeded random weights, in the I/O layout of Hugging Face / Optimum
 * decoder exports: `input_ids`, `attention_mask` `[batch, past_seq + seq]`, `position_ids`,
 * `past_key_values.N.{key,value}` `[batch, heads, past_seq, head_dim]` → `logits` `[batch, seq, vocab]`,
 * `present.N.{key,value}` `[batch, heads, past_seq + seq, head_dim]`. Start with `past_seq = 0`.
 */
export function buildDecoderModel(config: DecoderConfig = DEFAULT_DECODER): Uint8Array {
  const { vocabSize, hidden, heads, layers, ffn, maxPositions } = config;
  if (hidden % heads !== 0) throw new RangeError(`hidden (${hidden}) must be a multiple of heads (${heads})`);
  const headDim = hidden / heads;
  const random = seededRandom(config.seed);
  // Uniform with the given standard deviation. Large enough that logits are well apart, so greedy choices
  // do not hinge on the rounding differences between cached and uncached attention.
  const weights = (count: number, std: number) => Float32Array.from({ length: count }, () => (random() * 2 - 1) * std * Math.sqrt(3));
  const graph = new GraphBuilder('sluice-tiny-decoder');

  const ids = graph.input('input_ids', 'int64', ['batch', 'seq']);
  const mask = graph.input('attention_mask', 'int64', ['batch', 'total_seq']);
  const positions = graph.input('position_ids', 'int64', ['batch', 'seq']);
  const past = Array.from({ length: layers }, (_, l) => ({
    key: graph.input(`past_key_values.${l}.key`, 'float32', ['batch', heads, 'past_seq', headDim]),
    value: graph.input(`past_key_values.${l}.value`, 'float32', ['batch', heads, 'past_seq', headDim]),
  }));

  const splitHeads = graph.int64s('shape.split_heads', [0, 0, heads, headDim]);
  const mergeHeads = graph.int64s('shape.merge_heads', [0, 0, hidden]);
  const scale = graph.floats('attention.scale', [1 / Math.sqrt(headDim)], []);
  const blocked = graph.floats('attention.blocked', [-1e9], []);
  const one = graph.int64s('one', [1], []);
  const zero = graph.int64s('zero', [0], []);

  const wte = graph.initializer('wte', weights(vocabSize * hidden, 1), [vocabSize, hidden]);
  const wpe = graph.initializer('wpe', weights(maxPositions * hidden, 0.5), [maxPositions, hidden]);
  let x = graph.op('Add', [graph.op('Gather', [wte, ids], { axis: 0 }), graph.op('Gather', [wpe, positions], { axis: 0 })], {}, 'hidden');

  // Query i (absolute position total − seq + i) may see key j when j ≤ its position and the mask allows j.
  const total = graph.op('Gather', [graph.op('Shape', [mask]), one], { axis: 0 });
  const seq = graph.op('Gather', [graph.op('Shape', [ids]), one], { axis: 0 });
  const keyPositions = graph.op('Range', [zero, total, one]);
  const queryPositions = graph.op('Unsqueeze', [graph.op('Range', [graph.op('Sub', [total, seq]), total, one]), graph.int64s('axes.query', [1])]);
  const causal = graph.op('LessOrEqual', [keyPositions, queryPositions]); // [seq, total]
  const padding = graph.op('Unsqueeze', [graph.op('Cast', [mask], { to: 9 }), graph.int64s('axes.padding', [1, 2])]); // [batch, 1, 1, total]
  const allowed = graph.op('And', [causal, padding], {}, 'allowed'); // [batch, 1, seq, total]

  const layerNorm = (input: string, name: string) =>
    graph.op('LayerNormalization', [input, graph.floats(`${name}.weight`, Array(hidden).fill(1)), graph.floats(`${name}.bias`, Array(hidden).fill(0))], {
      axis: -1,
      epsilon: 1e-5,
    });
  const linear = (input: string, name: string, inputs: number, outputs: number) =>
    graph.op('Add', [
      graph.op('MatMul', [input, graph.initializer(`${name}.weight`, weights(inputs * outputs, 1 / Math.sqrt(inputs)), [inputs, outputs])]),
      graph.initializer(`${name}.bias`, weights(outputs, 0.02), [outputs]),
    ]);
  const toHeads = (input: string) => graph.op('Transpose', [graph.op('Reshape', [input, splitHeads])], { perm: [0, 2, 1, 3] });

  for (let l = 0; l < layers; l++) {
    const prefix = `layers.${l}`;
    const h = layerNorm(x, `${prefix}.ln_1`);
    const q = toHeads(linear(h, `${prefix}.attn.q`, hidden, hidden));
    const [key] = graph.node('Concat', [past[l]!.key, toHeads(linear(h, `${prefix}.attn.k`, hidden, hidden))], [`present.${l}.key`], { axis: 2 });
    const [value] = graph.node('Concat', [past[l]!.value, toHeads(linear(h, `${prefix}.attn.v`, hidden, hidden))], [`present.${l}.value`], { axis: 2 });
    const scores = graph.op('Mul', [graph.op('MatMul', [q, graph.op('Transpose', [key!], { perm: [0, 1, 3, 2] })]), scale]);
    const probabilities = graph.op('Softmax', [graph.op('Where', [allowed, scores, blocked])], { axis: -1 });
    const context = graph.op('Reshape', [graph.op('Transpose', [graph.op('MatMul', [probabilities, value!])], { perm: [0, 2, 1, 3] }), mergeHeads]);
    x = graph.op('Add', [x, linear(context, `${prefix}.attn.out`, hidden, hidden)], {}, 'hidden');
    const inner = linear(layerNorm(x, `${prefix}.ln_2`), `${prefix}.mlp.in`, hidden, ffn);
    // GELU's sigmoid approximation: Gelu itself only arrived in opset 20.
    const activated = graph.op('Mul', [inner, graph.op('Sigmoid', [graph.op('Mul', [inner, graph.floats(`${prefix}.mlp.gelu`, [1.702], [])])])]);
    x = graph.op('Add', [x, linear(activated, `${prefix}.mlp.out`, ffn, hidden)], {}, 'hidden');
  }
  const lmHead = graph.initializer('lm_head.weight', weights(hidden * vocabSize, 1 / Math.sqrt(hidden)), [hidden, vocabSize]);
  graph.node('MatMul', [layerNorm(x, 'ln_f'), lmHead], ['logits']);

  graph.output('logits', 'float32', ['batch', 'seq', vocabSize]);
  for (let l = 0; l < layers; l++) {
    graph.output(`present.${l}.key`, 'float32', ['batch', heads, 'total_seq', headDim]);
    graph.output(`present.${l}.value`, 'float32', ['batch', heads, 'total_seq', headDim]);
  }
  return new ModelBuilder(graph, {
    docString: 'A tiny transformer decoder with seeded random weights, for testing KV-cache decoding loops.',
    metadata: { 'sluice.kind': 'decoder-with-past', 'sluice.config': JSON.stringify(config) },
  }).toBytes();
}
