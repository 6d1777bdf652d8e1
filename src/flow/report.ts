import { config } from 'rxjs';

/**
 * Reports an error nobody can handle the way RxJS does (`config.onUnhandledError`, else thrown
 * from a timer): a user hook that throws must not unwind into someone else's call stack, such as
 * the `Subject.next()` of a producer.
 */
export function reportUnhandledError(err: unknown): void {
  setTimeout(() => {
    const { onUnhandledError } = config;
    if (onUnhandledError) onUnhandledError(err);
    else throw err;
  });
}

/** Calls a user hook (`onShed`, `onFailure`...); a throw is reported, not propagated. */
export function callHook<E>(hook: ((event: E) => void) | undefined, event: E): void {
  if (hook === undefined) return;
  try {
    hook(event);
  } catch (err) {
    reportUnhandledError(err);
  }
}
