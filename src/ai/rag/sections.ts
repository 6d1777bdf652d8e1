/**
 * The passages of each section (same file and heading path), in document order. A passage is one
 * paragraph, list, fence or table: the sentence that answers often sits in the paragraph beside the
 * one retrieval found, so the extractive answer reads a retrieved passage's neighbours too.
 */
import type { Passage, PassageMetadata, RetrievedPassage } from './passage.js';

/** A passage the answer may quote: retrieved, or a neighbour of one in its section. */
export interface Placed {
  readonly passage: RetrievedPassage;
  /** Retrieval's rank of the passage (from 0), or of the retrieved passage it neighbours. */
  readonly rank: number;
  /** Its place in its section relative to the retrieved one (negative: before it). */
  readonly offset: number;
}

const sectionOf = (metadata: PassageMetadata): string => `${metadata.source}\n${metadata.headings ?? ''}`;

/** The sections of an index's passages; build it from `VectorIndex.entries()` or passages, in document order. */
export class Sections {
  private readonly members = new Map<string, Passage[]>();
  private readonly place = new Map<string, { readonly section: string; readonly at: number }>();

  /** The sections of `entries`, in the order given. */
  static of(entries: Iterable<{ readonly id: string; readonly metadata: PassageMetadata } | Passage>): Sections {
    const sections = new Sections();
    for (const entry of entries) {
      const passage: Passage = 'metadata' in entry ? { id: entry.id, ...entry.metadata } : entry;
      const section = sectionOf(passage);
      const members = sections.members.get(section) ?? [];
      if (members.length === 0) sections.members.set(section, members);
      sections.place.set(passage.id, { section, at: members.length });
      members.push(passage);
    }
    return sections;
  }

  /** Up to `reach` passages either side of `id` in its section, with their offsets; none for an unknown id. */
  around(id: string, reach: number): { readonly passage: Passage; readonly offset: number }[] {
    const where = this.place.get(id);
    if (where === undefined) return [];
    const members = this.members.get(where.section)!;
    const near: { passage: Passage; offset: number }[] = [];
    for (let at = Math.max(0, where.at - reach); at <= Math.min(members.length - 1, where.at + reach); at++)
      if (at !== where.at) near.push({ passage: members[at]!, offset: at - where.at });
    return near;
  }

  /**
   * The retrieved passages, then the neighbours (within `reach`) of the first `depth` of them that
   * were not retrieved themselves; a neighbour carries the score and rank of the passage it neighbours.
   */
  widen(passages: readonly RetrievedPassage[], depth: number, reach: number): Placed[] {
    const placed: Placed[] = passages.map((passage, rank) => ({ passage, rank, offset: 0 }));
    const seen = new Set(passages.map((p) => p.id));
    for (const [rank, origin] of passages.slice(0, depth).entries()) {
      for (const { passage, offset } of this.around(origin.id, reach)) {
        if (seen.has(passage.id)) continue;
        seen.add(passage.id);
        placed.push({ passage: { ...passage, score: origin.score }, rank, offset });
      }
    }
    return placed;
  }
}
