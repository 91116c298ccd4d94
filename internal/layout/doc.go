// Package layout holds no code. Its test checks, with `go list -deps`, the
// import rules that keep the tree's trust boundary visible:
//
//   - The server does not link the in-container program: no package of the
//     host side (cmd/sandbox-mcp and its internal packages, cmd/sandbox-bench,
//     session, tools, policy, netproxy and everything they import) is or
//     imports agent.
//   - The agent links no host package: cmd/sandbox-agent imports, of this
//     module, only agent and the packages both sides share (agentproto,
//     workspace, internal/errcode), and of the rest only the standard
//     library and golang.org/x/sys, so neither the Docker client nor the MCP
//     SDK ends up inside a sandbox.
//   - tools imports no netproxy, and the audit log
//     (cmd/sandbox-mcp/internal/audit) imports no tools: the audit log owns
//     its line format, and main turns what the tools report into it.
//   - cmd/sandbox-mcp/internal/httpguard links neither cmd/sandbox-mcp,
//     tools nor session: it takes its own Options and ends sessions through
//     an interface.
//   - policy is pure: of this module it links only internal/errcode.
//   - internal/ holds what several programs or packages share: a package
//     only one command's packages import lives under cmd/NAME/internal/.
//   - The backend seam (session/backend), which every backend builds on,
//     links no Docker package: Docker lives in its backend,
//     session/backend/docker. The backends (session/backend/docker,
//     session/backend/kube) are siblings: neither links the other.
//   - session (the registry and the state machine) links no backend and no
//     Docker package: main builds the backend and hands it over
//     (Options.Backend).
//   - The snapshot store (snapshot) and `sandbox-mcp snapshot`
//     (cmd/sandbox-mcp/internal/snapshotcli) link neither session nor
//     Docker: they work on the state directory with no engine at all.
//
// Test files are left out: a test may run both ends of the protocol in one
// process. One `go list -deps` call lists the graph every rule reads.
package layout
