export { GraphBuilder, ModelBuilder, float } from './builder.js';
export type { AttributeValue, Dim, ElementType, FloatAttribute, ModelOptions, TensorData } from './builder.js';
