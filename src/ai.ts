/**
 * `sluice/ai` — models (generated from code or loaded by path), the inference pool in
 * worker threads, model workers, RAG (embed, retrieve, assemble), inference and
 * post-processing stages. Needs the optional peer `onnxruntime-node`.
 */
import './peers-ai.js'; // first: without onnxruntime-node, the import fails here, naming it
export { GraphBuilder, ModelBuilder, float } from './models/onnx/index.js';
export type { AttributeValue, Dim, ElementType, FloatAttribute, ModelOptions, TensorData } from './models/onnx/index.js';
export { HashTokenizer, DEFAULT_HASH_TOKENIZER, FeedBuffers, padBatch } from './models/tokenizer.js';
export type { Tokenizer, EncodedBatch, HashTokenizerConfig } from './models/tokenizer.js';
export { WordPieceTokenizer } from './models/wordpiece.js';
export type { WordPieceOptions } from './models/wordpiece.js';
export { loadModel, loadTokenizer, signatureProblems, SIGNATURES, LoadedModel } from './models/load.js';
export type { LoadModelOptions, ModelSignature, TensorSpec } from './models/load.js';
export { ModelNotFoundError, ModelCorruptError, ModelSignatureError, UnsupportedTokenizerError } from './models/errors.js';
export { generateModels, MODEL_FILES, EMBEDDING_CONFIG } from './models/generate.js';
export type { GenerateOptions as GenerateModelsOptions, GeneratedFile, GuardMetadata } from './models/generate.js';
export { GUARD_LABELS } from './models/guard.js';
export { cosine } from './models/embedding.js';
export { planPooling, poolOutputs } from './models/pooling.js';
export type { Pooling, PoolingOptions, PoolingPlan } from './models/pooling.js';
export { redact, redactText, Redactor, RedactStats, luhnValid, PII_KINDS, DEFAULT_REPLACEMENTS } from '../operators/redact.js';
export type { RedactOptions, RedactOperator, RedactPattern, PiiKind } from '../operators/redact.js';
export { guard, GuardBlockedError, isBlocked } from '../operators/guard.js';
export type { GuardOptions, GuardVerdict, GuardAction, Classifier, Classification } from '../operators/guard.js';
export { jsonOutput, parseJsonOutput, lightRepair, stripFence, collectText, OutputInvalidError } from '../operators/json-output.js';
export type { JsonOutputOptions, ParseJsonOutputOptions, JsonOutcome, OutputProblem, Repair, ResponseText } from '../operators/json-output.js';
export { VectorIndex } from './rag/vector-index.js';
export type { SearchOptions, SearchHit } from './rag/vector-index.js';
export { EmbeddingCache } from './rag/embedding-cache.js';
export { chunkMarkdown, loadCorpus, indexPassages, BUNDLED_CORPUS } from './rag/corpus.js';
export type { Passage, PassageMetadata, RetrievedPassage } from './rag/passage.js';
export { countTokens, tokenize, tokenEnds } from './rag/tokens.js';
export { InvalidVectorError, DuplicateIdError, IndexFormatError, EmbedderOutputError, TemplateVariablesError, PromptOverBudgetError } from './rag/errors.js';
export { embed } from '../operators/embed.js';
export type { Embedder as TextEmbedder, Embedded, EmbedOptions } from '../operators/embed.js';
export { retrieve, withCitations } from '../operators/retrieve.js';
export type { Retrieved, RetrieveOptions, Citation, CitedContext } from '../operators/retrieve.js';
export { assemble, PromptTemplate } from '../operators/assemble.js';
export type { AssembleOptions, AssembledPrompt, FewShotExample, PromptTemplateOptions, TemplateValue, VariablesSchema } from '../operators/assemble.js';
export { generateRequest, promptText, generation, complete, decode } from './inference/worker.js';
export type { ModelWorker, GenerateRequest, GenerationParams, GenerateOptions as GenerationOptions, InferOptions as ModelInferOptions, Token, FinishReason, Usage, GenerationDone, Completion, DecodeStep, Decoding, DecodeConfig } from './inference/worker.js';
export { StopMatcher, createRandom, distribution, sampleToken, applyRepetitionPenalty } from './inference/sampling.js';
export type { SamplingParams, SampledToken } from './inference/sampling.js';
export { OpenAIWorker, SseParser } from './inference/openai.js';
export type { OpenAIWorkerOptions } from './inference/openai.js';
export { CharLmWorker, DecoderLmWorker, ASCII_CODEC } from './inference/onnx-lm.js';
export type { RunModel, TokenCodec, DecoderShape, CharLmWorkerOptions, DecoderLmWorkerOptions } from './inference/onnx-lm.js';
export { HttpStatusError, RateLimitedError, MalformedEventError, ProviderError } from './inference/errors.js';
export { InferencePool } from './models/pool.js';
export type { InferencePoolOptions, InferencePoolStats, WorkerStats, RunOptions, Feeds, Outputs, ModelSource, ModelInfo } from './models/pool.js';
export { BorrowedOutputsError, PoolClosedError, PoolQueueFullError, WorkerCrashedError, InferenceFailedError, UnknownModelError } from './models/pool-errors.js';
export { embedder, textFeeds, tensorRows } from './models/pool-embedder.js';
export type { PoolEmbedderOptions } from './models/pool-embedder.js';
export { infer } from '../operators/infer.js';
export type { InferOptions, InferOperator } from '../operators/infer.js';
export { poolClassifier } from './models/pool-classifier.js';
export type { PoolClassifierOptions } from './models/pool-classifier.js';
export { ragWorker, RAG_STAGES } from './rag/worker.js';
export type { RagWorkerOptions, RagStage } from './rag/worker.js';
