import type * as z from 'zod';
import { isObjectSchema, isZodSchema, lazySchema } from '../../core/zod.js';
import { InvalidOptionsError } from '../../core/errors.js';
import { functionSchema, parseOptions, positiveInt } from '../../flow/options.js';
import { EmptyPromptError, PromptOverBudgetError, TemplateVariablesError } from '../rag/errors.js';
import type { RetrievedPassage } from '../rag/passage.js';
import type { ChatMessage } from '../../cache/key.js';
import { countTokens as defaultCountTokens, tokenEnds } from '../rag/tokens.js';
import { withCitations, type Citation } from './retrieve.js';
import type { PromptTokenizer } from '../models/prompt-tokenizer.js';
import { stage, type StageOperator, type StageOptions } from '../../../operators/stage.js';

/** A few-shot example: a user turn and the answer the model should imitate. Inserted verbatim. */
export interface FewShotExample {
  readonly user: string;
  readonly assistant: string;
}

/** What `assemble` emits. */
export interface AssembledPrompt {
  readonly messages: readonly ChatMessage[];
  /** Tokens of the prompt (by `tokenizer`: as the model sees it; else every message's content by `countTokens`); at most the budget. */
  readonly tokens: number;
  /** Passages left out to fit the budget, lowest score first. */
  readonly dropped: readonly string[];
  /** The passage cut (at a token boundary) to fit, when no whole passage fitted. */
  readonly truncated: string | undefined;
  /** The sources cited by `[n]` in the context. */
  readonly citations: readonly Citation[];
}

/** Values a template variable may hold. */
export type TemplateValue = string | number | boolean;
/** A zod schema of the variables a template uses. */
export type VariablesSchema = z.ZodType<Record<string, TemplateValue>>;

/** Options of `PromptTemplate`: the template text and the schema of its variables. */
export interface PromptTemplateOptions<S extends VariablesSchema> {
  /** The user message. `{{name}}` is replaced by a variable, `{{context}}` by the cited passages. */
  template: string;
  /** The variables' schema: a missing or mistyped variable fails with `TemplateVariablesError` naming it. */
  schema: S;
  /** The system prompt; may use `{{name}}` variables (not `{{context}}`). */
  system?: string;
  examples?: readonly FewShotExample[];
  /** Most tokens the whole prompt may take. */
  budget: number;
  /** Counts tokens. Default: a whitespace/punctuation tokenizer (`countTokens` from sluice), an estimate. */
  countTokens?: (text: string) => number;
  /** The serving model's tokenizer: the budget then counts exactly what the model is sent. Give this or `countTokens`. */
  tokenizer?: PromptTokenizer;
  /** When not even the best passage fits whole, cut it at a token boundary instead of dropping it. Default true. */
  truncate?: boolean;
}

const SLOT = /\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}/g;
const CONTEXT = 'context';

const templateOptionsSchema = lazySchema((z) =>
  z
    .object({
      template: z.string({ error: 'template must be a string' }).refine((t) => t.trim().length > 0, { error: 'template must not be empty' }),
      schema: z.custom<VariablesSchema>(isZodSchema, { error: 'schema must be a zod schema' }),
      system: z.string({ error: 'system must be a string' }).optional(),
      examples: z.array(z.object({ user: z.string(), assistant: z.string() }).strict()).optional(),
      budget: positiveInt('budget'),
      countTokens: functionSchema<(text: string) => number>().optional(),
      tokenizer: z
        .custom<PromptTokenizer>((v) => typeof (v as PromptTokenizer | undefined)?.countTokens === 'function', {
          error: 'tokenizer must have a countTokens(text) method',
        })
        .optional(),
      truncate: z.boolean().optional(),
    })
    .strict()
    .refine((o) => o.countTokens === undefined || o.tokenizer === undefined, { error: 'give countTokens or tokenizer, not both', path: ['tokenizer'] }),
);

function slots(text: string): string[] {
  return [...text.matchAll(SLOT)].map((m) => m[1]!);
}

/**
 * A chat prompt — system prompt, few-shot examples, a user template with typed
 * variables and a cited context — fitted to a token budget. `assemble` runs one
 * per element; use it directly outside a pipeline.
 *
 * Fitting: passages are kept best first; over budget, the lowest-scored go first.
 * If not even the best one fits whole, it is cut at the last token boundary that
 * fits (a partial passage is better than no context, a partial token never is).
 * A prompt over budget with no passage at all fails with `PromptOverBudgetError`
 * saying by how much; a user message that renders empty, with `EmptyPromptError`.
 *
 * ## Example
 * ```ts
 * const qa = new PromptTemplate({
 *   system: 'Answer from the context only and cite sources as [n].',
 *   template: 'Context:\n{{context}}\n\nQuestion: {{question}}',
 *   schema: z.object({ question: z.string().min(1) }),
 *   budget: 2048,
 * });
 * const { messages, dropped } = qa.render({ question }, passages);
 * ```
 */
export class PromptTemplate<S extends VariablesSchema> {
  readonly budget: number;
  /** Whether the template has a `{{context}}` slot for passages. */
  readonly usesContext: boolean;
  private readonly options: PromptTemplateOptions<S>;
  private readonly count: (text: string) => number;
  private readonly countPrompt: ((messages: readonly ChatMessage[]) => number) | undefined;

  constructor(options: PromptTemplateOptions<S>) {
    parseOptions(templateOptionsSchema(), options, 'prompt template options');
    this.options = options;
    this.budget = options.budget;
    const tokenizer = options.tokenizer;
    this.count = tokenizer === undefined ? (options.countTokens ?? defaultCountTokens) : (text) => tokenizer.countTokens(text);
    this.countPrompt = tokenizer?.countPromptTokens === undefined ? undefined : (messages) => tokenizer.countPromptTokens!(messages);
    const used = slots(options.template);
    this.usesContext = used.includes(CONTEXT);
    // A schema we can see into lets a misspelt {{name}} fail here rather than render as text.
    if (isObjectSchema(options.schema)) {
      const known = new Set(Object.keys(options.schema.shape as Record<string, unknown>));
      const issues: { path: string; message: string }[] = [];
      if (known.has(CONTEXT)) issues.push({ path: 'schema.context', message: '"context" is reserved for the retrieved passages' });
      for (const name of used)
        if (name !== CONTEXT && !known.has(name)) issues.push({ path: 'template', message: `{{${name}}} is not a variable of the schema` });
      for (const name of slots(options.system ?? '')) {
        if (!known.has(name))
          issues.push({
            path: 'system',
            message: `{{${name}}} is not a variable of the schema${name === CONTEXT ? ' ({{context}} belongs in the template)' : ''}`,
          });
      }
      if (issues.length > 0) throw new InvalidOptionsError('prompt template options', issues);
    }
  }

  /** Renders the prompt for `variables` with as many of `passages` as the budget allows. */
  render(variables: z.input<S>, passages: readonly RetrievedPassage[] = []): AssembledPrompt {
    const parsed = this.options.schema.safeParse(variables);
    if (!parsed.success) {
      throw new TemplateVariablesError(parsed.error.issues.map((issue) => ({ path: issue.path.map(String).join('.'), message: issue.message })));
    }
    const values = parsed.data;
    const fill = (text: string, context: string): string =>
      // One pass: a value containing `{{x}}` is inserted as text, never expanded (no injection through variables).
      text.replace(SLOT, (whole, name: string) => {
        if (name === CONTEXT) return context;
        const value = values[name];
        return value === undefined ? whole : String(value);
      });
    const head: ChatMessage[] = [];
    if (this.options.system !== undefined) {
      const system = fill(this.options.system, '');
      if (system.trim().length > 0) head.push({ role: 'system', content: system });
    }
    for (const example of this.options.examples ?? []) head.push({ role: 'user', content: example.user }, { role: 'assistant', content: example.assistant });
    const countPrompt = this.countPrompt;
    const headTokens = countPrompt === undefined ? head.reduce((sum, m) => sum + this.count(m.content), 0) : 0;

    // Best first; equal scores by id, so the same inputs always drop the same passages.
    const ranked = this.usesContext ? [...passages].sort((a, b) => b.score - a.score || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0)) : [];
    const build = (kept: readonly RetrievedPassage[]) => {
      const context = withCitations(kept);
      const user = fill(this.options.template, context.text);
      const tokens = countPrompt === undefined ? headTokens + this.count(user) : countPrompt([...head, { role: 'user', content: user }]);
      return { user, context, tokens };
    };
    const finish = (built: ReturnType<typeof build>, keptCount: number, truncated?: string): AssembledPrompt => {
      if (built.user.trim().length === 0) throw new EmptyPromptError('the user message rendered empty');
      return {
        messages: [...head, { role: 'user', content: built.user }],
        tokens: built.tokens,
        dropped: ranked
          .slice(keptCount + (truncated === undefined ? 0 : 1))
          .map((p) => p.id)
          .reverse(),
        truncated,
        citations: built.context.citations,
      };
    };

    const all = build(ranked);
    if (all.tokens <= this.budget) return finish(all, ranked.length);
    const bare = build([]);
    if (bare.user.trim().length === 0) throw new EmptyPromptError('the user message rendered empty');
    if (bare.tokens > this.budget) throw new PromptOverBudgetError(bare.tokens, this.budget);
    // Largest number of best passages that fits; tokens grow with every passage kept.
    let low = 0;
    let high = ranked.length - 1;
    while (low < high) {
      const mid = (low + high + 1) >> 1;
      if (build(ranked.slice(0, mid)).tokens <= this.budget) low = mid;
      else high = mid - 1;
    }
    if (low > 0 || this.options.truncate === false) return finish(build(ranked.slice(0, low)), low);

    // Not even the best passage fits: keep its longest prefix ending at a token boundary that fits.
    const best = ranked[0]!;
    const ends = tokenEnds(best.text);
    let fit = 0;
    let top = ends.length - 1;
    const withPrefix = (n: number) => build([{ ...best, text: best.text.slice(0, ends[n - 1]) }]);
    while (fit < top) {
      const mid = (fit + top + 1) >> 1;
      if (withPrefix(mid).tokens <= this.budget) fit = mid;
      else top = mid - 1;
    }
    return fit === 0 ? finish(bare, 0) : finish(withPrefix(fit), 0, best.id);
  }
}

export interface AssembleOptions<I, S extends VariablesSchema> extends PromptTemplateOptions<S>, StageOptions<I> {
  /** Selects the template variables. Default: the value itself. */
  variables?: (value: I) => z.input<S>;
  /** Selects the passages for `{{context}}`. Default: the value's `passages` (what `retrieve` emits). */
  passages?: (value: I) => readonly RetrievedPassage[];
}

const assembleOwnSchema = lazySchema((z) =>
  z
    .object({
      variables: functionSchema<(value: unknown) => unknown>().optional(),
      passages: functionSchema<(value: unknown) => readonly RetrievedPassage[]>().optional(),
    })
    .strict(),
);

/**
 * Assembles each element into a chat prompt that fits a token budget, as a stage
 * (bounded buffer, policies, cancellation, traces).
 *
 * ```
 * source:  --r1--r2--|           r = { input, passages } (from retrieve)
 * assemble({ template, schema, budget: 1024, variables: (r) => ({ question: r.input.text }) })
 * output:  --p1--p2--|           p = { messages: [{ role, content }], tokens, dropped, truncated, citations }
 * ```
 *
 * Passages go into `{{context}}` with `[n]` citation markers (see `withCitations`).
 * Over budget, the lowest-scored passages are dropped first; the trace notes
 * `assemble.tokens`, and `assemble.dropped` (comma-separated ids) and
 * `assemble.truncated` when it had to. Typed errors (passed on as they are, or
 * skipped with `errorPolicy: 'skip'`): `TemplateVariablesError`,
 * `PromptOverBudgetError` (`PROMPT_OVER_BUDGET`, by how much), `EmptyPromptError`.
 *
 * ## Example
 * ```ts
 * questions.pipe(
 *   embed({ embedder }),
 *   retrieve({ index, k: 8 }),
 *   assemble({
 *     system: 'Answer from the context only; cite sources as [n].',
 *     examples: [{ user: 'What is a stage?', assistant: 'An operator with a bounded buffer [1].' }],
 *     template: 'Context:\n{{context}}\n\nQuestion: {{question}}',
 *     schema: z.object({ question: z.string().min(1) }),
 *     variables: (r) => ({ question: r.input.text }),
 *     budget: 3000,
 *   }),
 * ); // Flow<Traced<AssembledPrompt>>
 * ```
 *
 * Invalid options throw `InvalidOptionsError` naming each bad field, including
 * a template {{name}} the schema does not declare.
 *
 * @see PromptTemplate for the fitting rules; retrieve; withCitations.
 */
export function assemble<I, S extends VariablesSchema>(options: AssembleOptions<I, S>): StageOperator<I, AssembledPrompt> {
  const { template, schema, system, examples, budget, countTokens, tokenizer, truncate, variables, passages, ...stageOptions } =
    options ?? ({} as AssembleOptions<I, S>);
  const name = stageOptions.name ?? 'assemble';
  parseOptions(assembleOwnSchema(), { variables, passages }, `assemble "${name}" options`);
  const prompt = new PromptTemplate<S>({
    template,
    schema,
    budget,
    ...(system === undefined ? {} : { system }),
    ...(examples === undefined ? {} : { examples }),
    ...(countTokens === undefined ? {} : { countTokens }),
    ...(tokenizer === undefined ? {} : { tokenizer }),
    ...(truncate === undefined ? {} : { truncate }),
  });
  if (passages !== undefined && !prompt.usesContext) {
    throw new InvalidOptionsError(`assemble "${name}" options`, [
      { path: 'template', message: 'a `passages` selector is given but the template has no {{context}} slot' },
    ]);
  }
  const selectVariables = variables ?? ((value: I) => value as unknown as z.input<S>);
  const selectPassages =
    passages ??
    ((value: I): readonly RetrievedPassage[] => {
      const carried = (value as { passages?: unknown } | null)?.passages;
      return Array.isArray(carried) ? (carried as RetrievedPassage[]) : [];
    });

  return stage<I, AssembledPrompt>(
    (value, context) => {
      const result = prompt.render(selectVariables(value), prompt.usesContext ? selectPassages(value) : []);
      context.note('tokens', result.tokens);
      if (result.dropped.length > 0) context.note('dropped', result.dropped.join(','));
      if (result.truncated !== undefined) context.note('truncated', result.truncated);
      return result;
    },
    { ...stageOptions, name },
  );
}
