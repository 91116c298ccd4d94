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
	"unsafe"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session"
)

// ReadIn is sandbox_read_file's input.
type ReadIn struct {
	Path      string `json:"path" jsonschema:"File to read, relative to /workspace."`
	Offset    int64  `json:"offset,omitempty" jsonschema:"First byte to read. Default 0."`
	Length    int64  `json:"length,omitempty" jsonschema:"Number of bytes to read. Default: to the end of the file (up to the server's cap)."`
	StartLine int64  `json:"start_line,omitempty" jsonschema:"First line to read (1-based), instead of offset and length."`
	EndLine   int64  `json:"end_line,omitempty" jsonschema:"Last line to read (inclusive). Default: to the end of the file (up to the server's cap)."`
	Encoding  string `json:"encoding,omitempty" jsonschema:"base64 to get the bytes as base64 whatever they are (an image's bytes, say)."`
	Sandbox   string `json:"sandbox,omitempty" jsonschema:"Sandbox id to read from. Default: this session's sandbox."`
}

// ReadOut is sandbox_read_file's output.
type ReadOut struct {
	Sandbox    string `json:"sandbox" jsonschema:"The sandbox the file is in."`
	Path       string `json:"path" jsonschema:"The path read, relative to /workspace."`
	Content    string `json:"content" jsonschema:"The bytes read, as text or base64 (see encoding); empty for an image unless base64 was asked for."`
	Encoding   string `json:"encoding" jsonschema:"utf-8 when the bytes are valid UTF-8, else base64."`
	Size       int64  `json:"size" jsonschema:"Size of the whole file in bytes."`
	Truncated  bool   `json:"truncated" jsonschema:"True when the server's cap cut the read short."`
	NextOffset int64  `json:"next_offset,omitempty" jsonschema:"When more of the file follows: the byte to read on from (offset)."`
	StartLine  int64  `json:"start_line,omitempty" jsonschema:"Line reads: the first line returned."`
	EndLine    int64  `json:"end_line,omitempty" jsonschema:"Line reads: the last line returned."`
	TotalLines int64  `json:"total_lines,omitempty" jsonschema:"Line reads: the number of lines in the file."`
	MediaType  string `json:"media_type,omitempty" jsonschema:"For an image (PNG, JPEG, GIF, WebP): its type; view it with sandbox_view_image."`
	Hint       string `json:"hint,omitempty" jsonschema:"What to call next, when there is more to read or a better tool."`
}

// inlineTextBytes is how much text a read also puts in its text content
// for a client that reads structured content (see textOnly): a short file
// is shown in full either way, a longer one travels once.
const inlineTextBytes = 16 << 10

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
	lines, dec := policy.CheckLines(in.Offset, in.Length, in.StartLine, in.EndLine)
	if !dec.Allow {
		return nil, out, dec.Err()
	}
	switch in.Encoding {
	case "", "utf-8", "base64":
	default:
		return nil, out, errcode.Errorf(errcode.InvalidArgument, "encoding %q is not supported; leave it out, or use base64 to get the bytes as base64", in.Encoding)
	}
	const advice = "or read less at once with offset and length, or start_line and end_line"
	length := in.Length
	if lines {
		length = 0
	}
	if err := d.reserve(ctx, c, policy.ReadReserve(d.Policy.ReadLimit(length)), reserveWait, advice); err != nil {
		return nil, out, err
	}
	var res session.ReadResult
	if lines {
		res, err = sb.ReadLines(ctx, rel, max(in.StartLine, 1), in.EndLine, d.Policy.MaxFileBytes)
	} else {
		res, err = sb.ReadFile(ctx, rel, in.Offset, in.Length, d.Policy.MaxFileBytes)
		res.Offset = in.Offset
	}
	if err != nil {
		return nil, out, err
	}
	n := int64(len(res.Data))
	out.Path, out.Size, out.Truncated = rel, res.Size, res.Truncated
	out.StartLine, out.EndLine, out.TotalLines = res.StartLine, res.EndLine, res.TotalLines
	if next := res.Offset + n; next < res.Size {
		out.NextOffset = next
	}
	c.bytes = n

	var head strings.Builder
	if lines {
		fmt.Fprintf(&head, "%s: lines %d-%d of %d (%d bytes from offset %d, file %d bytes)", rel, res.StartLine, res.EndLine, res.TotalLines, n, res.Offset, res.Size)
	} else {
		fmt.Fprintf(&head, "%s: %d of %d bytes from offset %d", rel, n, res.Size, res.Offset)
	}
	if res.Offset == 0 {
		out.MediaType = imageType(res.Data)
	}
	switch {
	case out.MediaType != "" && in.Encoding != "base64":
		out.Encoding = "base64"
		out.Hint = fmt.Sprintf("%s is a %s image of %d bytes: call sandbox_view_image to look at it, or read it with encoding base64 for its bytes", rel, out.MediaType, res.Size)
	case in.Encoding != "base64" && utf8.Valid(res.Data):
		// The agent's buffer is this call's alone and is not changed
		// again: the string shares it rather than copy a megabyte.
		out.Content, out.Encoding = unsafe.String(unsafe.SliceData(res.Data), len(res.Data)), "utf-8"
	default:
		b := make([]byte, base64.StdEncoding.EncodedLen(len(res.Data)))
		base64.StdEncoding.Encode(b, res.Data)
		out.Content, out.Encoding = unsafe.String(unsafe.SliceData(b), len(b)), "base64"
		if in.Encoding != "base64" {
			head.WriteString(", base64 (not valid UTF-8)")
		}
	}
	if out.Hint == "" && out.NextOffset > 0 {
		out.Hint = d.readOnHint(in, res, lines, n)
	}
	if out.Hint != "" {
		head.WriteString("; " + out.Hint)
	}
	head.WriteString("\n")

	// The content travels once where it can. A client that reads the
	// structured result (every client of protocol 2025-06-18 or later,
	// which shows only that when it is present) finds it there; the text
	// content is then a short rendering, with the text itself only when it
	// is short. A client older than structured content reads only the text,
	// so it gets the text there too. Base64 is no use to read as text and
	// is never repeated.
	text := head.String()
	jsonBytes := policy.JSONLen(text) + 2*policy.JSONLen(out.Content)
	switch {
	case out.Encoding != "utf-8":
		if out.MediaType == "" {
			text += "[binary: the bytes are in the result's content field, base64-encoded; to look at them, run e.g. `od -c` or `xxd` with sandbox_exec]\n"
		}
		jsonBytes = policy.JSONLen(text) + int64(len(out.Content)) + 2 // base64 needs no escapes
	case n <= inlineTextBytes || textOnly(c.req):
		text += out.Content
	default:
		text += fmt.Sprintf("[%d bytes of text: in the result's content field]\n", n)
		jsonBytes = policy.JSONLen(text) + policy.JSONLen(out.Content)
	}
	// Hold what the response takes, now that it is known, and the buffer
	// a text's content shares.
	var kept int64
	if out.Encoding == "utf-8" {
		kept = int64(cap(res.Data))
	}
	if err := c.resize(kept+policy.ResponseCost(jsonBytes), "or read it in smaller parts with offset and length, or start_line and end_line"); err != nil {
		return nil, out, err
	}
	return textResult(text), out, nil
}

// readOnHint says how to read what follows a read that stopped before the
// end of the file.
func (d *Deps) readOnHint(in ReadIn, res session.ReadResult, lines bool, n int64) string {
	next := res.Offset + n
	why := "more follows"
	if res.Truncated {
		why = fmt.Sprintf("cut at this server's cap of %d bytes", d.Policy.MaxFileBytes)
	}
	switch {
	case lines && res.Truncated && res.EndLine == res.StartLine && (n == 0 || res.Data[n-1] != '\n'):
		return fmt.Sprintf("%s inside line %d; read the rest of it with offset=%d", why, res.EndLine, next)
	case lines:
		return fmt.Sprintf("%s; read on with start_line=%d (the file has %d lines)", why, res.EndLine+1, res.TotalLines)
	}
	return fmt.Sprintf("%s; read on with offset=%d (the file has %d bytes)", why, next, res.Size)
}

// textOnly reports whether the client of a call negotiated a protocol
// version from before structured content (2025-06-18), so it reads only a
// result's text content.
func textOnly(req *mcp.CallToolRequest) bool {
	if req == nil || req.Session == nil {
		return false
	}
	p := req.Session.InitializeParams()
	return p != nil && p.ProtocolVersion != "" && p.ProtocolVersion < "2025-06-18"
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
