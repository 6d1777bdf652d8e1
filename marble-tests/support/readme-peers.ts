/**
 * The README's install table, read as a user reads it: each row's entry point or command, the
 * row it builds on ("`sluice serve`'s, and …"), and the install specifiers its cell names.
 */
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

export interface InstallRow {
  readonly user: string;
  readonly base: string | undefined;
  /** As written: `@nats-io/jetstream@~3.3.1`. */
  readonly specs: readonly string[];
  /** The package names: `@nats-io/jetstream`. */
  readonly packages: readonly string[];
}

const README = fileURLToPath(new URL('../../README.md', import.meta.url));
const HEADER = '| entry point or command | what it holds | also install |';

/** The package a specifier installs: `name`, `name@range`, `@scope/name@range`. */
export function packageOfSpec(spec: string): string {
  const at = spec.lastIndexOf('@');
  return at > 0 ? spec.slice(0, at) : spec;
}

export function readmeInstallRows(readme = readFileSync(README, 'utf8')): InstallRow[] {
  const lines = readme.split('\n');
  const start = lines.indexOf(HEADER);
  if (start === -1) throw new Error(`README.md has no install table (a line "${HEADER}")`);
  const rows: InstallRow[] = [];
  for (const line of lines.slice(start + 2)) {
    if (!line.startsWith('|')) break;
    const cells = line
      .slice(1, -1)
      .split(' | ')
      .map((cell) => cell.trim());
    if (cells.length !== 3) throw new Error(`README.md install table: a row without three cells: ${line}`);
    const user = /^`([^`]+)`$/.exec(cells[0]!)?.[1];
    if (user === undefined) throw new Error(`README.md install table: the first cell is not one code span: ${line}`);
    const install = cells[2]!;
    const spans = [...install.matchAll(/`([^`]+)`/g)].map((m) => m[1]!);
    const base = /^`[^`]+`'s\b/.test(install) ? spans.shift() : undefined;
    if (install !== '—' && spans.length === 0) throw new Error(`README.md install table: "${user}" names no package: ${line}`);
    const specs = spans.flatMap((span) => span.split(/\s+/));
    rows.push({ user, base, specs, packages: specs.map(packageOfSpec) });
  }
  return rows;
}

/** Everything a row's user installs: its base's packages, then its own. */
export function readmePeersOf(user: string, rows = readmeInstallRows()): string[] {
  const row = rows.find((r) => r.user === user);
  if (row === undefined) throw new Error(`README.md install table has no row for "${user}"`);
  return [...new Set([...(row.base === undefined ? [] : readmePeersOf(row.base, rows)), ...row.packages])];
}
