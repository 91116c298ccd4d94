package tools

import (
	"context"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// NameRestore is the name of the tool that restores a snapshot.
const NameRestore = "sandbox_restore"

// RestoreIn is sandbox_restore's input.
type RestoreIn struct {
	ID      string `json:"id" jsonschema:"The snapshot to restore: its id (snap-...), its label if no other snapshot of yours has it, or latest for your newest."`
	Sandbox string `json:"sandbox,omitempty" jsonschema:"Sandbox handle to restore into. Default: this session's own."`
}

// RestoreOut is sandbox_restore's output.
type RestoreOut struct {
	Sandbox string `json:"sandbox" jsonschema:"The sandbox whose workspace was replaced."`
	ID      string `json:"id" jsonschema:"The snapshot restored."`
	Files   int    `json:"files" jsonschema:"Entries restored."`
	Bytes   int64  `json:"bytes" jsonschema:"Bytes of archive read."`
	Skipped int    `json:"skipped" jsonschema:"Entries left out (devices, FIFOs, sockets)."`
}

func restoreDef() *mcp.Tool {
	return &mcp.Tool{
		Name:  NameRestore,
		Title: "Restore a snapshot into the sandbox",
		Description: "Use it to roll the workspace back to one of your snapshots rather than copying files with sandbox_exec. " +
			"It replaces the whole workspace (files, not processes). sandbox_snapshot with list: true lists them.",
		InputSchema:  inputSchema[RestoreIn](nil),
		OutputSchema: outputSchema[RestoreOut](),
		Annotations: &mcp.ToolAnnotations{
			Title:           "Restore a snapshot into the sandbox",
			DestructiveHint: ptr(true),
			IdempotentHint:  true,
			OpenWorldHint:   ptr(false),
		},
	}
}

func (in RestoreIn) target() string { return in.Sandbox }

func (d *Deps) checkRestore(in RestoreIn) (RestoreIn, error) {
	if dec := d.Policy.CanWrite(); !dec.Allow {
		return in, dec.Err()
	}
	if in.ID == "" {
		return in, errcode.Errorf(errcode.InvalidArgument, "id is empty: give a snapshot's id (snap-...), its label, or latest; %s", listYours)
	}
	return in, nil
}

func (d *Deps) restore(ctx context.Context, c *call, sb Sandbox, in RestoreIn) (*mcp.CallToolResult, RestoreOut, error) {
	out := RestoreOut{Sandbox: sb.ID()}
	if err := d.reserve(ctx, c, policy.StreamReserve(), reserveWait, ""); err != nil {
		return nil, out, err
	}
	id, err := d.resolveSnapshot(c, in.ID)
	if err != nil {
		return nil, out, err
	}
	info, res, err := sb.Restore(ctx, id)
	if err != nil {
		return nil, out, err
	}
	out.ID, out.Files, out.Bytes, out.Skipped = info.ID, res.Files, res.Bytes, res.Skipped
	c.bytes = res.Bytes
	label := ""
	if info.Label != "" {
		label = fmt.Sprintf(" (label %q)", info.Label)
	}
	text := fmt.Sprintf("restored %s%s (%d entries, %d bytes) into sandbox %s; the workspace now holds exactly the snapshot", info.ID, label, res.Files, res.Bytes, sb.ID())
	if res.Skipped > 0 {
		text += fmt.Sprintf("; %d special files (devices, FIFOs, sockets) were left out", res.Skipped)
	}
	return textResult(text), out, nil
}
