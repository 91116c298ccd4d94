// Package layout holds no code. Its test checks, with `go list -deps`, the
// import rules that keep the tree's trust boundary visible:
//
//   - The server does not link the in-container program: no package of the
//     host side (cmd/sandbox-mcp, cmd/sandbox-bench, session, tools, policy,
//     netproxy, internal/audit, internal/httpguard and everything they
//     import) is or imports agent.
//   - The agent links no host package: cmd/sandbox-agent imports, of this
//     module, only agent and the packages both sides share (agentproto,
//     workspace, internal/errcode), and of the rest only the standard
//     library and golang.org/x/sys, so neither the Docker client nor the MCP
//     SDK ends up inside a sandbox.
//   - tools imports neither netproxy nor internal/audit: the audit log sits
//     beside both and main wires it to each.
//   - internal/httpguard links neither cmd/sandbox-mcp, tools nor session:
//     it takes its own Options and ends sessions through an interface.
//   - The backend seam (session/backend), which a second backend builds on,
//     links no Docker package: Docker lives in session/engine.
//   - The snapshot store (snapshot) and `sandbox-mcp snapshot`
//     (cmd/sandbox-mcp/internal/snapshotcli) link neither session nor
//     Docker: they work on the state directory with no engine at all.
//
// Test files are left out: a test may run both ends of the protocol in one
// process.
package layout
