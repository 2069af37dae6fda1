/**
 * Trace export settings from OpenTelemetry's standard environment variables
 * (https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/ and the OTLP
 * exporter's), read without loading any OpenTelemetry code: tracing is off unless an OTLP
 * endpoint is set, and then src/observability/tracing.ts is imported.
 */
import { CorralError } from '../base/errors.ts';

export type OtlpProtocol = 'http/protobuf' | 'http/json';

export type SamplerSetting =
  | { kind: 'always_on' | 'always_off' | 'parentbased_always_on' | 'parentbased_always_off' }
  | { kind: 'traceidratio' | 'parentbased_traceidratio'; ratio: number };

export interface TracingSettings {
  /** Where spans are POSTed: the traces endpoint as given, or the base endpoint + `/v1/traces`. */
  url: string;
  protocol: OtlpProtocol;
  serviceName: string;
  /** `OTEL_EXPORTER_OTLP_(TRACES_)HEADERS`: `key=value` pairs, comma separated, values URL-decoded. */
  headers: Record<string, string>;
  sampler: SamplerSetting;
  /** The batch span processor (`OTEL_BSP_*`). */
  batch: { scheduledDelayMillis: number; exportTimeoutMillis: number; maxQueueSize: number; maxExportBatchSize: number };
}

type Env = Record<string, string | undefined>;

const SAMPLERS = new Set([
  'always_on',
  'always_off',
  'traceidratio',
  'parentbased_always_on',
  'parentbased_always_off',
  'parentbased_traceidratio',
]);

const value = (env: Env, name: string): string | undefined => {
  const v = env[name]?.trim();
  return v === undefined || v === '' ? undefined : v;
};

/** The settings `env` asks for; undefined when tracing is off (no OTLP endpoint, `OTEL_SDK_DISABLED=true`, or `OTEL_TRACES_EXPORTER=none`). */
export function tracingSettings(env: Env, defaultServiceName: string): TracingSettings | undefined {
  if (value(env, 'OTEL_SDK_DISABLED')?.toLowerCase() === 'true') return undefined;
  const exporter = value(env, 'OTEL_TRACES_EXPORTER')?.toLowerCase();
  if (exporter === 'none') return undefined;
  if (exporter !== undefined && exporter !== 'otlp') {
    throw invalid(`OTEL_TRACES_EXPORTER=${exporter}: corral exports traces over OTLP only (otlp or none)`);
  }
  const url = tracesUrl(env);
  if (url === undefined) return undefined;
  return {
    url,
    protocol: protocolOf(env),
    serviceName: value(env, 'OTEL_SERVICE_NAME') ?? defaultServiceName,
    headers: headersOf(value(env, 'OTEL_EXPORTER_OTLP_TRACES_HEADERS') ?? value(env, 'OTEL_EXPORTER_OTLP_HEADERS')),
    sampler: samplerOf(env),
    batch: {
      scheduledDelayMillis: intOf(env, 'OTEL_BSP_SCHEDULE_DELAY', 5_000, 0),
      exportTimeoutMillis: intOf(env, 'OTEL_BSP_EXPORT_TIMEOUT', 30_000, 1),
      maxQueueSize: intOf(env, 'OTEL_BSP_MAX_QUEUE_SIZE', 2_048, 1),
      maxExportBatchSize: Math.min(intOf(env, 'OTEL_BSP_MAX_EXPORT_BATCH_SIZE', 512, 1), intOf(env, 'OTEL_BSP_MAX_QUEUE_SIZE', 2_048, 1)),
    },
  };
}

function tracesUrl(env: Env): string | undefined {
  const traces = value(env, 'OTEL_EXPORTER_OTLP_TRACES_ENDPOINT');
  const base = value(env, 'OTEL_EXPORTER_OTLP_ENDPOINT');
  const name = traces !== undefined ? 'OTEL_EXPORTER_OTLP_TRACES_ENDPOINT' : 'OTEL_EXPORTER_OTLP_ENDPOINT';
  const raw = traces ?? base;
  if (raw === undefined) return undefined;
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw invalid(`${name}=${raw}: not a URL (e.g. http://localhost:4318)`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw invalid(`${name}=${raw}: an OTLP/HTTP endpoint is http:// or https://`);
  // the signal-specific variable is the whole URL; the base one gets the signal's path (the spec's rule)
  return traces !== undefined ? url.href : `${url.href.replace(/\/+$/, '')}/v1/traces`;
}

function protocolOf(env: Env): OtlpProtocol {
  const name =
    value(env, 'OTEL_EXPORTER_OTLP_TRACES_PROTOCOL') !== undefined ? 'OTEL_EXPORTER_OTLP_TRACES_PROTOCOL' : 'OTEL_EXPORTER_OTLP_PROTOCOL';
  const p = value(env, name) ?? 'http/protobuf';
  if (p === 'http/protobuf' || p === 'http/json') return p;
  throw invalid(`${name}=${p}: corral exports over OTLP/HTTP: http/protobuf or http/json (a collector can take grpc onward)`);
}

function samplerOf(env: Env): SamplerSetting {
  const kind = (value(env, 'OTEL_TRACES_SAMPLER') ?? 'parentbased_always_on').toLowerCase();
  if (!SAMPLERS.has(kind)) throw invalid(`OTEL_TRACES_SAMPLER=${kind}: expected one of ${[...SAMPLERS].join(', ')}`);
  if (kind !== 'traceidratio' && kind !== 'parentbased_traceidratio') return { kind } as SamplerSetting;
  const arg = value(env, 'OTEL_TRACES_SAMPLER_ARG');
  const ratio = arg === undefined ? 1 : Number(arg);
  if (!Number.isFinite(ratio) || ratio < 0 || ratio > 1) throw invalid(`OTEL_TRACES_SAMPLER_ARG=${arg}: a ratio from 0 to 1`);
  return { kind, ratio };
}

function intOf(env: Env, name: string, fallback: number, min: number): number {
  const raw = value(env, name);
  if (raw === undefined) return fallback;
  const n = Number(raw);
  if (!Number.isSafeInteger(n) || n < min) throw invalid(`${name}=${raw}: an integer of at least ${min}`);
  return n;
}

/** `k1=v1,k2=v2` (W3C baggage-like, values URL-encoded), as the OTLP exporter specification writes headers. */
function headersOf(raw: string | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  if (raw === undefined) return out;
  for (const part of raw.split(',')) {
    if (part.trim() === '') continue;
    const eq = part.indexOf('=');
    const key = eq > 0 ? part.slice(0, eq).trim() : '';
    if (!/^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/.test(key)) throw invalid('OTEL_EXPORTER_OTLP_HEADERS: expected key=value pairs, comma separated');
    try {
      out[key.toLowerCase()] = decodeURIComponent(part.slice(eq + 1).trim());
    } catch {
      throw invalid(`OTEL_EXPORTER_OTLP_HEADERS: the value of ${key} is not URL-encoded text`);
    }
  }
  return out;
}

const invalid = (message: string) => new CorralError('invalid_config', message);
