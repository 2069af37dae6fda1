/** Argument parsers shared by the commands (commander `argParser`s): a bad value is a usage error. */
import { InvalidArgumentError } from 'commander';

/** An integer in `min..max`. */
export function intArg(min: number, max: number) {
  return (value: string): number => {
    const n = Number(value);
    if (!Number.isInteger(n) || n < min || n > max) throw new InvalidArgumentError(`expected an integer in ${min}..${max}`);
    return n;
  };
}
