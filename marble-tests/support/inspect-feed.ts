/** The inspector's feed as the tests read it: its first snapshot, as a given caller sees it. */
import assert from 'node:assert/strict';
import type { InspectSnapshot } from '../../src/serve/inspect/snapshot.js';

/** The first snapshot of `url`'s `/inspect/events`, read with `headers` (a bearer token, say); fails on any status but 200. */
export async function firstSnapshot(url: string, headers: Record<string, string> = {}): Promise<InspectSnapshot> {
  const res = await fetch(`${url}/inspect/events`, { headers });
  assert.equal(res.status, 200, `the feed answered ${res.status}`);
  const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
  let text = '';
  while (!text.includes('\n\n')) text += (await reader.read()).value ?? '';
  await reader.cancel();
  return JSON.parse(/^data: (.*)$/m.exec(text)![1]!) as InspectSnapshot;
}
