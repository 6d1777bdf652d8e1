/**
 * The eval's printed report: per corpus, sluice beside the BM25 baseline with their ratio and the
 * goal (issue 37); and which goals a run misses, for `--check`.
 */
import type { CorpusReport } from './harness.js';

/** The goals of issue 37: each rate's floor, and sluice ahead of BM25 on the first two. */
export const GOALS = { precisionAt1: 0.9, factHit: 0.8, abstain: 0.9, blocked: 1 / 50 } as const;

/** `count` of `of` as a share; `NaN` when there is nothing to count. */
export const rate = (count: number, of: number): number => (of === 0 ? Number.NaN : count / of);

/** A share to one decimal, rounded down: a rate under its goal never prints as the goal (449 of 499 is 89.9 %, not 90 %). */
const pct = (x: number): string => (Number.isNaN(x) ? '—' : `${(Math.floor(x * 1000 + 1e-9) / 10).toFixed(1)} %`);
const counted = (x: number, of: number): string => (Number.isNaN(x) ? '—' : `${pct(x)} (${Math.round(x * of)}/${of})`);
const ratio = (a: number, b: number): string => (Number.isNaN(a) || Number.isNaN(b) || b === 0 ? '—' : `${(a / b).toFixed(2)}×`);
const ms = (x: number): string => (Number.isNaN(x) ? '—' : `${x.toFixed(1)} ms`);

/** One corpus as a table: metric, sluice, BM25, sluice ÷ BM25, goal. */
export function formatReport(report: CorpusReport): string {
  const { sluice, bm25 } = report;
  const rows: string[][] = [
    ['metric', 'sluice', 'BM25', 'sluice ÷ BM25', 'goal'],
    [
      'cited file right first (p@1)',
      counted(sluice.precisionAt1, sluice.covered),
      counted(bm25.precisionAt1, sluice.covered),
      ratio(sluice.precisionAt1, bm25.precisionAt1),
      `≥ ${pct(GOALS.precisionAt1)}, > BM25`,
    ],
    [
      'fact in answer (BM25: in top 3)',
      counted(sluice.factHit, sluice.covered),
      counted(bm25.factInTop3, sluice.covered),
      ratio(sluice.factHit, bm25.factInTop3),
      `≥ ${pct(GOALS.factHit)}, > BM25`,
    ],
    ['uncovered abstained', counted(sluice.abstain, sluice.uncovered), '', '', `≥ ${pct(GOALS.abstain)}`],
    ['covered abstained (false)', counted(sluice.falseAbstain, sluice.covered), '', '', ''],
    ['latency p50 / p95', `${ms(sluice.p50Ms)} / ${ms(sluice.p95Ms)}`, '', '', ''],
  ];
  const widths = rows[0]!.map((_, column) => Math.max(...rows.map((row) => row[column]!.length)));
  const line = (row: string[]) =>
    row
      .map((cell, column) => cell.padEnd(widths[column]!))
      .join('  ')
      .trimEnd();
  const head = `${report.name}: ${report.files} files, ${report.passages} passages; ${sluice.covered} covered and ${sluice.uncovered} uncovered questions`;
  const notes = [
    ...(sluice.blocked > 0 ? [`${sluice.blocked} question(s) blocked by the guard (counted as abstained)`] : []),
    ...(sluice.errors > 0 ? [`${sluice.errors} request(s) failed (counted as abstained)`] : []),
    ...(report.missing.length > 0 ? [`missing: ${report.missing.join(', ')} (${report.skippedQuestions} question(s) left out)`] : []),
  ];
  return [head, line(rows[0]!), line(widths.map((w) => '-'.repeat(w))), ...rows.slice(1).map(line), ...notes.map((n) => `  ${n}`)].join('\n');
}

/** What the guard did to a run's questions, all of them ordinary ones: blocked ones beside the goal's share. */
export function formatGuard(report: CorpusReport): string {
  const asked = report.answers.length;
  return `guard: ${report.sluice.blocked} of ${asked} ordinary questions blocked (${pct(rate(report.sluice.blocked, asked))}; goal at most 1 in ${Math.round(1 / GOALS.blocked)})`;
}

/** The guard's share of a run's questions blocked over the goal's, as a sentence; undefined within it. */
export function missedGuard(report: CorpusReport): string | undefined {
  const share = rate(report.sluice.blocked, report.answers.length);
  return share > GOALS.blocked ? `${report.name}: ${pct(share)} of the questions blocked by the guard > ${pct(GOALS.blocked)}` : undefined;
}

/** The questions a corpus got wrong, one line each: what sluice cited and what BM25 ranked first. */
export function formatMisses(report: CorpusReport): string {
  const lines: string[] = [];
  for (const a of report.answers) {
    const expected = a.question.file;
    const wrong = expected === undefined ? !a.abstained : a.abstained || a.citedFile !== expected || !a.factHit;
    if (!wrong) continue;
    const got = a.blocked
      ? 'blocked'
      : a.error !== undefined
        ? `error ${a.error}`
        : a.abstained
          ? 'abstained'
          : `cited ${a.citedFile}${expected === undefined || a.factHit ? '' : ', fact missing'}`;
    lines.push(
      `  ${a.question.question}\n    expected ${expected ?? 'abstain'}; sluice ${got}; BM25 ${a.bm25.file ?? 'nothing'}${a.bm25.factInTop3 ? ' (fact in top 3)' : ''}`,
    );
  }
  return lines.length === 0 ? `${report.name}: no misses` : `${report.name} misses:\n${lines.join('\n')}`;
}

/** The goals a corpus misses, as sentences; empty when it meets them all. */
export function missedGoals(report: CorpusReport): string[] {
  const { sluice, bm25 } = report;
  const missed: string[] = [];
  const below = (name: string, value: number, goal: number) => {
    if (!Number.isNaN(value) && value < goal) missed.push(`${report.name}: ${name} ${pct(value)} < ${pct(goal)}`);
  };
  below('cited file right first', sluice.precisionAt1, GOALS.precisionAt1);
  below('fact in answer', sluice.factHit, GOALS.factHit);
  below('uncovered abstained', sluice.abstain, GOALS.abstain);
  // Ahead: strictly above BM25, unless BM25 already has them all.
  const behind = (value: number, baseline: number) => value < baseline || (value === baseline && baseline < 1);
  if (behind(sluice.precisionAt1, bm25.precisionAt1))
    missed.push(`${report.name}: cited file right first ${pct(sluice.precisionAt1)} not ahead of BM25 ${pct(bm25.precisionAt1)}`);
  if (behind(sluice.factHit, bm25.factInTop3))
    missed.push(`${report.name}: fact in answer ${pct(sluice.factHit)} not ahead of BM25's top 3 ${pct(bm25.factInTop3)}`);
  return missed;
}
