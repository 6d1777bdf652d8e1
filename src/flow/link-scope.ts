/**
 * The link scope: the consumer link that Flows subscribed synchronously right now link to. A
 * consumer opens it while it subscribes its source; an outlet opens its link's while it emits,
 * so the inner Flows a \`mergeMap\` subscribes because of an element link to the same consumer.
 */
import type { DemandLink } from './protocol.js';

let scope: DemandLink | undefined;

/** Runs `fn` with `link` as the link scope: Flows subscribed synchronously inside link to it. */
export function withLink<R>(link: DemandLink | undefined, fn: () => R): R {
  const previous = scope;
  scope = link;
  try {
    return fn();
  } finally {
    scope = previous;
  }
}

/** The link scope currently open, if any. */
export function currentLink(): DemandLink | undefined {
  return scope;
}

/**
 * Opens `link` as the scope and returns the previous one, for hot paths that cannot
 * afford a closure; the caller must restore it with `swapLink(previous)`.
 * @internal
 */
export function swapLink(link: DemandLink | undefined): DemandLink | undefined {
  const previous = scope;
  scope = link;
  return previous;
}
