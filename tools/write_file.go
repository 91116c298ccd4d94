package tools

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// NameWriteFile is the name of the tool that writes a file.
const NameWriteFile = "sandbox_write_file"

// WriteIn is sandbox_write_file's input.
type WriteIn struct {
	Path     string `json:"path" jsonschema:"File to write, relative to /workspace. Missing directories are created."`
	Content  string `json:"content" jsonschema:"The bytes to write: text, or base64 when encoding is base64."`
	Encoding string `json:"encoding,omitempty" jsonschema:"How content is encoded: utf-8 or base64."`
	Append   bool   `json:"append,omitempty" jsonschema:"Append to the file instead of replacing it."`
	Mode     string `json:"mode,omitempty" jsonschema:"Permission bits for the file, as an octal string."`
	Sandbox  string `json:"sandbox,omitempty" jsonschema:"Sandbox handle to write in. Default: this session's own."`
}

// WriteOut is sandbox_write_file's output.
type WriteOut struct {
	Sandbox      string `json:"sandbox" jsonschema:"The sandbox the file is in."`
	Path         string `json:"path" jsonschema:"The path written, relative to /workspace."`
	BytesWritten int64  `json:"bytes_written" jsonschema:"Bytes written by this call."`
	Size         int64  `json:"size" jsonschema:"Size of the file afterwards."`
}

func writeDef(p policy.Policy) *mcp.Tool {
	desc := "Use it to create or replace a file rather than echo or a heredoc in sandbox_exec; missing directories are made. " +
		"content is utf-8 text, or base64 with encoding \"base64\". It replaces the file whole (a symlink at the path is replaced, not followed), or appends with append=true. mode is octal, such as \"0755\"."
	if p.ReadOnly {
		desc += " This server's workspace is read-only: every write is refused."
	}
	return &mcp.Tool{
		Name:         NameWriteFile,
		Title:        "Write a file in the sandbox",
		Description:  desc,
		InputSchema:  inputSchema[WriteIn](writeSchemaEdit),
		OutputSchema: outputSchema[WriteOut](),
		Annotations: &mcp.ToolAnnotations{
			Title:           "Write a file in the sandbox",
			ReadOnlyHint:    false,
			DestructiveHint: ptr(true),
			IdempotentHint:  true,
			OpenWorldHint:   ptr(false),
		},
	}
}

func writeSchemaEdit(s *jsonschema.Schema) {
	s.Properties["encoding"].Enum = []any{"utf-8", "base64"}
	s.Properties["encoding"].Default = json.RawMessage(`"utf-8"`)
	s.Properties["mode"].Pattern = `^(0o)?[0-7]{1,4}$`
	s.Properties["mode"].Default = json.RawMessage(`"0644"`)
}

func (in WriteIn) target() string { return in.Sandbox }

// writeReq is a write policy let through.
type writeReq struct {
	path    string // relative to the workspace
	content string // as sent
	base64  bool   // content is base64
	size    int64  // bytes content decodes to
	append  bool
	mode    uint32
}

func (d *Deps) checkWrite(in WriteIn) (writeReq, error) {
	if dec := d.Policy.CanWrite(); !dec.Allow {
		return writeReq{}, dec.Err()
	}
	rel, dec := policy.WorkspacePath(in.Path)
	if !dec.Allow {
		return writeReq{}, dec.Err()
	}
	if rel == "." {
		return writeReq{}, &errcode.Error{Code: errcode.InvalidArgument, Message: "path names the workspace root, which is a directory; name a file"}
	}
	mode, dec := policy.ParseMode(in.Mode)
	if !dec.Allow {
		return writeReq{}, dec.Err()
	}
	req := writeReq{path: rel, content: in.Content, append: in.Append, mode: mode}
	switch in.Encoding {
	case "", "utf-8":
		req.size = int64(len(in.Content))
	case "base64":
		size, err := base64Size(in.Content)
		if err != nil {
			return writeReq{}, errcode.Errorf(errcode.InvalidArgument, "content is not valid base64 (%w); send standard base64 with padding, or text with encoding utf-8", err)
		}
		req.size, req.base64 = size, true
	default:
		return writeReq{}, errcode.Errorf(errcode.InvalidArgument, "encoding %q is not supported; use utf-8 or base64", in.Encoding)
	}
	if dec := d.Policy.CheckWriteSize(req.size); !dec.Allow {
		return writeReq{}, dec.Err()
	}
	return req, nil
}

func (d *Deps) writeFile(ctx context.Context, c *call, sb Sandbox, in writeReq) (*mcp.CallToolResult, WriteOut, error) {
	out := WriteOut{Sandbox: sb.ID()}
	// The arguments hold their own reservation (holdArguments); the
	// content is in memory already, so a write that does not fit is
	// refused at once, and they are freed.
	if err := d.reserve(ctx, c, policy.StreamReserve(), 0, "or write the content in smaller parts with append"); err != nil {
		return nil, out, err
	}
	// The content is streamed to the sandbox from the argument string, text
	// as it is and base64 decoded on the way: the server holds no second
	// copy of it.
	var src io.Reader = strings.NewReader(in.content)
	if in.base64 {
		src = base64.NewDecoder(base64.StdEncoding, src)
	}
	res, err := sb.WriteFileFrom(ctx, in.path, src, in.size, in.append, in.mode)
	if err != nil {
		return nil, out, err
	}
	out.Path, out.BytesWritten, out.Size = in.path, res.Written, res.Size
	c.bytes = res.Written
	verb := "wrote"
	if in.append {
		verb = "appended"
	}
	return textResult(fmt.Sprintf("%s %d bytes to %s (now %d bytes)", verb, res.Written, in.path, res.Size)), out, nil
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
