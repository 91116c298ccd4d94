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
	if d.approvals == nil {
		d.approvals = &approvals{}
	}
	if d.approvableHosts == nil && d.Policy.Network == policy.NetworkAllowlist {
		d.approvableHosts = parseApprovable(d.Policy.NetworkApproval)
	}
	all := []Tool{
		tool(execDef(d.Policy), wrap(d, NameExec, (*Deps).checkExec, (*Deps).exec)),
		tool(jobDef(d.Policy), wrap(d, NameJob, (*Deps).checkJob, (*Deps).job)),
		tool(readDef(), wrap(d, NameReadFile, static(checkRead), (*Deps).readFile)),
		tool(writeDef(d.Policy), wrap(d, NameWriteFile, (*Deps).checkWrite, (*Deps).writeFile)),
		tool(editDef(d.Policy), wrap(d, NameEditFile, (*Deps).checkEdit, (*Deps).editFile)),
		tool(deleteDef(d.Policy), wrap(d, NameDelete, (*Deps).checkDelete, (*Deps).deletePath)),
		tool(moveDef(d.Policy), wrap(d, NameMove, (*Deps).checkMove, (*Deps).move)),
		tool(viewImageDef(), wrap(d, NameViewImage, static(checkViewImage), (*Deps).viewImage)),
		tool(listDef(), wrap(d, NameList, static(checkList), (*Deps).list)),
		tool(snapshotDef(), wrap(d, NameSnapshot, static(checkSnapshot), (*Deps).snapshot)),
		tool(restoreDef(), wrap(d, NameRestore, (*Deps).checkRestore, (*Deps).restore)),
		tool(deleteSnapshotDef(), wrap(d, NameDeleteSnapshot, as, (*Deps).deleteSnapshot)),
		tool(createDef(), wrap(d, NameCreate, as, (*Deps).create)),
		tool(statusDef(), wrap(d, NameStatus, as, (*Deps).status)),
		tool(endDef(), wrap(d, NameEnd, static(checkEnd), (*Deps).end)),
		tool(exposeDef(), wrap(d, NameExpose, (*Deps).checkExpose, (*Deps).expose)),
	}
	if d.Policy.Network == policy.NetworkAllowlist {
		// Only a sandbox with an egress proxy has hosts to drop.
		all = append(all, tool(networkDef(), wrap(d, NameNetwork, (*Deps).checkNetwork, (*Deps).network)))
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
	s.AddReceivingMiddleware(d.versions.record, d.versions.noSchemasBefore, acceptHabits, codeErrors, d.listSnapshots, d.holdArguments)
}

func ptr[T any](v T) *T { return &v }
