import { padBatch, type EncodedBatch, type FeedBuffers, type Tokenizer } from './tokenizer.js';

export interface WordPieceOptions {
  readonly vocab: ReadonlyMap<string, number>;
  readonly unkToken: string;
  readonly continuingSubwordPrefix: string;
  readonly maxInputCharsPerWord: number;
  readonly lowercase: boolean;
  readonly stripAccents: boolean;
  readonly cleanText: boolean;
  readonly handleChineseChars: boolean;
  /** Ids placed before and after the word pieces (`[CLS]` and `[SEP]` for BERT). */
  readonly prefixIds: readonly number[];
  readonly suffixIds: readonly number[];
  /** Including the special tokens, as HuggingFace counts it. */
  readonly maxLength: number;
  readonly padId: number;
}

/**
 * BERT's tokenizer as HuggingFace `tokenizers` runs it: BertNormalizer, BertPreTokenizer (whitespace and
 * punctuation), greedy longest-match-first WordPiece, then the `[CLS] … [SEP]` template and truncation.
 */
export class WordPieceTokenizer implements Tokenizer {
  readonly vocabSize: number;
  readonly maxLength: number;
  readonly padId: number;
  private readonly unkId: number;

  constructor(private readonly options: WordPieceOptions) {
    this.vocabSize = Math.max(-1, ...options.vocab.values()) + 1;
    this.maxLength = options.maxLength;
    this.padId = options.padId;
    const unkId = options.vocab.get(options.unkToken);
    if (unkId === undefined) throw new RangeError(`unk_token "${options.unkToken}" is not in the vocabulary`);
    this.unkId = unkId;
  }

  /** The word-piece strings of `text`, without special tokens. */
  tokenize(text: string): string[] {
    return this.preTokenize(this.normalize(text)).flatMap((word) => this.wordPieces(word));
  }

  encode(text: string): number[] {
    const budget = Math.max(0, this.maxLength - this.options.prefixIds.length - this.options.suffixIds.length);
    const pieces = this.tokenize(text).slice(0, budget);
    return [...this.options.prefixIds, ...pieces.map((p) => this.options.vocab.get(p) ?? this.unkId), ...this.options.suffixIds];
  }

  encodeBatch(texts: readonly string[], buffers?: FeedBuffers): EncodedBatch {
    return padBatch(
      texts.map((text) => this.encode(text)),
      this.padId,
      buffers,
    );
  }

  private normalize(text: string): string {
    let out = text;
    if (this.options.cleanText) {
      out = Array.from(out, (ch) => (ch === '\0' || ch === '\ufffd' || isControl(ch) ? '' : /\s/u.test(ch) ? ' ' : ch)).join('');
    }
    if (this.options.handleChineseChars) out = out.replace(/[\u4e00-\u9fff\u3400-\u4dbf\uf900-\ufaff\u{20000}-\u{2fa1f}]/gu, (ch) => ` ${ch} `);
    if (this.options.lowercase) out = out.toLowerCase();
    if (this.options.stripAccents) out = out.normalize('NFD').replace(/\p{Mn}/gu, '');
    return out;
  }

  private preTokenize(text: string): string[] {
    // BERT splits off every Unicode punctuation mark and every ASCII symbol, each as its own word.
    return text.split(/\s+/u).flatMap((chunk) => chunk.split(/([\p{P}!-/:-@[-`{-~])/u).filter((part) => part !== ''));
  }

  private wordPieces(word: string): string[] {
    const chars = Array.from(word);
    if (chars.length > this.options.maxInputCharsPerWord) return [this.options.unkToken];
    const pieces: string[] = [];
    for (let start = 0; start < chars.length; ) {
      let end = chars.length;
      let piece: string | undefined;
      for (; end > start; end--) {
        const candidate = (start > 0 ? this.options.continuingSubwordPrefix : '') + chars.slice(start, end).join('');
        if (this.options.vocab.has(candidate)) {
          piece = candidate;
          break;
        }
      }
      // HuggingFace maps the whole word to [UNK] when any part of it has no piece.
      if (piece === undefined) return [this.options.unkToken];
      pieces.push(piece);
      start = end;
    }
    return pieces;
  }
}

function isControl(ch: string): boolean {
  return ch !== '\t' && ch !== '\n' && ch !== '\r' && /[\p{Cc}\p{Cf}]/u.test(ch);
}
