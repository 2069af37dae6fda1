/**
 * A real OTLP/HTTP trace receiver for tests: an HTTP server taking `POST /v1/traces` as
 * `application/x-protobuf` (decoded here from the wire format of opentelemetry-proto's
 * trace/v1 and collector/trace/v1 messages) or `application/json` (OTLP's JSON mapping), and
 * keeping every span it was sent, with the service that sent it.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { waitFor } from './wait.ts';

export type AttributeValue = string | number | boolean | AttributeValue[] | null;

export interface ReceivedSpan {
  traceId: string;
  spanId: string;
  /** '' for a root span. */
  parentSpanId: string;
  traceState: string;
  name: string;
  /** OTLP's SpanKind: 1 internal, 2 server, 3 client, 4 producer, 5 consumer. */
  kind: number;
  startNs: bigint;
  endNs: bigint;
  attributes: Record<string, AttributeValue>;
  events: { name: string; attributes: Record<string, AttributeValue> }[];
  /** OTLP's status code: 0 unset, 1 ok, 2 error. */
  status: { code: number; message: string };
  /** The sending resource's `service.name`. */
  service: string;
  /** How it came: the request's content type. */
  encoding: 'protobuf' | 'json';
}

export const SPAN_KIND = { internal: 1, server: 2, client: 3, producer: 4, consumer: 5 } as const;
export const STATUS_CODE = { unset: 0, ok: 1, error: 2 } as const;

export class OtlpReceiver {
  readonly spans: ReceivedSpan[] = [];
  /** Requests that could not be decoded (a test fails on any). */
  readonly problems: string[] = [];
  private server: Server | undefined;
  private port = 0;

  async start(): Promise<void> {
    this.server = createServer((req, res) => void this.handle(req, res));
    await new Promise<void>((resolve) => this.server!.listen(0, '127.0.0.1', resolve));
    this.port = (this.server.address() as AddressInfo).port;
  }

  /** The base endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT`); traces go to `${endpoint}/v1/traces`. */
  get endpoint(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  async stop(): Promise<void> {
    await new Promise<void>((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
  }

  /** The spans of one trace. */
  trace(traceId: string): ReceivedSpan[] {
    return this.spans.filter((s) => s.traceId === traceId);
  }

  /** Waits until `pick` finds something among the spans received. */
  async waitFor<T>(pick: (spans: ReceivedSpan[]) => T | undefined | false, what: string, timeoutMs = 15_000): Promise<T> {
    return waitFor(() => pick(this.spans) || undefined, { what, timeoutMs });
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const body = Buffer.concat(chunks);
    const type = String(req.headers['content-type'] ?? '');
    if (req.method !== 'POST' || req.url !== '/v1/traces') {
      res.writeHead(404).end();
      return;
    }
    try {
      if (type.startsWith('application/x-protobuf')) {
        this.spans.push(...decodeProtobufRequest(body));
        res.writeHead(200, { 'content-type': 'application/x-protobuf' }).end();
      } else if (type.startsWith('application/json')) {
        this.spans.push(...decodeJsonRequest(JSON.parse(body.toString('utf8')) as JsonRequest));
        res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
      } else {
        this.problems.push(`content-type ${type}`);
        res.writeHead(415).end();
      }
    } catch (e) {
      this.problems.push(String(e));
      res.writeHead(400).end();
    }
  }
}

// ---- protobuf wire format ------------------------------------------------------------------

interface Field {
  no: number;
  wire: number;
  /** varint and fixed values as bigint; length-delimited ones as bytes. */
  value: bigint | Buffer;
}

function readVarint(buf: Buffer, at: number): [bigint, number] {
  let result = 0n;
  let shift = 0n;
  for (let i = at; i < buf.length; i++) {
    const b = buf[i]!;
    result |= BigInt(b & 0x7f) << shift;
    if ((b & 0x80) === 0) return [result, i + 1];
    shift += 7n;
    if (shift > 63n) throw new Error('varint too long');
  }
  throw new Error('truncated varint');
}

function fieldsOf(buf: Buffer): Field[] {
  const out: Field[] = [];
  let at = 0;
  while (at < buf.length) {
    const [tag, next] = readVarint(buf, at);
    at = next;
    const no = Number(tag >> 3n);
    const wire = Number(tag & 7n);
    if (wire === 0) {
      const [v, n] = readVarint(buf, at);
      out.push({ no, wire, value: v });
      at = n;
    } else if (wire === 1) {
      out.push({ no, wire, value: buf.readBigUInt64LE(at) });
      at += 8;
    } else if (wire === 2) {
      const [len, n] = readVarint(buf, at);
      const end = n + Number(len);
      if (end > buf.length) throw new Error('truncated length-delimited field');
      out.push({ no, wire, value: buf.subarray(n, end) });
      at = end;
    } else if (wire === 5) {
      out.push({ no, wire, value: BigInt(buf.readUInt32LE(at)) });
      at += 4;
    } else throw new Error(`unsupported wire type ${wire}`);
  }
  return out;
}

const bytesOf = (f: Field): Buffer => f.value as Buffer;
const textOf = (f: Field): string => bytesOf(f).toString('utf8');
const all = (fs: Field[], no: number): Field[] => fs.filter((f) => f.no === no);
const one = (fs: Field[], no: number): Field | undefined => fs.find((f) => f.no === no);

/** AnyValue: 1 string, 2 bool, 3 int, 4 double, 5 array (ArrayValue: 1 values). */
function anyValue(buf: Buffer): AttributeValue {
  const fs = fieldsOf(buf);
  const f = fs[0];
  if (!f) return null;
  switch (f.no) {
    case 1:
      return textOf(f);
    case 2:
      return (f.value as bigint) !== 0n;
    case 3:
      return Number(BigInt.asIntN(64, f.value as bigint));
    case 4: {
      const b = Buffer.alloc(8);
      b.writeBigUInt64LE(f.value as bigint);
      return b.readDoubleLE();
    }
    case 5:
      return all(fieldsOf(bytesOf(f)), 1).map((v) => anyValue(bytesOf(v)));
    default:
      return null;
  }
}

/** KeyValue: 1 key, 2 value. */
function attributesOf(fields: Field[]): Record<string, AttributeValue> {
  const out: Record<string, AttributeValue> = {};
  for (const kv of fields) {
    const fs = fieldsOf(bytesOf(kv));
    const key = one(fs, 1);
    const value = one(fs, 2);
    if (key) out[textOf(key)] = value ? anyValue(bytesOf(value)) : null;
  }
  return out;
}

/** ExportTraceServiceRequest: 1 ResourceSpans (1 Resource {1 attributes}, 2 ScopeSpans {1 scope, 2 Span}). */
function decodeProtobufRequest(body: Buffer): ReceivedSpan[] {
  const out: ReceivedSpan[] = [];
  for (const rs of all(fieldsOf(body), 1)) {
    const rsf = fieldsOf(bytesOf(rs));
    const resource = one(rsf, 1);
    const service = String(resource ? (attributesOf(all(fieldsOf(bytesOf(resource)), 1))['service.name'] ?? '') : '');
    for (const ss of all(rsf, 2)) {
      for (const sp of all(fieldsOf(bytesOf(ss)), 2)) out.push(protobufSpan(fieldsOf(bytesOf(sp)), service));
    }
  }
  return out;
}

/** Span: 1 trace_id, 2 span_id, 3 trace_state, 4 parent_span_id, 5 name, 6 kind, 7/8 times, 9 attributes, 11 events, 15 status. */
function protobufSpan(fs: Field[], service: string): ReceivedSpan {
  const hex = (no: number) => {
    const f = one(fs, no);
    return f ? bytesOf(f).toString('hex') : '';
  };
  const status = one(fs, 15);
  const sf = status ? fieldsOf(bytesOf(status)) : [];
  return {
    traceId: hex(1),
    spanId: hex(2),
    traceState: one(fs, 3) ? textOf(one(fs, 3)!) : '',
    parentSpanId: hex(4),
    name: one(fs, 5) ? textOf(one(fs, 5)!) : '',
    kind: Number((one(fs, 6)?.value as bigint | undefined) ?? 0n),
    startNs: (one(fs, 7)?.value as bigint | undefined) ?? 0n,
    endNs: (one(fs, 8)?.value as bigint | undefined) ?? 0n,
    attributes: attributesOf(all(fs, 9)),
    events: all(fs, 11).map((e) => {
      const ef = fieldsOf(bytesOf(e));
      return { name: one(ef, 2) ? textOf(one(ef, 2)!) : '', attributes: attributesOf(all(ef, 3)) };
    }),
    status: { code: Number((one(sf, 3)?.value as bigint | undefined) ?? 0n), message: one(sf, 2) ? textOf(one(sf, 2)!) : '' },
    service,
    encoding: 'protobuf',
  };
}

// ---- JSON ----------------------------------------------------------------------------------

interface JsonAnyValue {
  stringValue?: string;
  boolValue?: boolean;
  intValue?: string | number;
  doubleValue?: number;
  arrayValue?: { values?: JsonAnyValue[] };
}
interface JsonKeyValue {
  key: string;
  value?: JsonAnyValue;
}
interface JsonSpan {
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  traceState?: string;
  name: string;
  kind?: number;
  startTimeUnixNano: string | number;
  endTimeUnixNano: string | number;
  attributes?: JsonKeyValue[];
  events?: { name: string; attributes?: JsonKeyValue[] }[];
  status?: { code?: number; message?: string };
}
interface JsonRequest {
  resourceSpans?: { resource?: { attributes?: JsonKeyValue[] }; scopeSpans?: { spans?: JsonSpan[] }[] }[];
}

function jsonValue(v: JsonAnyValue | undefined): AttributeValue {
  if (!v) return null;
  if (v.stringValue !== undefined) return v.stringValue;
  if (v.boolValue !== undefined) return v.boolValue;
  if (v.intValue !== undefined) return Number(v.intValue);
  if (v.doubleValue !== undefined) return v.doubleValue;
  if (v.arrayValue) return (v.arrayValue.values ?? []).map(jsonValue);
  return null;
}

const jsonAttributes = (kvs: JsonKeyValue[] | undefined): Record<string, AttributeValue> =>
  Object.fromEntries((kvs ?? []).map((kv) => [kv.key, jsonValue(kv.value)]));

/** OTLP/JSON writes ids as hex strings (not base64, unlike protobuf's canonical JSON). */
function decodeJsonRequest(req: JsonRequest): ReceivedSpan[] {
  const out: ReceivedSpan[] = [];
  for (const rs of req.resourceSpans ?? []) {
    const service = String(jsonAttributes(rs.resource?.attributes)['service.name'] ?? '');
    for (const ss of rs.scopeSpans ?? []) {
      for (const s of ss.spans ?? []) {
        out.push({
          traceId: s.traceId,
          spanId: s.spanId,
          parentSpanId: s.parentSpanId ?? '',
          traceState: s.traceState ?? '',
          name: s.name,
          kind: s.kind ?? 0,
          startNs: BigInt(s.startTimeUnixNano),
          endNs: BigInt(s.endTimeUnixNano),
          attributes: jsonAttributes(s.attributes),
          events: (s.events ?? []).map((e) => ({ name: e.name, attributes: jsonAttributes(e.attributes) })),
          status: { code: s.status?.code ?? 0, message: s.status?.message ?? '' },
          service,
          encoding: 'json',
        });
      }
    }
  }
  return out;
}
