/**
 * The scoring kernel of `VectorIndex`: dot products of one query with every row,
 * in WebAssembly SIMD (f32x4): four lanes at a time with two accumulators, the pass
 * is bound by memory bandwidth, not by the loop (docs/internals/ai-figures.md).
 *
 * The module is assembled from bytes below (no toolchain at build time). It
 * imports its memory, so the index owns the buffer and can grow it.
 *
 * `scores(query, rows, count, stride, out)`: byte offsets `query`, `rows`, `out`;
 * `stride` floats per row, a multiple of 8 (rows and the query are zero-padded).
 */

/** Rows and queries are padded to a multiple of this many floats (two f32x4 lanes per step). */
export const LANES = 8;

const u32 = (n: number): number[] => {
  const out: number[] = [];
  do {
    let byte = n & 0x7f;
    n >>>= 7;
    if (n !== 0) byte |= 0x80;
    out.push(byte);
  } while (n !== 0);
  return out;
};
const name = (s: string): number[] => [...u32(s.length), ...Buffer.from(s, 'latin1')];
const section = (id: number, body: number[]): number[] => [id, ...u32(body.length), ...body];

// Opcodes used below.
const GET = 0x20,
  SET = 0x21,
  TEE = 0x22,
  I32 = 0x41,
  ADD = 0x6a,
  SHL = 0x74,
  LT_U = 0x49,
  GE_U = 0x4f;
const BLOCK = 0x02,
  LOOP = 0x03,
  VOID = 0x40,
  BR = 0x0c,
  BR_IF = 0x0d,
  END = 0x0b;
const SIMD = 0xfd;
const load = (offset: number): number[] => [SIMD, 0x00, 0x04, ...u32(offset)];
const F32X4_ADD = [SIMD, 0xe4, 0x01],
  F32X4_MUL = [SIMD, 0xe6, 0x01];
const lane = (i: number): number[] => [SIMD, 0x1f, i];
const ZERO = [SIMD, 0x0c, ...new Array<number>(16).fill(0)];

// Params: 0 query, 1 rows, 2 count, 3 stride, 4 out. Locals: 5 r, 6 j, 7 rowBytes (i32); 8 a, 9 b (v128).
const body = [
  0x02,
  0x03,
  0x7f,
  0x02,
  0x7b,
  GET,
  3,
  I32,
  2,
  SHL,
  SET,
  7,
  BLOCK,
  VOID,
  LOOP,
  VOID,
  GET,
  5,
  GET,
  2,
  GE_U,
  BR_IF,
  1,
  ...ZERO,
  SET,
  8,
  ...ZERO,
  SET,
  9,
  I32,
  0,
  SET,
  6,
  LOOP,
  VOID,
  GET,
  8,
  GET,
  1,
  GET,
  6,
  ADD,
  ...load(0),
  GET,
  0,
  GET,
  6,
  ADD,
  ...load(0),
  ...F32X4_MUL,
  ...F32X4_ADD,
  SET,
  8,
  GET,
  9,
  GET,
  1,
  GET,
  6,
  ADD,
  ...load(16),
  GET,
  0,
  GET,
  6,
  ADD,
  ...load(16),
  ...F32X4_MUL,
  ...F32X4_ADD,
  SET,
  9,
  GET,
  6,
  I32,
  32,
  ADD,
  TEE,
  6,
  GET,
  7,
  LT_U,
  BR_IF,
  0,
  END,
  GET,
  4,
  GET,
  8,
  GET,
  9,
  ...F32X4_ADD,
  TEE,
  8,
  ...lane(0),
  GET,
  8,
  ...lane(1),
  0x92,
  GET,
  8,
  ...lane(2),
  GET,
  8,
  ...lane(3),
  0x92,
  0x92,
  0x38,
  0x02,
  0x00,
  GET,
  4,
  I32,
  4,
  ADD,
  SET,
  4,
  GET,
  1,
  GET,
  7,
  ADD,
  SET,
  1,
  GET,
  5,
  I32,
  1,
  ADD,
  SET,
  5,
  BR,
  0,
  END,
  END,
  END,
];

const bytes = Uint8Array.from([
  0x00,
  0x61,
  0x73,
  0x6d,
  0x01,
  0x00,
  0x00,
  0x00,
  ...section(1, [1, 0x60, 5, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0]),
  ...section(2, [1, ...name('env'), ...name('memory'), 0x02, 0x00, 0x01]),
  ...section(3, [1, 0]),
  ...section(7, [1, ...name('scores'), 0x00, 0]),
  ...section(10, [1, ...u32(body.length), ...body]),
]);

/**
 * The slice of the WebAssembly API used here. @types/node 20 does not declare the
 * `WebAssembly` global and the project's lib has no DOM, so it is typed locally
 * rather than by a global declaration other code could collide with.
 */
export interface WasmMemory {
  readonly buffer: ArrayBuffer;
  grow(pages: number): number;
}
interface WasmApi {
  Memory: new (descriptor: { initial: number }) => WasmMemory;
  Module: new (bytes: Uint8Array) => object;
  Instance: new (module: object, imports: object) => { readonly exports: Record<string, unknown> };
  validate(bytes: Uint8Array): boolean;
}
const wasm = (globalThis as unknown as { WebAssembly: WasmApi }).WebAssembly;

/** A WebAssembly memory of `pages` 64 KiB pages, growable. */
export function createMemory(pages: number): WasmMemory {
  return new wasm.Memory({ initial: pages });
}

export type ScoreKernel = (query: number, rows: number, count: number, stride: number, out: number) => void;

let compiled: object | null | undefined;

/** The SIMD kernel bound to `memory`, or undefined where WebAssembly SIMD is unavailable. */
export function simdKernel(memory: WasmMemory): ScoreKernel | undefined {
  if (compiled === undefined) compiled = wasm.validate(bytes) ? new wasm.Module(bytes) : null;
  if (compiled === null) return undefined;
  const instance = new wasm.Instance(compiled, { env: { memory } });
  return instance.exports.scores as ScoreKernel;
}

/** The same computation in JavaScript, for engines without WebAssembly SIMD. */
export function scalarKernel(memory: () => Float32Array): ScoreKernel {
  return (query, rows, count, stride, out) => {
    const f = memory();
    const q = query >>> 2;
    let row = rows >>> 2;
    const o = out >>> 2;
    for (let r = 0; r < count; r++, row += stride) {
      let a = 0,
        b = 0,
        c = 0,
        d = 0;
      for (let j = 0; j < stride; j += 4) {
        a += f[row + j]! * f[q + j]!;
        b += f[row + j + 1]! * f[q + j + 1]!;
        c += f[row + j + 2]! * f[q + j + 2]!;
        d += f[row + j + 3]! * f[q + j + 3]!;
      }
      f[o + r] = a + b + (c + d);
    }
  };
}
