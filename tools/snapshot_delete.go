package tools

import (
	"context"
	"errors"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/snapshot"
)

// NameDeleteSnapshot is the name of the tool that deletes a snapshot.
const NameDeleteSnapshot = "sandbox_snapshot_delete"

// DeleteSnapshotIn is sandbox_snapshot_delete's input. Snapshots belong to
// the caller, not to one sandbox: the tool works in none and takes none.
type DeleteSnapshotIn struct {
	ID string `json:"id" jsonschema:"The snapshot to delete."`
}

// DeleteSnapshotOut is sandbox_snapshot_delete's output.
type DeleteSnapshotOut struct {
	ID string `json:"id" jsonschema:"The snapshot deleted."`
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

func (in DeleteSnapshotIn) target() string { return "" }
func (DeleteSnapshotIn) inNoSandbox() bool { return true }

// deleteSnapshot deletes one of the caller's snapshots. It works in no
// sandbox: sb is nil.
func (d *Deps) deleteSnapshot(ctx context.Context, c *call, _ Sandbox, in DeleteSnapshotIn) (*mcp.CallToolResult, DeleteSnapshotOut, error) {
	var out DeleteSnapshotOut
	err := d.Sessions.snapshotsOf(d.Sessions.Owner(c.req)).Delete(in.ID)
	if errors.Is(err, snapshot.ErrNotFound) {
		return nil, out, errcode.Errorf(errcode.NotFound, "no snapshot %q belongs to you; %s", in.ID, listYours)
	}
	if err != nil {
		return nil, out, err
	}
	out.ID = in.ID
	return textResult("deleted snapshot " + in.ID), out, nil
}
