/** A WebSocket token server's gauges and counters (`<prefix>ws_*`), read at scrape time from `TokenSocket.stats()`. */
import type { Counter, Gauge } from 'prom-client';
import { promClient } from '../../core/peers.js';
import type { TokenSocketStats } from '../socket-stats.js';
import type { Registers } from './pipeline-collectors.js';

const prom = promClient();

/** What a WebSocket token server reports at scrape time (`TokenSocket.stats()` fits). */
export type SocketCounters = Pick<
  TokenSocketStats,
  'connections' | 'activeRequests' | 'buffered' | 'started' | 'completed' | 'cancelled' | 'failed' | 'interrupted' | 'badFrames' | 'upgradesRejected'
>;

const SOCKET_OUTCOMES = ['completed', 'cancelled', 'failed', 'interrupted'] as const;
const REFUSAL_STATUSES = [400, 401, 403, 503] as const;

type SocketLabel = 'server' | 'outcome' | 'status';

export function collectSockets(sockets: ReadonlyMap<string, () => SocketCounters>, prefix: string, registers: Registers): void {
  const gauge = (name: string, help: string, read: (c: SocketCounters) => number) => {
    const metric: Gauge<'server'> = new prom.Gauge({
      name: `${prefix}ws_${name}`,
      help,
      labelNames: ['server'],
      registers,
      collect: () => {
        for (const [server, stats] of sockets) metric.set({ server }, read(stats()));
      },
    });
  };
  gauge('connections', 'Open WebSocket connections.', (c) => c.connections);
  gauge('active_requests', 'WebSocket requests generating now.', (c) => c.activeRequests);
  gauge('buffered_bytes', 'Bytes waiting in the WebSocket send buffers now, all connections together.', (c) => c.buffered);
  const counter = (
    name: string,
    help: string,
    labelNames: readonly SocketLabel[],
    fill: (counter: Counter<SocketLabel>, server: string, c: SocketCounters) => void,
  ) => {
    const metric: Counter<SocketLabel> = new prom.Counter({
      name: `${prefix}ws_${name}_total`,
      help,
      labelNames: [...labelNames],
      registers,
      collect: () => {
        metric.reset();
        for (const [server, stats] of sockets) fill(metric, server, stats());
      },
    });
  };
  counter('requests_started', 'WebSocket requests accepted and started.', ['server'], (c, server, s) => c.inc({ server }, s.started));
  counter('requests_ended', 'WebSocket requests ended, by outcome (interrupted: cut off by shutdown).', ['server', 'outcome'], (c, server, s) => {
    for (const outcome of SOCKET_OUTCOMES) c.inc({ server, outcome }, s[outcome]);
  });
  counter('bad_frames', 'Frames the WebSocket server could not understand.', ['server'], (c, server, s) => c.inc({ server }, s.badFrames));
  counter(
    'upgrades_rejected',
    'WebSocket upgrades refused, by HTTP status (a browser refused with close 4401 or 1013 counts as 401 or 503).',
    ['server', 'status'],
    (c, server, s) => {
      for (const status of REFUSAL_STATUSES) c.inc({ server, status: String(status) }, s.upgradesRejected[status]);
    },
  );
}
