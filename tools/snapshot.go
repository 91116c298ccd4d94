package tools

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// NameSnapshot is the name of the tool that snapshots a workspace.
const NameSnapshot = "sandbox_snapshot"

// SnapshotIn is sandbox_snapshot's input.
type SnapshotIn struct {
	Label   string `json:"label,omitempty" jsonschema:"A note to remember the snapshot by; sandbox_restore takes it in place of the id."`
	List    bool   `json:"list,omitempty" jsonschema:"true: make none; list your snapshots, newest first."`
	Sandbox string `json:"sandbox,omitempty" jsonschema:"Sandbox handle to snapshot. Default: this session's own."`
}

// SnapshotOut is sandbox_snapshot's output.
type SnapshotOut struct {
	Sandbox   string          `json:"sandbox" jsonschema:"The sandbox whose workspace was saved (empty for a list)."`
	ID        string          `json:"id,omitempty" jsonschema:"The snapshot's id."`
	Label     string          `json:"label,omitempty" jsonschema:"The label given."`
	CreatedAt string          `json:"created_at,omitempty" jsonschema:"When the snapshot was made, RFC 3339."`
	SizeBytes int64           `json:"size_bytes,omitempty" jsonschema:"Size of the tar archive in bytes."`
	Files     int             `json:"files,omitempty" jsonschema:"Number of entries (files, directories, symlinks) in the archive."`
	SHA256    string          `json:"sha256,omitempty" jsonschema:"SHA-256 of the tar archive, hex."`
	URI       string          `json:"uri,omitempty" jsonschema:"MCP resource to read the snapshot from."`
	Snapshots []SnapshotEntry `json:"snapshots,omitempty" jsonschema:"With list: your snapshots, newest first."`
}

// SnapshotEntry is one listed snapshot.
type SnapshotEntry struct {
	ID        string `json:"id"`
	Label     string `json:"label,omitempty"`
	Sandbox   string `json:"sandbox" jsonschema:"The sandbox it was made in."`
	CreatedAt string `json:"created_at" jsonschema:"RFC 3339."`
	SizeBytes int64  `json:"size_bytes"`
	Files     int    `json:"files"`
}

// listYours says where a model finds its snapshots, in errors.
const listYours = "sandbox_snapshot with list: true shows yours"

func snapshotDef() *mcp.Tool {
	return &mcp.Tool{
		Name:  NameSnapshot,
		Title: "Snapshot the sandbox's workspace",
		Description: "Use it when the workspace must outlive its sandbox or you may want to roll back. " +
			"It saves the whole workspace (files, not processes) on the server, readable as the MCP resource at uri. list: true lists your snapshots.",
		InputSchema:  inputSchema[SnapshotIn](func(s *jsonschema.Schema) { s.Properties["label"].MaxLength = intp(maxLabel) }),
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

// inNoSandbox: a list reads the caller's snapshots, and makes no sandbox.
func (in SnapshotIn) inNoSandbox() bool { return in.List }

func checkSnapshot(in SnapshotIn) (SnapshotIn, error) {
	if in.List && (in.Label != "" || in.Sandbox != "") {
		return in, errcode.Errorf(errcode.InvalidArgument, "list lists all your snapshots and takes no label or sandbox; leave list out to make a snapshot")
	}
	return in, nil
}

func (d *Deps) snapshot(ctx context.Context, c *call, sb Sandbox, in SnapshotIn) (*mcp.CallToolResult, SnapshotOut, error) {
	if in.List {
		return d.listSnapshotsTool(c)
	}
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
	label := ""
	if info.Label != "" {
		label = fmt.Sprintf(" (label %q)", info.Label)
	}
	return textResult(fmt.Sprintf("snapshot %s%s: %d entries, %d bytes, sha256 %s; read it at %s; sandbox_restore takes its id, its label or latest",
		info.ID, label, info.Files, info.SizeBytes, info.SHA256, info.URI())), out, nil
}

// listSnapshotsTool lists the caller's snapshots, newest first (the store's
// retention bounds how many a caller has).
func (d *Deps) listSnapshotsTool(c *call) (*mcp.CallToolResult, SnapshotOut, error) {
	var out SnapshotOut
	mine, err := d.Sessions.snapshotsOf(d.Sessions.Owner(c.req)).List()
	if err != nil {
		return nil, out, err
	}
	slices.Reverse(mine)
	var b strings.Builder
	if len(mine) == 0 {
		b.WriteString("You have no snapshots; sandbox_snapshot makes one.\n")
	}
	for _, in := range mine {
		e := SnapshotEntry{ID: in.ID, Label: in.Label, Sandbox: in.Sandbox, CreatedAt: in.CreatedAt.UTC().Format(time.RFC3339), SizeBytes: in.SizeBytes, Files: in.Files}
		out.Snapshots = append(out.Snapshots, e)
		fmt.Fprintf(&b, "%s  %s  sandbox %s  %d entries, %d bytes", e.ID, e.CreatedAt, e.Sandbox, e.Files, e.SizeBytes)
		if e.Label != "" {
			fmt.Fprintf(&b, "  label %q", e.Label)
		}
		b.WriteString("\n")
	}
	if len(mine) > 0 {
		b.WriteString("sandbox_restore takes an id, a label no other snapshot of yours has, or latest (the first above).\n")
	}
	return textResult(b.String()), out, nil
}

// resolveSnapshot turns what sandbox_restore was given (an id, latest, or
// a label) into one of the caller's snapshot ids.
func (d *Deps) resolveSnapshot(c *call, name string) (string, error) {
	return d.Sessions.snapshotsOf(d.Sessions.Owner(c.req)).Resolve(name)
}
