package tools

import (
	"context"
	"fmt"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/session"
)

// NameCreate is the name of the tool that makes a sandbox by handle.
const NameCreate = "sandbox_create"

// CreateIn is sandbox_create's input.
type CreateIn struct {
	Template string `json:"template,omitempty" jsonschema:"Template to make it from. Default: default."`
	Snapshot string `json:"snapshot,omitempty" jsonschema:"One of your snapshots to start from: id, label, or latest."`
	Label    string `json:"label,omitempty" jsonschema:"Your name for it."`
}

// CreateOut is sandbox_create's output.
type CreateOut struct {
	Sandbox  string `json:"sandbox" jsonschema:"Its handle: pass it as sandbox."`
	Label    string `json:"label,omitempty"`
	Template string `json:"template"`
	State    string `json:"state"`
	Snapshot string `json:"snapshot,omitempty" jsonschema:"The snapshot its workspace starts from."`
	Hint     string `json:"hint"`
}

func createDef() *mcp.Tool {
	return &mcp.Tool{
		Name:         NameCreate,
		Title:        "Create a sandbox",
		Description:  "Use it when you want another sandbox beside this session's (a clean one, one per subagent), optionally from a snapshot. It outlives this session: sandbox_end ends it.",
		InputSchema:  inputSchema[CreateIn](func(s *jsonschema.Schema) { s.Properties["label"].MaxLength = intp(session.MaxLabelBytes) }),
		OutputSchema: outputSchema[CreateOut](),
		Annotations: &mcp.ToolAnnotations{
			Title:           "Create a sandbox",
			DestructiveHint: ptr(false),
			OpenWorldHint:   ptr(false),
		},
	}
}

func (CreateIn) target() string    { return "" }
func (CreateIn) inNoSandbox() bool { return true }

// create makes a sandbox by handle. It works in none: sb is nil.
func (d *Deps) create(ctx context.Context, c *call, _ Sandbox, in CreateIn) (*mcp.CallToolResult, CreateOut, error) {
	var out CreateOut
	h, ok := d.Sessions.m.(handles)
	if !ok {
		return nil, out, fmt.Errorf("tools: the registry of sandboxes makes none by handle")
	}
	sb, err := h.Create(ctx, d.Sessions.Owner(c.req), session.CreateOptions{Label: in.Label, Template: in.Template, Snapshot: in.Snapshot})
	if err != nil {
		return nil, out, err
	}
	c.sandbox = sb.Handle
	out = CreateOut{Sandbox: sb.Handle, Label: sb.Label, Template: sb.Template, State: sb.State, Snapshot: sb.From, Hint: passHandle(sb.Handle) + "; sandbox_end ends it"}
	from := ""
	if out.Snapshot != "" {
		from = fmt.Sprintf(", its workspace from snapshot %s", out.Snapshot)
	}
	label := ""
	if out.Label != "" {
		label = fmt.Sprintf(" (label %q)", out.Label)
	}
	text := fmt.Sprintf("created sandbox %s%s: template %s, state %s%s; its container starts at its first call. Hint: %s", out.Sandbox, label, out.Template, out.State, from, out.Hint)
	return textResult(text), out, nil
}
