/**
 * The rules across fields of `ServeOptions`, written once: the server's option schema checks
 * them, and the `sluice` command checks them on its flags, each field named as its reader knows
 * it (an option name, or the flag or variable that set it).
 */

export interface ServeRule {
  /** The field the rule is about; a violation is reported at its path. */
  readonly field: string;
  /** Fields that must be set too when `field` is. */
  readonly needs?: readonly string[];
  /** A field that must not be set when `field` is. */
  readonly excludes?: string;
  /** What the field does, or why the two exclude each other. */
  readonly why: string;
}

export const SERVE_RULES: readonly ServeRule[] = [
  { field: 'ragModel', needs: ['upstreams', 'corpus'], why: 'names an upstream model that answers from the corpus' },
  { field: 'corpusIgnore', needs: ['corpus'], why: 'leaves documents of the corpus out' },
  { field: 'corpusMaxFileBytes', needs: ['corpus'], why: 'bounds the size of the corpus files read' },
  { field: 'gateway', needs: ['upstreams'], why: 'tunes gateway mode' },
  { field: 'localModels', excludes: 'upstreams', why: "gateway mode serves the upstreams' models" },
  { field: 'languageModel', excludes: 'upstreams', why: "gateway mode serves the upstreams' models" },
];

/** A broken rule: the field to report it at, and what to say, with every field named by `name`. */
export interface RuleViolation {
  readonly field: string;
  readonly message: string;
}

/** The rules `options` breaks; a field counts as set when it is not undefined (an empty list of local models counts as unset). */
export function ruleViolations(options: Readonly<Record<string, unknown>>, name: (field: string) => string = (field) => field): RuleViolation[] {
  const set = (field: string) => options[field] !== undefined && !(Array.isArray(options[field]) && options[field].length === 0);
  const broken: RuleViolation[] = [];
  for (const rule of SERVE_RULES) {
    if (!set(rule.field)) continue;
    const missing = rule.needs?.filter((field) => !set(field)) ?? [];
    if (missing.length > 0) broken.push({ field: rule.field, message: `${name(rule.field)} ${rule.why}: give ${rule.needs!.map(name).join(' and ')} too` });
    if (rule.excludes !== undefined && set(rule.excludes))
      broken.push({ field: rule.field, message: `give ${name(rule.field)} or ${name(rule.excludes)}, not both: ${rule.why}` });
  }
  return broken;
}
