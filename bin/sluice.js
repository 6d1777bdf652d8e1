#!/usr/bin/env node
// The `sluice` command. From a source checkout it runs src/cli.ts through tsx (a dev
// dependency); from the published package, the compiled dist/src/cli.js.
import { existsSync } from 'node:fs';

const source = new URL('../src/cli.ts', import.meta.url);
let cli;
try {
  if (existsSync(source)) {
    const { register } = await import('tsx/esm/api');
    register();
    cli = await import(source.href);
  } else {
    cli = await import(new URL('../dist/src/cli.js', import.meta.url).href);
  }
} catch (error) {
  // A missing optional peer (MissingPeerError) says which package to install: print that, not a stack.
  if (error?.code !== 'MISSING_PEER') throw error;
  console.error(`sluice: ${error.message}`);
  process.exit(1);
}
process.exit(await cli.main(process.argv.slice(2)));
