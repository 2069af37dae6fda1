/**
 * Where a sink may point (SSRF guard). A sink's URL is chosen by whoever adds the sink, possibly
 * an application acting for one of many tenants; without this guard a URL naming the daemon's own
 * host, its network or the cloud's metadata service makes the daemon POST there for it.
 *
 *  A1 An address is refused when it is unspecified, loopback, private (RFC 1918, CGNAT
 *     100.64/10), link-local (169.254/16, fe80::/10; the cloud metadata services 169.254.169.254
 *     and fd00:ec2::254 are there and in fc00::/7), unique-local (fc00::/7), site-local,
 *     multicast, broadcast or reserved, or an IPv6 address that embeds such an IPv4 address
 *     (IPv4-mapped ::ffff:0:0/96, IPv4-compatible ::/96, NAT64 64:ff9b::/96, 6to4 2002::/16).
 *  A2 Spellings do not matter: a URL's host is read as WHATWG URL parsing reads it (which is how
 *     `fetch` and `http.request` read it too), so `0x7f000001`, `2130706433`, `127.1`, `0177.1`,
 *     uppercase hex, `[::ffff:127.0.0.1]` and a trailing dot all become the address they mean
 *     before A1 judges it. `localhost` and `*.localhost` are loopback whatever the resolver says
 *     (RFC 6761).
 *  A3 At `corral sinks add` the host is judged, and a hostname's current DNS answer too (a name
 *     that does not resolve now is accepted: it is judged at each connect).
 *  A4 At each connect A1 judges the addresses the name resolves to then (`guardedLookup`, the
 *     socket's own lookup; `localhost` is judged by its answer here, since only the address
 *     connected to matters): the socket connects only to an address that passed, so a DNS answer
 *     that changed after `add` (or changes between two requests) cannot slip through, and there
 *     is no gap between the check and the connect.
 *  A5 A sink added with `--allow-private` skips A1–A4 (a receiver on the same host or network).
 */
import { BlockList, isIP, type LookupFunction } from 'node:net';
import { lookup as dnsLookup, type LookupAddress, type LookupOptions } from 'node:dns';
import { CorralError } from '../base/errors.ts';

/** A1's ranges, each with the words an error uses for it. */
const V4_RANGES: readonly [string, number, string][] = [
  ['0.0.0.0', 8, 'unspecified ("this network", 0.0.0.0/8)'],
  ['10.0.0.0', 8, 'private (10.0.0.0/8)'],
  ['100.64.0.0', 10, 'shared address space (CGNAT, 100.64.0.0/10)'],
  ['127.0.0.0', 8, 'loopback (127.0.0.0/8)'],
  ['169.254.0.0', 16, 'link-local (169.254.0.0/16, where cloud metadata services answer)'],
  ['172.16.0.0', 12, 'private (172.16.0.0/12)'],
  ['192.0.0.0', 24, 'reserved for protocol assignments (192.0.0.0/24)'],
  ['192.168.0.0', 16, 'private (192.168.0.0/16)'],
  ['198.18.0.0', 15, 'reserved for benchmarking (198.18.0.0/15)'],
  ['224.0.0.0', 4, 'multicast (224.0.0.0/4)'],
  ['240.0.0.0', 4, 'reserved or broadcast (240.0.0.0/4)'],
];
const V6_RANGES: readonly [string, number, string][] = [
  ['fc00::', 7, 'unique-local (fc00::/7)'],
  ['fe80::', 10, 'link-local (fe80::/10)'],
  ['fec0::', 10, 'site-local (fec0::/10)'],
  ['ff00::', 8, 'multicast (ff00::/8)'],
  ['100::', 64, 'discard-only (100::/64)'],
];
/** Named apart, so an error says what it is. */
const METADATA = new Map([
  ['169.254.169.254', 'the cloud metadata service (169.254.169.254)'],
  ['fd00:ec2::254', 'the cloud metadata service (fd00:ec2::254)'],
]);

function blockListOf(ranges: readonly [string, number, string][], family: 'ipv4' | 'ipv6'): { list: BlockList; why: string }[] {
  return ranges.map(([net, prefix, why]) => {
    const list = new BlockList();
    list.addSubnet(net, prefix, family);
    return { list, why };
  });
}
const V4_LISTS = blockListOf(V4_RANGES, 'ipv4');
const V6_LISTS = blockListOf(V6_RANGES, 'ipv6');

/**
 * An IPv6 address in WHATWG URL's canonical form (lower case, `::` compressed, a dotted IPv4 tail
 * in hex, the zone dropped) and its 8 groups; undefined when it is not one.
 */
function ipv6Of(address: string): { canonical: string; groups: number[] } | undefined {
  let canonical: string;
  try {
    canonical = new URL(`http://[${address.replace(/%.*$/, '')}]/`).hostname.slice(1, -1);
  } catch {
    return undefined;
  }
  const parse = (s: string) => (s === '' ? [] : s.split(':').map((g) => parseInt(g, 16)));
  const [head, tail] = canonical.includes('::') ? canonical.split('::') : [canonical, undefined];
  const h = parse(head ?? '');
  if (tail === undefined) return { canonical, groups: h };
  const t = parse(tail);
  return { canonical, groups: [...h, ...Array<number>(8 - h.length - t.length).fill(0), ...t] };
}

const v4Of = (hi: number, lo: number) => `${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`;

/**
 * A1: why `address` (an IPv4 or IPv6 address, as `net.isIP` accepts it) may not be a sink's, or
 * undefined when it may. Not an address at all: refused too.
 */
export function blockedAddressReason(address: string): string | undefined {
  const family = isIP(address);
  if (family === 4) {
    const named = METADATA.get(address);
    if (named) return named;
    return V4_LISTS.find((r) => r.list.check(address, 'ipv4'))?.why;
  }
  const v6 = family === 6 ? ipv6Of(address) : undefined;
  if (!v6) return `${JSON.stringify(address.slice(0, 60))} is not an IP address`;
  const { canonical, groups: g } = v6;
  if (canonical === '::') return 'unspecified (::)';
  if (canonical === '::1') return 'loopback (::1)';
  const named = METADATA.get(canonical);
  if (named) return named;
  // A1: an IPv6 address that carries an IPv4 one is judged by the IPv4 one
  const embedded =
    g[0] === 0 && g[1] === 0 && g[2] === 0 && g[3] === 0 && g[4] === 0 && (g[5] === 0xffff || g[5] === 0)
      ? { v4: v4Of(g[6]!, g[7]!), how: g[5] === 0xffff ? 'IPv4-mapped' : 'IPv4-compatible' }
      : g[0] === 0x64 && g[1] === 0xff9b && g[2] === 0 && g[3] === 0 && g[4] === 0 && g[5] === 0
        ? { v4: v4Of(g[6]!, g[7]!), how: 'NAT64' }
        : g[0] === 0x2002
          ? { v4: v4Of(g[1]!, g[2]!), how: '6to4' }
          : undefined;
  if (embedded) {
    const inner = blockedAddressReason(embedded.v4);
    return inner === undefined ? undefined : `${embedded.how} ${embedded.v4}: ${inner}`;
  }
  return V6_LISTS.find((r) => r.list.check(canonical, 'ipv6'))?.why;
}

/** A URL's host as an address (brackets dropped), or undefined when it is a name. */
export function hostAddress(hostname: string): string | undefined {
  const bare = hostname.startsWith('[') && hostname.endsWith(']') ? hostname.slice(1, -1) : hostname;
  return isIP(bare) === 0 ? undefined : bare;
}

/** A name RFC 6761 reserves for the host itself, whatever a resolver answers (A2). */
function isLocalhostName(hostname: string): boolean {
  const name = hostname.toLowerCase().replace(/\.+$/, '');
  return name === 'localhost' || name.endsWith('.localhost');
}

/** A1, A2 for a URL whose host is an address: why it may not be a sink's; undefined for a public address or a name. */
export function addressRefusal(url: URL): string | undefined {
  const address = hostAddress(url.hostname);
  if (address === undefined) return undefined;
  const why = blockedAddressReason(address);
  return why === undefined ? undefined : `${url.hostname} is ${why}`;
}

/**
 * A1, A2 without DNS, as `add` judges a URL: `addressRefusal`, and a name the host itself has
 * (`localhost`). Undefined for a public address or any other name (judged by what it resolves to).
 */
export function hostRefusal(url: URL): string | undefined {
  const refusal = addressRefusal(url);
  if (refusal !== undefined) return refusal;
  if (hostAddress(url.hostname) === undefined && isLocalhostName(url.hostname)) return `${url.hostname} is loopback (localhost)`;
  if (url.hostname === '') return 'the URL has no host';
  return undefined;
}

/** What `dns.lookup` with `all: true` calls back with. */
type LookupAllCallback = (err: NodeJS.ErrnoException | null, addresses: LookupAddress[]) => void;
/** A resolver in `dns.lookup`'s shape, `all: true` (tests pass their own). */
export type Resolver = (hostname: string, options: LookupOptions & { all: true }, callback: LookupAllCallback) => void;

/** The error a guarded lookup fails a connect with (A4): `code` names it for the sender. */
export class AddressRefused extends Error {
  readonly code = 'ERR_CORRAL_ADDRESS_REFUSED';
  constructor(message: string) {
    super(message);
    this.name = 'AddressRefused';
  }
}

/** The addresses of `hostname` that A1 allows; an `AddressRefused` naming the others when none is left. */
function allowedOf(hostname: string, addresses: readonly LookupAddress[]): LookupAddress[] | AddressRefused {
  const allowed = addresses.filter((a) => blockedAddressReason(a.address) === undefined);
  if (allowed.length > 0) return allowed;
  const first = addresses[0];
  const why = first ? `${first.address}, ${blockedAddressReason(first.address)}` : 'no address';
  return new AddressRefused(
    `refused to connect: ${hostname} resolves to ${why}${addresses.length > 1 ? ` (and ${addresses.length - 1} more refused)` : ''}; ` +
      'the sink does not allow private addresses (corral sinks add … --allow-private)',
  );
}

/**
 * A4: a `lookup` for `http.request` / `net.connect` that resolves as `dns.lookup` does and hands
 * the socket only the addresses A1 allows; none left fails the connect with `AddressRefused`.
 * (Node skips `lookup` for a host that is an address: `hostRefusal` judges those.)
 */
export function guardedLookup(resolve: Resolver = dnsLookup as unknown as Resolver): LookupFunction {
  return (hostname, options, callback) => {
    resolve(hostname, { ...options, all: true }, (err, addresses) => {
      if (err) {
        callback(err, options.all ? [] : '', undefined);
        return;
      }
      const allowed = allowedOf(hostname, addresses);
      if (allowed instanceof AddressRefused) callback(allowed, options.all ? [] : '', undefined);
      else if (options.all) callback(null, allowed);
      else callback(null, allowed[0]!.address, allowed[0]!.family);
    });
  };
}

/** How long `add` waits for a hostname's DNS answer before taking the URL unchecked (A3). */
const ADD_LOOKUP_MS = 3_000;

/**
 * A3: refuses (`invalid_argument`) a sink URL whose host is, or now resolves only to, an address
 * A1 refuses; `allowPrivate` skips it (A5). A name that does not resolve (or not within a few
 * seconds) is accepted: the connect-time check (A4) judges it at every request.
 */
export async function checkSinkHost(
  url: URL,
  opts: { allowPrivate: boolean; resolve?: Resolver; timeoutMs?: number; given?: string },
): Promise<void> {
  if (opts.allowPrivate) return;
  // the URL as the operator wrote it: `0x7f000001` is not obviously 127.0.0.1
  const given = JSON.stringify((opts.given ?? url.href).slice(0, 200));
  const refusal = hostRefusal(url);
  const hint = 'a sink may not point at this host or its network; add it with --allow-private (allowPrivate: true) if it should';
  if (refusal) throw new CorralError('invalid_argument', `--url ${given}: ${refusal}: ${hint}`, { details: { refusal } });
  if (hostAddress(url.hostname) !== undefined) return;
  const resolve = opts.resolve ?? (dnsLookup as unknown as Resolver);
  const addresses = await new Promise<LookupAddress[] | undefined>((done) => {
    const timer = setTimeout(() => done(undefined), opts.timeoutMs ?? ADD_LOOKUP_MS);
    timer.unref();
    resolve(url.hostname, { all: true }, (err, found) => {
      clearTimeout(timer);
      done(err ? undefined : found);
    });
  });
  if (!addresses || addresses.length === 0) return;
  const allowed = allowedOf(url.hostname, addresses);
  if (allowed instanceof AddressRefused) {
    const blocked = addresses.map((a) => `${a.address} (${blockedAddressReason(a.address)})`).join(', ');
    throw new CorralError('invalid_argument', `--url ${given}: ${url.hostname} resolves to ${blocked}: ${hint}`, {
      details: { refusal: blocked },
    });
  }
}
