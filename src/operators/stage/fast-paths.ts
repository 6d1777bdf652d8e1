/**
 * The stage's fast paths (`async` work hopping straight to the next stage, reused Promise tasks,
 * no context object for one-parameter arrows) can be switched off, so that tests can check they
 * give what the general path gives. A stage reads the switch when it is made, so it costs nothing
 * per element. (The direct send of a plain result is not switchable: a check on it measured +22
 * instructions per element, docs/internals/stage-hot-path.md.) @internal
 */
let enabled = true;

export function setFastPaths(on: boolean): void {
  enabled = on;
}

export function fastPathsOn(): boolean {
  return enabled;
}
