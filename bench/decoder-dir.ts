/**
 * A decoder directory in the layout `sluice serve --model DIR` loads (Optimum's): the generated
 * decoder of a given shape in `onnx/model.onnx`, a generated WordPiece `tokenizer.json` whose ids
 * cover the model's whole vocabulary (so every id it draws decodes to text), a plain chat template
 * and `config.json`. Lets the benches serve bench 11's decoder through the real server.
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { buildDecoderModel, type DecoderConfig } from '../src/ai/models/decoder.js';
import { wordPieceJson } from '../marble-tests/support/wordpiece.js';

/** Bench 11's decoder: 6 layers, hidden 512, FFN 2,048, vocabulary 8,192 (110 MB), as issue 36 sizes it. */
export const BENCH_DECODER = { vocabSize: 8192, hidden: 512, heads: 8, layers: 6, ffn: 2048, maxPositions: 512, seed: 7 } as const;

const SPECIAL = ['[PAD]', '[UNK]', '[CLS]', '[SEP]'];
const LETTERS = 'abcdefghijklmnopqrstuvwxyz0123456789.,:;!?-';

/** `size` distinct tokens: the specials, single characters, their continuations, then made-up words. */
function vocabulary(size: number): string[] {
  const words = [...SPECIAL, ...LETTERS, ...Array.from(LETTERS, (c) => `##${c}`)];
  for (let i = 0; words.length < size - 1; i++) words.push(`w${i.toString(36)}`);
  // The last id is the end of a sequence: a random model draws it about once in `size` tokens.
  words.push('[EOS]');
  return words.slice(0, size);
}

/** The WordPiece layout the tests use, without truncation, padding or added [CLS]/[SEP]: a decoder's prompt is its text. */
function tokenizerJson(vocab: readonly string[]) {
  return wordPieceJson(vocab, {
    truncation: null,
    padding: null,
    post_processor: null,
    added_tokens: [...SPECIAL, '[EOS]'].map((content) => ({
      id: vocab.indexOf(content),
      content,
      single_word: false,
      lstrip: false,
      rstrip: false,
      normalized: false,
      special: true,
    })),
  });
}

/** Writes the directory `dir` (created) for a decoder of `config`. */
export async function writeDecoderDir(dir: string, config: DecoderConfig): Promise<void> {
  await mkdir(join(dir, 'onnx'), { recursive: true });
  const vocab = vocabulary(config.vocabSize);
  await writeFile(join(dir, 'onnx', 'model.onnx'), buildDecoderModel(config));
  await writeFile(join(dir, 'tokenizer.json'), JSON.stringify(tokenizerJson(vocab)));
  await writeFile(
    join(dir, 'tokenizer_config.json'),
    JSON.stringify({ chat_template: '{% for m in messages %}{{ m.content }}\n{% endfor %}', eos_token: '[EOS]' }),
  );
  await writeFile(
    join(dir, 'config.json'),
    JSON.stringify({ model_type: 'gpt2', vocab_size: config.vocabSize, max_position_embeddings: config.maxPositions, eos_token_id: vocab.length - 1 }),
  );
}
