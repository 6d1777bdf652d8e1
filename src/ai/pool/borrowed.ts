import { BorrowedOutputsError } from './errors.js';
import type { Outputs } from './options.js';

const READER = "the reader of a borrowed run (runBorrowed's use, infer's fromOutputs)";

/** Why a borrowed run's reader may not return `result`, or undefined when it may: a Promise or a view into `outputs` would outlive them. */
export function borrowedResultError(pool: string, result: unknown, outputs: Outputs): BorrowedOutputsError | undefined {
  if (typeof (result as PromiseLike<unknown> | undefined)?.then === 'function') {
    return new BorrowedOutputsError(pool, `${READER} returned a Promise: it must read the outputs synchronously, they are reused once it returns`);
  }
  if (holdsBorrowed(result, outputs)) {
    return new BorrowedOutputsError(pool, `${READER} returned a view into the borrowed outputs: copy what you keep (e.g. row.slice())`);
  }
  return undefined;
}

/** Whether `result`, or an element of it when it is an array, is a view into the memory of `outputs` held in shared memory (the arena). */
function holdsBorrowed(result: unknown, outputs: Outputs): boolean {
  const borrowed = new Set<ArrayBufferLike>();
  for (const tensor of Object.values(outputs)) {
    const data = tensor.data;
    if (ArrayBuffer.isView(data) && data.buffer instanceof SharedArrayBuffer) borrowed.add(data.buffer);
  }
  if (borrowed.size === 0) return false;
  const isBorrowed = (value: unknown) => ArrayBuffer.isView(value) && borrowed.has(value.buffer);
  return isBorrowed(result) || (Array.isArray(result) && result.some(isBorrowed));
}
