import { GraphBuilder, ModelBuilder } from './onnx/index.js';

/** Id 0 is the beginning-of-text marker: it is fed as context, never predicted. */
export const BOS = '';

export interface CharLmModel {
  readonly vocab: readonly string[];
  /** `[vocab² rows, vocab]`: row `a·V + b` holds the next-character logits after the pair (a, b). */
  readonly logits: Float32Array;
}

// A predicted BOS or an impossible character: far below any real log-probability, but finite.
const NEVER = -30;

/**
 * A character trigram model with interpolated (trigram, bigram, unigram) probabilities. Its logits are
 * log-probabilities, so softmax sampling draws text whose every trigram is likely to occur in the corpus.
 */
export function trainCharLm(corpus: string, weights: readonly [trigram: number, bigram: number, unigram: number] = [0.85, 0.12, 0.03]): CharLmModel {
  const text = corpus.replace(/\r\n?/g, '\n');
  const vocab = [BOS, ...[...new Set(Array.from(text))].sort()];
  const V = vocab.length;
  const index = new Map(vocab.map((ch, i) => [ch, i]));
  const ids = [0, 0, ...Array.from(text, (ch) => index.get(ch)!)];
  const unigram = new Float64Array(V);
  const bigram = new Float64Array(V * V);
  const trigram = new Float64Array(V * V * V);
  for (let i = 2; i < ids.length; i++) {
    const [a, b, c] = [ids[i - 2]!, ids[i - 1]!, ids[i]!];
    unigram[c]!++;
    bigram[b * V + c]!++;
    trigram[(a * V + b) * V + c]!++;
  }
  const rowSum = (table: Float64Array, row: number) => {
    let sum = 0;
    for (let c = 0; c < V; c++) sum += table[row * V + c]!;
    return sum;
  };
  const total = rowSum(unigram, 0);
  const logits = new Float32Array(V * V * V).fill(NEVER);
  for (let a = 0; a < V; a++) {
    for (let b = 0; b < V; b++) {
      const pairCount = rowSum(trigram, a * V + b);
      const previousCount = rowSum(bigram, b);
      // Unseen contexts hand their share to the lower orders, so every row is a distribution.
      const w3 = pairCount > 0 ? weights[0] : 0;
      const w2 = previousCount > 0 ? weights[1] : 0;
      const w1 = 1 - w3 - w2;
      for (let c = 1; c < V; c++) {
        const p =
          (w3 > 0 ? (w3 * trigram[(a * V + b) * V + c]!) / pairCount : 0) +
          (w2 > 0 ? (w2 * bigram[b * V + c]!) / previousCount : 0) +
          (w1 * unigram[c]!) / total;
        if (p > 0) logits[(a * V + b) * V + c] = Math.log(p);
      }
    }
  }
  return { vocab, logits };
}

/** `input_ids` `[batch, seq]` → `logits` `[batch, seq, vocab]`: position t predicts character t+1, as causal LM exports do. */
export function buildCharLmModel(model: CharLmModel): Uint8Array {
  const V = model.vocab.length;
  const graph = new GraphBuilder('sluice-char-lm');
  const ids = graph.input('input_ids', 'int64', ['batch', 'seq']);
  const table = graph.initializer('ngram.logits', model.logits, [V * V, V]);
  const axis = graph.int64s('axes.seq', [1]);
  const start = graph.int64s('slice.start', [0]);
  // The context of position 0 is BOS (id 0): a zero column shaped like the first column of input_ids.
  const bos = graph.op('Mul', [graph.op('Slice', [ids, start, graph.int64s('slice.first', [1]), axis]), graph.int64s('zero', [0], [])]);
  const previous = graph.op('Concat', [bos, graph.op('Slice', [ids, start, graph.int64s('slice.all_but_last', [-1]), axis])], { axis: 1 });
  const context = graph.op('Add', [graph.op('Mul', [previous, graph.int64s('vocab_size', [V], [])]), ids]);
  graph.node('Gather', [table, context], ['logits'], { axis: 0 });
  graph.output('logits', 'float32', ['batch', 'seq', V]);
  return new ModelBuilder(graph, {
    docString: 'Character trigram language model trained on the bundled corpus.',
    metadata: { 'sluice.kind': 'causal-lm', 'sluice.vocab': JSON.stringify(model.vocab) },
  }).toBytes();
}

/** Maps text to ids of `vocab`; characters outside it are dropped. */
export function encodeChars(text: string, vocab: readonly string[]): number[] {
  const index = new Map(vocab.map((ch, i) => [ch, i]));
  return Array.from(text).flatMap((ch) => (ch !== BOS && index.has(ch) ? [index.get(ch)!] : []));
}
