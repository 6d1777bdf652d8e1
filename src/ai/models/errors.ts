import { SluiceError } from '../../core/errors.js';

const GENERATE_HINT =
  'Generate the bundled models with `generateModels({ outDir })` from sluice/ai (what `sluice serve` does on first start; `npm run models` in a clone of the repository), or pass the path of your own export.';

/** A model or tokenizer file that does not exist (or is a directory). */
export class ModelNotFoundError extends SluiceError {
  constructor(
    readonly path: string,
    what = 'Model',
  ) {
    super('MODEL_NOT_FOUND', `${what} file not found: ${path}.`, { hint: GENERATE_HINT });
  }
}

/** A file that exists but cannot be read as what it claims to be (not ONNX, truncated, not a tokenizer.json). */
export class ModelCorruptError extends SluiceError {
  constructor(
    readonly path: string,
    reason: string,
    cause?: unknown,
  ) {
    super('MODEL_CORRUPT', `${path} could not be loaded: ${reason}`, {
      hint: 'Re-export or re-download the file; a partial copy or a Git LFS pointer looks like this. Regenerate bundled models with --force.',
      cause,
    });
  }
}

/** A valid model whose inputs or outputs are not what the adapter feeds and reads. */
export class ModelSignatureError extends SluiceError {
  constructor(
    readonly path: string,
    readonly kind: string,
    readonly problems: readonly string[],
    hint?: string,
  ) {
    const a = /^[aeiou]/i.test(kind) ? 'an' : 'a';
    super('MODEL_SIGNATURE', `${path} does not have the signature of ${a} ${kind} model:\n${problems.map((p) => `  - ${p}`).join('\n')}\n`, {
      hint: hint ?? `Export the model with the input and output names ${a} ${kind} adapter expects, or pass a signature that matches it.`,
    });
  }
}

/** A tokenizer.json whose model or pipeline step sluice does not implement. */
export class UnsupportedTokenizerError extends SluiceError {
  constructor(
    readonly path: string,
    what: string,
  ) {
    super('TOKENIZER_UNSUPPORTED', `${path}: ${what} is not supported.`, {
      hint: 'Supported: Hugging Face tokenizer.json files with a BPE, WordPiece or Unigram model (through @huggingface/tokenizers), and sluice hashed tokenizers.',
    });
  }
}
