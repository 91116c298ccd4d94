package tools

import (
	"context"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// NameEnd is the name of the tool that ends a sandbox.
const NameEnd = "sandbox_end"

// EndIn is sandbox_end's input.
type EndIn struct {
	Sandbox  string `json:"sandbox" jsonschema:"The sandbox to end."`
	Snapshot bool   `json:"snapshot,omitempty" jsonschema:"true: save its workspace as a snapshot first."`
}

// EndOut is sandbox_end's output.
type EndOut struct {
	Sandbox  string `json:"sandbox"`
	Ended    bool   `json:"ended"`
	Snapshot string `json:"snapshot,omitempty" jsonschema:"The snapshot its workspace was saved as."`
}

func endDef() *mcp.Tool {
	return &mcp.Tool{
		Name:         NameEnd,
		Title:        "End a sandbox",
		Description:  "Use it when you are done with a sandbox: its processes stop and its files go, unless snapshot: true saves them first.",
		InputSchema:  inputSchema[EndIn](nil),
		OutputSchema: outputSchema[EndOut](),
		Annotations: &mcp.ToolAnnotations{
			Title:           "End a sandbox",
			DestructiveHint: ptr(true),
			OpenWorldHint:   ptr(false),
		},
	}
}

func (EndIn) target() string    { return "" }
func (EndIn) inNoSandbox() bool { return true }

func checkEnd(in EndIn) (EndIn, error) {
	if in.Sandbox == "" {
		return in, errcode.Errorf(errcode.InvalidArgument, "sandbox is empty: name the sandbox to end; sandbox_status lists yours")
	}
	return in, nil
}

// end ends one of the caller's sandboxes. It works in none: sb is nil.
func (d *Deps) end(ctx context.Context, c *call, _ Sandbox, in EndIn) (*mcp.CallToolResult, EndOut, error) {
	out := EndOut{Sandbox: in.Sandbox}
	h, ok := d.Sessions.m.(handles)
	if !ok {
		return nil, out, fmt.Errorf("tools: the registry of sandboxes ends none by handle")
	}
	saved, err := h.End(ctx, in.Sandbox, d.Sessions.Owner(c.req), in.Snapshot)
	if err != nil {
		return nil, out, err
	}
	c.sandbox = in.Sandbox
	out.Ended = true
	text := "ended sandbox " + in.Sandbox
	switch {
	case saved != nil:
		out.Snapshot = saved.ID
		text += fmt.Sprintf("; its workspace was saved as snapshot %s (sandbox_create with snapshot %q starts a new sandbox from it)", saved.ID, saved.ID)
	case in.Snapshot:
		text += "; it never started, so there was nothing to save"
	}
	return textResult(text), out, nil
}
