package tools

import (
	"context"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// NameMove is sandbox_move's name.
const NameMove = "sandbox_move"

// MoveIn is sandbox_move's input.
type MoveIn struct {
	From      string `json:"from" jsonschema:"File, symlink or directory to move, relative to /workspace."`
	To        string `json:"to" jsonschema:"Its new path, relative to /workspace; ending in / moves it into that directory. Missing directories are created."`
	Overwrite bool   `json:"overwrite,omitempty" jsonschema:"Replace an existing file at to. Default: an existing to is an error."`
	Sandbox   string `json:"sandbox,omitempty" jsonschema:"Sandbox handle to move in. Default: this session's own."`
}

// MoveOut is sandbox_move's output.
type MoveOut struct {
	Sandbox string `json:"sandbox" jsonschema:"The sandbox the files are in."`
	From    string `json:"from" jsonschema:"The path moved, relative to /workspace."`
	To      string `json:"to" jsonschema:"Where it is now, relative to /workspace."`
}

func moveDef(p policy.Policy) *mcp.Tool {
	desc := "Use it to rename or move a file, symlink or directory within /workspace rather than mv in sandbox_exec; it works where exec is denied. " +
		"An existing destination is replaced only with overwrite=true. Symlinks on either path are never followed."
	if p.ReadOnly {
		desc += " This server's workspace is read-only: every move is refused."
	}
	return &mcp.Tool{
		Name:         NameMove,
		Title:        "Move or rename in the sandbox",
		Description:  desc,
		InputSchema:  inputSchema[MoveIn](nil),
		OutputSchema: outputSchema[MoveOut](),
		Annotations: &mcp.ToolAnnotations{
			Title:           "Move or rename in the sandbox",
			ReadOnlyHint:    false,
			DestructiveHint: ptr(true),
			IdempotentHint:  false,
			OpenWorldHint:   ptr(false),
		},
	}
}

func (in MoveIn) target() string { return in.Sandbox }

// checkMove makes in.From and in.To relative to the workspace.
func (d *Deps) checkMove(in MoveIn) (MoveIn, error) {
	from, err := d.changeablePath(in.From)
	if err != nil {
		return in, err
	}
	to, dec := policy.WorkspacePath(in.To)
	if !dec.Allow {
		return in, dec.Err()
	}
	in.From, in.To = from, to
	return in, nil
}

func (d *Deps) move(ctx context.Context, c *call, sb Sandbox, in MoveIn) (*mcp.CallToolResult, MoveOut, error) {
	out := MoveOut{Sandbox: sb.ID()}
	from, to := in.From, in.To
	res, err := sb.Move(ctx, from, to, in.Overwrite)
	if err != nil {
		return nil, out, err
	}
	out.From, out.To = from, res.To
	return textResult(fmt.Sprintf("moved %s (a %s) to %s", from, res.Type, res.To)), out, nil
}
