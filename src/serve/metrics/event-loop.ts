/** The process's event-loop delay, by statistic, over the interval since the previous scrape. */
import { monitorEventLoopDelay, type IntervalHistogram } from 'node:perf_hooks';
import type { Gauge } from 'prom-client';
import { promClient } from '../../core/peers.js';
import type { Registers } from './pipeline-collectors.js';

const prom = promClient();

const LOOP_STATS = [
  ['p50', (h: IntervalHistogram) => h.percentile(50)],
  ['p90', (h: IntervalHistogram) => h.percentile(90)],
  ['p99', (h: IntervalHistogram) => h.percentile(99)],
  ['max', (h: IntervalHistogram) => h.max],
  ['mean', (h: IntervalHistogram) => h.mean],
] as const;

/** `<prefix>event_loop_delay_seconds{stat}`; the returned monitor is enabled, and disabling it is the caller's. */
export function collectEventLoopDelay(resolution: number, prefix: string, registers: Registers): IntervalHistogram {
  const histogram = monitorEventLoopDelay({ resolution });
  histogram.enable();
  const gauge: Gauge<'stat'> = new prom.Gauge({
    name: `${prefix}event_loop_delay_seconds`,
    help: 'Event-loop delay since the previous scrape (perf_hooks.monitorEventLoopDelay), by statistic.',
    labelNames: ['stat'],
    registers,
    collect: () => {
      // With no sample yet the histogram reports NaN or huge sentinels: report 0 instead.
      const ready = histogram.count > 0;
      for (const [stat, read] of LOOP_STATS) gauge.set({ stat }, ready ? read(histogram) / 1e9 : 0);
      histogram.reset();
    },
  });
  return histogram;
}
