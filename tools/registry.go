package tools

import (
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// Tool is one tool as data: its definition and how to add it to a server.
type Tool struct {
	Def *mcp.Tool
	add func(*mcp.Server, *mcp.Tool)
}

// All returns every tool, bound to d.
func All(d *Deps) []Tool {
	if d.budget == nil {
		if d.Memory == nil {
			d.Memory = NewMemory(d.Policy)
		}
		d.budget = d.Memory.b
	}
	if d.versions == nil {
		d.versions = newVersions()
	}
	if d.approvableHosts == nil && d.Policy.Network == policy.NetworkAllowlist {
		d.approvableHosts = parseApprovable(d.Policy.NetworkApproval)
	}
	all := []Tool{
		tool(execDef(d.Policy), wrap(d, NameExec, d.checkExec, d.exec)),
		tool(jobDef(d.Policy), wrap(d, NameJob, d.checkJob, d.job)),
		tool(readDef(), wrap(d, NameReadFile, checkRead, d.readFile)),
		tool(writeDef(d.Policy), wrap(d, NameWriteFile, d.checkWrite, d.writeFile)),
		tool(editDef(d.Policy), wrap(d, NameEditFile, d.checkEdit, d.editFile)),
		tool(deleteDef(d.Policy), wrap(d, NameDelete, d.checkDelete, d.deletePath)),
		tool(moveDef(d.Policy), wrap(d, NameMove, d.checkMove, d.move)),
		tool(viewImageDef(), wrap(d, NameViewImage, checkViewImage, d.viewImage)),
		tool(listDef(), wrap(d, NameList, checkList, d.list)),
		tool(snapshotDef(), wrap(d, NameSnapshot, checkSnapshot, d.snapshot)),
		tool(restoreDef(), wrap(d, NameRestore, d.checkRestore, d.restore)),
		tool(deleteSnapshotDef(), wrap(d, NameDeleteSnapshot, as, d.deleteSnapshot)),
	}
	if d.Policy.Network == policy.NetworkAllowlist {
		// Only a sandbox with an egress proxy has hosts to drop.
		all = append(all, tool(networkDef(), wrap(d, NameNetwork, d.checkNetwork, d.network)))
	}
	return all
}

func tool[In, Out any](def *mcp.Tool, h mcp.ToolHandlerFor[In, Out]) Tool {
	return Tool{Def: def, add: func(s *mcp.Server, t *mcp.Tool) { mcp.AddTool(s, t, h) }}
}

// Register adds every tool and resource to s.
func Register(s *mcp.Server, d *Deps) {
	for _, t := range All(d) {
		t.add(s, t.Def)
	}
	registerResources(s, d)
	s.AddReceivingMiddleware(d.versions.record, acceptHabits, codeErrors, d.listSnapshots, d.holdArguments)
}

func ptr[T any](v T) *T { return &v }
