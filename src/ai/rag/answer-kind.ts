/**
 * What kind of answer a question asks for beyond its words: "how many" wants a number, "which
 * version" a version, "how long" a duration, "which environment variable" a NAME_LIKE_THIS, "why" a
 * reason ("because", "due to"), "which … are there" a list, "what does it return" a literal it is
 * set to (`` `FAILED_TO_RUN` ``, `"[Circular]"`), and a question about what happens unless
 * one sets something wants the default. A sentence holding such a value is likelier to be the answer than one that only
 * repeats the question's words.
 */

/** A kind of value a question asks for. */
export type AnswerKind = 'number' | 'duration' | 'version' | 'variable' | 'reason' | 'list' | 'value';

/** What a question asks for: the kinds of value, and whether it asks what holds by default. */
export interface Expectation {
  readonly kinds: readonly AnswerKind[];
  /** The question asks what holds when nothing is set ("by default", "unless I change it", "without configuring"). */
  readonly defaults: boolean;
}

const ASKS: Readonly<Record<AnswerKind, RegExp>> = {
  number:
    /\bhow (?:many|much|big|large|high|low)\b|\bnumber of\b|\bnumeric\b|\b(?:what|which) (?:is |are )?(?:the )?(?:\w+ )?(?:port|count|limit|size)\b|\b(?:largest|smallest|maximum|minimum)\b/i,
  duration: /\bhow (?:long|soon|often)\b|\bafter how\b/i,
  version: /\b(?:which|what|from)\b[^?]{0,40}\b(?:version|release)s?\b/i,
  variable: /\benv(?:ironment)? var(?:iable)?s?\b/i,
  reason: /\bwhy\b|\bwhat for\b|\bfor what reason\b/i,
  list: /\b(?:which|what)\b[^?]{0,40}\b(?:are there|exist|are available|are supported)\b|\bwhat (?:kinds|types|sorts) of\b/i,
  value: /\bwhat (?:does|do|will|would|did)\b[^?]{0,80}\b(?:return|put|set|give|yield|contain|print|output|emit|produce|resolve|evaluate)s?\b/i,
};

const DEFAULTS = new RegExp(
  [
    /\bdefaults?\b|\bunless (?:i|you|we)\b|\bon (?:its|their) own\b|\bout of the box\b/,
    /\b(?:if|when) (?:i|you|we) (?:do not|don't|did not|didn't|never) (?:set|configure|give|pass|specify|provide|change|tell|choose|add)\b/,
    /\bwithout (?:configuring|setting|specifying|passing|giving|telling|changing|choosing)\b/,
    // "If I give it no servers", "when no timeout is given", "if I leave the option out".
    /\b(?:if|when) (?:i|you|we) (?:give|pass|set) (?:it |them )?no\b|\b(?:if|when) no [\w-]+(?: [\w-]+)? (?:is|are) (?:given|passed|set|specified|provided|configured)\b/,
    /\b(?:if|when) (?:i|you|we) (?:omit|leave out)\b|\bleave (?:it|them|(?:the |an? )?[\w-]+) (?:out|unset|empty|blank)\b/,
  ]
    .map((part) => part.source)
    .join('|'),
  'i',
);

const HOLDS: Readonly<Record<AnswerKind, RegExp>> = {
  number:
    /(?:^|[^\w.])\d[\d_,]*(?:\.\d+)?(?:e\d+)?(?![\w.]*\.\d)|\b(?:one|two|three|four|five|six|seven|eight|nine|ten|twelve|twice|once|unlimited|infinity|no limit)\b/i,
  duration:
    /(?:\d[\d_,.]*(?:e\d+)?|\b(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|fifteen|twenty|thirty|sixty|a few|several))[\s-]*(?:ms|milliseconds?|millis|s|secs?|seconds?|min|minutes?|h|hours?|days?|weeks?|months?|years?)\b|\b(?:an?|one) (?:second|minute|hour|day|week|month|year)\b/i,
  version: /\bv?\d+\.\d+(?:\.\d+)?\b|\b(?:node(?:\.js)?|version|v)\s*\d+|\b\p{Lu}[\w.]*\s\d+\+?(?!\S*\d\.)/u,
  variable: /\b\p{Lu}[\p{Lu}\d]*(?:_[\p{Lu}\d]+)+\b/u,
  reason: /\b(?:because|due to|since|so that|in order to|otherwise|as a result|which means|to (?:prevent|avoid|ensure|allow|keep|make sure))\b/i,
  list: /(?:`[^`]+`[^`]*){3,}|[\w-]+, [\w-]+,? (?:and|or) [\w-]+/,
  value:
    /\b(?:set to|returns?|returned|gives?|yields?|prints?|outputs?|replaced (?:with|by)|becomes?|is|are|be)\s+(?:the (?:string|value) )?(?:`[^`]+`|"[^"]+"|'[^']+')/i,
};

/** "without SCOPE_FOR", "without --force", "without `maxRetries`": an option left out, written as code (so case counts). */
const LEFT_OUT = /\b[Ww]ithout (?:an? |the |any )?[`'"]?(?:--?[a-z][\w-]*|[A-Z][A-Z0-9]*_[A-Z0-9_]+|[a-z]+[A-Z]\w*)/;

const SAYS_DEFAULT =
  /\bdefault(?:s|ed)?\b|\bunless\b|\bif (?:not|unset|omitted|none)\b|\b(?:is|are|was|were) (?:not|never) (?:specified|given|set|passed|provided)\b|\bomitted\b/i;

/** What `question` asks for beyond its words; undefined when nothing in particular. */
export function expectedAnswer(question: string): Expectation | undefined {
  const kinds = (Object.keys(ASKS) as AnswerKind[]).filter((kind) => ASKS[kind].test(question));
  const defaults = DEFAULTS.test(question) || LEFT_OUT.test(question);
  return kinds.length === 0 && !defaults ? undefined : { kinds, defaults };
}

/** How much of what `expected` asks for `text` holds: a share in [0, 1], kinds and the default weighing alike. */
export function answerShare(expected: Expectation, text: string): number {
  const parts = expected.kinds.length + (expected.defaults ? 1 : 0);
  if (parts === 0) return 0;
  let held = expected.kinds.filter((kind) => HOLDS[kind].test(text)).length;
  if (expected.defaults && SAYS_DEFAULT.test(text)) held += 1;
  return held / parts;
}

/** "How do I…", "how to…", "which option…": asked for a way to do something, which documentation answers by naming it. */
const HOW_TO =
  /\b(?:how (?:do|can|should|would) (?:i|you|we)|how to|(?:which|what) (?:option|flag|method|function|setting|api|property|field|command|middleware|hook|event|parameter)s?)\b/i;

/** Whether `question` asks how to do something: its answer likely names an option, a function or a command (in code). */
export function asksHowTo(question: string): boolean {
  return HOW_TO.test(question);
}
