/**
 * An answer made only of what was retrieved: the sentences, code lines and table rows of the top
 * passages (and their section neighbours) that best answer the question, ranked by the odds that
 * each answers (`answerOdds`: sentence BM25 over its words, the embedding model's cosine, retrieval's
 * rank and more), in reading order, each followed by the `[n]` of the passage it came from, then
 * the list of sources. It never says more than the sources say.
 */
import { answerShare } from './answer-kind.js';
import { answerOdds } from './sentence-odds.js';
import type { RetrievedPassage } from './passage.js';
import { matchSentences, missingMass, type QueryTerms } from './sentence-scores.js';
import { quotablesOf, type Quotable } from './sentences.js';

export { quotablesOf, sentencesOf, type Quotable } from './sentences.js';
export type { QueryTerms } from './sentence-scores.js';

/** Options of the extractive answer a `ragWorker` gives without a generator. */
export interface ExtractOptions {
  /** Sentences in an answer at most. Default 3. */
  readonly sentences?: number;
  /** A sentence scoring below this is left out: its cosine to the question, or with query words its blend of sentence BM25 and cosine. Default 0.2. */
  readonly minScore?: number;
  /** Sentences of its paragraph, list item or code fence quoted on each side of the best one, as its context (those before it only while they hold a word of the question, unless it points back). Default 2; 0 quotes the picked sentences alone. */
  readonly context?: number;
}

export interface ExtractedAnswer {
  /** The answer with its `[n]` citations and the source list; the no-answer sentence when nothing matched. */
  readonly text: string;
  /** The passages cited, `[1]` first. */
  readonly sources: readonly RetrievedPassage[];
}

/** What the answer says when nothing retrieved is close enough. */
export const NO_ANSWER = 'I found nothing about that in the documents I have.';

/** How much a lone code line's score counts, beside prose and table rows. */
const CODE_WEIGHT = 0.75;
/** The share of a sentence's score its words give (sentence BM25); the rest is its cosine to the question. */
const LEXICAL_SHARE = 0.7;
/** A sentence scoring under this part of the best one's is left out, unless it fills `FILLS`. */
const KEEP = 0.5;
/** The share of the query's IDF mass, missing from the answer so far, that admits a sentence below `KEEP`. */
const FILLS = 0.15;
/** Two sentences sharing more than this share of their words (Jaccard) say the same: the later one is not quoted. */
const NEAR_DUPLICATE = 0.8;
/** What a further sentence's log-odds gain per share of the query's IDF mass it adds to the answer: a second source for the words the first lacks. */
const COVERS = 8;
/** What a sentence holding the kind of value the question asks for (a number for "how many") adds to its score, at most. */
const ANSWER_BONUS = 0.15;

const rankOf = (c: Candidate): number => c.rank ?? c.passage;
/**
 * Retrieval's rank of a sentence's passage as the anchor is chosen by: its own, or one below that
 * of its section's best-ranked passage (`sectionBest`), whichever is better — a long list or table
 * cut into pieces is one section, and the piece retrieval ranked first vouches for the rest.
 */
const placeOf = (c: Candidate, sectionBest: number): number => Math.min(rankOf(c), sectionBest + 1);

/** The best rank among the candidates of each section (a passage's `source`: its file and heading). */
function sectionRanks(passages: readonly RetrievedPassage[], candidates: readonly Candidate[]): Map<string, number> {
  const best = new Map<string, number>();
  for (const c of candidates) {
    const source = passages[c.passage]?.source ?? '';
    best.set(source, Math.min(best.get(source) ?? Infinity, rankOf(c)));
  }
  return best;
}

/** Whether a candidate is code alone: a code line, or a comment line with its code (a lead-in sentence with its line is prose). */
function isCode(text: string): boolean {
  return /^(`[^`]*`\s*)+$/.test(text);
}

/** A sentence of the retrieved passages: where it comes from and its text. */
export interface Candidate {
  /** Its passage's index in the passages given. */
  readonly passage: number;
  /** Its place in the passage. */
  readonly position: number;
  readonly text: string;
  /** Retrieval's rank of its passage, or of the retrieved passage its passage neighbours. Default: `passage`. */
  readonly rank?: number;
  /** Its passage's place beside the retrieved one it neighbours (0: retrieved itself). Default 0. */
  readonly offset?: number;
  /** The paragraph, list item, code fence or table row it belongs to in its passage (`Quotable.block`). */
  readonly block?: number;
  /** It is an attribute list (`Quotable.attributes`): quoted after the heading it is written under. */
  readonly attributes?: true;
}

interface Scored extends Candidate {
  readonly score: number;
  /** What the anchor is chosen by: the log-odds that it answers (`answerOdds`), or without query words its cosine. */
  readonly ranked: number;
  readonly held: ReadonlySet<string>;
}

/**
 * Picks the sentences that answer `question` among the passages' candidates (vectors from the same
 * embedder) and writes the answer: in passage order, then sentence order, each followed by its
 * source's number. With `words`, a sentence is scored by BM25 over the query's words inside the
 * passages (IDF from the corpus, headings as context) beside its cosine; the one likeliest to answer
 * (`answerOdds`, its passage's rank weighed in) anchors the answer; further sentences scoring at least
 * half as well join it, those holding query words the answer still lacks first (from any passage). Without
 * `words`, the closest sentences by cosine.
 */
export function composeAnswer(
  question: Float32Array,
  passages: readonly RetrievedPassage[],
  candidates: readonly Candidate[],
  vectors: readonly Float32Array[],
  options: ExtractOptions = {},
  words?: QueryTerms,
): ExtractedAnswer {
  const limit = options.sentences ?? 3;
  const minScore = options.minScore ?? 0.2;
  const cosines = cosinesTo(question, vectors, candidates.length);
  const picked =
    words === undefined
      ? dedupe(candidates.map((c, i) => ({ ...c, score: cosines[i]!, ranked: cosines[i]!, held: new Set<string>() })))
          .filter((c) => c.score >= minScore)
          .slice(0, limit)
      : pickByWords(passages, candidates, cosines, words, limit, minScore);
  if (picked.length === 0) return { text: NO_ANSWER, sources: [] };
  return writeAnswer(passages, withAntecedents(withContext(picked, candidates, options.context ?? 2, words), candidates, passages));
}

/**
 * The picked sentences and, beside the anchor (the first), up to `width` sentences of its block (its
 * paragraph, list item or code fence; a table row has none) before and after it: the sentence that
 * best answers is quoted in its context, where a value or a condition it leaves out is often stated.
 */
function withContext(picked: readonly Scored[], candidates: readonly Candidate[], width: number, words?: QueryTerms): Scored[] {
  const anchor = picked[0];
  if (anchor === undefined || width === 0) return [...picked];
  const quoted = new Set(picked.map((p) => `${p.passage}:${p.position}`));
  const block = candidates.filter((c) => c.passage === anchor.passage && c.block === anchor.block);
  const asked = new Set(words?.terms ?? []);
  const speaksOf = (c: Candidate) => words === undefined || words.termsOf(c.text).some((term) => asked.has(term));
  // What comes before the best sentence is quoted only while it speaks of the question, unless the best one points back to it: the answer opens on the point.
  let reach = width;
  if (!POINTS_BACK.test(anchor.text)) {
    reach = 0;
    while (reach < width && block.some((c) => c.position === anchor.position - reach - 1 && speaksOf(c))) reach++;
  }
  const beside = block.filter(
    (c) =>
      c.position - anchor.position <= width &&
      anchor.position - c.position <= reach &&
      c.position !== anchor.position &&
      !quoted.has(`${c.passage}:${c.position}`),
  );
  return [...picked, ...beside.map((c) => ({ ...c, score: 0, ranked: 0, held: new Set<string>() }))];
}

/** A sentence opening on a demonstrative ("This will…", "These flags…"): after a code block, it speaks of that code. */
const DEMONSTRATIVE = /^(?:this|these|that|those)\b/i;

/**
 * The last line of the code block just before `p`'s passage in its section, when that block is among
 * the candidates as the passage before it (placed beside the same retrieved passage, one place up).
 */
function codeBefore(p: Candidate, candidates: readonly Candidate[], passages: readonly RetrievedPassage[]): Candidate | undefined {
  if (p.rank === undefined) return undefined;
  const source = passages[p.passage]?.source;
  const before = candidates.filter((c) => c.rank === p.rank && (c.offset ?? 0) === (p.offset ?? 0) - 1 && passages[c.passage]?.source === source);
  const last = before.at(-1);
  return last !== undefined && isCode(last.text) ? last : undefined;
}

/** A sentence opening on a word that points back ("But they…", "Therefore…", "This option…"): alone, it leaves out what it is about. */
const POINTS_BACK = /^(?:but|however|therefore|thus|hence|otherwise|instead|this|these|those|that|they|it|its|their|such|then)\b/i;

/**
 * Each picked prose sentence that points back, preceded by the sentence before it in its passage when
 * that one is not quoted anyway, or, opening its passage, by the heading it is written under.
 */
function withAntecedents(picked: readonly Scored[], candidates: readonly Candidate[], passages: readonly RetrievedPassage[]): Scored[] {
  const quoted = new Set(picked.map((p) => `${p.passage}:${p.position}`));
  return picked.map((p) => {
    const attributes = p.attributes === true;
    if (!attributes && (!POINTS_BACK.test(p.text) || quoted.has(`${p.passage}:${p.position - 1}`))) return p;
    // An attribute list (`Default: 2; Type: Number`) states values of what its heading names, wherever it stands.
    const code = p.position === 0 && !attributes && DEMONSTRATIVE.test(p.text) ? codeBefore(p, candidates, passages) : undefined;
    // "This will…" opening a passage right after a code block speaks of that code: its last line comes first.
    if (code !== undefined && !quoted.has(`${code.passage}:${code.position}`)) return { ...p, text: `${code.text} ${p.text}` };
    if (p.position === 0 || attributes) {
      const heading = passages[p.passage]?.headings?.split(' › ').at(-1)?.trim();
      // An API heading is named before the passage's sentences anyway (`subjectOf`).
      const named = attributes ? namesCode(heading ?? '') && apiOf(heading!) !== undefined : apiOf(heading ?? '') !== undefined;
      return heading === undefined || heading === '' || named ? p : { ...p, text: `${heading}: ${p.text}` };
    }
    const before = candidates.find((c) => c.passage === p.passage && c.position === p.position - 1);
    if (before === undefined || isCode(before.text)) return p;
    return { ...p, text: `${before.text} ${p.text}` };
  });
}

/**
 * `cosineSimilarity(question, vectors[i])` for the first `count` vectors, to the last bit: the same
 * sums in the same order, but the question's own sum of squares is made once, not once per sentence.
 */
export function cosinesTo(question: Float32Array, vectors: readonly Float32Array[], count = vectors.length): number[] {
  let na = 0;
  for (let i = 0; i < question.length; i++) na += question[i]! * question[i]!;
  const cosines = new Array<number>(count);
  for (let v = 0; v < count; v++) {
    const b = vectors[v]!;
    let dot = 0;
    let nb = 0;
    for (let i = 0; i < question.length; i++) {
      dot += question[i]! * b[i]!;
      nb += b[i]! * b[i]!;
    }
    cosines[v] = dot / Math.sqrt(na * nb || 1);
  }
  return cosines;
}

/** Best first, each text once. */
function dedupe(scored: Scored[]): Scored[] {
  const seen = new Set<string>();
  return scored.sort((a, b) => b.ranked - a.ranked).filter((c) => !seen.has(c.text) && seen.add(c.text) !== undefined);
}

/** The anchor sentence, then those that add to it, up to `limit`. */
function pickByWords(
  passages: readonly RetrievedPassage[],
  candidates: readonly Candidate[],
  cosines: readonly number[],
  words: QueryTerms,
  limit: number,
  minScore: number,
): Scored[] {
  const matches = matchSentences(
    candidates.map((c) => ({ text: c.text, headings: passages[c.passage]?.headings ?? '' })),
    words,
  );
  const sections = sectionRanks(passages, candidates);
  const terms = Math.max(1, words.terms.length);
  const scored = dedupe(
    candidates.flatMap((candidate, i) => {
      const match = matches[i]!;
      const share = words.expects === undefined || match.held.size === 0 ? 0 : answerShare(words.expects, candidate.text);
      const code = isCode(candidate.text);
      const blended = LEXICAL_SHARE * match.score + (1 - LEXICAL_SHARE) * cosines[i]! + ANSWER_BONUS * share;
      // A line of code alone shares the names of a whole section (imports, constructors): it must hold more to be quoted.
      const score = code ? blended * CODE_WEIGHT : blended;
      const sectionBest = sections.get(passages[candidate.passage]?.source ?? '') ?? rankOf(candidate);
      const ranked = answerOdds({
        lexical: match.score,
        cosine: cosines[i]!,
        kind: share,
        code,
        place: placeOf(candidate, sectionBest),
        neighbour: (candidate.offset ?? 0) !== 0,
        held: match.held.size / terms,
        own: match.own / terms,
        length: match.length,
        names: words.howTo === true && /`[^`]+`/.test(candidate.text),
        howToCode: words.howTo === true && code,
      });
      // A line of code saying only what the question says is never quoted.
      return code && echoes(candidate.text, words) ? [] : [{ ...candidate, score, ranked, held: match.held }];
    }),
  ).filter((c) => c.score >= minScore);
  const anchor = scored[0];
  if (anchor === undefined) return [];
  const picked = [anchor];
  const held = new Set(anchor.held);
  let rest = scored.slice(1);
  while (picked.length < limit) {
    let next: { readonly candidate: Scored; readonly value: number } | undefined;
    for (const candidate of rest) {
      // Nearly the sentence already quoted (another row of the same table, a copy in another page): it would say nothing new.
      if (picked.some((p) => overlap(p.text, candidate.text) > NEAR_DUPLICATE)) continue;
      const adds = missingMass(words, held, candidate.held);
      // A sentence well below the anchor joins only for a good part of the query the answer still lacks.
      if (candidate.score < KEEP * anchor.score && adds < FILLS) continue;
      const value = candidate.ranked + COVERS * adds;
      if (next === undefined || value > next.value) next = { candidate, value };
    }
    if (next === undefined) break;
    picked.push(next.candidate);
    for (const term of next.candidate.held) held.add(term);
    rest = rest.filter((c) => c !== next.candidate);
  }
  return picked;
}

/**
 * Whether a line of code says nothing but the question's own words (`use std::sync::mpsc;` for
 * "what does mpsc mean in std::sync::mpsc", the error message a question pastes): quoting it would
 * answer the question with itself.
 */
function echoes(text: string, words: QueryTerms): boolean {
  const terms = words.termsOf(text);
  return terms.length > 0 && terms.every((term) => words.terms.includes(term));
}

/** The words of three letters or more two texts share, over those either has (Jaccard). */
function overlap(a: string, b: string): number {
  const x = new Set(a.toLowerCase().match(/[a-z]{3,}/g));
  const y = new Set(b.toLowerCase().match(/[a-z]{3,}/g));
  if (x.size === 0 || y.size === 0) return 0;
  let both = 0;
  for (const word of x) if (y.has(word)) both++;
  return both / (x.size + y.size - both);
}

/**
 * What an API heading may open with before the API's name: a label of what it is (`Static method:`,
 * `Class:`, as Node.js's docs write them), its result's assignment (`const ok =`), `new`, `static`,
 * `async`, `await`, or a method's `.`.
 */
const API_LEAD =
  /^(?:(?:[Ss]tatic |[Ii]nstance )?(?:[Mm]ethod|[Pp]roperty|[Ff]unction|[Cc]lass|[Ii]nterface|[Cc]onstructor)\s*:\s*)?(?:(?:const|let|var)\s+[\w$]+\s*=\s*|(?:new|static|async|await)\s+|\.)?/;

/**
 * A heading that is an API's name (`logger.child(bindings)`, `exports.errWithCause(error)`, `SonicBoom#flush([cb])`,
 * `level (String)`, `undici:request:create`, `new Client(url[, options])`, `.checkIgnore(target): TestResult`,
 * `const ok = safe(re, opts={})`): the name, or with `API_LEAD` stripped, and after its parameters perhaps a return type.
 */
const API_HEADING = /^[\p{L}_$][\w$]*(?:[.#:][\w$]+)*\s*(?:\(.*\)\s*(?:(?:->|→|:)\s*.*)?)?\s*(?:=>.*)?$/u;

/** A command-line option as a heading (`--fresh`, `-C <initial-cache>`, `--max-old-space-size=SIZE (in MiB)`): its flag first. */
const OPTION_HEADING = /^(--?[A-Za-z][\w-]*)(?:[=\s[,].*)?$/;

/** Whether a heading is written as code: a call, a member or a label (`.`, `#`, `(`, `:`), a command-line option, or one identifier with a capital or `_` inside (`caseSensitive`, `max_depth`), not a word (`Usage`). */
function namesCode(heading: string): boolean {
  return /[.#(:]/.test(heading) || OPTION_HEADING.test(heading) || /^[a-z$][\w$]*(?:[A-Z_$])[\w$]*$/.test(heading);
}

/** The API a heading names (`safe` for `const ok = safe(re)`, `--fresh` for an option), or undefined when it is not an API heading. */
function apiOf(heading: string): string | undefined {
  const option = OPTION_HEADING.exec(heading);
  if (option !== null) return option[1];
  const bare = heading.replace(API_LEAD, '');
  if (API_HEADING.test(bare)) return /^[\p{L}_$][\w$.#:]*/u.exec(bare)![0];
  // A name in a notation of its own, one word of code (`$<TARGET_RUNTIME_DLLS:tgt>`, `@scope:registry`): itself.
  return /^[^\s\p{L}\p{N}]?[^\s]+$/u.test(bare) && /[:#.]/.test(bare) && /\p{L}/u.test(bare) ? bare : undefined;
}

/** The innermost heading of a passage when it names an API none of its quoted sentences names: the subject they leave out. */
function subjectOf(passage: RetrievedPassage, quoted: readonly Scored[]): string | undefined {
  const heading = passage.headings?.split(' › ').at(-1)?.trim();
  const name = heading === undefined || !namesCode(heading) ? undefined : apiOf(heading);
  return name === undefined || quoted.some((q) => q.text.includes(name)) ? undefined : heading;
}

/**
 * The answer's text: retrieval's order (best passage first), then reading order, each sentence
 * followed by its passage's number; a passage's API heading leads its sentences when they do not name it.
 */
function writeAnswer(passages: readonly RetrievedPassage[], picked: readonly Scored[]): ExtractedAnswer {
  const ordered = [...picked].sort((a, b) => rankOf(a) - rankOf(b) || (a.offset ?? 0) - (b.offset ?? 0) || a.position - b.position);
  const cited = [...new Set(ordered.map((p) => p.passage))];
  const number = new Map(cited.map((passage, i) => [passage, i + 1]));
  const named = new Set<string>();
  const body = cited
    .map((passage) => {
      const quoted = ordered.filter((p) => p.passage === passage);
      const sentences = quoted.map((p) => `${p.text} [${number.get(p.passage)}]`).join(' ');
      const subject = subjectOf(passages[passage]!, quoted);
      if (subject === undefined || named.has(subject)) return sentences;
      named.add(subject);
      return `${subject}: ${sentences}`;
    })
    .join(' ');
  const sources = cited.map((passage) => passages[passage]!);
  const list = sources.map((s, i) => `[${i + 1}] ${s.source}`).join('\n');
  return { text: `${body}\n\nSources:\n${list}`, sources };
}

/**
 * The sentences of `passages` to rank, each with where it came from (and, for neighbours of retrieved
 * passages, their `placement`). `split` cuts a passage's text into them: `quotablesOf`, or the same
 * remembered per passage (a `TextMemo` of it).
 */
export function candidatesOf(
  passages: readonly RetrievedPassage[],
  placement?: readonly { readonly rank: number; readonly offset: number }[],
  split: (text: string) => readonly Quotable[] = quotablesOf,
): Candidate[] {
  return passages.flatMap((p, passage) =>
    split(p.text).map(({ text, block, attributes }, position) => {
      const place = placement?.[passage];
      const kind = attributes === true ? { attributes } : {};
      return place === undefined
        ? { passage, position, text, block, ...kind }
        : { passage, position, text, block, ...kind, rank: place.rank, offset: place.offset };
    }),
  );
}

/** An answer cut into the pieces it is streamed in: words with the space that follows them. */
export function answerPieces(text: string): string[] {
  return text.match(/\S+\s*/g) ?? [];
}
