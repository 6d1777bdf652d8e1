import { lazySchema, zod } from '../../core/zod.js';
import { stage, type FailureEvent, type StageOperator, type StageOptions } from '../../../operators/stage.js';
import { functionSchema, parseOptions } from '../../flow/options.js';
import { SluiceError } from '../../core/errors.js';
import type { TraceContext } from '../../core/trace.js';
import type { Classification, Classifier } from '../models/classifier.js';

/** `pass`: delivered as is. `flag`: delivered, marked in the trace. `block`: not delivered, reported. */
export type GuardAction = 'pass' | 'flag' | 'block';

export interface GuardVerdict extends Classification {
  readonly action: GuardAction;
}

/** An element the guard blocked: it is not delivered, and reaches `onFailure` (and `onBlock`) with this error. */
export class GuardBlockedError extends SluiceError {
  constructor(
    stage: string,
    readonly seq: number,
    readonly verdict: GuardVerdict,
  ) {
    super('GUARD_BLOCKED', `Stage "${stage}" blocked element #${seq}: "${verdict.label}" scored ${verdict.score}.`, {
      stage,
      hint: 'The element was withheld by policy; raise thresholds.block to let such content through, or errorPolicy "skip" to go on after a block.',
    });
  }
}

/** Options of `guard`: the classifier, the thresholds per label and a report of each verdict. */
export interface GuardOptions<T> extends Omit<StageOptions<T>, 'errorPolicy'> {
  /** Scores each element's text. Its signal aborts on unsubscribe, kill switch or `timeout`. */
  classify: Classifier;
  /** A score at or above `flag` flags the element, at or above `block` blocks it (`flag` ≤ `block`, both in [0, 1]). */
  thresholds: { flag: number; block: number };
  /** Labels that are never flagged or blocked, whatever their score. Default `['safe']`. */
  safeLabels?: readonly string[];
  /** The text to classify. Default: the element itself, which must then be a string. */
  text?: (value: T) => string;
  /**
   * A block skips the element and the stream goes on (`skip`, default), or ends the
   * stream with `GuardBlockedError` (`fail`).
   */
  errorPolicy?: 'fail' | 'skip';
  /** Every verdict, as it is made (for audit logs and metrics). */
  onVerdict?: (event: { readonly stage: string; readonly value: T; readonly verdict: GuardVerdict; readonly trace: TraceContext }) => void;
}

const unit = (what: string) =>
  zod()
    .number({ error: `${what} must be a number` })
    .min(0, { error: `${what} must be ≥ 0` })
    .max(1, { error: `${what} must be ≤ 1` });

const guardOptionsSchema = lazySchema((z) =>
  z
    .object({
      classify: functionSchema<Classifier>(),
      thresholds: z
        .object({ flag: unit('thresholds.flag'), block: unit('thresholds.block') })
        .strict()
        .refine((t) => t.flag <= t.block, { error: 'thresholds.flag must be ≤ thresholds.block', path: ['flag'] }),
      safeLabels: z.array(z.string()).default(['safe']),
      text: functionSchema<(value: unknown) => string>().optional(),
      errorPolicy: z.enum(['fail', 'skip']).default('skip'),
      onVerdict: functionSchema<(event: unknown) => void>().optional(),
    })
    // Everything else belongs to `stage`, which validates it in turn.
    .loose(),
);

/**
 * A policy filter: classifies each element's text and delivers it (`pass`), delivers
 * it marked (`flag`), or withholds it (`block`). The verdict is noted in the element's
 * trace: `"<name>.verdict"` (`pass` / `flag` / `block`), `"<name>.label"`,
 * `"<name>.score"`.
 *
 * ```
 * source:  -a-b-c-|       classify: a → 0.1, b → 0.6, c → 0.95
 * guard({ classify, thresholds: { flag: 0.5, block: 0.9 } })
 * output:  -a-b---|       b noted 'flag'; c blocked: reported to onFailure as GuardBlockedError
 * ```
 *
 * Blocked elements are never delivered. They count as `failed` in `stats` and reach
 * `onFailure` with a `GuardBlockedError` (code `GUARD_BLOCKED`) carrying the verdict;
 * the stream goes on (`errorPolicy: 'skip'`, the default) or ends with that error
 * (`errorPolicy: 'fail'`). A classifier that throws or rejects fails the element like
 * any work (`StageError`). It is a `stage`: `capacity`, `concurrency`, `timeout`,
 * `killSwitch` and the other stage options apply, and demand is kept.
 *
 * A synchronous classifier keeps the stage synchronous for passing elements (a
 * block goes through a rejected promise so the error keeps its type).
 *
 * ## Example
 * ```ts
 * const toxic = ['idiot', 'hate'];
 * answers.pipe(
 *   guard({
 *     name: 'moderation',
 *     classify: (text) => ({ label: 'toxic', score: toxic.some((w) => text.includes(w)) ? 0.95 : 0 }),
 *     thresholds: { flag: 0.5, block: 0.9 },
 *     onFailure: ({ error }) => audit.log(error),
 *   }),
 * );
 * ```
 *
 * Invalid options throw `InvalidOptionsError` naming each bad field.
 *
 * @see stage; GuardBlockedError.
 */
export function guard<T>(options: GuardOptions<T>): StageOperator<T, T> {
  const name = options?.name ?? 'guard';
  const parsed = parseOptions(guardOptionsSchema(), options, `guard "${name}" options`);
  const { classify, thresholds, safeLabels, text, errorPolicy, onVerdict, ...stageOptions } = parsed;
  const safe = new Set(safeLabels);
  const textOf = (text ?? ((value: unknown) => value)) as (value: T) => unknown;
  const verdictOf = (result: Classification): GuardVerdict => {
    const action: GuardAction = safe.has(result.label) || !(result.score >= thresholds.flag) ? 'pass' : result.score >= thresholds.block ? 'block' : 'flag';
    return { label: result.label, score: result.score, action };
  };
  return stage<T, T>(
    (value, context) => {
      const content = textOf(value);
      if (typeof content !== 'string') throw new TypeError(`guard "${name}" classifies text: give a text(value) option for ${typeof content} elements`);
      const decide = (result: Classification): T | PromiseLike<T> => {
        const verdict = verdictOf(result);
        context.note('verdict', verdict.action);
        context.note('label', verdict.label);
        context.note('score', verdict.score);
        onVerdict?.({ stage: name, value, verdict, trace: context.trace });
        // Rejected, not thrown: the stage keeps a rejection's SluiceError as it is.
        if (verdict.action === 'block') return Promise.reject(new GuardBlockedError(name, context.seq, verdict));
        return value;
      };
      const result = classify(content, context.signal);
      return isThenable(result) ? Promise.resolve(result).then(decide) : decide(result);
    },
    { ...(stageOptions as StageOptions<T>), name, errorPolicy },
  );
}

function isThenable<V>(value: V | PromiseLike<V>): value is PromiseLike<V> {
  return typeof value === 'object' && value !== null && typeof (value as { then?: unknown }).then === 'function';
}

/** Narrows a failure reported by a guard to a block (as opposed to a classifier error). */
export function isBlocked<T>(event: FailureEvent<T>): event is FailureEvent<T> & { readonly error: GuardBlockedError } {
  return event.error instanceof GuardBlockedError;
}
