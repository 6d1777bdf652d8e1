import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * The first existing `relative` path in the folder of `from` (a module's `import.meta.url`) or
 * one of its parents. Finds the package's own files (data/, the chat page, the pool's worker)
 * whether the module runs from src/, from dist/ or from a bundled chunk of dist/.
 */
export function findUp(from: string, relative: string): string | undefined {
  let dir = dirname(fileURLToPath(from));
  for (;;) {
    const candidate = join(dir, relative);
    if (existsSync(candidate)) return candidate;
    const parent = dirname(dir);
    if (parent === dir) return undefined;
    dir = parent;
  }
}
