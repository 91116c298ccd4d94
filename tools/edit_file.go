package tools

import (
	"context"
	"fmt"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session"
)

// NameEditFile is sandbox_edit_file's name.
const NameEditFile = "sandbox_edit_file"

// EditIn is sandbox_edit_file's input.
type EditIn struct {
	Path       string   `json:"path" jsonschema:"File to edit, relative to /workspace."`
	OldString  string   `json:"old_string,omitempty" jsonschema:"The exact text to replace, whitespace included. Empty (with a missing file): create the file with new_string."`
	NewString  string   `json:"new_string,omitempty" jsonschema:"The text to put in its place."`
	ReplaceAll bool     `json:"replace_all,omitempty" jsonschema:"Replace every occurrence. Default: old_string must occur exactly once."`
	Edits      []EditOp `json:"edits,omitempty" jsonschema:"Several edits instead of old_string and new_string: applied in order, each to the text the ones before it left; if one fails, none is made."`
	Sandbox    string   `json:"sandbox,omitempty" jsonschema:"Sandbox handle to edit in. Default: this session's own."`
}

// EditOp is one edit of a sandbox_edit_file call with several.
type EditOp struct {
	OldString  string `json:"old_string" jsonschema:"The exact text to replace, whitespace included."`
	NewString  string `json:"new_string" jsonschema:"The text to put in its place."`
	ReplaceAll bool   `json:"replace_all,omitempty" jsonschema:"Replace every occurrence. Default: old_string must occur exactly once."`
}

// EditOut is sandbox_edit_file's output.
type EditOut struct {
	Sandbox      string `json:"sandbox" jsonschema:"The sandbox the file is in."`
	Path         string `json:"path" jsonschema:"The path edited, relative to /workspace."`
	Replacements int    `json:"replacements" jsonschema:"How many occurrences were replaced, all edits together."`
	Size         int64  `json:"size" jsonschema:"Size of the file afterwards."`
	Created      bool   `json:"created,omitempty" jsonschema:"True when the file did not exist and was created."`
}

func editDef(p policy.Policy) *mcp.Tool {
	desc := "Use it to change part of a file rather than sed in sandbox_exec or rewriting the whole file. " +
		"Replaces old_string (exact text, whitespace included, found exactly once unless replace_all) with new_string; edits takes several, in order, all or nothing. " +
		"An empty old_string on a missing file creates it."
	if p.ReadOnly {
		desc += " This server's workspace is read-only: every edit is refused."
	}
	return &mcp.Tool{
		Name:         NameEditFile,
		Title:        "Edit a file in the sandbox",
		Description:  desc,
		InputSchema:  inputSchema[EditIn](editSchemaEdit),
		OutputSchema: outputSchema[EditOut](),
		Annotations: &mcp.ToolAnnotations{
			Title:           "Edit a file in the sandbox",
			ReadOnlyHint:    false,
			DestructiveHint: ptr(true),
			IdempotentHint:  false,
			OpenWorldHint:   ptr(false),
		},
	}
}

func editSchemaEdit(s *jsonschema.Schema) {
	s.Properties["edits"].MaxItems = intp(policy.MaxEdits)
}

func (in EditIn) target() string { return in.Sandbox }

// editReq is an edit policy let through: the path made relative to the
// workspace, and the edits in order.
type editReq struct {
	path  string
	edits []session.Edit
}

// checkEdit makes in.Path relative to the workspace and checks the edits:
// old_string and new_string, or edits, not both.
func (d *Deps) checkEdit(in EditIn) (editReq, error) {
	rel, err := d.changeablePath(in.Path)
	if err != nil {
		return editReq{}, err
	}
	single := in.OldString != "" || in.NewString != "" || in.ReplaceAll
	var edits []session.Edit
	switch {
	case len(in.Edits) > 0 && single:
		return editReq{}, errcode.Errorf(errcode.InvalidArgument, "give old_string and new_string, or edits, not both; put the first edit in edits too")
	case len(in.Edits) > 0:
		for _, e := range in.Edits {
			edits = append(edits, session.Edit{OldText: e.OldString, NewText: e.NewString, ReplaceAll: e.ReplaceAll})
		}
	default:
		edits = []session.Edit{{OldText: in.OldString, NewText: in.NewString, ReplaceAll: in.ReplaceAll}}
	}
	var total int64
	for i, e := range edits {
		if dec := d.Policy.CheckEdit(e.OldText, e.NewText); !dec.Allow {
			if len(edits) > 1 {
				dec.Reason = fmt.Sprintf("edit %d of %d: %s", i+1, len(edits), dec.Reason)
			}
			return editReq{}, dec.Err()
		}
		total += int64(len(e.OldText) + len(e.NewText))
	}
	if dec := d.Policy.CheckEdits(len(edits), total); !dec.Allow {
		return editReq{}, dec.Err()
	}
	return editReq{path: rel, edits: edits}, nil
}

func (d *Deps) editFile(ctx context.Context, c *call, sb Sandbox, in editReq) (*mcp.CallToolResult, EditOut, error) {
	out := EditOut{Sandbox: sb.ID()}
	rel := in.path
	// The strings are held with the arguments (holdArguments) and streamed
	// to the sandbox from them; the file itself never leaves it.
	if err := d.reserve(ctx, c, policy.StreamReserve(), 0, "or edit in smaller steps"); err != nil {
		return nil, out, err
	}
	res, err := sb.EditFile(ctx, rel, in.edits, d.Policy.MaxFileBytes)
	if err != nil {
		return nil, out, err
	}
	out.Path, out.Replacements, out.Size, out.Created = rel, res.Replacements, res.Size, res.Created
	for _, e := range in.edits {
		c.bytes += int64(len(e.NewText))
	}
	msg := fmt.Sprintf("replaced %d occurrence(s) in %s (now %d bytes)", res.Replacements, rel, res.Size)
	if len(in.edits) > 1 {
		msg = fmt.Sprintf("made %d edits, %d replacement(s), in %s (now %d bytes)", len(in.edits), res.Replacements, rel, res.Size)
	}
	if res.Created {
		msg = fmt.Sprintf("created %s (%d bytes)", rel, res.Size)
	}
	return textResult(msg), out, nil
}
