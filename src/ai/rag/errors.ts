import { SluiceError } from '../../core/errors.js';

/** A vector with the wrong dimension, a non-finite component, or no direction (all zeros). */
export class InvalidVectorError extends SluiceError {
  constructor(
    /** Which argument was bad: `vector` (add), `query` (search), or an embedder's output. */
    readonly field: string,
    readonly problem: string,
    stage?: string,
  ) {
    super('INVALID_VECTOR', `${field}: ${problem}`, {
      ...(stage === undefined ? {} : { stage }),
      hint: 'Vectors must have exactly `dim` finite components, not all zero (cosine similarity needs a direction).',
    });
  }
}

/** `add` with an id the index already holds. */
export class DuplicateIdError extends SluiceError {
  constructor(readonly id: string) {
    super('DUPLICATE_ID', `The index already holds id "${id}".`, { hint: 'Call remove(id) first to replace it, or use a unique id per vector.' });
  }
}

/** A saved index that cannot be read back: wrong magic, unknown version, truncated or corrupt. */
export class IndexFormatError extends SluiceError {
  constructor(
    readonly path: string,
    /** The part of the file that failed validation: `magic`, `version`, `dim`, `count`, `length`, `vectors`, `metadata`. */
    readonly field: string,
    problem: string,
  ) {
    super('INDEX_FORMAT', `Cannot load vector index "${path}": ${field}: ${problem}`, {
      hint: 'The file is not a sluice vector index or was damaged; rebuild it and save() again.',
    });
  }
}

/** The embedder returned something other than one finite vector per text. */
export class EmbedderOutputError extends SluiceError {
  constructor(stage: string, problem: string) {
    super('EMBEDDER_OUTPUT', `Stage "${stage}": the embedder ${problem}`, {
      stage,
      hint: 'An embedder must resolve to one Float32Array per input text, in input order, all of the same dimension.',
    });
  }
}

/** Template variables that do not satisfy the assembler's schema; `issues` name each bad variable. */
export class TemplateVariablesError extends SluiceError {
  constructor(readonly issues: readonly { path: string; message: string }[]) {
    super('INVALID_VARIABLES', `Invalid prompt variables:\n${issues.map((i) => `  - ${i.path || '(root)'}: ${i.message}`).join('\n')}`, {
      hint: 'Make the `variables` selector return values matching the `variables` schema.',
    });
  }
}

/** The prompt does not fit its token budget even with every retrieved passage dropped. */
export class PromptOverBudgetError extends SluiceError {
  constructor(
    readonly tokens: number,
    readonly budget: number,
  ) {
    super('PROMPT_OVER_BUDGET', `The prompt needs ${tokens} tokens without any passage, ${tokens - budget} over the budget of ${budget}.`, {
      hint: 'Raise `budget`, shorten the system prompt, template or few-shot examples, or shorten the variables.',
    });
  }

  /** Tokens beyond the budget. */
  get over(): number {
    return this.tokens - this.budget;
  }
}

/** One class for every empty prompt, wherever it is found. */
export { EmptyPromptError } from '../../core/errors.js';

/** Why a corpus cannot be served: no such folder, not a folder, unreadable, or nothing in it that can be indexed. */
export class CorpusError extends SluiceError {
  constructor(
    /** The folder, or `passages` when the passages were given directly. */
    readonly directory: string,
    readonly reason: 'missing' | 'not-a-directory' | 'unreadable' | 'no-documents' | 'nothing-indexable',
    /** What is wrong with it, without the folder's name or the hint. */
    readonly problem: string,
    cause?: unknown,
  ) {
    super('INVALID_CORPUS', `corpus ${directory}: ${problem}`, {
      hint: 'Point it at a folder of Markdown or text documents (.md, .markdown, .mdx, .txt) with at least one paragraph of words.',
      ...(cause !== undefined && { cause }),
    });
  }
}
