/** OpenTelemetry's environment variables as corral reads them (src/observability/tracing-settings.ts). */
import { describe, expect, it } from 'vitest';
import { tracingSettings } from '../../src/observability/tracing-settings.ts';
import { CorralError } from '../../src/base/errors.ts';

const codeOf = (fn: () => unknown): string | undefined => {
  try {
    fn();
    return undefined;
  } catch (e) {
    return e instanceof CorralError ? `${e.code}: ${e.message}` : String(e);
  }
};

describe('tracing settings from the environment', () => {
  it('is off without an OTLP endpoint, when the SDK is disabled, or with the exporter none', () => {
    expect(tracingSettings({}, 'svc')).toBeUndefined();
    expect(tracingSettings({ OTEL_EXPORTER_OTLP_ENDPOINT: '  ' }, 'svc')).toBeUndefined();
    expect(tracingSettings({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:4318', OTEL_SDK_DISABLED: 'TRUE' }, 'svc')).toBeUndefined();
    expect(tracingSettings({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:4318', OTEL_TRACES_EXPORTER: 'none' }, 'svc')).toBeUndefined();
  });

  it('defaults: http/protobuf, the base endpoint + /v1/traces, parent-based always-on, the batch processor’s defaults', () => {
    expect(tracingSettings({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318/' }, 'corral-daemon')).toEqual({
      url: 'http://collector:4318/v1/traces',
      protocol: 'http/protobuf',
      serviceName: 'corral-daemon',
      headers: {},
      sampler: { kind: 'parentbased_always_on' },
      batch: { scheduledDelayMillis: 5_000, exportTimeoutMillis: 30_000, maxQueueSize: 2_048, maxExportBatchSize: 512 },
    });
  });

  it('the traces endpoint is taken as it is, and wins; the signal’s protocol and headers win too', () => {
    const s = tracingSettings(
      {
        OTEL_EXPORTER_OTLP_ENDPOINT: 'http://base:4318',
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'https://traces.example/custom/path',
        OTEL_EXPORTER_OTLP_PROTOCOL: 'http/protobuf',
        OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: 'http/json',
        OTEL_EXPORTER_OTLP_HEADERS: 'a=1',
        OTEL_EXPORTER_OTLP_TRACES_HEADERS: 'Api-Key=s%20ecret, x-tenant = t1',
        OTEL_SERVICE_NAME: 'mine',
        OTEL_TRACES_SAMPLER: 'parentbased_traceidratio',
        OTEL_TRACES_SAMPLER_ARG: '0.25',
        OTEL_BSP_SCHEDULE_DELAY: '100',
        OTEL_BSP_MAX_QUEUE_SIZE: '10',
        OTEL_BSP_MAX_EXPORT_BATCH_SIZE: '50',
      },
      'svc',
    )!;
    expect(s.url).toBe('https://traces.example/custom/path');
    expect(s.protocol).toBe('http/json');
    expect(s.headers).toEqual({ 'api-key': 's ecret', 'x-tenant': 't1' });
    expect(s.serviceName).toBe('mine');
    expect(s.sampler).toEqual({ kind: 'parentbased_traceidratio', ratio: 0.25 });
    // a batch is never larger than the queue
    expect(s.batch).toMatchObject({ scheduledDelayMillis: 100, maxQueueSize: 10, maxExportBatchSize: 10 });
  });

  it('refuses what it cannot honour, naming the variable', () => {
    const base = { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:4318' };
    const cases: [Record<string, string>, string][] = [
      [{ OTEL_EXPORTER_OTLP_ENDPOINT: 'not a url' }, 'OTEL_EXPORTER_OTLP_ENDPOINT=not a url'],
      [{ OTEL_EXPORTER_OTLP_ENDPOINT: 'grpc://c:4317' }, 'http:// or https://'],
      [{ ...base, OTEL_EXPORTER_OTLP_PROTOCOL: 'grpc' }, 'OTEL_EXPORTER_OTLP_PROTOCOL=grpc'],
      [{ ...base, OTEL_TRACES_EXPORTER: 'zipkin' }, 'OTEL_TRACES_EXPORTER=zipkin'],
      [{ ...base, OTEL_TRACES_SAMPLER: 'sometimes' }, 'OTEL_TRACES_SAMPLER=sometimes'],
      [{ ...base, OTEL_TRACES_SAMPLER: 'traceidratio', OTEL_TRACES_SAMPLER_ARG: '2' }, 'OTEL_TRACES_SAMPLER_ARG=2'],
      [{ ...base, OTEL_BSP_SCHEDULE_DELAY: '-1' }, 'OTEL_BSP_SCHEDULE_DELAY=-1'],
      [{ ...base, OTEL_BSP_MAX_QUEUE_SIZE: '1.5' }, 'OTEL_BSP_MAX_QUEUE_SIZE=1.5'],
      [{ ...base, OTEL_EXPORTER_OTLP_HEADERS: 'novalue' }, 'OTEL_EXPORTER_OTLP_HEADERS'],
      [{ ...base, OTEL_EXPORTER_OTLP_HEADERS: 'k=%E0%A4%A' }, 'not URL-encoded'],
    ];
    for (const [env, says] of cases) {
      const got = codeOf(() => tracingSettings(env, 'svc'));
      expect(got, JSON.stringify(env)).toMatch(/^invalid_config: /);
      expect(got, JSON.stringify(env)).toContain(says);
    }
  });

  it('a ratio sampler without an argument samples everything', () => {
    expect(tracingSettings({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c', OTEL_TRACES_SAMPLER: 'traceidratio' }, 's')!.sampler).toEqual({
      kind: 'traceidratio',
      ratio: 1,
    });
  });
});
