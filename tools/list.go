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
	Recursive  bool   `json:"recursive,omitempty" jsonschema:"List everything under the directory, breadth-first. Dependency trees and caches (node_modules, .git, .venv...) show as one entry with a count unless listed by their path."`
	Pattern    string `json:"pattern,omitempty" jsonschema:"Only entries whose path (relative to /workspace) matches this glob, e.g. **/*.py: ** crosses directories, a pattern without / matches names; one with / lists recursively."`
	MaxEntries int    `json:"max_entries,omitempty" jsonschema:"Most entries to return. Default 200."`
	Details    bool   `json:"details,omitempty" jsonschema:"Also give each entry's mode and mtime."`
	Sandbox    string `json:"sandbox,omitempty" jsonschema:"Sandbox handle to list. Default: this session's own."`
}

// ListEntry is one listed file.
type ListEntry struct {
	Path   string `json:"path" jsonschema:"Path relative to /workspace."`
	Type   string `json:"type" jsonschema:"file, dir, symlink or other."`
	Size   int64  `json:"size" jsonschema:"Size in bytes."`
	Target string `json:"target,omitempty" jsonschema:"Where a symlink points, as stored."`
	Pruned bool   `json:"pruned,omitempty" jsonschema:"A dependency tree or cache not entered: list it by its path to see inside."`
	Count  int64  `json:"count,omitempty" jsonschema:"For a pruned directory: the entries directly in it."`
	Mode   string `json:"mode,omitempty" jsonschema:"With details: permission bits as an octal string."`
	MTime  string `json:"mtime,omitempty" jsonschema:"With details: last modification time, RFC 3339."`
}

// ListOut is sandbox_list's output.
type ListOut struct {
	Sandbox   string      `json:"sandbox" jsonschema:"The sandbox listed."`
	Path      string      `json:"path" jsonschema:"The directory listed, relative to /workspace."`
	Entries   []ListEntry `json:"entries" jsonschema:"The entries, a level at a time, sorted by name within each directory."`
	Truncated bool        `json:"truncated" jsonschema:"True when there were more entries than returned (see hint)."`
	Hint      string      `json:"hint,omitempty" jsonschema:"How to see what was left out."`
}

// pruneDirs are the directories a recursive sandbox_list shows as one
// entry with a count instead of entering them, below the path asked for:
// version control and dependency trees, which can hold tens of thousands
// of files a model rarely wants listed. The agent prunes any directory
// holding a CACHEDIR.TAG file too (cargo's target, pytest's and mypy's
// caches). docs/tools.md lists them.
var pruneDirs = []string{".git", ".hg", ".svn", "node_modules", ".venv", "venv", "__pycache__", ".tox"}

func listDef() *mcp.Tool {
	return &mcp.Tool{
		Name:  NameList,
		Title: "List files in the sandbox",
		Description: "Use it to list a directory, or all under it with recursive=true, rather than ls or find in sandbox_exec. " +
			"Breadth-first, at most max_entries (default 200); node_modules, .git and such stay one entry; pattern filters by glob (**/*.py). Symlinks are listed, never followed.",
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
	s.Properties["pattern"].MaxLength = intp(policy.MaxPatternBytes)
}

func (in ListIn) target() string { return in.Sandbox }

// checkList makes in.Path relative to the workspace and sets
// in.MaxEntries to the number of entries to list; a pattern with "/" makes
// the list recursive.
func checkList(in ListIn) (ListIn, error) {
	rel, dec := policy.WorkspacePath(in.Path)
	if !dec.Allow {
		return in, dec.Err()
	}
	n, dec := policy.ListEntries(in.MaxEntries)
	if !dec.Allow {
		return in, dec.Err()
	}
	if dec := policy.CheckPattern(in.Pattern); !dec.Allow {
		return in, dec.Err()
	}
	in.Path, in.MaxEntries = rel, n
	in.Recursive = in.Recursive || strings.Contains(in.Pattern, "/")
	return in, nil
}

func (d *Deps) list(ctx context.Context, c *call, sb Sandbox, in ListIn) (*mcp.CallToolResult, ListOut, error) {
	out := ListOut{Sandbox: sb.ID(), Entries: []ListEntry{}}
	rel, n := in.Path, in.MaxEntries
	if err := d.reserve(ctx, c, policy.ListReserve(n), reserveWait, "or list fewer entries with max_entries"); err != nil {
		return nil, out, err
	}
	lr, err := sb.List(ctx, rel, session.ListOptions{Recursive: in.Recursive, MaxEntries: n, Pattern: in.Pattern,
		Prune: pruneDirs, MaxScan: policy.ListScanEntries})
	if err != nil {
		return nil, out, err
	}
	entries := lr.Entries
	out.Entries = make([]ListEntry, 0, len(entries))
	out.Path, out.Truncated = rel, lr.Truncated
	var text strings.Builder
	for _, e := range entries {
		le := ListEntry{Path: e.Path, Type: e.Type, Size: e.Size, Target: e.Target, Pruned: e.Pruned, Count: e.Count}
		if in.Details {
			le.Mode, le.MTime = fmt.Sprintf("%04o", e.Mode&0o7777), e.MTime.UTC().Format(time.RFC3339)
			fmt.Fprintf(&text, "%s %s ", le.Mode, le.MTime)
		}
		out.Entries = append(out.Entries, le)
		switch le.Type {
		case "dir":
			text.WriteString(le.Path + "/")
			if le.Pruned {
				fmt.Fprintf(&text, " (%d entries, not listed: list %s to see them)", le.Count, le.Path)
			}
		case "symlink":
			fmt.Fprintf(&text, "%s -> %s", le.Path, le.Target)
		case "file":
			fmt.Fprintf(&text, "%s %d", le.Path, le.Size)
		default:
			fmt.Fprintf(&text, "%s (%s)", le.Path, le.Type)
		}
		text.WriteString("\n")
	}
	if len(entries) == 0 {
		what := "is empty"
		if in.Pattern != "" {
			what = fmt.Sprintf("has nothing matching %q", in.Pattern)
		}
		fmt.Fprintf(&text, "%s %s\n", rel, what)
	}
	switch {
	case !lr.Truncated:
	case lr.Scanned >= policy.ListScanEntries:
		out.Hint = fmt.Sprintf("stopped after looking at %d entries; list a subdirectory, or narrow the pattern", lr.Scanned)
	case len(entries) < n:
		out.Hint = fmt.Sprintf("truncated after %d entries: their paths passed this server's cap of %d bytes of listing for %d entries; list a subdirectory", len(entries), policy.ListBytes(n), n)
	default:
		out.Hint = fmt.Sprintf("truncated at %d entries; list a subdirectory, narrow with pattern, or raise max_entries (up to %d)", n, policy.MaxListEntries)
	}
	if out.Hint != "" {
		fmt.Fprintf(&text, "[%s]\n", out.Hint)
	}
	c.bytes = int64(len(entries))
	// Hold what the rendered entries and their response take: each entry
	// is in the text and in the structured content.
	jsonBytes := policy.JSONLen(text.String()) + policy.JSONLen(out.Hint)
	for _, e := range out.Entries {
		jsonBytes += policy.JSONLen(e.Path) + policy.JSONLen(e.Target) + policy.JSONLen(e.MTime) + listEntryJSON
	}
	if err := c.resize(policy.ListCost(len(entries), jsonBytes), "or list fewer entries with max_entries"); err != nil {
		return nil, out, err
	}
	return textResult(text.String()), out, nil
}

// listEntryJSON is the JSON of a ListEntry besides its path, target and
// mtime: keys, punctuation, type, size, count and mode.
const listEntryJSON = 128
