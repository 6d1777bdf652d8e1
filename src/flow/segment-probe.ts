/**
 * Probes between the plain RxJS operators of a segment (the operators between a Flow and the
 * consumer that links to it), so the consumer's link learns of an element a filter dropped after a
 * deferral as it happens, instead of from a silence.
 *
 * A link alone sees only elements going in and coming out; `concatMap` draining its queue into a
 * `filter` that drops what it delivers looks like nothing at all. Between operators the drop is
 * visible: an operator that has answered an element during the call that gave it one (it is
 * synchronous: `filter`, `map`, `take`...) and has never emitted outside such a call dropped an
 * element it gives nothing for. An operator that has emitted outside a call (`delay`, `concatMap`
 * over timers) holds elements, and is never taken to drop one; an operator not yet seen to answer
 * is not trusted either. What the probes cannot tell stays with the link's timing (`Inlet`).
 *
 * Only lift chains are probed (RxJS's own operators and `operate`-built ones): a chain with any
 * other Observable between the Flow and the consumer, or fewer than two operators, is left as it is.
 */
import { Observable, Subscriber, type Operator } from 'rxjs';
import { isFlow, type DemandLink } from './demand.js';

/** A link that takes drops reported by probes: `Inlet`. */
type DropAwareLink = DemandLink & { dropped(): void; moved(): void };

/** What RxJS keeps on an Observable made by `lift`. */
interface Lifted {
  readonly source?: Observable<unknown>;
  readonly operator?: Operator<unknown, unknown>;
}

/** Longest chain walked: a longer one is left unprobed. */
const MAX_OPERATORS = 64;

/** What the probes have seen of one operator. */
class OperatorState {
  /** Calls giving it an element, running now. */
  depth = 0;
  /** It emitted during the innermost call running. */
  answered = false;
  /** It has emitted during a call: synchronous, so far. */
  synchronous = false;
  /** It has emitted outside any call: it holds elements (it defers), so what it gives nothing for may come later. */
  defers = false;
}

/**
 * Sits after one operator of the chain (`made`: its state, undefined for the first) and before the
 * next (`into`: its state, undefined for the last, whose outputs go to the consumer).
 */
class SegmentProbe<T> extends Subscriber<T> {
  constructor(
    destination: Subscriber<T>,
    private readonly made: OperatorState | undefined,
    private readonly into: OperatorState | undefined,
    private readonly link: DropAwareLink,
  ) {
    super(destination);
  }

  protected override _next(value: T): void {
    this.link.moved();
    const made = this.made;
    if (made !== undefined) {
      if (made.depth > 0) {
        made.answered = true;
        made.synchronous = true;
      } else made.defers = true;
    }
    const into = this.into;
    if (into === undefined) return this.destination.next(value);
    const outer = into.answered;
    into.answered = false;
    into.depth++;
    try {
      this.destination.next(value);
    } finally {
      into.depth--;
    }
    const answered = into.answered;
    into.answered = outer || answered;
    if (!answered && into.synchronous && !into.defers) this.link.dropped();
  }
}

/**
 * `source` rebuilt with a probe after each of its operators when it is a lift chain of at least two
 * operators down to a Flow, else `source` itself. Subscribe the result in `link`'s scope, as `source`.
 */
export function probeSegment<T>(source: Observable<T>, link: DemandLink): Observable<T> {
  if (isFlow(source) || link.dropped === undefined || link.moved === undefined) return source;
  const operators: Operator<unknown, unknown>[] = [];
  let at: Observable<unknown> = source;
  while (!isFlow(at)) {
    const { operator, source: below } = at as Lifted;
    if (operator === undefined || below === undefined || operators.length === MAX_OPERATORS) return source;
    operators.push(operator);
    at = below;
  }
  if (operators.length < 2) return source;
  operators.reverse();
  const states = operators.map(() => new OperatorState());
  let built: Observable<unknown> = at;
  operators.forEach((operator, i) => {
    const made = i === 0 ? undefined : states[i];
    const into = states[i + 1];
    const probed = function (this: Subscriber<unknown>, below: Observable<unknown>) {
      return operator.call(new SegmentProbe(this, made, into, link as DropAwareLink), below);
    };
    built = lift(built, probed as unknown as Operator<unknown, unknown>);
  });
  return built as Observable<T>;
}

/** What `Observable.lift` does (deprecated in RxJS's public API, so written out). */
function lift(source: Observable<unknown>, operator: Operator<unknown, unknown>): Observable<unknown> {
  const observable = new Observable<unknown>() as Observable<unknown> & { source: Observable<unknown>; operator: Operator<unknown, unknown> };
  observable.source = source;
  observable.operator = operator;
  return observable;
}
