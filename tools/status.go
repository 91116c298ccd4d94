package tools

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// NameStatus is the name of the tool that lists the caller's sandboxes.
const NameStatus = "sandbox_status"

// StatusIn is sandbox_status's input: none.
type StatusIn struct{}

// StatusOut is sandbox_status's output.
type StatusOut struct {
	Sandboxes []SandboxEntry `json:"sandboxes"`
}

// SandboxEntry is one of the caller's sandboxes.
type SandboxEntry struct {
	Sandbox  string `json:"sandbox" jsonschema:"Its handle."`
	Label    string `json:"label,omitempty"`
	Template string `json:"template"`
	State    string `json:"state" jsonschema:"new, starting, running, idle-saved (next call restores it) or lost."`
	Session  bool   `json:"session,omitempty" jsonschema:"true: a session's own sandbox, which ends with it."`
	Created  string `json:"created" jsonschema:"RFC 3339."`
	LastUsed string `json:"last_used" jsonschema:"RFC 3339."`
	Jobs     int    `json:"jobs_running" jsonschema:"Jobs running; -1: unknown."`
}

func statusDef() *mcp.Tool {
	return &mcp.Tool{
		Name:         NameStatus,
		Title:        "List your sandboxes",
		Description:  "Use it when you need your sandboxes' handles, states and running jobs. It starts none.",
		InputSchema:  inputSchema[StatusIn](nil),
		OutputSchema: outputSchema[StatusOut](),
		Annotations: &mcp.ToolAnnotations{
			Title:          "List your sandboxes",
			ReadOnlyHint:   true,
			IdempotentHint: true,
			OpenWorldHint:  ptr(false),
		},
	}
}

func (StatusIn) target() string    { return "" }
func (StatusIn) inNoSandbox() bool { return true }

// status lists the caller's sandboxes. It works in none: sb is nil.
func (d *Deps) status(ctx context.Context, c *call, _ Sandbox, _ StatusIn) (*mcp.CallToolResult, StatusOut, error) {
	out := StatusOut{Sandboxes: []SandboxEntry{}}
	h, ok := d.Sessions.m.(handles)
	if !ok {
		return nil, out, fmt.Errorf("tools: the registry of sandboxes lists none")
	}
	stamp := func(t time.Time) string { return t.UTC().Format(time.RFC3339) }
	var b strings.Builder
	list := h.List(ctx, d.Sessions.Owner(c.req))
	if len(list) == 0 {
		b.WriteString("you have no sandboxes; sandbox_create makes one, and any other tool makes this session's own\n")
	} else {
		fmt.Fprintf(&b, "%d sandboxes (sandbox, state, template, jobs running, created, last used, label):\n", len(list))
	}
	for _, s := range list {
		e := SandboxEntry{Sandbox: s.Handle, Label: s.Label, Template: s.Template, State: s.State, Session: s.Session,
			Created: stamp(s.Created), LastUsed: stamp(s.LastUsed), Jobs: s.Jobs}
		out.Sandboxes = append(out.Sandboxes, e)
		jobs := fmt.Sprint(e.Jobs)
		if e.Jobs < 0 {
			jobs = "?"
		}
		label := ""
		if e.Label != "" {
			label = fmt.Sprintf("  %q", e.Label)
		}
		if e.Session {
			label += "  (this session's own)"
		}
		fmt.Fprintf(&b, "%s  %s  %s  %s  %s  %s%s\n", e.Sandbox, e.State, e.Template, jobs, e.Created, e.LastUsed, label)
	}
	return textResult(b.String()), out, nil
}
