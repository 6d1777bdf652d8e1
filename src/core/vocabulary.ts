/**
 * Overflow policies — one vocabulary for types, metrics labels, trace records and docs.
 *
 * | policy          | when the buffer is full                                        | lossless |
 * |-----------------|----------------------------------------------------------------|----------|
 * | `pause`         | no more demand goes upstream (default)                         | yes      |
 * | `shed-incoming` | the arriving element is shed                                   | no       |
 * | `shed-oldest`   | the oldest buffered element is shed, the arriving one kept     | no       |
 * | `fail`          | the stream fails with `OverflowError` after delivering the buffer | no    |
 * | `conflate`      | the arriving element is merged into the newest buffered one    | content  |
 */
export const POLICIES = ['pause', 'shed-incoming', 'shed-oldest', 'fail', 'conflate'] as const;
/** What a stage does when it is full: one of `POLICIES` (wait for demand, or shed by a named rule). */
export type Policy = (typeof POLICIES)[number];

/** Why an element was shed. */
export type ShedReason = 'buffer-full' | 'evicted' | 'lagging' | 'cancelled';

/** How an element left a stage: every element that enters leaves exactly once. */
export type Outcome = 'delivered' | 'shed' | 'failed';

/** Priority classes of requests at a server's door, lowest first: `low` is shed before `default`, `default` before `high`. */
export const PRIORITY_CLASSES = ['low', 'default', 'high'] as const;
/** A request's priority class (one of `PRIORITY_CLASSES`). */
export type PriorityClass = (typeof PRIORITY_CLASSES)[number];
