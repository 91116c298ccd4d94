package tools

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"math"
	"net/http"
	"strings"
	"unicode/utf8"
	"unsafe"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session"
)

// NameReadFile is the name of the tool that reads a file.
const NameReadFile = "sandbox_read_file"

// ReadIn is sandbox_read_file's input.
type ReadIn struct {
	Path       string `json:"path" jsonschema:"File to read, relative to /workspace."`
	Offset     int64  `json:"offset,omitempty" jsonschema:"First line to read (1-based). Default 1."`
	Limit      int64  `json:"limit,omitempty" jsonschema:"Number of lines to read. Default: up to 2000 lines within the output cap, long lines cut; with a limit, whole lines up to the file cap."`
	ByteOffset int64  `json:"byte_offset,omitempty" jsonschema:"First byte to read: read bytes instead of lines (binary files, the rest of a cut line)."`
	ByteLength int64  `json:"byte_length,omitempty" jsonschema:"Number of bytes to read. Default: up to the output cap; with a length, up to the file cap."`
	Encoding   string `json:"encoding,omitempty" jsonschema:"base64 to get the bytes as base64 whatever they are (an image's bytes, say)."`
	Sandbox    string `json:"sandbox,omitempty" jsonschema:"Sandbox handle to read from. Default: this session's own."`
}

// ReadOut is sandbox_read_file's output.
type ReadOut struct {
	Sandbox        string `json:"sandbox" jsonschema:"The sandbox the file is in."`
	Path           string `json:"path" jsonschema:"The path read, relative to /workspace."`
	Content        string `json:"content" jsonschema:"The text read, or base64 (see encoding); empty for an image unless base64 was asked for. Lines cut at 2000 characters end in a [...] marker."`
	Encoding       string `json:"encoding" jsonschema:"utf-8 for text; base64 for other bytes, or when asked for."`
	Size           int64  `json:"size" jsonschema:"Size of the whole file in bytes."`
	Truncated      bool   `json:"truncated" jsonschema:"True when less came back than the file holds past offset (or than asked for), or lines were cut: next_offset, next_byte_offset and hint say how to read on."`
	NextOffset     int64  `json:"next_offset,omitempty" jsonschema:"When more lines follow: the line to read on from (pass it as offset)."`
	NextByteOffset int64  `json:"next_byte_offset,omitempty" jsonschema:"When reading on by bytes: the byte to read on from (pass it as byte_offset)."`
	TotalLines     int64  `json:"total_lines,omitempty" jsonschema:"Text read by lines: the lines in the file (left out when the file is larger than the file cap, which is as far as lines are counted)."`
	MediaType      string `json:"media_type,omitempty" jsonschema:"For an image (PNG, JPEG, GIF, WebP): its type; view it with sandbox_view_image."`
	Hint           string `json:"hint,omitempty" jsonschema:"What to call next, when there is more to read or a better tool."`
}

func readDef() *mcp.Tool {
	return &mcp.Tool{
		Name:  NameReadFile,
		Title: "Read a file from the sandbox",
		Description: "Use it to read a file rather than cat in sandbox_exec. " +
			"Returns up to 2000 lines unless limit is set; offset is the first line (1-based); byte_offset and byte_length read bytes; hint says where more follows. " +
			"Other bytes than text come back as base64; an image gives its media_type only: view it with sandbox_view_image.",
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
	for _, k := range []string{"offset", "limit", "byte_length"} {
		s.Properties[k].Minimum = new(float64(1))
	}
	s.Properties["byte_offset"].Minimum = new(float64(0))
}

// readRenamed are the arguments models send to sandbox_read_file that it
// does not take (it took the first two before offset and limit became
// lines), and the sentence that names the right ones.
var readRenamed = map[string]string{
	"start_line": "offset is the first line to read (1-based) and limit the number of lines",
	"end_line":   "give offset (the first line, 1-based) and limit (the number of lines: end_line - offset + 1)",
	"length":     "limit is a number of lines (with offset); byte_length a number of bytes (with byte_offset)",
}

func (in ReadIn) target() string { return in.Sandbox }

// readReq is a read policy let through: the input with its path made
// relative to the workspace.
type readReq struct {
	ReadIn
	bytes bool // a range of bytes, not of lines
}

func checkRead(in ReadIn) (readReq, error) {
	rel, dec := policy.WorkspacePath(in.Path)
	if !dec.Allow {
		return readReq{}, dec.Err()
	}
	byBytes, dec := policy.CheckReadRange(in.Offset, in.Limit, in.ByteOffset, in.ByteLength)
	if !dec.Allow {
		return readReq{}, dec.Err()
	}
	switch in.Encoding {
	case "", "utf-8", "base64":
	default:
		return readReq{}, errcode.Errorf(errcode.InvalidArgument, "encoding %q is not supported; leave it out, or use base64 to get the bytes as base64", in.Encoding)
	}
	in.Path = rel
	// base64 without lines asked for reads bytes.
	byBytes = byBytes || (in.Encoding == "base64" && in.Offset == 0 && in.Limit == 0)
	return readReq{ReadIn: in, bytes: byBytes}, nil
}

// window reports whether the read asked for no length: it returns what
// fits a model's context (ReadWindowLines lines within the output cap, or
// the output cap of bytes), not the file cap.
func (in readReq) window() bool {
	if in.bytes {
		return in.ByteLength == 0
	}
	return in.Limit == 0
}

// byteWindow is the bytes a read by bytes without a length returns: what
// the output cap holds once base64-encoded.
func (d *Deps) byteWindow() int64 {
	return max(min(d.Policy.MaxOutputBytes/4*3, d.Policy.MaxFileBytes), 1)
}

// request is the agent's read for in.
func (d *Deps) request(in readReq) session.ReadRequest {
	p := d.Policy
	req := session.ReadRequest{Path: in.Path}
	switch {
	case in.bytes:
		req.Offset, req.Length = in.ByteOffset, in.ByteLength
		req.Max = d.byteWindow()
		if in.ByteLength > 0 {
			req.Max = p.ReadLimit(in.ByteLength)
		}
	default:
		req.StartLine, req.MaxScan = max(in.Offset, 1), p.MaxFileBytes
		n := in.Limit
		req.Max = p.MaxFileBytes
		if n == 0 {
			n, req.Max, req.MaxLineChars = policy.ReadWindowLines, max(min(p.MaxOutputBytes, p.MaxFileBytes), 1), policy.ReadLineChars
		}
		if n <= math.MaxInt64-req.StartLine {
			req.EndLine = req.StartLine + n - 1
		}
	}
	return req
}

func (d *Deps) readFile(ctx context.Context, c *call, sb Sandbox, in readReq) (*mcp.CallToolResult, ReadOut, error) {
	out := ReadOut{Sandbox: sb.ID(), Path: in.Path}
	rel := in.Path
	const advice = "or read less at once with limit (lines) or byte_length"
	req := d.request(in)
	if err := d.reserve(ctx, c, policy.ReadReserve(req.Max), reserveWait, advice); err != nil {
		return nil, out, err
	}
	res, err := sb.Read(ctx, req)
	if err != nil {
		return nil, out, err
	}
	lines := req.StartLine > 0
	if res.Offset == 0 {
		out.MediaType = imageType(res.Data)
	}
	binary := !utf8.Valid(res.Data) || bytes.IndexByte(res.Data, 0) >= 0
	if lines && binary && out.MediaType == "" && in.window() {
		// Not text: the window is bytes, from where the lines asked for
		// start.
		req = session.ReadRequest{Path: rel, Offset: res.Offset, Max: d.byteWindow()}
		if res, err = sb.Read(ctx, req); err != nil {
			return nil, out, err
		}
		lines = false
	}
	n := int64(len(res.Data))
	out.Size = res.Size
	c.bytes = n

	// Where to read on.
	counted := res.Scanned >= res.Size
	var partial bool // a line read that ends inside a line (Max)
	switch {
	case lines:
		if counted {
			out.TotalLines = res.TotalLines
		}
		partial = res.EndLine > 0 && n > 0 && res.Data[n-1] != '\n' && res.End < res.Size && !cutAt(res.Cuts, res.EndLine)
		if partial {
			out.NextByteOffset = res.End
		}
		switch next := res.EndLine + 1; {
		case res.EndLine == 0:
		case next <= res.TotalLines:
			out.NextOffset = next
		case !counted && res.End < res.Size:
			out.NextByteOffset = res.End // past the lines counted
		}
	case res.End < res.Size:
		out.NextByteOffset = res.End
	}
	more := out.NextOffset > 0 || out.NextByteOffset > 0
	out.Truncated = res.Truncated || len(res.Cuts) > 0 || (in.window() && more)

	var head strings.Builder
	switch {
	case res.Size == 0:
		fmt.Fprintf(&head, "%s: empty file", rel)
	case lines && res.EndLine == 0 && n == 0:
		fmt.Fprintf(&head, "%s: no lines from line %d (the file has %d bytes)", rel, req.StartLine, res.Size)
	case lines:
		of := fmt.Sprintf("of %d", res.TotalLines)
		if !counted {
			of = fmt.Sprintf("of at least %d", res.TotalLines)
		}
		fmt.Fprintf(&head, "%s: lines %d-%d %s (%d bytes of %d)", rel, res.StartLine, res.EndLine, of, n, res.Size)
	default:
		fmt.Fprintf(&head, "%s: bytes %d-%d of %d", rel, res.Offset, res.Offset+n, res.Size)
	}
	switch {
	case out.MediaType != "" && in.Encoding != "base64":
		out.Encoding = "base64"
		out.Hint = fmt.Sprintf("%s is a %s image of %d bytes: call sandbox_view_image to look at it, or read its bytes with encoding base64 and byte_length %d", rel, out.MediaType, res.Size, res.Size)
	case in.Encoding != "base64" && !binary:
		out.Encoding = "utf-8"
		if len(res.Cuts) > 0 {
			out.Content = markCuts(res.Data, res.StartLine, res.Cuts, res.Scanned < res.Size)
		} else {
			// The agent's buffer is this call's alone and is not changed
			// again: the string shares it rather than copy a megabyte.
			out.Content = unsafe.String(unsafe.SliceData(res.Data), len(res.Data))
		}
	default:
		b := make([]byte, base64.StdEncoding.EncodedLen(len(res.Data)))
		base64.StdEncoding.Encode(b, res.Data)
		out.Content, out.Encoding = unsafe.String(unsafe.SliceData(b), len(b)), "base64"
		if in.Encoding != "base64" {
			head.WriteString(", not text: base64 below (look at it with xxd or od -c in sandbox_exec)")
		} else {
			head.WriteString(", base64")
		}
	}
	if out.Hint == "" {
		out.Hint = d.readHint(in, res, lines, partial, counted, out)
	}
	if out.Hint != "" {
		head.WriteString("; " + out.Hint)
	}
	head.WriteString("\n")

	// Every client shows the model one of the two copies: the structured
	// content, or the text. The text carries the content too, so a client
	// that shows only text blocks reads it (its size is bounded: a window,
	// or the range asked for).
	text := head.String() + out.Content
	jsonBytes := policy.JSONLen(text) + policy.JSONLen(out.Content)
	if out.Encoding != "utf-8" {
		jsonBytes = int64(len(text)+len(out.Content)) + 4<<10 // base64 needs no escapes
	}
	// Hold what the response takes, now that it is known, the text, and
	// the buffer a text's content shares.
	kept := int64(len(text))
	if out.Encoding == "utf-8" {
		kept += int64(cap(res.Data))
	}
	if err := c.resize(kept+policy.ResponseCost(jsonBytes), "or read it in smaller parts with offset and limit, or byte_offset and byte_length"); err != nil {
		return nil, out, err
	}
	return textResult(text), out, nil
}

// readHint says how to read on after a read, or what was cut; "" when
// the whole file (or the whole range asked for) came back.
func (d *Deps) readHint(in readReq, res session.ReadResult, lines, partial, counted bool, out ReadOut) string {
	var hints []string
	switch {
	case partial:
		hints = append(hints, fmt.Sprintf("line %d goes on past the %s this read returns: read the rest of it with byte_offset=%d, or skip to offset=%d",
			res.EndLine, sizeOf(int64(len(res.Data))), res.End, res.EndLine+1))
	case lines && out.NextOffset > 0 && (in.window() || res.Truncated):
		why := fmt.Sprintf("the %d-line window", policy.ReadWindowLines)
		switch {
		case res.Truncated && in.window():
			why = fmt.Sprintf("the %s a read without limit returns", sizeOf(min(d.Policy.MaxOutputBytes, d.Policy.MaxFileBytes)))
		case res.Truncated:
			why = fmt.Sprintf("this server's cap of %s per read", sizeOf(d.Policy.MaxFileBytes))
		}
		h := fmt.Sprintf("cut at %s; read on with offset=%d", why, out.NextOffset)
		if in.window() {
			h += fmt.Sprintf(" (a limit reads more at once, up to %s), or search with rg in sandbox_exec", sizeOf(d.Policy.MaxFileBytes))
		}
		hints = append(hints, h)
	case lines && out.NextByteOffset > 0:
		hints = append(hints, fmt.Sprintf("lines are counted in the first %s only (the file has %d bytes): read on by bytes with byte_offset=%d, or use rg, sed -n or tail in sandbox_exec",
			sizeOf(res.Scanned), res.Size, out.NextByteOffset))
	case !lines && out.NextByteOffset > 0 && (in.window() || res.Truncated):
		hints = append(hints, fmt.Sprintf("more follows; read on with byte_offset=%d (the file has %d bytes)", out.NextByteOffset, res.Size))
	}
	if len(res.Cuts) > 0 {
		hints = append(hints, fmt.Sprintf("lines longer than %d characters are cut, each marked with the byte_offset of its rest", policy.ReadLineChars))
	}
	return strings.Join(hints, "; ")
}

// cutAt reports whether line is one of cuts.
func cutAt(cuts []agentproto.LineCut, line int64) bool {
	for _, c := range cuts {
		if c.Line == line {
			return true
		}
	}
	return false
}

// markCuts renders a line read's data, whose first line is first, with a
// marker after each cut line's kept part saying what was left out and
// where it starts. partial says the scan stopped before the file's end (a
// cut that reaches it left out at least that much).
func markCuts(data []byte, first int64, cuts []agentproto.LineCut, partial bool) string {
	var b strings.Builder
	b.Grow(len(data) + 80*len(cuts))
	line, rest := first, data
	for len(cuts) > 0 && len(rest) > 0 {
		seg, after, nl := bytes.Cut(rest, []byte{'\n'})
		b.Write(seg)
		if c := cuts[0]; c.Line == line {
			more := ""
			if partial && !nl {
				more = "at least "
			}
			fmt.Fprintf(&b, " [… %s%d more bytes of this line: byte_offset=%d]", more, c.Rest, c.Offset)
			cuts = cuts[1:]
		}
		if nl {
			b.WriteByte('\n')
		}
		line, rest = line+1, after
	}
	b.Write(rest)
	return b.String()
}

// imageType returns the MIME type of PNG, JPEG, GIF and WebP data, or "".
func imageType(b []byte) string {
	switch t := http.DetectContentType(b); t {
	case "image/png", "image/jpeg", "image/gif", "image/webp":
		return t
	}
	return ""
}
