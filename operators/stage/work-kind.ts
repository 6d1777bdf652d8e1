/** What kind of work a stage has, decided once per function when the stage is made. */

/**
 * An arrow function of at most one plain parameter cannot see a second argument: it
 * has no binding for it and no `arguments` of its own. Such work (`x => x * 2`,
 * `async text => embed(text)`) gets no context object, which saves an allocation per
 * element per stage, and a Promise result's task holds the element's seq and trace
 * itself. Anything else (two parameters, defaults, rest, destructuring, `function`,
 * bound or native functions) gets one.
 */
const ONE_PLAIN_PARAMETER_ARROW = /^(?:async\s*)?(?:\(\s*(?:[A-Za-z_$][\w$]*)?\s*\)|[A-Za-z_$][\w$]*)\s*=>/;

export function ignoresContext(work: (...args: never[]) => unknown): boolean {
  try {
    return work.length <= 1 && ONE_PLAIN_PARAMETER_ARROW.test(Function.prototype.toString.call(work));
  } catch {
    return false;
  }
}

const AsyncFunction = (async () => {}).constructor;

/**
 * An `async` function, by its prototype and its own source text: calling it returns a native
 * Promise, or throws. A bound one or a Proxy (whose `apply` may return anything) reads as native
 * code, and an ordinary function given the prototype by `Object.setPrototypeOf` reads as what it
 * is: those take the general path, which looks at what they return.
 */
export function isAsyncFunction(work: (...args: never[]) => unknown): boolean {
  if (!(work instanceof AsyncFunction)) return false;
  try {
    return /^async[\s(]/.test(Function.prototype.toString.call(work));
  } catch {
    return false;
  }
}
