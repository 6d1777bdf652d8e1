import type { ChatMessage } from '../../cache/key.js';

/**
 * Counts tokens as a model's own tokenizer does, for budgets that mean what the model sees:
 * `LocalModel` (sluice/ai) and `openAiTokenCounter` are ones.
 */
export interface PromptTokenizer {
  /** Tokens of a text. */
  countTokens(text: string): number;
  /** Tokens of the whole prompt the model is sent (its chat template or per-message overhead included); preferred when given. */
  countPromptTokens?(messages: readonly ChatMessage[]): number;
}
