/**
 * Fits the abstention decision of src/ai/rag/abstain.ts (logistic regression over
 * `abstentionFeatures`) on the evidence `npm run eval` recorded, and measures how it generalises:
 * leave one corpus out, fit on the other sets, count what the decision does on the one left out.
 *
 *     npm run eval -- --json /tmp/eval.json --evidence
 *     npm run fit:abstain -- /tmp/eval.json            # --cost 8: an uncovered question answered weighs 8 covered ones abstained
 *     npm run fit:abstain -- /tmp/eval.json --served /tmp/main.json   # the served column from another run (e.g. main's)
 *
 * Prints the cross-validated table beside the decision served when the JSON was written, then the
 * constants fitted on every set (what abstain.ts holds).
 */
import { readFile } from 'node:fs/promises';
import { parseArgs } from 'node:util';
import { abstentionFeatures, settledByCoverage, type Evidence } from '../src/ai/rag/abstain.js';

/** One question of a set, as the fit sees it. */
export interface Example {
  readonly set: string;
  readonly covered: boolean;
  /** The served decision when the JSON was written. */
  readonly servedAbstained: boolean;
  /** `abstentionFeatures`; undefined when `settledByCoverage` decides whatever the weights. */
  readonly features: readonly number[] | undefined;
  /** What `settledByCoverage` decided, when it did. */
  readonly settled: boolean | undefined;
}

/** A fitted decision in the features' own units: answer when `intercept + Σ weights·features > 0`. */
export interface Decision {
  readonly intercept: number;
  readonly weights: readonly number[];
}

/** Ridge penalty on the standardised weights: keeps the fit finite when a training fold separates perfectly. */
const L2 = 0.01;
const NEWTON_STEPS = 50;

/** Logistic regression (Newton's method) on standardised features; weights and intercept in standardised units. */
function logistic(x: readonly (readonly number[])[], y: readonly number[]): number[] {
  const d = x[0]!.length + 1;
  const beta = new Array<number>(d).fill(0);
  for (let step = 0; step < NEWTON_STEPS; step++) {
    const gradient = new Array<number>(d).fill(0);
    const hessian = Array.from({ length: d }, (_, i) => Array.from({ length: d }, (_, j) => (i === j ? (i < d - 1 ? L2 : 0) + 1e-9 : 0)));
    x.forEach((row, n) => {
      const z = [...row, 1];
      const p = 1 / (1 + Math.exp(-z.reduce((s, v, i) => s + v * beta[i]!, 0)));
      for (let i = 0; i < d; i++) {
        gradient[i]! += (p - y[n]!) * z[i]!;
        for (let j = 0; j < d; j++) hessian[i]![j]! += p * (1 - p) * z[i]! * z[j]!;
      }
    });
    for (let i = 0; i < d - 1; i++) gradient[i]! += L2 * beta[i]!;
    const delta = solve(hessian, gradient);
    for (let i = 0; i < d; i++) beta[i]! -= delta[i]!;
  }
  return beta;
}

/** Gaussian elimination with partial pivoting: `a · x = b`. */
function solve(a: number[][], b: number[]): number[] {
  const n = b.length;
  const m = a.map((row, i) => [...row, b[i]!]);
  for (let col = 0; col < n; col++) {
    let pivot = col;
    for (let r = col + 1; r < n; r++) if (Math.abs(m[r]![col]!) > Math.abs(m[pivot]![col]!)) pivot = r;
    [m[col], m[pivot]] = [m[pivot]!, m[col]!];
    for (let r = 0; r < n; r++) {
      if (r === col) continue;
      const f = m[r]![col]! / m[col]![col]!;
      for (let c = col; c <= n; c++) m[r]![c]! -= f * m[col]![c]!;
    }
  }
  return m.map((row, i) => row[n]! / row[i]!);
}

/**
 * Fits the decision on `examples`: logistic regression, then the threshold on its score that
 * minimises covered questions abstained plus `cost` × uncovered ones answered over these examples.
 */
export function fitDecision(examples: readonly Example[], cost: number): Decision {
  const usable = examples.filter((e): e is Example & { features: readonly number[] } => e.features !== undefined);
  const width = usable[0]!.features.length;
  const mean = Array.from({ length: width }, (_, i) => usable.reduce((s, e) => s + e.features[i]!, 0) / usable.length);
  const sd = mean.map((m, i) => Math.sqrt(usable.reduce((s, e) => s + (e.features[i]! - m) ** 2, 0) / usable.length) || 1);
  const standard = usable.map((e) => e.features.map((v, i) => (v - mean[i]!) / sd[i]!));
  const beta = logistic(
    standard,
    usable.map((e) => (e.covered ? 1 : 0)),
  );
  const scores = standard.map((row) => row.reduce((s, v, i) => s + v * beta[i]!, beta[width]!));
  // Candidate thresholds: below every score, and midway between neighbours.
  const sorted = [...new Set(scores)].sort((a, b) => a - b);
  const candidates = [sorted[0]! - 1, ...sorted.map((s, i) => (i + 1 < sorted.length ? (s + sorted[i + 1]!) / 2 : s + 1))];
  let best = { loss: Infinity, threshold: 0 };
  for (const threshold of candidates) {
    // What coverage settles costs the same whatever the threshold: only the rest is counted.
    let loss = 0;
    scores.forEach((s, n) => {
      const answered = s > threshold;
      if (usable[n]!.covered && !answered) loss += 1;
      if (!usable[n]!.covered && answered) loss += cost;
    });
    if (loss < best.loss) best = { loss, threshold };
  }
  const weights = beta.slice(0, width).map((w, i) => w / sd[i]!);
  const intercept = beta[width]! - best.threshold - weights.reduce((s, w, i) => s + w * mean[i]!, 0);
  return { intercept, weights };
}

/** Whether `decision` answers the example. */
export function answers(decision: Decision, example: Example): boolean {
  if (example.features === undefined) return example.settled === true;
  return decision.intercept + example.features.reduce((s, v, i) => s + v * decision.weights[i]!, 0) > 0;
}

/** Covered questions abstained and uncovered ones abstained, with their counts. */
export interface Tally {
  readonly coveredAbstained: number;
  readonly covered: number;
  readonly uncoveredAbstained: number;
  readonly uncovered: number;
}

function tally(examples: readonly Example[], abstains: (e: Example) => boolean): Tally {
  const covered = examples.filter((e) => e.covered);
  const uncovered = examples.filter((e) => !e.covered);
  return {
    coveredAbstained: covered.filter(abstains).length,
    covered: covered.length,
    uncoveredAbstained: uncovered.filter(abstains).length,
    uncovered: uncovered.length,
  };
}

/** Leave one corpus out: for each set, the decision fitted on the others, counted on it. */
export function crossValidate(examples: readonly Example[], cost: number): Map<string, Tally> {
  const sets = [...new Set(examples.map((e) => e.set))].sort();
  return new Map(
    sets.map((set) => {
      const decision = fitDecision(
        examples.filter((e) => e.set !== set),
        cost,
      );
      return [
        set,
        tally(
          examples.filter((e) => e.set === set),
          (e) => !answers(decision, e),
        ),
      ] as const;
    }),
  );
}

/** The examples of an `npm run eval -- --json FILE --evidence` report. */
export function examplesOf(report: {
  readonly reports: readonly {
    readonly name: string;
    readonly answers: readonly { readonly question: { readonly file?: string }; readonly abstained: boolean; readonly evidence?: Evidence }[];
  }[];
}): Example[] {
  return report.reports.flatMap((r) =>
    r.answers.map((a) => {
      if (a.evidence === undefined) throw new Error(`${r.name}: no evidence recorded; run npm run eval -- --json FILE --evidence`);
      const settled = settledByCoverage(a.evidence);
      const features = settled === undefined ? abstentionFeatures(a.evidence) : undefined;
      return { set: r.name, covered: a.question.file !== undefined, servedAbstained: a.abstained, features, settled };
    }),
  );
}

const pct = (n: number, of: number): string => `${of === 0 ? '–' : Math.round((100 * n) / of)} % (${n}/${of})`;

if (process.argv[1] !== undefined && import.meta.url.endsWith(process.argv[1].split('/').pop()!)) {
  const { values, positionals } = parseArgs({ allowPositionals: true, options: { cost: { type: 'string', default: '8' }, served: { type: 'string' } } });
  if (positionals.length !== 1) {
    console.error('usage: npm run fit:abstain -- EVAL.json [--cost 8]');
    process.exit(2);
  }
  const cost = Number(values.cost);
  let examples = examplesOf(JSON.parse(await readFile(positionals[0]!, 'utf8')));
  if (values.served !== undefined) {
    const other = JSON.parse(await readFile(values.served, 'utf8')) as {
      reports: { name: string; answers: { question: { question: string }; abstained: boolean }[] }[];
    };
    const abstained = new Map<string, boolean>(other.reports.flatMap((r) => r.answers.map((a) => [`${r.name}\n${a.question.question}`, a.abstained] as const)));
    const questions = JSON.parse(await readFile(positionals[0]!, 'utf8')) as typeof other;
    const keys = questions.reports.flatMap((r) => r.answers.map((a) => `${r.name}\n${a.question.question}`));
    examples = examples.map((e, i) => ({ ...e, servedAbstained: abstained.get(keys[i]!) ?? e.servedAbstained }));
  }
  const cv = crossValidate(examples, cost);
  console.log('| set | covered abstained: served | left out | uncovered abstained: served | left out |');
  console.log('|---|---:|---:|---:|---:|');
  const total = { served: tally([], () => true), cv: tally([], () => true) };
  const add = (a: Tally, b: Tally): Tally => ({
    coveredAbstained: a.coveredAbstained + b.coveredAbstained,
    covered: a.covered + b.covered,
    uncoveredAbstained: a.uncoveredAbstained + b.uncoveredAbstained,
    uncovered: a.uncovered + b.uncovered,
  });
  for (const [set, held] of cv) {
    const served = tally(
      examples.filter((e) => e.set === set),
      (e) => e.servedAbstained,
    );
    total.served = add(total.served, served);
    total.cv = add(total.cv, held);
    console.log(
      `| ${set} | ${pct(served.coveredAbstained, served.covered)} | ${pct(held.coveredAbstained, held.covered)} | ${pct(served.uncoveredAbstained, served.uncovered)} | ${pct(held.uncoveredAbstained, held.uncovered)} |`,
    );
  }
  const { served, cv: all } = total;
  console.log(
    `| all | ${pct(served.coveredAbstained, served.covered)} | ${pct(all.coveredAbstained, all.covered)} | ${pct(served.uncoveredAbstained, served.uncovered)} | ${pct(all.uncoveredAbstained, all.uncovered)} |`,
  );
  const fitted = fitDecision(examples, cost);
  console.log(
    `\nfitted on every set (cost ${cost}): INTERCEPT = ${fitted.intercept.toFixed(3)}, weights = [${fitted.weights.map((w) => w.toFixed(3)).join(', ')}]`,
  );
}
