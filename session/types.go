package session

import (
	"github.com/sandbox-mcp/sandbox-mcp/agentclient"
	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// The requests and results of a sandbox's calls are the agent client's
// (package agentclient): a sandbox passes them through.
type (
	// ExecRequest is one command to run in a sandbox.
	ExecRequest = agentclient.ExecRequest
	// ExecResult is what a command did.
	ExecResult = agentclient.ExecResult
	// NetworkRefusal is one kind of request the egress proxy refused a sandbox.
	NetworkRefusal = agentclient.NetworkRefusal
	// ReadResult is part of a file.
	ReadResult = agentclient.ReadResult
	// WriteResult is what a write did.
	WriteResult = agentclient.WriteResult
	// Entry is one listed file.
	Entry = agentclient.Entry
	// ListOptions say what a list lists: see workspace.ListOptions.
	ListOptions = agentclient.ListOptions
	// ListResult is a list's entries, and whether it was cut short.
	ListResult = agentclient.ListResult
)

// snapshotLimits are the caps on a workspace's tar stream, both ways. The
// stream holds the workspace's bytes plus headers and padding: the workspace
// cap plus some room for those is the ceiling.
func snapshotLimits(p policy.Policy) agentproto.Limits {
	return agentproto.TreeLimits(p.MaxWorkspaceBytes + p.MaxWorkspaceBytes/8 + 1<<20)
}
