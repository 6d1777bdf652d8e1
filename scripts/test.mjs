// Runs every marble-tests/**/*.test.ts with Node's test runner (Node 20 does not expand globs).
// Usage: node scripts/test.mjs [substring...] (a file runs when its path holds any of them)
import { readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { spawnSync } from 'node:child_process';

const filters = process.argv.slice(2);
const files = [];
(function walk(dir) {
  for (const entry of readdirSync(dir).sort()) {
    const path = join(dir, entry);
    if (statSync(path).isDirectory()) walk(path);
    else if (entry.endsWith('.test.ts') && (filters.length === 0 || filters.some((f) => path.includes(f)))) files.push(path);
  }
})('marble-tests');
if (files.length === 0) {
  console.error(`no test files found${filters.length > 0 ? ` matching ${filters.map((f) => `"${f}"`).join(' or ')}` : ''}`);
  process.exit(1);
}
const result = spawnSync(process.execPath, ['--conditions=sluice-source', '--import', 'tsx', '--test', '--test-reporter=spec', ...files], { stdio: 'inherit' });
process.exit(result.status ?? 1);
