/**
 * Streaming detokenization: the text each new token adds, when a token's text depends on
 * its neighbours. A byte-level BPE token can end in the middle of a UTF-8 character (an
 * emoji is often three tokens), and SentencePiece decoders drop the space of a first piece,
 * so decoding token by token would emit U+FFFD and lose spaces.
 */

/** The text of a run of ids, as the model's tokenizer decodes it. */
export type DecodeIds = (ids: readonly number[]) => string;

/** How many ids before the new ones are decoded with them, for the decoder's context. */
const CONTEXT = 4;
const REPLACEMENT = '\ufffd';
/** Tokens a split character can be held over. */
const MAX_HELD = 4;

/**
 * Decodes a window of recent ids (a few already emitted ones as context, then the pending
 * ones) and emits what it adds beyond what was already emitted — except a trailing run of
 * U+FFFD, which is a character still missing its last bytes: held until the next token
 * completes it. A U+FFFD followed by more text is a real decoding error and passes through;
 * `end()` releases whatever is still held.
 *
 * ## Example
 * ```ts
 * const stream = new TokenTextStream((ids) => tokenizer.decode(ids), promptIds);
 * for (const id of generated) process.stdout.write(stream.push(id));
 * process.stdout.write(stream.end());
 * ```
 */
export class TokenTextStream {
  private window: number[];
  /** Characters of `decode(window)` already emitted (or belonging to the context). */
  private emitted: number;

  constructor(
    private readonly decodeIds: DecodeIds,
    /** Ids before the first generated one (the prompt): the context of the first token. */
    context: readonly number[] = [],
  ) {
    this.window = context.slice(-CONTEXT);
    this.emitted = this.window.length === 0 ? 0 : decodeIds(this.window).length;
  }

  /** The text `id` adds; empty while it only continues a character that is not complete yet. */
  push(id: number): string {
    this.window.push(id);
    const text = this.decodeIds(this.window);
    let end = text.length;
    // A character has at most 4 bytes: U+FFFD still trailing after more tokens than that is an error, not a split.
    if (this.window.length <= CONTEXT + MAX_HELD) while (end > this.emitted && text[end - 1] === REPLACEMENT) end--;
    const added = end > this.emitted ? text.slice(this.emitted, end) : '';
    this.emitted = Math.max(this.emitted, end);
    if (end === text.length) {
      // Nothing held: restart the window from the last few ids, so decoding stays a few tokens long.
      this.window = this.window.slice(-CONTEXT);
      this.emitted = this.decodeIds(this.window).length;
    }
    return added;
  }

  /** What is still held (an incomplete character, decoded as U+FFFD); the stream is done. */
  end(): string {
    const text = this.decodeIds(this.window);
    const rest = text.length > this.emitted ? text.slice(this.emitted) : '';
    this.window = [];
    this.emitted = 0;
    return rest;
  }
}
