/**
 * Fair-share write budgets: how many token frames one connection, and the whole server,
 * may send in one event-loop turn before yielding, so one fast model cannot keep the loop
 * to itself. Kept apart because both budgets wake connections on a later turn.
 */

/**
 * Token frames a connection sends before it yields to the event loop. A healthy local
 * socket accepts writes synchronously, so without a budget a fast model would keep the
 * loop to itself until the kernel buffer fills, starving every other connection.
 */
export const FRAMES_PER_TURN = 32;

/**
 * Token frames the whole server sends in one event-loop turn. With a thousand busy
 * connections, 32 each would make one turn write 32k frames (~1 s here), delaying every
 * `generate`, `cancel` and pong behind it; past this budget connections wait for the
 * next turn, the ones that waited longest first.
 */
export const FRAMES_PER_SERVER_TURN = 1024;

/** A writer to wake when a budget it waited for is refilled. */
export interface Waiter {
  pump(): void;
}

/** The budget all of a server's connections share. */
export class ServerBudget {
  private left: number;
  private readonly waiting = new Set<Waiter>();
  private nextTurn: NodeJS.Immediate | undefined;

  constructor(private readonly perTurn = FRAMES_PER_SERVER_TURN) {
    this.left = perTurn;
  }

  /** True while this turn's budget lasts; otherwise queues `waiter` for the next turn. */
  inTurn(waiter: Waiter): boolean {
    if (this.left > 0) return true;
    this.waiting.add(waiter);
    this.nextTurn ??= setImmediate(() => {
      this.nextTurn = undefined;
      this.left = this.perTurn;
      // Set order is arrival order: the longest waiting go first.
      const waiting = [...this.waiting];
      this.waiting.clear();
      for (const w of waiting) w.pump();
    });
    return false;
  }

  spend(): void {
    this.left--;
  }

  /** `waiter` is gone: it is not woken. */
  forget(waiter: Waiter): void {
    this.waiting.delete(waiter);
  }

  close(): void {
    clearImmediate(this.nextTurn);
    this.nextTurn = undefined;
    this.waiting.clear();
  }
}

/** One connection's budget, drawn together with the server's. */
export class WriteBudget {
  private left: number;
  private nextTurn: NodeJS.Immediate | undefined;

  constructor(
    private readonly server: ServerBudget,
    private readonly owner: Waiter,
    private readonly perTurn = FRAMES_PER_TURN,
  ) {
    this.left = perTurn;
  }

  /** True while both budgets last this turn; otherwise `owner.pump()` runs once the one used up is refilled. */
  mayWrite(): boolean {
    if (this.left <= 0) {
      this.nextTurn ??= setImmediate(() => {
        this.nextTurn = undefined;
        this.left = this.perTurn;
        this.owner.pump();
      });
      return false;
    }
    return this.server.inTurn(this.owner);
  }

  /** One token frame was sent. */
  spend(): void {
    this.left--;
    this.server.spend();
  }

  /** 1 while a refill is scheduled, for the server's timer count. */
  timers(): number {
    return this.nextTurn === undefined ? 0 : 1;
  }

  close(): void {
    clearImmediate(this.nextTurn);
    this.nextTurn = undefined;
    this.server.forget(this.owner);
  }
}
