/**
 * Shared feed buffers that a pool job may still read. A `SharedArrayBuffer` crosses to
 * a worker without a copy, so its owner must not refill it until the run is over:
 * `InferencePool.run` leases the shared buffers of its feeds until the worker is done
 * with them (answered, crashed, or the job left the queue unsent), and `FeedBuffers`
 * only hands out buffers nobody holds.
 */
const holders = new WeakMap<SharedArrayBuffer, number>();

export function lease(buffer: SharedArrayBuffer): void {
  holders.set(buffer, (holders.get(buffer) ?? 0) + 1);
}

export function release(buffer: SharedArrayBuffer): void {
  const count = holders.get(buffer) ?? 0;
  if (count <= 1) holders.delete(buffer);
  else holders.set(buffer, count - 1);
}

export function leased(buffer: SharedArrayBuffer): boolean {
  return holders.has(buffer);
}

/** The shared buffers behind `tensors`' data, each once. */
export function sharedBuffers(tensors: Readonly<Record<string, { readonly data: unknown }>>): SharedArrayBuffer[] {
  const found = new Set<SharedArrayBuffer>();
  for (const tensor of Object.values(tensors)) {
    const data = tensor.data;
    if (ArrayBuffer.isView(data) && data.buffer instanceof SharedArrayBuffer) found.add(data.buffer);
  }
  return [...found];
}
