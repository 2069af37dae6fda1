/**
 * The JSON `send` and `steer` take: the argument, a file (`--file F`) or standard input (`-`, or
 * `--file -`). An argument is bounded by the OS (about 128 KiB on Linux, under the event limit,
 * 256 KiB by default); a file or a pipe only by the limit, and is read with that bound, so that a
 * file of gigabytes given by mistake is refused after the limit's worth of bytes, not read whole.
 */
import { createReadStream } from 'node:fs';
import { CorralError, toError } from '../base/errors.ts';
import { unstorableReason } from '../base/json-safety.ts';

export interface JsonSource {
  /** The argument; `-` means standard input. */
  json?: string | undefined;
  /** `--file`; `-` means standard input. */
  file?: string | undefined;
}

export interface JsonInputOptions {
  /** What the JSON is, for messages: `event`, `steering input`. */
  what: string;
  /** Most bytes the file or standard input may hold. */
  maxBytes: number;
  /** The setting that sets `maxBytes`, named in the message when it is exceeded. */
  limitName?: string;
  stdin: NodeJS.ReadableStream;
}

export function parseJsonArgument(text: string, what = 'event'): unknown {
  let value: unknown;
  try {
    value = JSON.parse(text) as unknown;
  } catch (e) {
    throw new CorralError('invalid_argument', `the ${what} must be JSON: ${(e as Error).message}`);
  }
  // refuse what jsonb cannot keep before touching the database (a usage error, not exit 1)
  const why = unstorableReason(value);
  if (why) throw new CorralError('invalid_argument', `the ${what} cannot be stored: ${why}`);
  return value;
}

/** The JSON value from exactly one of the argument, `--file` or standard input. */
export async function readJsonInput(source: JsonSource, opts: JsonInputOptions): Promise<unknown> {
  const { json, file } = source;
  if (json !== undefined && file !== undefined) {
    throw new CorralError('invalid_argument', `give the ${opts.what} either as an argument or with --file, not both`);
  }
  if (json === undefined && file === undefined) {
    throw new CorralError(
      'invalid_argument',
      `no ${opts.what} given: pass it as JSON, with --file FILE, or as - to read it from standard input`,
    );
  }
  const path = file ?? json!;
  if (file === undefined && json !== '-') return parseJsonArgument(json!, opts.what);
  const fromStdin = path === '-';
  const where = fromStdin ? 'standard input' : path;
  let bytes: Buffer | undefined;
  try {
    bytes = await readBounded(fromStdin ? opts.stdin : createReadStream(path), opts.maxBytes);
  } catch (e) {
    throw new CorralError('invalid_argument', `cannot read ${where}: ${readError(e)}`, { cause: e });
  }
  if (bytes === undefined) {
    const limit = `${opts.maxBytes} bytes${opts.limitName ? ` (${opts.limitName})` : ''}`;
    throw new CorralError('payload_too_large', `${where} holds more than the ${opts.what} limit of ${limit}`, {
      details: { maxBytes: opts.maxBytes },
    });
  }
  let text: string;
  try {
    // fatal: bytes that are not UTF-8 are refused, not turned into U+FFFD; a BOM is dropped
    text = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch {
    throw new CorralError('invalid_argument', `${where} is not UTF-8 text`);
  }
  if (text.trim() === '') throw new CorralError('invalid_argument', `${where} is empty: expected the ${opts.what} as JSON`);
  return parseJsonArgument(text, opts.what);
}

/** The stream's bytes, or undefined as soon as there are more than `maxBytes` (the rest unread). */
async function readBounded(stream: NodeJS.ReadableStream, maxBytes: number): Promise<Buffer | undefined> {
  const chunks: Buffer[] = [];
  let total = 0;
  for await (const chunk of stream) {
    const b = typeof chunk === 'string' ? Buffer.from(chunk) : chunk;
    total += b.length;
    // leaving the loop destroys the stream: nothing more is read
    if (total > maxBytes) return undefined;
    chunks.push(b);
  }
  return Buffer.concat(chunks);
}

/** `ENOENT: no such file or directory` without the `, open '<path>'` that repeats the path. */
function readError(e: unknown): string {
  return toError(e).message.replace(/, \w+ '.*'$/, '');
}
