/**
 * Fair-share write budgets: how many token frames one connection, and the whole server,
 * may send in one event-loop turn before yielding, so one fast model cannot keep the loop
 * to itself. Kept apart because both budgets wake connections on a later turn.
 */
import { Ring } from '../../flow/ring.js';

/**
 * Token frames a connection sends before it yields to the event loop. A healthy local
 * socket accepts writes synchronously, so without a budget a fast model would keep the
 * loop to itself until the kernel buffer fills, starving every other connection.
 */
export const FRAMES_PER_TURN = 32;

/**
 * Token frames the whole server sends in one event-loop turn. With a thousand busy
 * connections, 32 each would make one turn write 32k frames, delaying every
 * `generate`, `cancel` and pong behind it; past this budget connections wait for the
 * next turn, the ones that waited longest first.
 */
export const FRAMES_PER_SERVER_TURN = 1024;

/** A writer to wake when a budget it waited for is refilled. */
export interface Waiter {
  pump(): void;
}

/**
 * The budget all of a server's connections share, and the one queue of connections waiting
 * for the next turn (for either budget): one `setImmediate` per turn for the whole server, and
 * a connection waits in the queue once, not re-queued every turn (with a thousand busy
 * connections, re-queueing each one every turn made a 1,000-entry Set and array per 1,024 frames).
 */
export class ServerBudget {
  private left: number;
  /** Refills so far: a connection's own budget is refilled when it sees a new turn. */
  turn = 0;
  /** Budgets waiting for the next turn, longest waiting first; a closed one is skipped when its turn comes. */
  private readonly waiting = new Ring<WriteBudget>(64);
  private nextTurn: NodeJS.Immediate | undefined;
  private readonly refill = () => this.runTurn();

  constructor(private readonly perTurn = FRAMES_PER_SERVER_TURN) {
    this.left = perTurn;
  }

  /** True while this turn's budget lasts. */
  inTurn(): boolean {
    return this.left > 0;
  }

  spend(): void {
    this.left--;
  }

  /** `budget` waits for the next turn (once, however often it asks). */
  wait(budget: WriteBudget): void {
    if (budget.queued) return;
    budget.queued = true;
    this.waiting.push(budget);
    this.nextTurn ??= setImmediate(this.refill);
  }

  private runTurn(): void {
    this.nextTurn = undefined;
    this.turn++;
    this.left = this.perTurn;
    // The ones queued before this turn, in order, while the budget lasts; one that waits again goes to the back.
    for (let n = this.waiting.length; n > 0 && this.left > 0; n--) {
      const budget = this.waiting.shift()!;
      budget.queued = false;
      if (!budget.closed) budget.owner.pump();
    }
    if (this.waiting.length > 0) this.nextTurn ??= setImmediate(this.refill);
  }

  close(): void {
    clearImmediate(this.nextTurn);
    this.nextTurn = undefined;
    while (this.waiting.length > 0) this.waiting.shift()!.queued = false;
  }
}

/** One connection's budget, drawn together with the server's. */
export class WriteBudget {
  private left: number;
  private turn: number;
  /** In the server's queue for the next turn. */
  queued = false;
  closed = false;

  constructor(
    private readonly server: ServerBudget,
    readonly owner: Waiter,
    private readonly perTurn = FRAMES_PER_TURN,
  ) {
    this.left = perTurn;
    this.turn = server.turn;
  }

  /** True while both budgets last this turn; otherwise `owner.pump()` runs in a later turn, when the server's budget reaches it. */
  mayWrite(): boolean {
    if (this.turn !== this.server.turn) {
      this.turn = this.server.turn;
      this.left = this.perTurn;
    }
    if (this.left > 0 && this.server.inTurn()) return true;
    if (!this.closed) this.server.wait(this);
    return false;
  }

  /** One token frame was sent. */
  spend(): void {
    this.left--;
    this.server.spend();
  }

  /** 1 while it waits for a later turn, for the server's timer count. */
  timers(): number {
    return this.queued && !this.closed ? 1 : 0;
  }

  close(): void {
    this.closed = true;
  }
}
