import type { CorpusSkip, CorpusSkipReason } from './document-text.js';

/** Examples kept per reason, for a log line that says where to look without listing a whole corpus. */
const EXAMPLES = 3;

/**
 * What a corpus left out, counted by reason, for one log line at start-up:
 * `skipped 3: 2 no-text (guide.md#intro-2, …), 1 binary (logo.md)`.
 */
export class CorpusSkips {
  readonly counts: Partial<Record<CorpusSkipReason, number>> = {};
  private readonly examples = new Map<CorpusSkipReason, string[]>();
  total = 0;

  add(skip: CorpusSkip): void {
    this.total++;
    this.counts[skip.reason] = (this.counts[skip.reason] ?? 0) + 1;
    const examples = this.examples.get(skip.reason) ?? [];
    if (examples.length < EXAMPLES) examples.push(skip.id ?? skip.file);
    this.examples.set(skip.reason, examples);
  }

  summary(): string {
    const parts = Object.entries(this.counts)
      .sort((a, b) => b[1] - a[1])
      .map(([reason, count]) => {
        const examples = this.examples.get(reason as CorpusSkipReason) ?? [];
        return `${count} ${reason} (${examples.join(', ')}${count > examples.length ? ', …' : ''})`;
      });
    return `skipped ${this.total}: ${parts.join(', ')}`;
  }
}
