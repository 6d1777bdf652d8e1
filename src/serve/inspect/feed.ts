/**
 * The inspector's live feed: server-sent events, one `snapshot` event per interval, conflated per
 * reader. A reader whose previous message has not drained from its socket is skipped, and gets the
 * newest snapshot once it drained: a slow tab sees fewer, newer snapshots, and the server holds at
 * most one message per reader, however long the reader stops reading. Readers in the same scope
 * (the operators; one tenant's readers) share one message per tick.
 */
import type { ServerResponse } from 'node:http';

interface Reader {
  readonly res: ServerResponse;
  /** Readers of one scope are sent the same message: it is built once per tick for all of them. */
  readonly scope: string;
  /** The last write did not drain yet: nothing more is queued until it does. */
  blocked: boolean;
  /** Messages not sent to it because it was blocked. */
  skipped: number;
  /** A tick passed it by while blocked: it is owed the newest snapshot when it drains. */
  stale: boolean;
  readonly onDrain: () => void;
}

/** A feed's readers now, for tests and health checks. */
export interface FeedStats {
  readonly readers: number;
  /** Readers whose last message has not drained. */
  readonly blocked: number;
  /** Bytes queued for the slowest reader: at most one message. */
  readonly maxQueued: number;
  /** Bytes queued for all readers together: at most one message each. */
  readonly queued: number;
  /** Bytes of the largest message built since the feed started: what "one message" is. */
  readonly largestMessage: number;
  /** Messages skipped, all readers together. */
  readonly skipped: number;
  /** True while its timer runs (only with readers). */
  readonly ticking: boolean;
}

export class SnapshotFeed {
  private readonly readers = new Set<Reader>();
  private timer: NodeJS.Timeout | undefined;
  private closed = false;
  private largest = 0;

  constructor(
    private readonly interval: number,
    /** The next message's JSON for a scope; called once per tick and scope, only when some reader of it can take it. */
    private readonly next: (scope: string) => string,
  ) {}

  /** Serves the feed of `scope` on `res` until the client leaves or the feed closes. */
  add(res: ServerResponse, scope = '', headers: Readonly<Record<string, string>> = {}): void {
    if (this.closed) {
      res.writeHead(503, { 'content-type': 'text/plain' }).end('the inspector is closed');
      return;
    }
    res.writeHead(200, {
      ...headers,
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache',
      'x-accel-buffering': 'no',
    });
    const reader: Reader = {
      res,
      scope,
      blocked: false,
      skipped: 0,
      stale: false,
      onDrain: () => {
        reader.blocked = false;
        // Owed a tick it missed: the newest state at once. Never more than one message per tick, however fast it drains.
        if (!reader.stale) return;
        reader.stale = false;
        this.write(reader, this.next(reader.scope));
      },
    };
    this.readers.add(reader);
    res.once('close', () => {
      res.off('drain', reader.onDrain);
      this.readers.delete(reader);
      if (this.readers.size === 0) this.stopTimer();
    });
    this.write(reader, this.next(scope));
    this.timer ??= setInterval(() => this.tick(), this.interval);
  }

  stats(): FeedStats {
    let blocked = 0;
    let maxQueued = 0;
    let queued = 0;
    let skipped = 0;
    for (const reader of this.readers) {
      if (reader.blocked) blocked++;
      maxQueued = Math.max(maxQueued, reader.res.writableLength);
      queued += reader.res.writableLength;
      skipped += reader.skipped;
    }
    return { readers: this.readers.size, blocked, maxQueued, queued, largestMessage: this.largest, skipped, ticking: this.timer !== undefined };
  }

  /** Ends every reader's stream and stops the timer; later readers get 503. */
  close(): void {
    this.closed = true;
    this.stopTimer();
    for (const reader of [...this.readers]) {
      reader.res.off('drain', reader.onDrain);
      reader.res.end();
      // A reader that stopped reading would hold its socket open: its stream is over anyway.
      reader.res.destroy();
    }
    this.readers.clear();
  }

  private tick(): void {
    const messages = new Map<string, string>();
    for (const reader of this.readers) {
      if (reader.blocked) {
        reader.skipped++;
        reader.stale = true;
        continue;
      }
      let message = messages.get(reader.scope);
      if (message === undefined) messages.set(reader.scope, (message = this.next(reader.scope)));
      this.write(reader, message);
    }
  }

  private write(reader: Reader, json: string): void {
    const res = reader.res;
    if (res.destroyed || res.writableEnded) return;
    const message = `event: snapshot\ndata: ${json}\n\n`;
    this.largest = Math.max(this.largest, Buffer.byteLength(message));
    if (res.write(message)) return;
    reader.blocked = true;
    res.once('drain', reader.onDrain);
  }

  private stopTimer(): void {
    clearInterval(this.timer);
    this.timer = undefined;
  }
}
