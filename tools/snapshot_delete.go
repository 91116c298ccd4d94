package tools

import (
	"context"
	"errors"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/session"
)

// NameDeleteSnapshot is the name of the tool that deletes a snapshot.
const NameDeleteSnapshot = "sandbox_snapshot_delete"

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

func (in DeleteSnapshotIn) target() string { return in.Sandbox }

func (d *Deps) deleteSnapshot(ctx context.Context, c *call, sb Sandbox, in DeleteSnapshotIn) (*mcp.CallToolResult, DeleteSnapshotOut, error) {
	out := DeleteSnapshotOut{Sandbox: sb.ID()}
	store := d.Sessions.snapshots()
	info, err := store.Get(in.ID)
	if errors.Is(err, session.ErrSnapshotNotFound) || (err == nil && info.Owner != sb.Owner()) {
		return nil, out, errcode.Errorf(errcode.NotFound, "no snapshot %q belongs to you; resources/list shows your snapshots", in.ID)
	}
	if err != nil {
		return nil, out, err
	}
	if err := store.Delete(in.ID); err != nil && !errors.Is(err, session.ErrSnapshotNotFound) {
		return nil, out, err
	}
	out.ID = in.ID
	return textResult("deleted snapshot " + in.ID), out, nil
}
