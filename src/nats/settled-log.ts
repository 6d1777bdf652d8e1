/**
 * The ids of a link's messages its receivers are done with (acknowledged or dead-lettered), so
 * that a copy is never handed on twice. The server's own de-duplication (`Nats-Msg-Id`) cannot
 * promise that across its restarts: it rebuilds its window from the messages it still stores,
 * and a work queue removed the ones already acknowledged, so a worker's redone output is stored
 * again; and a crashed server can deliver acknowledged messages again as first deliveries.
 *
 * Each receiver therefore writes the ids it settles to the stream `SLUICE_<name>_SETTLED` (one
 * record per batch, kept `dedupWindow`), acknowledges the messages once the server stored the
 * record, and follows the stream from its start, so every receiver knows every id settled within
 * the window, after any restart. A message whose id is known is acknowledged without being
 * handed on. An id is a message's `Nats-Msg-Id` (what `toLink` sets), else its stream sequence.
 */
import type { JsMsg } from '@nats-io/jetstream';
import type { Link } from './link.js';
import { ID } from './wire.js';

/** A message's id for de-duplication: what its producer named it (kept when it was put back), else where it is stored. */
export function idOf(message: JsMsg): string {
  const headers = message.headers;
  return headers?.get(ID) || headers?.get('Nats-Msg-Id') || `${message.info.stream}-${message.seq}`;
}

/** One receiver's view of a link's settled ids. */
export class SettledLog {
  /** Id → when it was learnt (ms, local clock): dropped after `dedupWindow`, as the stream drops it. */
  private readonly ids = new Map<string, number>();
  /** Ids settled here whose record is not sent yet, and the acknowledgements to send after it. */
  private pending: string[] = [];
  private acknowledgements: (() => void)[] = [];
  private flushQueued = false;
  private stopFollowing: (() => void) | undefined;
  private pruneTimer: ReturnType<typeof setInterval> | undefined;

  constructor(private readonly link: Link<unknown>) {}

  /** Resolves once every record stored before it was called is known here; goes on following new ones. */
  async start(): Promise<void> {
    const { js, jsm, settledStream } = this.link;
    const before = (await jsm.streams.info(settledStream)).state;
    const messages = await (await js.consumers.get(settledStream)).consume();
    this.stopFollowing?.(); // a start tried again after a passing failure
    this.stopFollowing = () => void messages.close();
    if (this.pruneTimer === undefined) {
      const window = this.link.config.dedupWindow;
      this.pruneTimer = setInterval(() => this.prune(Date.now() - window), Math.max(1_000, window / 4));
      this.pruneTimer.unref();
    }
    let caughtUp: () => void = () => {};
    const ready = new Promise<void>((resolve) => (caughtUp = resolve));
    if (before.messages === 0) caughtUp();
    void (async () => {
      for await (const record of messages) {
        try {
          this.learn(record.json<string[]>());
        } catch {
          // not a record of ours: skipped
        }
        if (record.seq >= before.last_seq || record.info.pending === 0) caughtUp();
      }
    })();
    // The last record may have expired meanwhile, leaving nothing to read.
    jsm.streams.info(settledStream).then(
      (now) => now.state.messages === 0 && caughtUp(),
      () => {},
    );
    // A stream that is not read within a while (a cluster electing its leader): the caller tries again.
    let timer: ReturnType<typeof setTimeout> | undefined;
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error('the settled-ids stream was not read in 10 s')), 10_000);
    });
    await Promise.race([ready, late]).finally(() => clearTimeout(timer));
  }

  /** Whether `id` was settled by a receiver of the link within the window. */
  has(id: string): boolean {
    return this.ids.has(id);
  }

  /**
   * Records `id` as settled: known here at once, and sent to the server with the others of the
   * same turn of the event loop (a fetched batch settles within one); `acknowledge` is called once
   * the server has stored the record, so no message is acknowledged whose id a crash could lose.
   * A record the server did not take is sent again, and its acknowledgements wait for it.
   */
  record(id: string, acknowledge: () => void): void {
    this.learn([id]);
    this.pending.push(id);
    this.acknowledgements.push(acknowledge);
    if (this.flushQueued) return;
    this.flushQueued = true;
    // After the turn's I/O: the elements of one fetched batch settle within it, and share one record.
    setImmediate(() => {
      this.flushQueued = false;
      this.flush();
    });
  }

  close(): void {
    this.stopFollowing?.();
    if (this.pruneTimer !== undefined) clearInterval(this.pruneTimer);
  }

  private flush(): void {
    const ids = this.pending;
    const acknowledgements = this.acknowledgements;
    this.pending = [];
    this.acknowledgements = [];
    if (ids.length === 0) return;
    this.link.js.publish(this.link.settledSubject, JSON.stringify(ids)).then(
      () => {
        for (const acknowledge of acknowledgements) acknowledge();
      },
      () => {
        // Not stored (the server is away): sent again later; unacknowledged until then.
        if (this.link.connection.isClosed()) return;
        setTimeout(() => {
          this.pending.push(...ids);
          this.acknowledgements.push(...acknowledgements);
          this.flush();
        }, this.link.config.creditInterval);
      },
    );
  }

  /** Known from now: moved to the end, so the map stays in the order ids were learnt. */
  private learn(ids: readonly string[]): void {
    const now = Date.now();
    for (const id of ids) {
      this.ids.delete(id);
      this.ids.set(id, now);
    }
  }

  private prune(before: number): void {
    for (const [id, at] of this.ids) {
      if (at >= before) break; // insertion order is arrival order
      this.ids.delete(id);
    }
  }
}
