/** Histogram buckets shared by the metrics that measure the same kind of thing. */

/** Seconds, from a fast stage's service (0.1 ms) to a long generation (30 s). */
export const LATENCY_BUCKETS = [0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];
/** Tokens per generation. */
export const TOKEN_BUCKETS = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144];
/** Seconds between two tokens. */
export const PER_TOKEN_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5];
