// One MCP client session over stdio against one server: PAIRS write+read
// pairs of a 1 KiB file (write new content, read it back), timed per call.
// Prints one line: LABEL read_p50 read_p99 write_p50 write_p99 (ms).
//
// Usage: node client.mjs LABEL PAIRS WARMUP FILE -- SERVER_CMD [ARGS...]
// FILE is the path as the server names it (relative for loomfs, absolute
// for the reference server). The tool names are found in the server's
// tool list: workspace_write/workspace_read, or write_file and
// read_text_file (read_file on older reference servers).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [label, pairsArg, warmupArg, file, sep, command, ...args] = process.argv.slice(2);
if (sep !== "--" || !command) {
  console.error("usage: node client.mjs LABEL PAIRS WARMUP FILE -- SERVER_CMD [ARGS...]");
  process.exit(2);
}
const pairs = Number(pairsArg);
const warmup = Number(warmupArg);

const transport = new StdioClientTransport({ command, args, stderr: "inherit" });
const client = new Client({ name: "loomfs-bench", version: "1.0.0" });
await client.connect(transport);

const { tools } = await client.listTools();
const names = new Set(tools.map((t) => t.name));
const pick = (...candidates) => {
  const n = candidates.find((c) => names.has(c));
  if (!n) throw new Error(`${label}: none of ${candidates} in tool list: ${[...names]}`);
  return n;
};
const writeTool = pick("workspace_write", "write_file");
const readTool = pick("workspace_read", "read_text_file", "read_file");

// 1 KiB of text, unique per pair: a marker line padded to 1024 bytes.
const content = (i) => {
  const head = `pair ${i} ${label}\n`;
  return head + "x".repeat(1023 - head.length) + "\n";
};

async function call(name, args) {
  const t0 = performance.now();
  const res = await client.callTool({ name, arguments: args });
  const ms = performance.now() - t0;
  if (res.isError) throw new Error(`${label}: ${name}: ${JSON.stringify(res.content)}`);
  return { ms, res };
}

const reads = [];
const writes = [];
for (let i = 0; i < warmup + pairs; i++) {
  const text = content(i);
  const w = await call(writeTool, { path: file, content: text });
  const r = await call(readTool, { path: file });
  // The read must see this pair's write.
  const got = JSON.stringify(r.res.content) + JSON.stringify(r.res.structuredContent ?? "");
  if (!got.includes(`pair ${i} `)) throw new Error(`${label}: read ${i} did not return the content just written`);
  if (i >= warmup) {
    writes.push(w.ms);
    reads.push(r.ms);
  }
}
await client.close();

// Nearest-rank percentile.
const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)];
};
const f = (x) => x.toFixed(3);
console.log([label, f(pct(reads, 50)), f(pct(reads, 99)), f(pct(writes, 50)), f(pct(writes, 99))].join(" "));
