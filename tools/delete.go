package tools

import (
	"context"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// NameDelete is sandbox_delete's name.
const NameDelete = "sandbox_delete"

// DeleteIn is sandbox_delete's input.
type DeleteIn struct {
	Path      string `json:"path" jsonschema:"File, symlink or directory to delete, relative to /workspace."`
	Recursive bool   `json:"recursive,omitempty" jsonschema:"Delete a directory that is not empty, with everything in it."`
	Sandbox   string `json:"sandbox,omitempty" jsonschema:"Sandbox handle to delete in. Default: this session's own."`
}

// DeleteOut is sandbox_delete's output.
type DeleteOut struct {
	Sandbox string `json:"sandbox" jsonschema:"The sandbox the path was in."`
	Path    string `json:"path" jsonschema:"The path deleted, relative to /workspace."`
	Deleted int64  `json:"deleted" jsonschema:"Entries removed, the path itself included."`
}

func deleteDef(p policy.Policy) *mcp.Tool {
	desc := "Use it to delete a file, symlink (not its target) or directory rather than rm in sandbox_exec; it works where exec is denied. " +
		"A directory that is not empty needs recursive=true. Symlinks are never followed."
	if p.ReadOnly {
		desc += " This server's workspace is read-only: every delete is refused."
	}
	return &mcp.Tool{
		Name:         NameDelete,
		Title:        "Delete a file or directory in the sandbox",
		Description:  desc,
		InputSchema:  inputSchema[DeleteIn](nil),
		OutputSchema: outputSchema[DeleteOut](),
		Annotations: &mcp.ToolAnnotations{
			Title:           "Delete a file or directory in the sandbox",
			ReadOnlyHint:    false,
			DestructiveHint: ptr(true),
			IdempotentHint:  true,
			OpenWorldHint:   ptr(false),
		},
	}
}

func (in DeleteIn) target() string { return in.Sandbox }

// checkDelete makes in.Path relative to the workspace.
func (d *Deps) checkDelete(in DeleteIn) (DeleteIn, error) {
	rel, err := d.changeablePath(in.Path)
	if err != nil {
		return in, err
	}
	in.Path = rel
	return in, nil
}

func (d *Deps) deletePath(ctx context.Context, c *call, sb Sandbox, in DeleteIn) (*mcp.CallToolResult, DeleteOut, error) {
	out := DeleteOut{Sandbox: sb.ID()}
	rel := in.Path
	res, err := sb.Delete(ctx, rel, in.Recursive)
	if err != nil {
		return nil, out, err
	}
	out.Path, out.Deleted = rel, res.Deleted
	c.bytes = res.Deleted
	msg := fmt.Sprintf("deleted %s (a %s)", rel, res.Type)
	if res.Deleted > 1 {
		msg = fmt.Sprintf("deleted %s and everything in it (%d entries)", rel, res.Deleted)
	}
	return textResult(msg), out, nil
}
