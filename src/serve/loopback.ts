/** Which hosts only this machine can reach: an open server (no tokens) must answer only those. */

/** True for hosts only this machine can reach. */
export function isLoopback(host: string): boolean {
  return host === 'localhost' || host === '::1' || host === '[::1]' || /^127\.\d+\.\d+\.\d+$/.test(host);
}

/** True for a `Host` header naming this machine (`localhost`, `127.x.y.z`, `[::1]`, with or without a port). */
export function loopbackHost(header: string | undefined): boolean {
  if (header === undefined) return false;
  const host = header.startsWith('[') ? header.slice(0, header.indexOf(']') + 1) : header.split(':', 1)[0]!;
  return isLoopback(host.toLowerCase());
}
