package tools

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// ReadIn is sandbox_read_file's input.
type ReadIn struct {
	Path    string `json:"path" jsonschema:"File to read, relative to /workspace."`
	Offset  int64  `json:"offset,omitempty" jsonschema:"First byte to read. Default 0."`
	Length  int64  `json:"length,omitempty" jsonschema:"Number of bytes to read. Default: to the end of the file (up to the server's cap)."`
	Sandbox string `json:"sandbox,omitempty" jsonschema:"Sandbox id to read from. Default: this session's sandbox."`
}

// ReadOut is sandbox_read_file's output.
type ReadOut struct {
	Sandbox   string `json:"sandbox" jsonschema:"The sandbox the file is in."`
	Path      string `json:"path" jsonschema:"The path read, relative to /workspace."`
	Content   string `json:"content" jsonschema:"The bytes read, as text or base64 (see encoding)."`
	Encoding  string `json:"encoding" jsonschema:"utf-8 when the bytes are valid UTF-8, else base64."`
	Size      int64  `json:"size" jsonschema:"Size of the whole file in bytes."`
	Truncated bool   `json:"truncated" jsonschema:"True when the server's cap cut the read short; read the rest with offset."`
}

func (d *Deps) readFile(ctx context.Context, c *call, in ReadIn) (*mcp.CallToolResult, ReadOut, error) {
	var out ReadOut
	sb, err := d.Sessions.sandbox(c, in.Sandbox)
	if err != nil {
		return nil, out, err
	}
	out.Sandbox = sb.ID()
	rel, dec := policy.WorkspacePath(in.Path)
	if !dec.Allow {
		return nil, out, denied(dec)
	}
	if dec := policy.CheckRange(in.Offset, in.Length); !dec.Allow {
		return nil, out, denied(dec)
	}
	res, err := sb.ReadFile(ctx, rel, in.Offset, in.Length, d.Policy.MaxFileBytes)
	if err != nil {
		return nil, out, err
	}
	out.Path = rel
	out.Size = res.Size
	out.Truncated = res.Truncated
	if utf8.Valid(res.Data) {
		out.Content, out.Encoding = string(res.Data), "utf-8"
	} else {
		out.Content, out.Encoding = base64.StdEncoding.EncodeToString(res.Data), "base64"
	}
	c.bytes = int64(len(res.Data))

	var text strings.Builder
	fmt.Fprintf(&text, "%s: %d of %d bytes from offset %d", rel, len(res.Data), res.Size, in.Offset)
	if out.Encoding == "base64" {
		text.WriteString(", base64 (not valid UTF-8)")
	}
	if res.Truncated {
		fmt.Fprintf(&text, "; truncated at this server's cap of %d bytes, read the rest with offset=%d", d.Policy.MaxFileBytes, in.Offset+int64(len(res.Data)))
	}
	text.WriteString("\n")
	if out.Encoding == "utf-8" {
		text.WriteString(out.Content)
	} else {
		// Base64 is no use to read; it is in the structured result's
		// content field once, not twice.
		text.WriteString("[binary: the bytes are in the result's content field, base64-encoded; to look at them, run e.g. `od -c` or `xxd` with sandbox_exec]\n")
	}
	content := []mcp.Content{&mcp.TextContent{Text: text.String()}}
	if mime := imageType(res.Data); mime != "" && in.Offset == 0 && !res.Truncated && int64(len(res.Data)) == res.Size {
		content = append(content, &mcp.ImageContent{Data: res.Data, MIMEType: mime})
	}
	return &mcp.CallToolResult{Content: content}, out, nil
}

// imageType returns the MIME type of PNG, JPEG, GIF and WebP data, or "".
func imageType(b []byte) string {
	switch t := http.DetectContentType(b); t {
	case "image/png", "image/jpeg", "image/gif", "image/webp":
		return t
	}
	return ""
}

// WriteIn is sandbox_write_file's input.
type WriteIn struct {
	Path     string `json:"path" jsonschema:"File to write, relative to /workspace. Missing directories are created."`
	Content  string `json:"content" jsonschema:"The bytes to write: text, or base64 when encoding is base64."`
	Encoding string `json:"encoding,omitempty" jsonschema:"How content is encoded: utf-8 or base64."`
	Append   bool   `json:"append,omitempty" jsonschema:"Append to the file instead of replacing it."`
	Mode     string `json:"mode,omitempty" jsonschema:"Permission bits for the file, as an octal string."`
	Sandbox  string `json:"sandbox,omitempty" jsonschema:"Sandbox id to write in. Default: this session's sandbox."`
}

// WriteOut is sandbox_write_file's output.
type WriteOut struct {
	Sandbox      string `json:"sandbox" jsonschema:"The sandbox the file is in."`
	Path         string `json:"path" jsonschema:"The path written, relative to /workspace."`
	BytesWritten int64  `json:"bytes_written" jsonschema:"Bytes written by this call."`
	Size         int64  `json:"size" jsonschema:"Size of the file afterwards."`
}

func (d *Deps) writeFile(ctx context.Context, c *call, in WriteIn) (*mcp.CallToolResult, WriteOut, error) {
	var out WriteOut
	sb, err := d.Sessions.sandbox(c, in.Sandbox)
	if err != nil {
		return nil, out, err
	}
	out.Sandbox = sb.ID()
	if dec := d.Policy.CanWrite(); !dec.Allow {
		return nil, out, denied(dec)
	}
	rel, dec := policy.WorkspacePath(in.Path)
	if !dec.Allow {
		return nil, out, denied(dec)
	}
	if rel == "." {
		return nil, out, &toolError{code: policy.InvalidArgument, msg: "path names the workspace root, which is a directory; name a file"}
	}
	mode, dec := policy.ParseMode(in.Mode)
	if !dec.Allow {
		return nil, out, denied(dec)
	}
	var data []byte
	switch in.Encoding {
	case "", "utf-8":
		data = []byte(in.Content)
	case "base64":
		data, err = base64.StdEncoding.DecodeString(in.Content)
		if err != nil {
			return nil, out, &toolError{code: policy.InvalidArgument, msg: fmt.Sprintf("content is not valid base64 (%v); send standard base64 with padding, or text with encoding utf-8", err)}
		}
	default:
		return nil, out, &toolError{code: policy.InvalidArgument, msg: fmt.Sprintf("encoding %q is not supported; use utf-8 or base64", in.Encoding)}
	}
	if dec := d.Policy.CheckWriteSize(int64(len(data))); !dec.Allow {
		return nil, out, denied(dec)
	}
	res, err := sb.WriteFile(ctx, rel, data, in.Append, mode)
	if err != nil {
		return nil, out, err
	}
	out.Path, out.BytesWritten, out.Size = rel, res.Written, res.Size
	c.bytes = res.Written
	verb := "wrote"
	if in.Append {
		verb = "appended"
	}
	return textResult(fmt.Sprintf("%s %d bytes to %s (now %d bytes)", verb, res.Written, rel, res.Size)), out, nil
}

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

func (d *Deps) list(ctx context.Context, c *call, in ListIn) (*mcp.CallToolResult, ListOut, error) {
	out := ListOut{Entries: []ListEntry{}}
	sb, err := d.Sessions.sandbox(c, in.Sandbox)
	if err != nil {
		return nil, out, err
	}
	out.Sandbox = sb.ID()
	rel, dec := policy.WorkspacePath(in.Path)
	if !dec.Allow {
		return nil, out, denied(dec)
	}
	n, dec := policy.ListEntries(in.MaxEntries)
	if !dec.Allow {
		return nil, out, denied(dec)
	}
	entries, truncated, err := sb.List(ctx, rel, in.Recursive, n)
	if err != nil {
		return nil, out, err
	}
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
	if truncated {
		fmt.Fprintf(&text, "[truncated at %d entries; list a subdirectory, or raise max_entries]\n", n)
	}
	c.bytes = int64(len(entries))
	return textResult(text.String()), out, nil
}

func textResult(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}
