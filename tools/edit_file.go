package tools

import (
	"context"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session"
)

// NameEditFile is sandbox_edit_file's name.
const NameEditFile = "sandbox_edit_file"

// EditIn is sandbox_edit_file's input.
type EditIn struct {
	Path       string `json:"path" jsonschema:"File to edit, relative to /workspace."`
	OldString  string `json:"old_string" jsonschema:"The exact text to replace, whitespace included. Empty (with a missing file): create the file with new_string."`
	NewString  string `json:"new_string" jsonschema:"The text to put in its place."`
	ReplaceAll bool   `json:"replace_all,omitempty" jsonschema:"Replace every occurrence. Default: old_string must occur exactly once."`
	Sandbox    string `json:"sandbox,omitempty" jsonschema:"Sandbox id to edit in. Default: this session's sandbox."`
}

// EditOut is sandbox_edit_file's output.
type EditOut struct {
	Sandbox      string `json:"sandbox" jsonschema:"The sandbox the file is in."`
	Path         string `json:"path" jsonschema:"The path edited, relative to /workspace."`
	Replacements int    `json:"replacements" jsonschema:"How many occurrences were replaced."`
	Size         int64  `json:"size" jsonschema:"Size of the file afterwards."`
	Created      bool   `json:"created,omitempty" jsonschema:"True when the file did not exist and was created."`
}

func editDef(p policy.Policy) *mcp.Tool {
	desc := "Use it to change part of a file rather than sed in sandbox_exec or rewriting the whole file. " +
		"Replaces old_string (exact text, whitespace included, found exactly once unless replace_all) with new_string; the file's mode is kept. " +
		"An empty old_string on a missing file creates it."
	if p.ReadOnly {
		desc += " This server's workspace is read-only: every edit is refused."
	}
	return &mcp.Tool{
		Name:         NameEditFile,
		Title:        "Edit a file in the sandbox",
		Description:  desc,
		InputSchema:  inputSchema[EditIn](nil),
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

func (in EditIn) target() string { return in.Sandbox }

// checkEdit makes in.Path relative to the workspace.
func (d *Deps) checkEdit(in EditIn) (EditIn, error) {
	rel, err := d.changeablePath(in.Path)
	if err != nil {
		return in, err
	}
	if dec := d.Policy.CheckEdit(in.OldString, in.NewString); !dec.Allow {
		return in, dec.Err()
	}
	in.Path = rel
	return in, nil
}

func (d *Deps) editFile(ctx context.Context, c *call, sb Sandbox, in EditIn) (*mcp.CallToolResult, EditOut, error) {
	out := EditOut{Sandbox: sb.ID()}
	rel := in.Path
	// The strings are held with the arguments (holdArguments) and streamed
	// to the sandbox from them; the file itself never leaves it.
	if err := d.reserve(ctx, c, policy.StreamReserve(), 0, "or edit in smaller steps"); err != nil {
		return nil, out, err
	}
	res, err := sb.EditFile(ctx, rel, []session.Edit{{OldText: in.OldString, NewText: in.NewString, ReplaceAll: in.ReplaceAll}}, d.Policy.MaxFileBytes)
	if err != nil {
		return nil, out, err
	}
	out.Path, out.Replacements, out.Size, out.Created = rel, res.Replacements, res.Size, res.Created
	c.bytes = int64(len(in.NewString))
	msg := fmt.Sprintf("replaced %d occurrence(s) in %s (now %d bytes)", res.Replacements, rel, res.Size)
	if res.Created {
		msg = fmt.Sprintf("created %s (%d bytes)", rel, res.Size)
	}
	return textResult(msg), out, nil
}
