package tools

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
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
		return nil, out, dec.Err()
	}
	if dec := policy.CheckRange(in.Offset, in.Length); !dec.Allow {
		return nil, out, dec.Err()
	}
	const advice = "or read less at once with offset and length"
	if err := d.reserve(ctx, c, policy.ReadReserve(d.Policy.ReadLimit(in.Length)), reserveWait, advice); err != nil {
		return nil, out, err
	}
	res, err := sb.ReadFile(ctx, rel, in.Offset, in.Length, d.Policy.MaxFileBytes)
	if err != nil {
		return nil, out, err
	}
	n := len(res.Data)
	out.Path = rel
	out.Size = res.Size
	out.Truncated = res.Truncated
	c.bytes = int64(n)

	valid := utf8.Valid(res.Data)
	var head strings.Builder
	fmt.Fprintf(&head, "%s: %d of %d bytes from offset %d", rel, n, res.Size, in.Offset)
	if !valid {
		head.WriteString(", base64 (not valid UTF-8)")
	}
	if res.Truncated {
		fmt.Fprintf(&head, "; truncated at this server's cap of %d bytes, read the rest with offset=%d", d.Policy.MaxFileBytes, in.Offset+int64(n))
	}
	head.WriteString("\n")

	// The content is copied once from the agent's buffer into the string the
	// result carries: text shares it between the text a model reads and the
	// structured content field; base64 is encoded straight into its string.
	var text string
	if valid {
		var b strings.Builder
		b.Grow(head.Len() + n)
		b.WriteString(head.String())
		b.Write(res.Data)
		text = b.String()
		out.Content, out.Encoding = text[head.Len():], "utf-8"
	} else {
		var b strings.Builder
		b.Grow(base64.StdEncoding.EncodedLen(n))
		enc := base64.NewEncoder(base64.StdEncoding, &b)
		enc.Write(res.Data) // a strings.Builder does not fail
		enc.Close()
		out.Content, out.Encoding = b.String(), "base64"
		// Base64 is no use to read; it is in the structured result's
		// content field once, not twice.
		text = head.String() + "[binary: the bytes are in the result's content field, base64-encoded; to look at them, run e.g. `od -c` or `xxd` with sandbox_exec]\n"
	}
	content := []mcp.Content{&mcp.TextContent{Text: text}}
	// Now that the content is known, hold what its response takes: the
	// JSON of the text and the structured content (text escaped as JSON,
	// or base64), and an image's bytes and their base64.
	jsonBytes := policy.JSONLen(text) + int64(len(out.Content)) + 2 // base64 needs no escapes
	if out.Encoding == "utf-8" {
		jsonBytes = policy.JSONLen(head.String()) + 2*policy.JSONLen(out.Content)
	}
	var kept int64
	if mime := imageType(res.Data); mime != "" && in.Offset == 0 && !res.Truncated && int64(n) == res.Size {
		content = append(content, &mcp.ImageContent{Data: res.Data, MIMEType: mime})
		kept, jsonBytes = int64(cap(res.Data)), jsonBytes+policy.Base64Len(int64(n))
	}
	if err := c.resize(kept+policy.ResponseCost(jsonBytes), "or read it in smaller parts with offset and length"); err != nil {
		return nil, out, err
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
		return nil, out, dec.Err()
	}
	rel, dec := policy.WorkspacePath(in.Path)
	if !dec.Allow {
		return nil, out, dec.Err()
	}
	if rel == "." {
		return nil, out, &errcode.Error{Code: errcode.InvalidArgument, Message: "path names the workspace root, which is a directory; name a file"}
	}
	mode, dec := policy.ParseMode(in.Mode)
	if !dec.Allow {
		return nil, out, dec.Err()
	}
	// The arguments hold their own reservation (holdArguments); the
	// content is in memory already, so a write that does not fit is
	// refused at once, and they are freed.
	if err := d.reserve(ctx, c, policy.StreamReserve(), 0, "or write the content in smaller parts with append"); err != nil {
		return nil, out, err
	}
	// The content is streamed to the sandbox from the argument string, text
	// as it is and base64 decoded on the way: the server holds no second
	// copy of it.
	var src io.Reader
	var size int64
	switch in.Encoding {
	case "", "utf-8":
		src, size = strings.NewReader(in.Content), int64(len(in.Content))
	case "base64":
		size, err = base64Size(in.Content)
		if err != nil {
			return nil, out, errcode.Errorf(errcode.InvalidArgument, "content is not valid base64 (%v); send standard base64 with padding, or text with encoding utf-8", err)
		}
		src = base64.NewDecoder(base64.StdEncoding, strings.NewReader(in.Content))
	default:
		return nil, out, errcode.Errorf(errcode.InvalidArgument, "encoding %q is not supported; use utf-8 or base64", in.Encoding)
	}
	if dec := d.Policy.CheckWriteSize(size); !dec.Allow {
		return nil, out, dec.Err()
	}
	res, err := sb.WriteFileFrom(ctx, rel, src, size, in.Append, mode)
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

// base64Size returns the number of bytes s decodes to, or the error
// base64.StdEncoding.DecodeString gives for it, without holding the
// decoded bytes.
func base64Size(s string) (int64, error) {
	n, err := io.Copy(io.Discard, base64.NewDecoder(base64.StdEncoding, strings.NewReader(s)))
	if err != nil {
		// The streaming decoder counts offsets per chunk; DecodeString
		// names the offending byte in the whole content.
		if _, whole := base64.StdEncoding.DecodeString(s); whole != nil {
			err = whole
		}
	}
	return n, err
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
		return nil, out, dec.Err()
	}
	n, dec := policy.ListEntries(in.MaxEntries)
	if !dec.Allow {
		return nil, out, dec.Err()
	}
	if err := d.reserve(ctx, c, policy.ListReserve(n), reserveWait, "or list fewer entries with max_entries"); err != nil {
		return nil, out, err
	}
	entries, truncated, err := sb.List(ctx, rel, in.Recursive, n)
	if err != nil {
		return nil, out, err
	}
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

func textResult(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}
