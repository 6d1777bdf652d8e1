/** What the WebSocket and server tests share: a condition poller and a recording `sluice.v1` client. */
import assert from 'node:assert/strict';
import { WebSocket } from 'ws';
import { SUBPROTOCOL, serverFrameSchema, type ServerFrame } from '../../src/serve/protocol.js';

/** Polls `condition` every few ms; the deadline is only a safety net. */
export async function until(condition: () => boolean, what: string, safetyMs = 30_000): Promise<void> {
  const deadline = Date.now() + safetyMs;
  while (!condition()) {
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await new Promise<void>((resolve) => setTimeout(resolve, 2));
  }
}

export interface OpenOptions {
  /** Sent as a `bearer.<token>` subprotocol. */
  readonly token?: string;
  readonly origin?: string;
  readonly headers?: Record<string, string>;
}

/** A real `ws` client that records every frame, each validated against the server frame schema. */
export class WsClient {
  readonly frames: ServerFrame[] = [];
  readonly closed: Promise<number>;

  constructor(readonly ws: WebSocket) {
    ws.on('message', (data) => this.frames.push(serverFrameSchema().parse(JSON.parse(String(data))) as ServerFrame));
    this.closed = new Promise((resolve) => ws.on('close', (code) => resolve(code)));
    ws.on('error', () => {});
  }

  /** Opens `url`; an HTTP refusal rejects with an error carrying `status`. */
  static open(url: string, options: OpenOptions = {}): Promise<WsClient> {
    const protocols = [SUBPROTOCOL, ...(options.token === undefined ? [] : [`bearer.${options.token}`])];
    const ws = new WebSocket(url, protocols, { headers: options.headers ?? {}, ...(options.origin !== undefined && { origin: options.origin }) });
    const client = new WsClient(ws);
    return new Promise((resolve, reject) => {
      ws.once('open', () => resolve(client));
      ws.once('unexpected-response', (_, res) => reject(Object.assign(new Error(`HTTP ${res.statusCode}`), { status: res.statusCode })));
      ws.once('error', reject);
    });
  }

  send(message: unknown): void {
    this.ws.send(typeof message === 'string' ? message : JSON.stringify(message));
  }

  /** The `done` or `error` frame of request `id`, once it came. */
  end(id: string): ServerFrame | undefined {
    return this.frames.find((f) => 'id' in f && f.id === id && f.type !== 'token');
  }

  /** The text request `id` streamed so far. */
  text(id: string): string {
    return this.frames.map((f) => (f.type === 'token' && f.id === id ? f.text : '')).join('');
  }
}
