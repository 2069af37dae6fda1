/** What tests of commands and APIs share: a stream that keeps what is written to it, and the code of a rejection. */
import { Writable } from 'node:stream';
import { expect } from 'vitest';
import { CorralError } from '../../src/base/errors.ts';

/** A writable stream that keeps the text written to it (a command's stdout, a logger's destination). */
export class Capture extends Writable {
  text = '';
  override _write(chunk: Buffer, _enc: BufferEncoding, cb: () => void): void {
    this.text += chunk.toString('utf8');
    cb();
  }
}

/** A command's standard output and error, captured. */
export const captureIo = () => ({ out: new Capture(), err: new Capture() });

/** The `CorralError` code `p` rejects with; undefined when it resolves. Any other rejection fails the test. */
export async function errorCodeOf(p: Promise<unknown>): Promise<string | undefined> {
  try {
    await p;
    return undefined;
  } catch (e) {
    expect(e).toBeInstanceOf(CorralError);
    return (e as CorralError).code;
  }
}
