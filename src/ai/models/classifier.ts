/** What a classifier says about one text: its label and how sure it is (0–1). */
export interface Classification {
  readonly label: string;
  readonly score: number;
}

/** A content classifier: a keyword list, a moderation API, an ONNX model in a worker... */
export type Classifier = (text: string, signal: AbortSignal) => Classification | PromiseLike<Classification>;
