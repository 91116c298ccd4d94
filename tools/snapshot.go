package tools

import (
	"context"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// NameSnapshot is the name of the tool that snapshots a workspace.
const NameSnapshot = "sandbox_snapshot"

// SnapshotIn is sandbox_snapshot's input.
type SnapshotIn struct {
	Label   string `json:"label,omitempty" jsonschema:"A note to remember the snapshot by."`
	Sandbox string `json:"sandbox,omitempty" jsonschema:"Sandbox id to snapshot. Default: this session's sandbox."`
}

// SnapshotOut is sandbox_snapshot's output.
type SnapshotOut struct {
	Sandbox   string `json:"sandbox" jsonschema:"The sandbox whose workspace was saved."`
	ID        string `json:"id" jsonschema:"The snapshot's id."`
	Label     string `json:"label" jsonschema:"The label given."`
	CreatedAt string `json:"created_at" jsonschema:"When the snapshot was made, RFC 3339."`
	SizeBytes int64  `json:"size_bytes" jsonschema:"Size of the tar archive in bytes."`
	Files     int    `json:"files" jsonschema:"Number of entries (files, directories, symlinks) in the archive."`
	SHA256    string `json:"sha256" jsonschema:"SHA-256 of the tar archive, hex."`
	URI       string `json:"uri" jsonschema:"MCP resource to read the snapshot from."`
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

func (in SnapshotIn) target() string { return in.Sandbox }

func (d *Deps) snapshot(ctx context.Context, c *call, sb Sandbox, in SnapshotIn) (*mcp.CallToolResult, SnapshotOut, error) {
	out := SnapshotOut{Sandbox: sb.ID()}
	if err := d.reserve(ctx, c, policy.StreamReserve(), reserveWait, ""); err != nil {
		return nil, out, err
	}
	info, err := sb.Snapshot(ctx, in.Label)
	if err != nil {
		return nil, out, err
	}
	out.ID, out.Label = info.ID, info.Label
	out.CreatedAt = info.CreatedAt.UTC().Format(time.RFC3339Nano)
	out.SizeBytes, out.Files, out.SHA256, out.URI = info.SizeBytes, info.Files, info.SHA256, info.URI()
	c.bytes = info.SizeBytes
	return textResult(fmt.Sprintf("snapshot %s: %d entries, %d bytes, sha256 %s; read it at %s",
		info.ID, info.Files, info.SizeBytes, info.SHA256, info.URI())), out, nil
}
