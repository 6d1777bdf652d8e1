/**
 * Measurement plumbing shared by the bench sections: clocks, GC, statistics,
 * environment knobs and table rendering. Nothing here knows about sluice.
 */
import { setImmediate as immediate } from 'node:timers/promises';

/** Reads a positive integer from the environment (`1e6`, `1_000_000` and `1000000` all work). */
export function envInt(name: string, fallback: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw.trim() === '') return fallback;
  const value = Number(raw.replaceAll('_', ''));
  if (!Number.isFinite(value) || value < 1) throw new Error(`${name} must be a positive number, got "${raw}"`);
  return Math.floor(value);
}

/** `BENCH_ONLY=regex` runs only the cases (and sections) whose id matches. */
export function selected(id: string): boolean {
  const only = process.env.BENCH_ONLY;
  return only === undefined || only === '' || new RegExp(only).test(id);
}

const gcFunction = globalThis.gc;

export const canCollect = gcFunction !== undefined;

/** Full GC, when the process runs with `--expose-gc`. */
export function collect(): void {
  gcFunction?.();
}

/** Lets pending macrotasks and microtasks of a previous case finish, then collects. */
export async function settle(): Promise<void> {
  await immediate();
  collect();
  await immediate();
}

export function nowNs(): bigint {
  return process.hrtime.bigint();
}

/**
 * Milliseconds on the system-wide monotonic clock (`CLOCK_MONOTONIC` on Linux), so a
 * time taken in one process compares with one taken in another on the same machine
 * (`performance.now()` counts from each process's own origin).
 */
export function monotonicMs(): number {
  return Number(process.hrtime.bigint()) / 1e6;
}

export function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

/** Nearest-rank percentile of an ascending-sorted array. */
export function percentile(sorted: ArrayLike<number>, p: number): number {
  if (sorted.length === 0) return NaN;
  const rank = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[rank]!;
}

export function formatNs(ns: number): string {
  if (!Number.isFinite(ns)) return '—';
  if (ns >= 100) return ns.toFixed(0);
  if (ns >= 10) return ns.toFixed(1);
  return ns.toFixed(2);
}

export function formatRatio(ratio: number): string {
  if (!Number.isFinite(ratio)) return '—';
  return ratio >= 10 ? `${ratio.toFixed(0)}×` : `${ratio.toFixed(1)}×`;
}

export function formatMB(bytes: number): string {
  return `${(bytes / 1024 / 1024).toFixed(1)} MB`;
}

export function formatCount(n: number): string {
  if (n >= 1_000_000 && n % 100_000 === 0) return `${n / 1_000_000}M`;
  if (n >= 1_000 && n % 1_000 === 0) return `${n / 1_000}k`;
  return String(n);
}

/** Column-aligned text table for the terminal. */
export function textTable(header: readonly string[], rows: readonly (readonly string[])[]): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: readonly string[]) => cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ');
  return [line(header), widths.map((w) => '-'.repeat(w)).join('  '), ...rows.map(line)].join('\n');
}

/** GitHub-flavoured markdown table (first column left-aligned, the rest right-aligned). */
export function markdownTable(header: readonly string[], rows: readonly (readonly string[])[]): string {
  const escape = (cell: string) => cell.replaceAll('|', '\\|');
  return [
    `| ${header.map(escape).join(' | ')} |`,
    `|${header.map((_, i) => (i === 0 ? '---' : '---:')).join('|')}|`,
    ...rows.map((r) => `| ${r.map(escape).join(' | ')} |`),
  ].join('\n');
}

/** A benchmark figure beside its target. Figures are reported, never asserted. */
export interface TargetCheck {
  readonly what: string;
  readonly measured: number;
  readonly unit: string;
  readonly limit: number;
  /** `le`: measured ≤ limit passes; `lt`: measured < limit; `ge`: measured ≥ limit (a speed-up). */
  readonly comparison: 'le' | 'lt' | 'ge';
  readonly pass: boolean;
}

export function target(what: string, measured: number, unit: string, comparison: 'le' | 'lt' | 'ge', limit: number): TargetCheck {
  const pass = comparison === 'le' ? measured <= limit : comparison === 'lt' ? measured < limit : measured >= limit;
  return { what, measured, unit, limit, comparison, pass };
}
