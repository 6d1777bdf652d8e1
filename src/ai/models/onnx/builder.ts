import { SluiceError } from '../../../core/errors.js';
import { ProtoWriter } from './protobuf.js';

/** Element types the writer supports, named as onnxruntime-node names them (`Tensor.Type`). */
export type ElementType = 'float32' | 'int64' | 'int32' | 'bool';

/** A dimension: a fixed size, or a symbolic name such as `'batch'` shared by the tensors that agree on it. */
export type Dim = number | string;

/** Data an initializer can hold; `Uint8Array` is read as `bool`. */
export type TensorData = Float32Array | BigInt64Array | Int32Array | Uint8Array;

/** A float attribute whose value happens to be integral (a plain `1` would be written as an int). */
export interface FloatAttribute {
  readonly float: number;
}

/**
 * Attribute values: an integral number is an INT, any other number a FLOAT (wrap with `float()` to force a
 * FLOAT), a number array INTS (FLOATS if any element is fractional), a string a STRING.
 */
export type AttributeValue = number | FloatAttribute | readonly number[] | string;

export const float = (value: number): FloatAttribute => ({ float: value });

// onnx.proto TensorProto.DataType
const DATA_TYPE: Record<ElementType, number> = { float32: 1, int32: 6, int64: 7, bool: 9 };
// onnx.proto AttributeProto.AttributeType
const ATTRIBUTE_TYPE = { FLOAT: 1, INT: 2, STRING: 3, FLOATS: 6, INTS: 7 } as const;

interface ValueInfo {
  readonly name: string;
  readonly type: ElementType;
  readonly dims: readonly Dim[];
}

interface Initializer {
  readonly name: string;
  readonly data: TensorData;
  readonly dims: readonly number[];
}

interface Node {
  readonly op: string;
  readonly inputs: readonly string[];
  readonly outputs: readonly string[];
  readonly attributes: Readonly<Record<string, AttributeValue>>;
  readonly name: string;
}

/** A graph under construction. Names are checked as they are added, so a wiring mistake fails here, with the node named, rather than deep inside onnxruntime. */
export class GraphBuilder {
  private readonly inputs: ValueInfo[] = [];
  private readonly outputs: ValueInfo[] = [];
  private readonly initializers: Initializer[] = [];
  private readonly nodes: Node[] = [];
  private readonly defined = new Set<string>();
  private temporaries = 0;

  constructor(readonly name: string) {}

  input(name: string, type: ElementType, dims: readonly Dim[]): string {
    this.define(name, `input "${name}"`);
    this.inputs.push({ name, type, dims });
    return name;
  }

  /** Declares a graph output; `name` must be produced by a node (or be an input or initializer) by the time the model is written. */
  output(name: string, type: ElementType, dims: readonly Dim[]): string {
    this.outputs.push({ name, type, dims });
    return name;
  }

  initializer(name: string, data: TensorData, dims: readonly number[]): string {
    const size = dims.reduce((a, b) => a * b, 1);
    if (size !== data.length) throw graphError(this.name, `initializer "${name}" has ${data.length} element(s) but dims [${dims.join(', ')}] hold ${size}`);
    this.define(name, `initializer "${name}"`);
    this.initializers.push({ name, data, dims });
    return name;
  }

  /** An int64 initializer, for the shapes, axes and indices that ops take as inputs since opset 13. */
  int64s(name: string, values: readonly number[], dims: readonly number[] = [values.length]): string {
    return this.initializer(
      name,
      BigInt64Array.from(values, (v) => BigInt(v)),
      dims,
    );
  }

  /** A float initializer holding a scalar (dims `[]`) or a vector. */
  floats(name: string, values: readonly number[], dims: readonly number[] = [values.length]): string {
    return this.initializer(name, Float32Array.from(values), dims);
  }

  node(op: string, inputs: readonly string[], outputs: readonly string[], attributes: Readonly<Record<string, AttributeValue>> = {}): readonly string[] {
    const name = `${op}_${this.nodes.length}`;
    // '' is ONNX's way of leaving an optional input out.
    for (const input of inputs) {
      if (input !== '' && !this.defined.has(input)) throw graphError(this.name, `node ${name} reads "${input}", which nothing defines before it`);
    }
    for (const output of outputs) this.define(output, `output "${output}" of node ${name}`);
    this.nodes.push({ op, inputs, outputs, attributes, name });
    return outputs;
  }

  /** A single-output node whose output gets a fresh name: keeps graph code to one line per op. */
  op(op: string, inputs: readonly string[], attributes: Readonly<Record<string, AttributeValue>> = {}, hint = op.toLowerCase()): string {
    const output = `${hint}_${this.temporaries++}`;
    this.node(op, inputs, [output], attributes);
    return output;
  }

  /** Encodes the graph as an ONNX GraphProto. */
  encode(): ProtoWriter {
    for (const output of this.outputs) {
      if (!this.defined.has(output.name)) throw graphError(this.name, `output "${output.name}" is never produced`);
    }
    const graph = new ProtoWriter();
    for (const node of this.nodes) graph.message(1, encodeNode(node));
    graph.string(2, this.name);
    for (const initializer of this.initializers) graph.message(5, encodeTensor(initializer));
    for (const input of this.inputs) graph.message(11, encodeValueInfo(input));
    for (const output of this.outputs) graph.message(12, encodeValueInfo(output));
    return graph;
  }

  private define(name: string, what: string): void {
    if (name === '') throw graphError(this.name, `${what} has an empty name`);
    if (this.defined.has(name)) throw graphError(this.name, `${what} redefines "${name}"`);
    this.defined.add(name);
  }
}

export interface ModelOptions {
  /** Default opset 17 (onnxruntime ≥ 1.14); IR version follows from it. */
  readonly opset?: number;
  readonly producer?: string;
  readonly docString?: string;
  /** Written as ModelProto.metadata_props; onnxruntime exposes them, and they travel with the file. */
  readonly metadata?: Readonly<Record<string, string>>;
}

export class ModelBuilder {
  constructor(
    readonly graph: GraphBuilder,
    private readonly options: ModelOptions = {},
  ) {}

  /** The ModelProto bytes: deterministic, since every field is written in a fixed order from the builder's state. */
  toBytes(): Uint8Array {
    const opset = this.options.opset ?? 17;
    const model = new ProtoWriter();
    model.int(1, irVersionFor(opset));
    model.string(2, this.options.producer ?? 'sluice');
    model.string(3, '0.1.0');
    if (this.options.docString) model.string(6, this.options.docString);
    model.message(7, this.graph.encode());
    model.message(8, new ProtoWriter().string(1, '').int(2, opset));
    for (const [key, value] of Object.entries(this.options.metadata ?? {}).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) {
      model.message(14, new ProtoWriter().string(1, key).string(2, value));
    }
    return model.finish();
  }
}

// https://onnxruntime.ai/docs/reference/compatibility.html: the IR version each opset shipped with.
function irVersionFor(opset: number): number {
  if (opset <= 12) return 7;
  if (opset <= 18) return 8;
  if (opset <= 20) return 9;
  return 10;
}

function encodeNode(node: Node): ProtoWriter {
  const out = new ProtoWriter();
  for (const input of node.inputs) out.string(1, input);
  for (const output of node.outputs) out.string(2, output);
  out.string(3, node.name);
  out.string(4, node.op);
  for (const [name, value] of Object.entries(node.attributes)) out.message(5, encodeAttribute(name, value));
  return out;
}

function encodeAttribute(name: string, value: AttributeValue): ProtoWriter {
  const out = new ProtoWriter().string(1, name);
  if (typeof value === 'string') return out.string(4, value).int(20, ATTRIBUTE_TYPE.STRING);
  if (typeof value === 'number') {
    return Number.isInteger(value) ? out.int(3, value).int(20, ATTRIBUTE_TYPE.INT) : out.float(2, value).int(20, ATTRIBUTE_TYPE.FLOAT);
  }
  if ('float' in value) return out.float(2, value.float).int(20, ATTRIBUTE_TYPE.FLOAT);
  const values = value as readonly number[];
  return values.every(Number.isInteger) ? out.packedInts(8, values).int(20, ATTRIBUTE_TYPE.INTS) : out.packedFloats(7, values).int(20, ATTRIBUTE_TYPE.FLOATS);
}

function encodeTensor(tensor: Initializer): ProtoWriter {
  const out = new ProtoWriter();
  out.packedInts(1, tensor.dims);
  out.int(2, DATA_TYPE[elementTypeOf(tensor.data)]);
  out.string(8, tensor.name);
  // raw_data is little-endian; typed arrays are too on every platform Node ships for.
  out.bytes(9, new Uint8Array(tensor.data.buffer, tensor.data.byteOffset, tensor.data.byteLength));
  return out;
}

function encodeValueInfo(info: ValueInfo): ProtoWriter {
  const shape = new ProtoWriter();
  for (const dim of info.dims) {
    shape.message(1, typeof dim === 'number' ? new ProtoWriter().int(1, dim) : new ProtoWriter().string(2, dim));
  }
  const tensorType = new ProtoWriter().int(1, DATA_TYPE[info.type]).message(2, shape);
  return new ProtoWriter().string(1, info.name).message(2, new ProtoWriter().message(1, tensorType));
}

function elementTypeOf(data: TensorData): ElementType {
  if (data instanceof Float32Array) return 'float32';
  if (data instanceof BigInt64Array) return 'int64';
  if (data instanceof Int32Array) return 'int32';
  return 'bool';
}

function graphError(graph: string, message: string): SluiceError {
  return new SluiceError('INVALID_GRAPH', `ONNX graph "${graph}": ${message}.`, { hint: 'Check the names passed to graph.input/initializer/node.' });
}
