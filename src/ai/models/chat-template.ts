/**
 * A model's chat template (the Jinja `chat_template` of its `tokenizer_config.json`),
 * rendered by `@huggingface/jinja` — the implementation transformers.js uses — so a
 * chat reaches the model in the exact layout it was trained on.
 */
import type { Template } from '@huggingface/jinja';
import { InvalidOptionsError, errorMessage } from '../../core/errors.js';
import { hfJinja } from '../../core/peers.js';
import { lazySchema } from '../../core/zod.js';
import { parseOptions } from '../../flow/options.js';

/** A chat message as templates read it. */
export interface TemplateMessage {
  readonly role: string;
  readonly content: string;
}

/** Options of `ChatTemplate`: variables passed to every render. */
export interface ChatTemplateOptions {
  /** Variables every render sees: `bos_token`, `eos_token` and the other special tokens of the config. */
  readonly variables?: Readonly<Record<string, unknown>>;
}

const optionsSchema = lazySchema((z) => z.strictObject({ variables: z.record(z.string(), z.unknown(), { error: 'variables must be an object' }).optional() }));

/**
 * Renders chats with a Jinja chat template, `add_generation_prompt` set so the text ends
 * where the assistant's answer begins. A template refusing the messages (its
 * `raise_exception`, e.g. roles that do not alternate) throws `InvalidOptionsError` on `messages`.
 *
 * ## Example
 * ```ts
 * const template = ChatTemplate.fromConfig(JSON.parse(await readFile('tokenizer_config.json', 'utf8')));
 * template?.render([{ role: 'user', content: 'Hi' }]); // '<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n'
 * ```
 */
export class ChatTemplate {
  private readonly template: Template;

  constructor(
    readonly source: string,
    private readonly options: ChatTemplateOptions = {},
  ) {
    parseOptions(optionsSchema(), options, 'ChatTemplate options');
    const { Template } = hfJinja();
    this.template = new Template(source);
  }

  /** Renders `messages` to the prompt text the model was trained on. */
  render(messages: readonly TemplateMessage[], variables: Readonly<Record<string, unknown>> = {}): string {
    try {
      return this.template.render({
        ...this.options.variables,
        add_generation_prompt: true,
        ...variables,
        messages: messages.map((m) => ({ role: m.role, content: m.content })),
      });
    } catch (cause) {
      // The template's own raise_exception ("roles must alternate"...) or a failure on these messages: the request's fault.
      throw new InvalidOptionsError('request', [{ path: 'messages', message: `the model's chat template refused them (${errorMessage(cause)})` }]);
    }
  }

  /**
   * The template of a parsed `tokenizer_config.json` (`chat_template` as a string, or the
   * `default` of a list of named ones), with its special tokens as variables; undefined
   * when it has none.
   */
  static fromConfig(config: Readonly<Record<string, unknown>>): ChatTemplate | undefined {
    const source = templateSource(config.chat_template);
    if (source === undefined) return undefined;
    const variables: Record<string, unknown> = {};
    for (const key of ['bos_token', 'eos_token', 'unk_token', 'pad_token', 'sep_token', 'cls_token', 'mask_token']) {
      const token = specialToken(config[key]);
      // Templates test `bos_token` as a string; an absent one renders as empty, as transformers does.
      variables[key] = token ?? '';
    }
    return new ChatTemplate(source, { variables });
  }
}

function templateSource(value: unknown): string | undefined {
  if (typeof value === 'string' && value.trim().length > 0) return value;
  if (Array.isArray(value)) {
    const named = value as { name?: unknown; template?: unknown }[];
    const chosen = named.find((t) => t.name === 'default') ?? named[0];
    if (typeof chosen?.template === 'string') return chosen.template;
  }
  return undefined;
}

/** A special token as the config writes it: a string, or an AddedToken object with `content`. */
export function specialToken(value: unknown): string | undefined {
  if (typeof value === 'string') return value;
  if (typeof value === 'object' && value !== null && typeof (value as { content?: unknown }).content === 'string')
    return (value as { content: string }).content;
  return undefined;
}
