package tools

import (
	"context"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session"
)

// Tool names for snapshots beyond sandbox_snapshot.
const (
	NameRestore        = "sandbox_restore"
	NameDeleteSnapshot = "sandbox_snapshot_delete"
)

// RestoreIn is sandbox_restore's input.
type RestoreIn struct {
	ID      string `json:"id" jsonschema:"The snapshot to restore, as sandbox_snapshot returned it (snap-...)."`
	Sandbox string `json:"sandbox,omitempty" jsonschema:"Sandbox id to restore into. Default: this session's sandbox."`
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
		Description: "Use it to roll the workspace back to a snapshot, or to start from one another session of yours made, rather than copying files with sandbox_exec. " +
			"It replaces the whole workspace: files not in the snapshot are removed; processes are not in a snapshot. resources/list shows your snapshots.",
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

func (d *Deps) restore(ctx context.Context, c *call, in RestoreIn) (*mcp.CallToolResult, RestoreOut, error) {
	var out RestoreOut
	sb, err := d.Sessions.sandbox(c, in.Sandbox)
	if err != nil {
		return nil, out, err
	}
	out.Sandbox = sb.ID()
	if dec := d.Policy.CanWrite(); !dec.Allow {
		return nil, out, dec.Err()
	}
	if !session.ValidSnapshotID(in.ID) {
		return nil, out, errcode.Errorf(errcode.InvalidArgument, "%q is not a snapshot id; ids look like snap-0123456789abcdef0123", in.ID)
	}
	if err := d.reserve(ctx, c, policy.StreamReserve(), reserveWait, ""); err != nil {
		return nil, out, err
	}
	info, res, err := sb.Restore(ctx, in.ID)
	if err != nil {
		return nil, out, err
	}
	out.ID, out.Files, out.Bytes, out.Skipped = info.ID, res.Files, res.Bytes, res.Skipped
	c.bytes = res.Bytes
	text := fmt.Sprintf("restored %s (%d entries, %d bytes) into sandbox %s; the workspace now holds exactly the snapshot", info.ID, res.Files, res.Bytes, sb.ID())
	if res.Skipped > 0 {
		text += fmt.Sprintf("; %d special files (devices, FIFOs, sockets) were left out", res.Skipped)
	}
	return textResult(text), out, nil
}

// DeleteSnapshotIn is sandbox_snapshot_delete's input.
type DeleteSnapshotIn struct {
	ID      string `json:"id" jsonschema:"The snapshot to delete."`
	Sandbox string `json:"sandbox,omitempty" jsonschema:"Unused by this tool beyond reporting; snapshots belong to you, not to one sandbox."`
}

// DeleteSnapshotOut is sandbox_snapshot_delete's output.
type DeleteSnapshotOut struct {
	Sandbox string `json:"sandbox" jsonschema:"This session's sandbox."`
	ID      string `json:"id" jsonschema:"The snapshot deleted."`
}

func deleteSnapshotDef() *mcp.Tool {
	return &mcp.Tool{
		Name:         NameDeleteSnapshot,
		Title:        "Delete a snapshot",
		Description:  "Use it to delete one of your snapshots from the server when you no longer need it. The workspace is not touched.",
		InputSchema:  inputSchema[DeleteSnapshotIn](nil),
		OutputSchema: outputSchema[DeleteSnapshotOut](),
		Annotations: &mcp.ToolAnnotations{
			Title:           "Delete a snapshot",
			DestructiveHint: ptr(true),
			IdempotentHint:  true,
			OpenWorldHint:   ptr(false),
		},
	}
}

func (d *Deps) deleteSnapshot(ctx context.Context, c *call, in DeleteSnapshotIn) (*mcp.CallToolResult, DeleteSnapshotOut, error) {
	var out DeleteSnapshotOut
	sb, err := d.Sessions.sandbox(c, in.Sandbox)
	if err != nil {
		return nil, out, err
	}
	out.Sandbox = sb.ID()
	store := d.Sessions.Manager().Snapshots()
	info, err := store.Get(in.ID)
	if err == session.ErrSnapshotNotFound || (err == nil && info.Owner != sb.Owner()) {
		return nil, out, errcode.Errorf(errcode.NotFound, "no snapshot %q belongs to you; resources/list shows your snapshots", in.ID)
	}
	if err != nil {
		return nil, out, err
	}
	if err := store.Delete(in.ID); err != nil && err != session.ErrSnapshotNotFound {
		return nil, out, err
	}
	out.ID = in.ID
	return textResult("deleted snapshot " + in.ID), out, nil
}
