/**
 * Which documents of a corpus folder to leave out: the patterns of its `.sluiceignore` and the
 * ones given, in `.gitignore` syntax (the `ignore` package reads it as git does), so a folder of
 * user docs can keep its maintainers' notes, drafts or generated pages beside them unindexed.
 */
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import ignore from 'ignore';
import { errorMessage } from '../../core/errors.js';
import { CorpusError } from './errors.js';

/** The file in a corpus folder whose patterns leave documents out. */
export const IGNORE_FILE = '.sluiceignore';

/** Tells which paths (relative to the corpus folder, `/`-separated) are left out. */
export type IgnoredPath = (file: string) => boolean;

/** The test for `directory`: its `.sluiceignore` (if any) and `patterns`; `undefined` when neither has a pattern. */
export async function corpusIgnore(directory: string, patterns: readonly string[] = []): Promise<IgnoredPath | undefined> {
  const own = await ignoreFile(directory);
  const all = [...own, ...patterns].filter((line) => line.trim() !== '' && !line.startsWith('#'));
  if (all.length === 0) return undefined;
  const matcher = ignore().add(all);
  return (file) => matcher.ignores(file);
}

/** The lines of `directory/.sluiceignore`; none when there is no such file. */
async function ignoreFile(directory: string): Promise<string[]> {
  const path = join(directory, IGNORE_FILE);
  try {
    return (await readFile(path, 'utf8')).split(/\r?\n/);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT' || code === 'ENOTDIR') return [];
    throw new CorpusError(directory, 'unreadable', `its ${IGNORE_FILE} cannot be read (${code ?? errorMessage(err)})`, err);
  }
}
