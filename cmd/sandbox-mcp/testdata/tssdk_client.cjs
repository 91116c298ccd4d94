// The TypeScript MCP SDK's client (@modelcontextprotocol/sdk), as bundled
// in the MCP conformance suite (../shared/tools/mcp-conformance.cjs), drives
// the server: TestTypeScriptSDKClient runs it.
//
//   node tssdk_client.cjs BUNDLE PROTOCOL stdio SERVER ARGS...
//   node tssdk_client.cjs BUNDLE PROTOCOL http URL
//
// The bundle is a command line tool that exports nothing: its source is
// evaluated up to the tool's own start (`var $ = new Command();`), with the
// SDK's Client and StreamableHTTPClientTransport handed out before it. The
// SDK asks for its LATEST_PROTOCOL_VERSION in initialize; PROTOCOL replaces
// that value, as an older SDK release would send its own. The SDK has a
// stdio transport, but the bundle does not hold it: the newline-delimited
// JSON-RPC below is that transport's whole job. It prints one JSON line: what
// the client saw.
"use strict";
const fs = require("fs");
const path = require("path");
const Module = require("module");
const { spawn } = require("child_process");

const [bundle, protocol, mode, ...rest] = process.argv.slice(2);
let src = fs.readFileSync(bundle, "utf8").replace(/^#!.*\n/, "");
const marker = "\nvar $ = new Command();\n";
const at = src.indexOf(marker);
if (at < 0 || !/\nvar Client = class extends Protocol \{/.test(src) || !/\nvar StreamableHTTPClientTransport = class \{/.test(src)) {
  console.log(JSON.stringify({ nosdk: "the bundle does not hold the SDK's Client where this script looks for it" }));
  process.exit(3);
}
src = src.slice(0, at) +
  "\nmodule.exports = { Client, StreamableHTTPClientTransport, supported: SUPPORTED_PROTOCOL_VERSIONS, latest: LATEST_PROTOCOL_VERSION, ask(v) { LATEST_PROTOCOL_VERSION = v; } };\nreturn;\n" +
  src.slice(at);
const mod = new Module(bundle, null);
mod.filename = bundle;
mod.paths = Module._nodeModulePaths(path.dirname(bundle));
mod._compile(src, bundle);
const sdk = mod.exports;

class StdioTransport {
  constructor(cmd, args) { this.cmd = cmd; this.args = args; this.buf = ""; }
  async start() {
    this.proc = spawn(this.cmd, this.args, { stdio: ["pipe", "pipe", "inherit"] });
    this.proc.stdout.setEncoding("utf8");
    this.proc.stdout.on("data", (d) => {
      this.buf += d;
      for (let i; (i = this.buf.indexOf("\n")) >= 0;) {
        const line = this.buf.slice(0, i);
        this.buf = this.buf.slice(i + 1);
        if (line.trim() !== "") this.onmessage?.(JSON.parse(line));
      }
    });
    this.proc.on("exit", () => this.onclose?.());
    this.proc.on("error", (e) => this.onerror?.(e));
  }
  async send(msg) { this.proc.stdin.write(JSON.stringify(msg) + "\n"); }
  setProtocolVersion(v) { this.protocolVersion = v; }
  async close() {
    this.proc.stdin.end();
    await new Promise((r) => { if (this.proc.exitCode !== null) r(); else this.proc.on("exit", r); });
  }
}

async function main() {
  if (!sdk.supported.includes(protocol)) throw new Error(`the SDK does not support ${protocol} (it supports ${sdk.supported.join(", ")})`);
  sdk.ask(protocol);
  const transport = mode === "stdio" ? new StdioTransport(rest[0], rest.slice(1)) : new sdk.StreamableHTTPClientTransport(new URL(rest[0]));
  const client = new sdk.Client({ name: "ts-sdk-e2e", version: "0" });
  await client.connect(transport);
  const out = { sdkLatest: sdk.latest, negotiated: transport.protocolVersion, server: client.getServerVersion(),
    instructions: (client.getInstructions() || "").length };
  out.tools = (await client.listTools()).tools.map((t) => t.name).sort();
  // callTool checks structuredContent against each tool's outputSchema.
  const exec = await client.callTool({ name: "sandbox_exec", arguments: { argv: ["sh", "-c", "echo hi; exit 3"] } });
  out.exec = { isError: !!exec.isError, structured: exec.structuredContent, text: exec.content?.[0]?.text };
  const w = await client.callTool({ name: "sandbox_write_file", arguments: { path: "a.txt", content: "from ts\n" } });
  const r = await client.callTool({ name: "sandbox_read_file", arguments: { path: "a.txt" } });
  out.read = { isError: !!(w.isError || r.isError), content: r.structuredContent?.content, text: r.content?.[0]?.text };
  const bad = await client.callTool({ name: "sandbox_read_file", arguments: { path: "../etc/passwd" } });
  out.bad = { isError: !!bad.isError, text: bad.content?.[0]?.text };
  const res = await client.readResource({ uri: "sandbox://policy" });
  out.policy = res.contents[0].uri;
  await client.close();
  console.log(JSON.stringify(out));
}
main().catch((e) => { console.log(JSON.stringify({ error: String(e && e.stack || e) })); process.exit(1); });
