/**
 * A JetStream cluster of three real nats-server processes on loopback, started by a test: each its
 * own client port, route port and store, routes to the other two. A node can be killed (SIGKILL) and
 * started again on the same ports and store.
 */
import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { launchNatsServer } from './nats-server.js';

export interface NatsCluster {
  /** Client URLs of every node, for `connect({ servers })`. */
  readonly urls: readonly string[];
  /** The node names, `n0`…`n2`, in the order of `urls`. */
  readonly names: readonly string[];
  /** SIGKILLs node `index`. */
  kill(index: number): Promise<void>;
  /** Starts node `index` again on its ports and store. */
  start(index: number): Promise<void>;
  /** Stops every node and removes the stores. */
  close(): Promise<void>;
}

const SIZE = 3;

/**
 * `count` distinct ports the OS has just handed out and taken back (routes must be known before the
 * servers start). All are held until the last is handed out: a port given back at once may be handed
 * out again by the next call.
 */
async function freePorts(count: number): Promise<number[]> {
  const servers = await Promise.all(
    Array.from(
      { length: count },
      () =>
        new Promise<Server>((resolve, reject) => {
          const server = createServer();
          server.once('error', reject);
          server.listen(0, '127.0.0.1', () => resolve(server));
        }),
    ),
  );
  const ports = servers.map((server) => (server.address() as { port: number }).port);
  await Promise.all(servers.map((server) => new Promise<void>((resolve) => server.close(() => resolve()))));
  return ports;
}

async function launch(args: readonly string[]): Promise<ChildProcess> {
  return (await launchNatsServer(args)).child;
}

function exited(child: ChildProcess, signal: NodeJS.Signals): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    child.once('exit', () => resolve());
    child.kill(signal);
  });
}

export async function startNatsCluster(): Promise<NatsCluster> {
  const ports = await freePorts(2 * SIZE);
  const clientPorts = ports.slice(0, SIZE);
  const routePorts = ports.slice(SIZE);
  const stores = clientPorts.map(() => mkdtempSync(join(tmpdir(), 'sluice-nats-cluster-')));
  const names = clientPorts.map((_, i) => `n${i}`);
  const argsOf = (i: number): string[] => [
    '-js',
    '-sd',
    stores[i]!,
    '-a',
    '127.0.0.1',
    '-p',
    String(clientPorts[i]),
    '--server_name',
    names[i]!,
    '--cluster_name',
    'sluice-test',
    '--cluster',
    `nats://127.0.0.1:${routePorts[i]}`,
    '--routes',
    routePorts
      .filter((_, j) => j !== i)
      .map((port) => `nats://127.0.0.1:${port}`)
      .join(','),
  ];
  const launched = await Promise.allSettled(clientPorts.map((_, i) => launch(argsOf(i))));
  const nodes: (ChildProcess | undefined)[] = launched.map((result) => (result.status === 'fulfilled' ? result.value : undefined));
  const failed = launched.find((result) => result.status === 'rejected');
  if (failed !== undefined) {
    // The nodes that did start would keep the test process alive: stop them before failing.
    await Promise.all(nodes.map((node) => (node === undefined ? undefined : exited(node, 'SIGKILL'))));
    for (const store of stores) rmSync(store, { recursive: true, force: true });
    throw failed.reason;
  }
  return {
    urls: clientPorts.map((port) => `nats://127.0.0.1:${port}`),
    names,
    async kill(index) {
      const node = nodes[index];
      nodes[index] = undefined;
      if (node !== undefined) await exited(node, 'SIGKILL');
    },
    async start(index) {
      if (nodes[index] === undefined) nodes[index] = await launch(argsOf(index));
    },
    async close() {
      await Promise.all(nodes.map((node) => (node === undefined ? undefined : exited(node, 'SIGTERM'))));
      for (const store of stores) rmSync(store, { recursive: true, force: true });
    },
  };
}
