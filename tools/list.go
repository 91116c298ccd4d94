package tools

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session"
)

// NameList is the name of the tool that lists files.
const NameList = "sandbox_list"

// ListIn is sandbox_list's input.
type ListIn struct {
	Path       string `json:"path,omitempty" jsonschema:"Directory to list, relative to /workspace. Default: the workspace root."`
	Recursive  bool   `json:"recursive,omitempty" jsonschema:"List everything under the directory, not just its entries."`
	MaxEntries int    `json:"max_entries,omitempty" jsonschema:"Most entries to return. Default 1000."`
	Sandbox    string `json:"sandbox,omitempty" jsonschema:"Sandbox id to list. Default: this session's sandbox."`
}

// ListEntry is one listed file.
type ListEntry struct {
	Path   string `json:"path" jsonschema:"Path relative to /workspace."`
	Type   string `json:"type" jsonschema:"file, dir, symlink or other."`
	Size   int64  `json:"size" jsonschema:"Size in bytes."`
	Mode   string `json:"mode" jsonschema:"Permission bits as an octal string."`
	MTime  string `json:"mtime" jsonschema:"Last modification time, RFC 3339."`
	Target string `json:"target,omitempty" jsonschema:"Where a symlink points, as stored."`
}

// ListOut is sandbox_list's output.
type ListOut struct {
	Sandbox   string      `json:"sandbox" jsonschema:"The sandbox listed."`
	Path      string      `json:"path" jsonschema:"The directory listed, relative to /workspace."`
	Entries   []ListEntry `json:"entries" jsonschema:"The entries, sorted by path."`
	Truncated bool        `json:"truncated" jsonschema:"True when there were more than max_entries entries."`
}

func listDef() *mcp.Tool {
	return &mcp.Tool{
		Name:  NameList,
		Title: "List files in the sandbox",
		Description: "Use it to list a directory, or all under it with recursive=true, rather than ls or find in sandbox_exec. " +
			"Symlinks are listed, never followed. At most max_entries entries (default 1000); truncated says there were more.",
		InputSchema:  inputSchema[ListIn](listSchemaEdit),
		OutputSchema: outputSchema[ListOut](),
		Annotations: &mcp.ToolAnnotations{
			Title:         "List files in the sandbox",
			ReadOnlyHint:  true,
			OpenWorldHint: ptr(false),
		},
	}
}

func listSchemaEdit(s *jsonschema.Schema) {
	m := s.Properties["max_entries"]
	m.Minimum = new(float64(0))
	m.Maximum = new(float64(policy.MaxListEntries))
}

func (in ListIn) target() string { return in.Sandbox }

// checkList makes in.Path relative to the workspace and sets
// in.MaxEntries to the number of entries to list.
func checkList(in ListIn) (ListIn, error) {
	rel, dec := policy.WorkspacePath(in.Path)
	if !dec.Allow {
		return in, dec.Err()
	}
	n, dec := policy.ListEntries(in.MaxEntries)
	if !dec.Allow {
		return in, dec.Err()
	}
	in.Path, in.MaxEntries = rel, n
	return in, nil
}

func (d *Deps) list(ctx context.Context, c *call, sb Sandbox, in ListIn) (*mcp.CallToolResult, ListOut, error) {
	out := ListOut{Sandbox: sb.ID(), Entries: []ListEntry{}}
	rel, n := in.Path, in.MaxEntries
	if err := d.reserve(ctx, c, policy.ListReserve(n), reserveWait, "or list fewer entries with max_entries"); err != nil {
		return nil, out, err
	}
	lr, err := sb.List(ctx, rel, session.ListOptions{Recursive: in.Recursive, MaxEntries: n})
	if err != nil {
		return nil, out, err
	}
	entries, truncated := lr.Entries, lr.Truncated
	out.Entries = make([]ListEntry, 0, len(entries))
	out.Path, out.Truncated = rel, truncated
	var text strings.Builder
	for _, e := range entries {
		le := ListEntry{
			Path:   e.Path,
			Type:   e.Type,
			Size:   e.Size,
			Mode:   fmt.Sprintf("%04o", e.Mode&0o7777),
			MTime:  e.MTime.UTC().Format(time.RFC3339),
			Target: e.Target,
		}
		out.Entries = append(out.Entries, le)
		fmt.Fprintf(&text, "%s %s %d %s", le.Mode, le.Type, le.Size, le.Path)
		if le.Type == "symlink" {
			fmt.Fprintf(&text, " -> %s", le.Target)
		}
		if le.Type == "dir" {
			text.WriteString("/")
		}
		text.WriteString("\n")
	}
	if len(entries) == 0 {
		fmt.Fprintf(&text, "%s is empty\n", rel)
	}
	switch {
	case truncated && len(entries) < n:
		fmt.Fprintf(&text, "[truncated after %d entries: their paths passed this server's cap of %d bytes of listing for %d entries; list a subdirectory]\n", len(entries), policy.ListBytes(n), n)
	case truncated:
		fmt.Fprintf(&text, "[truncated at %d entries; list a subdirectory, or raise max_entries]\n", n)
	}
	c.bytes = int64(len(entries))
	// Hold what the rendered entries and their response take: each entry
	// is in the text and in the structured content.
	jsonBytes := policy.JSONLen(text.String())
	for _, e := range out.Entries {
		jsonBytes += policy.JSONLen(e.Path) + policy.JSONLen(e.Target) + policy.JSONLen(e.MTime) + listEntryJSON
	}
	if err := c.resize(policy.ListCost(len(entries), jsonBytes), "or list fewer entries with max_entries"); err != nil {
		return nil, out, err
	}
	return textResult(text.String()), out, nil
}

// listEntryJSON is the JSON of a ListEntry besides its path, target and
// mtime: keys, punctuation, type, size and mode.
const listEntryJSON = 96
