// Builds dist/: the declarations with tsc, the JavaScript with esbuild — one module per entry
// point and the code they share in chunks, so `import 'sluice'` reads a handful of files instead
// of one per source file (why: docs/internals/import-cost.md).
import { execFileSync } from 'node:child_process';
import { rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { build } from 'esbuild';

process.chdir(new URL('../', import.meta.url).pathname);

// Every module a user or a thread loads by path: the package's exports, the CLI, the pool's worker.
const ENTRY_POINTS = [
  'src/index.ts',
  'src/ai.ts',
  'src/serve.ts',
  'src/nats.ts',
  'src/testing/index.ts',
  'src/testing/ai.ts',
  'src/cli.ts',
  'src/ai/pool/worker-thread.ts',
];

rmSync('dist', { recursive: true, force: true });
const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
execFileSync(process.execPath, [tsc, '-p', 'tsconfig.build.json', '--emitDeclarationOnly'], { stdio: 'inherit' });
await build({
  entryPoints: ENTRY_POINTS,
  outbase: '.',
  outdir: 'dist',
  bundle: true,
  splitting: true,
  format: 'esm',
  platform: 'node',
  target: 'node20',
  // Dependencies and peers stay imports: the user's copy is the one loaded, and a missing optional peer is reported by name.
  packages: 'external',
  chunkNames: 'chunks/[name]-[hash]',
  legalComments: 'none',
  // package.json says "sideEffects": false for users' bundlers; our own peers-*.ts checks must stay.
  ignoreAnnotations: true,
  logLevel: 'warning',
});

// The word vectors the package ships (data/, git-ignored), from a devDependency.
execFileSync(process.execPath, ['--conditions=sluice-source', '--import', 'tsx', 'scripts/word-vectors.ts'], { stdio: 'inherit' });
