/**
 * Reads a V8 heap snapshot (the JSON `--heapsnapshot-signal` writes) and counts its objects by
 * name (constructor for objects, "(string)" etc. for the rest): count and self size in bytes.
 */
export function heapCounts(json: string): Map<string, { count: number; bytes: number }> {
  const snap = JSON.parse(json) as {
    snapshot: { meta: { node_fields: string[]; node_types: [string[], ...unknown[]] } };
    nodes: number[];
    strings: string[];
  };
  const fields = snap.snapshot.meta.node_fields;
  const width = fields.length;
  const typeAt = fields.indexOf('type');
  const nameAt = fields.indexOf('name');
  const sizeAt = fields.indexOf('self_size');
  const types = snap.snapshot.meta.node_types[0];
  const out = new Map<string, { count: number; bytes: number }>();
  for (let i = 0; i < snap.nodes.length; i += width) {
    const type = types[snap.nodes[i + typeAt]!] ?? '?';
    const name =
      type === 'object' || type === 'closure'
        ? `${snap.strings[snap.nodes[i + nameAt]!]}${type === 'closure' ? ' (closure)' : ''}`
        : `(${type})`;
    const e = out.get(name) ?? { count: 0, bytes: 0 };
    e.count++;
    e.bytes += snap.nodes[i + sizeAt]!;
    out.set(name, e);
  }
  return out;
}
