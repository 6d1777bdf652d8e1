/** The paths an `InvalidOptionsError` names, sorted: what a test of an options schema compares. */
import assert from 'node:assert/strict';
import { InvalidOptionsError } from '../../src/core/errors.js';

/** The sorted paths of the `InvalidOptionsError` that `call` throws; fails if it throws anything else or nothing. */
export function invalidPaths(call: () => unknown): string[] {
  try {
    call();
  } catch (error) {
    return pathsOf(error);
  }
  return assert.fail('expected InvalidOptionsError');
}

/** The sorted paths of `error`, which must be an `InvalidOptionsError`. */
export function pathsOf(error: unknown): string[] {
  assert.ok(error instanceof InvalidOptionsError, `expected InvalidOptionsError, got ${String(error)}`);
  return error.issues.map((issue) => issue.path).sort();
}
