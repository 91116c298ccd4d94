package tools

import (
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// Tool names (fixed by the contract).
const (
	NameExec      = "sandbox_exec"
	NameReadFile  = "sandbox_read_file"
	NameWriteFile = "sandbox_write_file"
	NameList      = "sandbox_list"
	NameSnapshot  = "sandbox_snapshot"
)

// Tool is one tool as data: its definition and how to add it to a server.
type Tool struct {
	Def *mcp.Tool
	add func(*mcp.Server, *mcp.Tool)
}

// All returns every tool, bound to d.
func All(d *Deps) []Tool {
	if d.budget == nil {
		d.budget = newBudget(d.Policy.MaxInflightBytes, d.Policy.MaxSessionInflightBytes)
	}
	return []Tool{
		tool(execDef(d.Policy), wrap(d, NameExec, d.exec)),
		tool(jobDef(d.Policy), wrap(d, NameJob, d.job)),
		tool(readDef(), wrap(d, NameReadFile, d.readFile)),
		tool(writeDef(d.Policy), wrap(d, NameWriteFile, d.writeFile)),
		tool(editDef(d.Policy), wrap(d, NameEditFile, d.editFile)),
		tool(deleteDef(d.Policy), wrap(d, NameDelete, d.deletePath)),
		tool(moveDef(d.Policy), wrap(d, NameMove, d.move)),
		tool(viewImageDef(), wrap(d, NameViewImage, d.viewImage)),
		tool(listDef(), wrap(d, NameList, d.list)),
		tool(snapshotDef(), wrap(d, NameSnapshot, d.snapshot)),
		tool(restoreDef(), wrap(d, NameRestore, d.restore)),
		tool(deleteSnapshotDef(), wrap(d, NameDeleteSnapshot, d.deleteSnapshot)),
	}
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
	s.AddReceivingMiddleware(codeErrors, d.listSnapshots, d.holdArguments)
}

func ptr[T any](v T) *T { return &v }

func execDef(p policy.Policy) *mcp.Tool {
	desc := "Run a command in this session's sandbox (a Linux container with no network unless the server allows some hosts) and return its exit code and output. " +
		"Give argv (a program and its arguments, no shell) or command (a shell line). " +
		"The working directory is /workspace (or cwd, relative to it); files persist between calls, the shell's cd and variables do not. " +
		"A non-zero exit code is a normal result. Past timeout_ms the command is killed with every process it started. " +
		"Long output keeps its head and tail; the rest is read with sandbox_job. background: true returns at once (servers, watchers, long builds)."
	switch p.Exec {
	case policy.ExecAllowlist:
		desc += " Only these commands may run: " + joinComma(p.AllowCmds) + "."
	case policy.ExecDeny:
		desc += " This server does not run commands; every call is refused."
	}
	return &mcp.Tool{
		Name:         NameExec,
		Title:        "Run a command in the sandbox",
		Description:  desc,
		InputSchema:  execInputSchema(p),
		OutputSchema: outputSchema[ExecOut](),
		Annotations: &mcp.ToolAnnotations{
			Title:           "Run a command in the sandbox",
			ReadOnlyHint:    false,
			DestructiveHint: ptr(true),
			IdempotentHint:  false,
			OpenWorldHint:   ptr(p.Network != policy.NetworkNone),
		},
	}
}

func readDef() *mcp.Tool {
	return &mcp.Tool{
		Name:  NameReadFile,
		Title: "Read a file from the sandbox",
		Description: "Use it to read a file rather than cat in sandbox_exec. " +
			"Text comes back as utf-8, other bytes as base64. Read part of a large file by lines (start_line, end_line) or bytes (offset, length); next_offset and hint say where more follows. " +
			"An image gives its media_type only: look at it with sandbox_view_image.",
		InputSchema:  inputSchema[ReadIn](readSchemaEdit),
		OutputSchema: outputSchema[ReadOut](),
		Annotations: &mcp.ToolAnnotations{
			Title:         "Read a file from the sandbox",
			ReadOnlyHint:  true,
			OpenWorldHint: ptr(false),
		},
	}
}

func writeDef(p policy.Policy) *mcp.Tool {
	desc := "Use it to create or replace a file rather than echo or a heredoc in sandbox_exec; missing directories are made. " +
		"content is utf-8 text, or base64 with encoding \"base64\". It replaces the file whole (a symlink at the path is replaced, not followed), or appends with append=true. mode is octal, such as \"0755\"."
	if p.ReadOnly {
		desc += " This server's workspace is read-only: every write is refused."
	}
	return &mcp.Tool{
		Name:         NameWriteFile,
		Title:        "Write a file in the sandbox",
		Description:  desc,
		InputSchema:  inputSchema[WriteIn](writeSchemaEdit),
		OutputSchema: outputSchema[WriteOut](),
		Annotations: &mcp.ToolAnnotations{
			Title:           "Write a file in the sandbox",
			ReadOnlyHint:    false,
			DestructiveHint: ptr(true),
			IdempotentHint:  true,
			OpenWorldHint:   ptr(false),
		},
	}
}

func listDef() *mcp.Tool {
	return &mcp.Tool{
		Name:  NameList,
		Title: "List files in the sandbox",
		Description: "Use it to list a directory, or all under it with recursive=true, rather than ls or find in sandbox_exec. " +
			"Symlinks are listed, never followed. At most max_entries entries (default 1000); truncated says there were more.",
		InputSchema:  inputSchema[ListIn](listSchemaEdit),
		OutputSchema: outputSchema[ListOut](),
		Annotations: &mcp.ToolAnnotations{
			Title:         "List files in the sandbox",
			ReadOnlyHint:  true,
			OpenWorldHint: ptr(false),
		},
	}
}

func snapshotDef() *mcp.Tool {
	return &mcp.Tool{
		Name:  NameSnapshot,
		Title: "Snapshot the sandbox's workspace",
		Description: "Use it when the workspace must outlive this session or you may want to roll back: nothing made with sandbox_exec lasts past the session. " +
			"It saves the whole workspace as a tar archive on the server, readable as the MCP resource at uri; files only, not processes.",
		InputSchema:  inputSchema[SnapshotIn](nil),
		OutputSchema: outputSchema[SnapshotOut](),
		Annotations: &mcp.ToolAnnotations{
			Title:           "Snapshot the sandbox's workspace",
			ReadOnlyHint:    false,
			DestructiveHint: ptr(false),
			IdempotentHint:  false,
			OpenWorldHint:   ptr(false),
		},
	}
}

func joinComma(s []string) string {
	out := ""
	for i, v := range s {
		if i > 0 {
			out += ", "
		}
		out += v
	}
	return out
}
