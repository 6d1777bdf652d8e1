/** The models sluice generates from code, written into a temporary folder for one test file. */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { generateModels } from '../../src/ai/models/generate.js';

const root = fileURLToPath(new URL('../..', import.meta.url));

export interface GeneratedModels {
  readonly dir: string;
  remove(): Promise<void>;
}

export async function generatedModels(name: string): Promise<GeneratedModels> {
  const dir = await mkdtemp(join(tmpdir(), `sluice-${name}-`));
  await generateModels({ outDir: dir, dataDir: join(root, 'data') });
  return { dir, remove: () => rm(dir, { recursive: true, force: true }) };
}
