package tools

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"
	"unsafe"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session"
)

// NameReadFile is the name of the tool that reads a file.
const NameReadFile = "sandbox_read_file"

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

func readDef() *mcp.Tool {
	return &mcp.Tool{
		Name:  NameReadFile,
		Title: "Read a file from the sandbox",
		Description: "Use it to read a file rather than cat in sandbox_exec. " +
			"Text comes back as utf-8, other bytes as base64. Read part of a large file by lines (start_line, end_line) or bytes (offset, length); next_offset and hint say where more follows. " +
			"An image gives its media_type only: look at it with sandbox_view_image.",
		InputSchema:  inputSchema[ReadIn](readSchemaEdit),
		OutputSchema: outputSchema[ReadOut](),
		Annotations: &mcp.ToolAnnotations{
			Title:         "Read a file from the sandbox",
			ReadOnlyHint:  true,
			OpenWorldHint: ptr(false),
		},
	}
}

func readSchemaEdit(s *jsonschema.Schema) {
	s.Properties["encoding"].Enum = []any{"utf-8", "base64"}
	for _, k := range []string{"start_line", "end_line"} {
		s.Properties[k].Minimum = new(float64(1))
	}
	for _, k := range []string{"offset", "length"} {
		s.Properties[k].Minimum = new(float64(0))
	}
}

// inlineTextBytes is how much text a read also puts in its text content
// for a client that reads structured content (see textOnly): a short file
// is shown in full either way, a longer one travels once.
const inlineTextBytes = 16 << 10

func (in ReadIn) target() string { return in.Sandbox }

// readReq is a read policy let through: the input with its path made
// relative to the workspace.
type readReq struct {
	ReadIn
	lines bool // a range of lines, not of bytes
}

func checkRead(in ReadIn) (readReq, error) {
	rel, dec := policy.WorkspacePath(in.Path)
	if !dec.Allow {
		return readReq{}, dec.Err()
	}
	if dec := policy.CheckRange(in.Offset, in.Length); !dec.Allow {
		return readReq{}, dec.Err()
	}
	lines, dec := policy.CheckLines(in.Offset, in.Length, in.StartLine, in.EndLine)
	if !dec.Allow {
		return readReq{}, dec.Err()
	}
	switch in.Encoding {
	case "", "utf-8", "base64":
	default:
		return readReq{}, errcode.Errorf(errcode.InvalidArgument, "encoding %q is not supported; leave it out, or use base64 to get the bytes as base64", in.Encoding)
	}
	in.Path = rel
	return readReq{ReadIn: in, lines: lines}, nil
}

func (d *Deps) readFile(ctx context.Context, c *call, sb Sandbox, in readReq) (*mcp.CallToolResult, ReadOut, error) {
	out := ReadOut{Sandbox: sb.ID()}
	rel, lines := in.Path, in.lines
	var err error
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
		res, err = sb.Read(ctx, session.ReadRequest{Path: rel, StartLine: max(in.StartLine, 1), EndLine: in.EndLine,
			Max: d.Policy.MaxFileBytes, MaxScan: d.Policy.MaxFileBytes})
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
	switch {
	case lines && res.TotalLines == 0:
		fmt.Fprintf(&head, "%s: empty file (0 lines)", rel)
	case lines:
		fmt.Fprintf(&head, "%s: lines %d-%d of %d (%d bytes from offset %d, file %d bytes)", rel, res.StartLine, res.EndLine, res.TotalLines, n, res.Offset, res.Size)
	default:
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
		out.Hint = d.readOnHint(in.ReadIn, res, lines, n)
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
