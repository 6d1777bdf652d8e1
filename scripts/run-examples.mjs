// Runs every examples/*.ts with small inputs (CI keeps them working), then the README's runnable
// snippets the way the README says to run one; fails on the first non-zero exit.
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, realpathSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../', import.meta.url));

function check(name, result, started) {
  if (result.status !== 0) {
    process.stdout.write(result.stdout ?? '');
    process.stderr.write(result.stderr ?? '');
    console.error(`${name} failed (exit ${result.status})`);
    process.exit(1);
  }
  console.log(`${name}: ok (${Date.now() - started} ms)`);
}

const examples = readdirSync(join(ROOT, 'examples'))
  .filter((f) => f.endsWith('.ts'))
  .sort();
for (const file of examples) {
  const started = Date.now();
  const result = spawnSync(process.execPath, ['--conditions=sluice-source', '--import', 'tsx', `examples/${file}`], {
    cwd: ROOT,
    env: { ...process.env, DEMO_N: process.env.DEMO_N ?? '20000' },
    encoding: 'utf8',
  });
  check(`example ${file}`, result, started);
}

// The README: "save it as pipeline.mts in a project where sluice is installed and run npx tsx pipeline.mts".
// The project is a fresh one outside this repository (package.json without "type", as `npm init` writes
// it), sluice linked into its node_modules; only the sluice-source condition differs from an install,
// since a clone has no dist/.
const snippets = [...readFileSync(join(ROOT, 'README.md'), 'utf8').matchAll(/^```(?:ts|typescript) runnable\n([\s\S]*?)^```$/gm)].map((m) => m[1]);
if (snippets.length === 0) {
  console.error('README.md has no runnable TypeScript snippet: the instruction to run one is untested');
  process.exit(1);
}
const app = mkdtempSync(join(tmpdir(), 'sluice-readme-'));
try {
  writeFileSync(join(app, 'package.json'), `${JSON.stringify({ name: 'readme-snippet', version: '1.0.0', private: true }, null, 2)}\n`);
  mkdirSync(join(app, 'node_modules'));
  symlinkSync(ROOT, join(app, 'node_modules', 'sluice'), 'dir');
  symlinkSync(realpathSync(join(ROOT, 'node_modules', 'rxjs')), join(app, 'node_modules', 'rxjs'), 'dir');
  const tsx = createRequire(import.meta.url).resolve('tsx/cli');
  for (const [i, code] of snippets.entries()) {
    const started = Date.now();
    const file = `pipeline-${i + 1}.mts`;
    writeFileSync(join(app, file), code);
    check(
      `README snippet ${i + 1} (npx tsx ${file})`,
      spawnSync(process.execPath, [tsx, '--conditions=sluice-source', file], { cwd: app, encoding: 'utf8' }),
      started,
    );
  }
} finally {
  rmSync(app, { recursive: true, force: true });
}
console.log(`examples: ${examples.length} ran, README snippets: ${snippets.length} ran, all ok`);
