/** W3C Trace Context as corral checks and carries it (src/base/trace-context.ts), and `turn_start.trace` on the wire. */
import { describe, expect, it } from 'vitest';
import {
  activeTraceCarrier,
  checkTraceCarrier,
  traceCarrierFromHeaders,
  traceIdsOf,
  traceparentProblem,
  tracestateProblem,
} from '../../src/base/trace-context.ts';
import { encodeFrame, parseDaemonMessage } from '../../src/fabric/protocol.ts';
import { makeTurnStart } from '../fabric/helpers.ts';

const TP = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';

describe('traceparent and tracestate', () => {
  it('takes version 00 and the first four fields of a later version; refuses the rest', () => {
    expect(traceparentProblem(TP)).toBeUndefined();
    expect(traceparentProblem(`01-${TP.slice(3)}-more`)).toBeUndefined();
    for (const bad of [
      '',
      TP.toUpperCase(),
      `ff${TP.slice(2)}`,
      `${TP}-more`,
      `00-${'0'.repeat(32)}-00f067aa0ba902b7-01`,
      `00-4bf92f3577b34da6a3ce929d0e0e4736-${'0'.repeat(16)}-01`,
      TP.slice(0, 54),
      `${TP.slice(0, 53)}x1`,
      `01-${TP.slice(3)}-${'x'.repeat(300)}`,
    ]) {
      expect(traceparentProblem(bad), bad).toBeTypeOf('string');
    }
    expect(traceparentProblem(42)).toBe('a traceparent is a string');
    expect(checkTraceCarrier({ traceparent: `01-${TP.slice(3)}-more` })).toEqual({ traceparent: TP });
    expect(checkTraceCarrier({ traceparent: TP, tracestate: '' })).toEqual({ traceparent: TP });
    expect(() => checkTraceCarrier({ traceparent: 'x' })).toThrow(/W3C traceparent/);
  });

  it('a tracestate: printable ASCII, at most 512 characters', () => {
    expect(tracestateProblem('a=1,b=2')).toBeUndefined();
    expect(tracestateProblem('x'.repeat(512))).toBeUndefined();
    expect(tracestateProblem('x'.repeat(513))).toMatch(/512/);
    expect(tracestateProblem('a=\n')).toMatch(/ASCII/);
    expect(() => checkTraceCarrier({ traceparent: TP, tracestate: 'a=é' })).toThrow(/ASCII/);
  });

  it('from headers: an invalid traceparent is ignored with its tracestate; a bad tracestate alone is dropped', () => {
    expect(traceCarrierFromHeaders({ traceparent: ` ${TP} `, tracestate: 'a=1' })).toEqual({ traceparent: TP, tracestate: 'a=1' });
    expect(traceCarrierFromHeaders({ traceparent: 'junk', tracestate: 'a=1' })).toBeUndefined();
    expect(traceCarrierFromHeaders({ traceparent: [TP, TP] })).toBeUndefined();
    expect(traceCarrierFromHeaders({ traceparent: TP, tracestate: ['a=1', 'b=2'] })).toEqual({ traceparent: TP, tracestate: 'a=1,b=2' });
    expect(traceCarrierFromHeaders({ traceparent: TP, tracestate: 'x'.repeat(600) })).toEqual({ traceparent: TP });
    expect(traceCarrierFromHeaders({})).toBeUndefined();
  });

  it('names its trace and span ids', () => {
    expect(traceIdsOf(TP)).toEqual({ traceId: '4bf92f3577b34da6a3ce929d0e0e4736', spanId: '00f067aa0ba902b7', sampled: true });
    expect(traceIdsOf(`${TP.slice(0, 53)}00`).sampled).toBe(false);
  });

  it('no OpenTelemetry registered: no active carrier', () => {
    expect(activeTraceCarrier()).toBeUndefined();
  });
});

describe('turn_start.trace', () => {
  const buf = (m: unknown) => Buffer.from(JSON.stringify(m));
  it('is optional, and when present a W3C traceparent with an optional tracestate of at most 512 characters', () => {
    const start = makeTurnStart({ text: 'hi' });
    const traced = { ...start, trace: { traceparent: TP, tracestate: 'a=1' } };
    expect(parseDaemonMessage(Buffer.from(encodeFrame(traced as never)))).toEqual({ ok: true, msg: traced });
    expect(parseDaemonMessage(buf(start)).ok).toBe(true);
    for (const trace of [
      {},
      { traceparent: 'x' },
      { traceparent: TP, tracestate: 'x'.repeat(513) },
      { traceparent: TP, tracestate: 5 },
      TP,
    ]) {
      expect(parseDaemonMessage(buf({ ...start, trace })).ok, JSON.stringify(trace)).toBe(false);
    }
  });
});
