/**
 * The configuration's messages for bad settings: the ones its zod schema gave, kept word for word
 * when the rules were written out by hand (zod cost every command ~40 ms of start-up).
 */
import { describe, expect, it } from 'vitest';
import { loadConfig, type Config } from '../../src/config.ts';

const fault = (overrides: Record<string, unknown>, env: Record<string, string> = {}): string => {
  try {
    loadConfig(overrides as Partial<Config>, env, '/x');
  } catch (e) {
    return (e as Error).message.replace(/^invalid configuration: /, '');
  }
  return 'accepted';
};

describe('config rules', () => {
  it('integers: converted as Number() does, then type, integer, safe range, bounds', () => {
    expect(fault({}, { CORRAL_LEASE_MS: 'soon' })).toBe('leaseMs (CORRAL_LEASE_MS): Invalid input: expected number, received NaN');
    expect(fault({}, { CORRAL_LEASE_MS: 'Infinity' })).toBe('leaseMs (CORRAL_LEASE_MS): Invalid input: expected number, received Infinity');
    expect(fault({}, { CORRAL_LEASE_MS: '1000.5' })).toBe('leaseMs (CORRAL_LEASE_MS): Invalid input: expected int, received number');
    expect(fault({}, { CORRAL_LEASE_MS: '1e20' })).toBe('leaseMs (CORRAL_LEASE_MS): Too big: expected int to be <=9007199254740991');
    expect(fault({}, { CORRAL_LEASE_MS: '50' })).toBe('leaseMs (CORRAL_LEASE_MS): Too small: expected number to be >=100');
    expect(fault({}, { CORRAL_LEASE_MS: ' ' })).toBe('leaseMs (CORRAL_LEASE_MS): Too small: expected number to be >=100');
    expect(fault({}, { CORRAL_DRAIN_MS: '3600001' })).toBe('drainMs (CORRAL_DRAIN_MS): Too big: expected number to be <=3600000');
    expect(fault({ leaseMs: true })).toBe('leaseMs (CORRAL_LEASE_MS): Too small: expected number to be >=100');
    expect(fault({ leaseMs: Symbol('x') })).toBe('leaseMs (CORRAL_LEASE_MS): Invalid input: expected number, received symbol');
    expect(loadConfig({}, { CORRAL_LEASE_MS: ' 70000 ' }).leaseMs).toBe(70_000);
    expect(loadConfig({}, { CORRAL_LEASE_MS: '0x20000' }).leaseMs).toBe(131_072);
    expect(loadConfig({ leaseMs: '70000' } as unknown as Partial<Config>).leaseMs).toBe(70_000);
  });

  it('optional settings stay absent, and are checked when given', () => {
    const c = loadConfig({}, {});
    expect('metricsPort' in c || 'databaseUrl' in c || 'serverKey' in c).toBe(false);
    expect(loadConfig({}, { CORRAL_METRICS_PORT: '9100' }).metricsPort).toBe(9100);
    expect(fault({}, { CORRAL_METRICS_PORT: '70000' })).toBe('metricsPort (CORRAL_METRICS_PORT): Too big: expected number to be <=65535');
    expect(fault({ databaseUrl: '' })).toBe('databaseUrl (DATABASE_URL): Too small: expected string to have >=1 characters');
  });

  it('strings, choices and flags', () => {
    expect(fault({ homeDir: '' })).toBe('homeDir (CORRAL_HOME): Too small: expected string to have >=1 characters');
    expect(fault({ homeDir: 5 })).toBe('homeDir (CORRAL_HOME): Invalid input: expected string, received number');
    expect(fault({ homeDir: new Date(0) })).toBe('homeDir (CORRAL_HOME): Invalid input: expected string, received Date');
    expect(fault({}, { CORRAL_ENDPOINT: 'http://x' })).toBe(
      'endpoint (CORRAL_ENDPOINT): expected tcp://host:port, ipc://path or inproc://name',
    );
    expect(fault({}, { CORRAL_QUEUE: 'a b' })).toBe(
      'queueName (CORRAL_QUEUE): Invalid string: must match pattern /^[A-Za-z0-9_.-]{1,50}$/',
    );
    expect(fault({}, { CORRAL_SERVER_KEY: 'abc' })).toBe(
      'serverKey (CORRAL_SERVER_KEY): Too small: expected string to have exactly 40 characters',
    );
    expect(fault({}, { CORRAL_SERVER_KEY: 'a'.repeat(41) })).toBe(
      'serverKey (CORRAL_SERVER_KEY): Too big: expected string to have exactly 40 characters',
    );
    expect(fault({}, { CORRAL_DEAD_LETTER_MODE: 'maybe' })).toBe(
      'deadLetterMode (CORRAL_DEAD_LETTER_MODE): Invalid option: expected one of "continue"|"block"',
    );
    expect(fault({ insecure: 'yes' })).toBe('insecure (CORRAL_INSECURE): Invalid input: expected boolean, received string');
    expect(fault({ insecure: null })).toBe('insecure (CORRAL_INSECURE): Invalid input: expected boolean, received null');
  });

  it('the first bad setting in declaration order is named; conditions between settings come after', () => {
    expect(fault({}, { CORRAL_LOG_LEVEL: 'x', CORRAL_LEASE_MS: 'x', CORRAL_QUEUE: 'a b' })).toMatch(/^queueName /);
    expect(fault({}, { CORRAL_RETRY_DELAY_S: '200', CORRAL_QUEUE: 'a b' })).toMatch(/^queueName /);
    expect(fault({}, { CORRAL_RETRY_DELAY_S: '200' })).toBe('retryDelayMaxSeconds must be >= retryDelaySeconds');
    expect(fault({}, { CORRAL_LEASE_MS: '1000' })).toBe('progressIntervalMs must be shorter than leaseMs');
    expect(fault({ maxEventBytes: 600_000 })).toBe(
      'maxEventBytes (CORRAL_MAX_EVENT_BYTES): maxEventBytes must be at most half of maxMessageBytes (a turn_start carries the event and its envelope)',
    );
    expect(fault({ insecure: true, endpoint: 'tcp://0.0.0.0:5555' })).toBe(
      'insecureRemote (CORRAL_INSECURE_REMOTE): binding a non-loopback address without CURVE needs --insecure-remote (CORRAL_INSECURE_REMOTE=1) as well',
    );
  });

  it('unknown keys are dropped', () => {
    expect('bogus' in loadConfig({ bogus: 1 } as Partial<Config>)).toBe(false);
  });
});
