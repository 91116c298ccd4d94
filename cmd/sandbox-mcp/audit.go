package main

import (
	"fmt"
	"io"

	"github.com/sandbox-mcp/sandbox-mcp/cmd/sandbox-mcp/internal/audit"
	"github.com/sandbox-mcp/sandbox-mcp/tools"
)

const auditUsage = `Usage:
  sandbox-mcp audit digest [flags] < ARGS   print the audit log's arg_digest of a tool call's arguments

ARGS is the call's "arguments" object as JSON; whitespace outside strings
does not matter. The digest is keyed with the server's key in
--state-dir/audit.key, so use the server's --state-dir (or --config).
Flags are the server's; see sandbox-mcp -h.
`

// maxAuditArgs bounds what audit digest reads from stdin: a little more
// than any tool call's arguments can be.
const maxAuditArgs = 64 << 20

// auditCmd serves the operator's side of the audit log: checking which
// arguments a recorded digest stands for.
func auditCmd(args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) == 0 || args[0] != "digest" {
		fmt.Fprint(stderr, auditUsage)
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			return 0
		}
		return 2
	}
	cfg, rest, err := parseConfig(args[1:], getenv)
	if err == nil && len(rest) > 0 {
		err = fmt.Errorf("unexpected argument %q: the arguments JSON goes on stdin", rest[0])
	}
	if err != nil {
		fmt.Fprintf(stderr, "sandbox-mcp audit digest: %v\n", err)
		return 2
	}
	// Read the key, never make one: a new key would give digests that
	// match nothing in the log.
	key, err := audit.ReadKey(cfg.StateDir)
	if err != nil {
		fmt.Fprintf(stderr, "sandbox-mcp audit digest: %v (the server makes the key at its first start with --audit-log; name its --state-dir)\n", err)
		return 1
	}
	in, err := io.ReadAll(io.LimitReader(stdin, maxAuditArgs+1))
	if err != nil {
		fmt.Fprintf(stderr, "sandbox-mcp audit digest: read stdin: %v\n", err)
		return 1
	}
	if len(in) > maxAuditArgs {
		fmt.Fprintf(stderr, "sandbox-mcp audit digest: more than %d bytes on stdin; no tool call's arguments are that large\n", maxAuditArgs)
		return 1
	}
	fmt.Fprintln(stdout, audit.Digest(key, in))
	return 0
}

// auditTool is what the tools report of a call, as the audit log's record
// of it: the log, not the tools, decides how the line reads.
func auditTool(r tools.Record) audit.ToolRecord {
	return audit.ToolRecord{
		Time: r.Time, Caller: r.Caller, Session: r.Session, Sandbox: r.Sandbox, Tool: r.Tool,
		ArgDigest: r.ArgDigest, Args: r.Args, Decision: r.Decision, Reason: r.Reason,
		ExitCode: r.ExitCode, Bytes: r.Bytes, Duration: r.Duration,
	}
}

// auditApproval is an approval question or answer as the audit log's
// record of it.
func auditApproval(r tools.ApprovalRecord) audit.ApprovalRecord {
	return audit.ApprovalRecord{
		Time: r.Time, Event: r.Event, Caller: r.Caller, Session: r.Session, Sandbox: r.Sandbox, Tool: r.Tool,
		Host: r.Host, Port: r.Port, Pattern: r.Pattern, Answer: r.Answer, Detail: r.Detail,
	}
}
