/**
 * Debian's Chromium for the browser tests (`SLUICE_CHROMIUM` names another build): whether it
 * is there, the skip reason when it is not (never under CI=true, where .ci/run installs it), and
 * a headless launch that does not phone home (this closed network answers with refusals).
 */
import { existsSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium, type Browser, type Page } from 'playwright-core';

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

/** How long a browser test waits for one step (a page under load may take a while). */
export const STEP_TIMEOUT = 30_000;

/** Polls `check` until it returns a value other than `undefined`; fails with `what` after `timeout` ms. */
export async function until<T>(what: string, check: () => Promise<T | undefined>, timeout = STEP_TIMEOUT): Promise<T> {
  const deadline = Date.now() + timeout;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeout} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

/** Where the browser tests keep their screenshots: `SLUICE_E2E_SCREENSHOTS`, else `test-artifacts/screenshots` of the checkout (git ignores it). */
export const SCREENSHOTS = process.env.SLUICE_E2E_SCREENSHOTS || fileURLToPath(new URL('../../test-artifacts/screenshots', import.meta.url));

/** Keeps a full-page screenshot of `page` as a test artifact, named `name`.png. */
export async function keepScreenshot(page: Page, name: string): Promise<string> {
  mkdirSync(SCREENSHOTS, { recursive: true });
  const path = join(SCREENSHOTS, `${name}.png`);
  await page.screenshot({ path, fullPage: true });
  return path;
}
