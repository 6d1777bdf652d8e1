/**
 * Debian's Chromium for the browser tests (`SLUICE_CHROMIUM` names another build): whether it
 * is there, the skip reason when it is not (never under CI=true, where .ci/run installs it), and
 * a headless launch that does not phone home (this closed network answers with refusals).
 */
import { existsSync } from 'node:fs';
import { chromium, type Browser } from 'playwright-core';

export const CHROMIUM = process.env.SLUICE_CHROMIUM || '/usr/bin/chromium';
export const installed = existsSync(CHROMIUM);

/** `describe`'s `skip`: false when the test must run (Chromium there, or CI, where its absence is a failure). */
export function skipWithoutChromium(what: string): string | false {
  return installed || process.env.CI === 'true'
    ? false
    : `${CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium, as .ci/run does) to run ${what}`;
}

export function launchChromium(): Promise<Browser> {
  if (!installed) throw new Error(`${CHROMIUM} is missing, and CI=true: .ci/run must install Debian's chromium before the tests`);
  return chromium.launch({
    executablePath: CHROMIUM,
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
}
