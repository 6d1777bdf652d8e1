/**
 * `sluice/ai` — models (generated from code or loaded by path), the inference pool in
 * worker threads, model workers, RAG (embed, retrieve, assemble), inference and
 * post-processing stages. Needs the optional peer `onnxruntime-node`.
 *
 * @module
 */
import './peers-ai.js'; // first: without onnxruntime-node, the import fails here, naming it
export { HashTokenizer, DEFAULT_HASH_TOKENIZER, FeedBuffers } from './ai/models/tokenizer.js';
export type { Tokenizer, EncodedBatch, HashTokenizerConfig } from './ai/models/tokenizer.js';
export { HfTokenizer } from './ai/models/hf-tokenizer.js';
export type { HfTokenizerOptions } from './ai/models/hf-tokenizer.js';
export { loadModel, loadTokenizer, SIGNATURES, LoadedModel } from './ai/models/load.js';
export type { LoadModelOptions, LoadTokenizerOptions, ModelSignature, TensorSpec } from './ai/models/load.js';
export { ModelNotFoundError, ModelCorruptError, ModelSignatureError, UnsupportedTokenizerError } from './ai/models/errors.js';
export { generateModels, MODEL_FILES, EMBEDDING_CONFIG } from './ai/models/generate.js';
export type { GenerateOptions as GenerateModelsOptions, GeneratedFile, GuardMetadata } from './ai/models/generate.js';
export type { EmbeddingModelConfig } from './ai/models/embedding.js';
export { GUARD_LABELS, GUARD_THRESHOLDS } from './ai/models/guard.js';
export type { GuardRates } from './ai/models/guard.js';
export { planPooling, poolOutputs } from './ai/models/pooling.js';
export { loadEmbeddingDir, EmbeddingDirError, type EmbeddingDir } from './ai/models/embedding-dir.js';
export type { Pooling, PoolingOptions, PoolingPlan } from './ai/models/pooling.js';
export { redact } from './ai/stages/redact.js';
export type { RedactOperator } from './ai/stages/redact.js';
export { redactText, Redactor } from './ai/stages/redactor.js';
export { RedactStats } from './ai/stages/redact-options.js';
export type { RedactOptions } from './ai/stages/redact-options.js';
export { PII_KINDS, DEFAULT_REPLACEMENTS } from './ai/stages/pii-detectors.js';
export type { RedactPattern, PiiKind } from './ai/stages/pii-detectors.js';
export { guard, GuardBlockedError, isBlocked } from './ai/stages/guard.js';
export type { GuardOptions, GuardVerdict, GuardAction } from './ai/stages/guard.js';
export type { Classifier, Classification } from './ai/models/classifier.js';
export { jsonOutput, parseJsonOutput, OutputInvalidError } from './ai/stages/json-output.js';
export type { JsonOutputOptions, ParseJsonOutputOptions, JsonOutcome, OutputProblem, Repair, ResponseText } from './ai/stages/json-output.js';
export { VectorIndex } from './ai/rag/vector-index.js';
export type { SearchOptions, SearchHit } from './ai/rag/vector-index.js';
export { EmbeddingCache } from './ai/rag/embedding-cache.js';
export { chunkMarkdown, loadCorpus, indexPassages, BUNDLED_CORPUS, DEFAULT_MAX_FILE_BYTES } from './ai/rag/corpus.js';
export type { LoadCorpusOptions, IndexPassagesOptions } from './ai/rag/corpus.js';
export type { CorpusSkip, CorpusSkipReason } from './ai/rag/document-text.js';
export type { Passage, PassageMetadata, RetrievedPassage } from './ai/rag/passage.js';
export { countTokens, tokenize } from './ai/rag/tokens.js';
export { LexicalIndex, lexicalTerm, lexicalTerms } from './ai/rag/lexical-index.js';
export type { LexicalHit } from './ai/rag/lexical-index.js';
export { reciprocalRankFusion, RRF_K, scoreFusion, type RankedScore } from './ai/rag/fusion.js';
export type { Fused } from './ai/rag/fusion.js';
export { retrievePassages, RETRIEVAL_MODES, LEXICAL_GRANULARITIES } from './ai/rag/retriever.js';
export type { LexicalGranularity, RetrievalMode, Retrieval, RetrievalPlan } from './ai/rag/retriever.js';
export { feedbackTerms } from './ai/rag/query-expansion.js';
export type { ExpansionTerm, FeedbackOptions, FeedbackSource } from './ai/rag/query-expansion.js';
export { supportsAnswer, DEFAULT_ABSTAIN } from './ai/rag/abstain.js';
export { WordVectors, WORD_VECTORS_PACKAGE, WORD_VECTORS_FILE } from './ai/rag/word-vectors.js';
export { MeaningIndex } from './ai/rag/meaning-index.js';
export type { MeaningPassage } from './ai/rag/meaning-index.js';
export { expectedAnswer, answerShare, asksHowTo } from './ai/rag/answer-kind.js';
export type { AnswerKind, Expectation } from './ai/rag/answer-kind.js';
export type { Evidence, AbstainOptions } from './ai/rag/abstain.js';
export {
  InvalidVectorError,
  DuplicateIdError,
  IndexFormatError,
  EmbedderOutputError,
  TemplateVariablesError,
  PromptOverBudgetError,
  CorpusError,
} from './ai/rag/errors.js';
export { embed } from './ai/stages/embed.js';
export type { Embedder as TextEmbedder, Embedded, EmbedOptions } from './ai/stages/embed.js';
export { retrieve, withCitations } from './ai/stages/retrieve.js';
export type { Retrieved, RetrieveOptions, Citation, CitedContext } from './ai/stages/retrieve.js';
export { assemble, PromptTemplate } from './ai/stages/assemble.js';
export type { PromptTokenizer } from './ai/models/prompt-tokenizer.js';
export type {
  AssembleOptions,
  AssembledPrompt,
  FewShotExample,
  PromptTemplateOptions,
  TemplateValue,
  VariablesSchema,
} from './ai/stages/assemble.js';
export { generateRequest, promptText, generation, complete, decode } from './ai/inference/worker.js';
export { guardedWorker } from './ai/pipelines/guarded-worker.js';
export type { GuardedWorkerOptions } from './ai/pipelines/guarded-worker.js';
export { redactedWorker, redactTokens } from './ai/pipelines/redacted-worker.js';
export type { RedactTokensOptions } from './ai/pipelines/redacted-worker.js';
export { jsonWorker } from './ai/pipelines/json-worker.js';
export type { JsonFormat } from './ai/pipelines/json-worker.js';
export type {
  ModelWorker,
  GenerateRequest,
  GenerationParams,
  GenerateOptions as GenerationOptions,
  InferOptions as ModelInferOptions,
  Token,
  FinishReason,
  EndReason,
  Usage,
  GenerationDone,
  Completion,
  DecodeStep,
  Decoding,
  DecodeConfig,
} from './ai/inference/worker.js';
export { StopMatcher, sampleToken } from './ai/inference/sampling.js';
export type { SamplingParams, SampledToken } from './ai/inference/sampling.js';
export { OpenAIWorker } from './ai/inference/openai.js';
export type { OpenAIWorkerOptions } from './ai/inference/openai.js';
export { BatchedEmbedder } from './ai/pipelines/batched-embedder.js';
export type { BatchedEmbedderOptions } from './ai/pipelines/batched-embedder.js';
export { BatchedClassifier } from './ai/pipelines/batched-classifier.js';
export type { BatchedClassifierOptions } from './ai/pipelines/batched-classifier.js';
export { Gateway, UpstreamDiscoveryError } from './ai/inference/gateway.js';
export type { GatewayOptions, UpstreamOptions } from './ai/inference/gateway.js';
export type { UpstreamView } from './ai/inference/upstream-stats.js';
export { CharLmWorker, DecoderLmWorker, ASCII_CODEC } from './ai/inference/onnx-lm.js';
export { LocalModel, LocalModelError } from './ai/inference/local-model.js';
export type { LocalModelOptions, LocalWorkerOptions } from './ai/inference/local-model.js';
export { TokenTextStream } from './ai/inference/detokenize.js';
export { openAiTokenCounter, openAiEncodingOf } from './ai/inference/openai-tokens.js';
export type { DecodeIds } from './ai/inference/detokenize.js';
export { ChatTemplate } from './ai/models/chat-template.js';
export type { ChatTemplateOptions, TemplateMessage } from './ai/models/chat-template.js';
export type { RunModel, TokenCodec, DecoderShape, CharLmWorkerOptions, DecoderLmWorkerOptions } from './ai/inference/onnx-lm.js';
export { HttpStatusError, RateLimitedError, MalformedEventError, ProviderError, ContextLengthExceededError } from './ai/inference/errors.js';
export { InferencePool } from './ai/pool/pool.js';
export type { InferencePoolStats } from './ai/pool/pool.js';
export type { InferencePoolOptions, RunOptions, Feeds, Outputs, ModelSource } from './ai/pool/options.js';
export type { WorkerStats } from './ai/pool/slot.js';
export type { ModelInfo } from './ai/pool/protocol.js';
export type { ResidentStep, ResidentRow, ResidentHeld } from './ai/pool/resident-kv.js';
export type { KvShape } from './ai/pool/kv-stack.js';
export {
  BorrowedOutputsError,
  PoolClosedError,
  PoolQueueFullError,
  WorkerCrashedError,
  InferenceFailedError,
  UnknownModelError,
} from './ai/pool/errors.js';
export { embedder, textFeeds, tensorRows } from './ai/pool/embedder.js';
export type { PoolEmbedderOptions } from './ai/pool/embedder.js';
export { infer } from './ai/stages/infer.js';
export type { InferOptions, InferOperator } from './ai/stages/infer.js';
export { poolClassifier } from './ai/pool/classifier.js';
export type { PoolClassifierOptions } from './ai/pool/classifier.js';
export { ragWorker, RAG_STAGES } from './ai/pipelines/rag-worker.js';
export { Intake, PRIORITY_CLASSES } from './ai/pipelines/intake.js';
export { StepBatcher } from './ai/inference/step-batcher.js';
export type { StepBatcherOptions, StepBatcherStats, StepWeights } from './ai/inference/step-batcher.js';
export type { DecoderBatchOptions } from './ai/inference/kv-batch.js';
export type { ResidentKvOptions } from './ai/inference/resident-decoder.js';
export { CacheBudget } from './ai/inference/cache-budget.js';
export type { CacheHold, CacheBudgetStats } from './ai/inference/cache-budget.js';
export type { IntakeOptions, IntakeEntry, PriorityClass } from './ai/pipelines/intake.js';
export { pipelineWorker, streamStage, jobOf } from './ai/pipelines/pipeline-worker.js';
export type { PipelineWorker, PipelineWorkerOptions, PipelineJob, StreamStageOptions } from './ai/pipelines/pipeline-worker.js';
export type { RagWorkerOptions, RagStage } from './ai/pipelines/rag-worker.js';
export type { ExtractOptions } from './ai/rag/extract.js';
