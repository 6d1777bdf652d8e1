/**
 * The few protobuf wire-format primitives an ONNX writer needs. Hand-rolled because ONNX is written here,
 * never read, and the encoding is about a hundred lines: a dependency (protobufjs plus a .proto file at run
 * time) would cost more than it saves.
 */

enum WireType {
  Varint = 0,
  LengthDelimited = 2,
  Fixed32 = 5,
}

const textEncoder = new TextEncoder();

/** Accumulates the fields of one message; nested messages are encoded first and written as bytes. */
export class ProtoWriter {
  private readonly chunks: Uint8Array[] = [];
  private length = 0;

  private push(bytes: Uint8Array): void {
    this.chunks.push(bytes);
    this.length += bytes.length;
  }

  private tag(field: number, wire: WireType): void {
    this.push(varint(BigInt(field * 8 + wire)));
  }

  /** int32, int64, enum and bool fields. Negative values take ten bytes (two's complement), as protobuf mandates. */
  int(field: number, value: number | bigint): this {
    this.tag(field, WireType.Varint);
    this.push(varint(BigInt(value)));
    return this;
  }

  float(field: number, value: number): this {
    this.tag(field, WireType.Fixed32);
    const bytes = new Uint8Array(4);
    new DataView(bytes.buffer).setFloat32(0, value, true);
    this.push(bytes);
    return this;
  }

  bytes(field: number, value: Uint8Array): this {
    this.tag(field, WireType.LengthDelimited);
    this.push(varint(BigInt(value.length)));
    this.push(value);
    return this;
  }

  string(field: number, value: string): this {
    return this.bytes(field, textEncoder.encode(value));
  }

  message(field: number, value: ProtoWriter): this {
    return this.bytes(field, value.finish());
  }

  /** A packed repeated int64 field (proto3's default encoding for repeated scalars). */
  packedInts(field: number, values: readonly (number | bigint)[]): this {
    const inner = new ProtoWriter();
    for (const value of values) inner.push(varint(BigInt(value)));
    return this.bytes(field, inner.finish());
  }

  packedFloats(field: number, values: readonly number[]): this {
    const bytes = new Uint8Array(values.length * 4);
    const view = new DataView(bytes.buffer);
    values.forEach((value, i) => view.setFloat32(i * 4, value, true));
    return this.bytes(field, bytes);
  }

  finish(): Uint8Array {
    const out = new Uint8Array(this.length);
    let offset = 0;
    for (const chunk of this.chunks) {
      out.set(chunk, offset);
      offset += chunk.length;
    }
    return out;
  }
}

const UINT64 = (1n << 64n) - 1n;

function varint(value: bigint): Uint8Array {
  let v = value < 0n ? value & UINT64 : value;
  const bytes: number[] = [];
  do {
    let byte = Number(v & 0x7fn);
    v >>= 7n;
    if (v !== 0n) byte |= 0x80;
    bytes.push(byte);
  } while (v !== 0n);
  return Uint8Array.from(bytes);
}
