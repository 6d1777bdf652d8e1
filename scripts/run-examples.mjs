// Runs every examples/*.ts with small inputs (CI keeps them working); fails on the first non-zero exit.
import { readdirSync } from 'node:fs';
import { spawnSync } from 'node:child_process';

const examples = readdirSync('examples')
  .filter((f) => f.endsWith('.ts'))
  .sort();
for (const file of examples) {
  const started = Date.now();
  const result = spawnSync(process.execPath, ['--conditions=sluice-source', '--import', 'tsx', `examples/${file}`], {
    env: { ...process.env, DEMO_N: process.env.DEMO_N ?? '20000' },
    encoding: 'utf8',
  });
  if (result.status !== 0) {
    process.stdout.write(result.stdout ?? '');
    process.stderr.write(result.stderr ?? '');
    console.error(`example ${file} failed (exit ${result.status})`);
    process.exit(1);
  }
  console.log(`example ${file}: ok (${Date.now() - started} ms)`);
}
console.log(`examples: ${examples.length} ran, all ok`);
