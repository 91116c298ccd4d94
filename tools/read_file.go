package tools

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// NameReadFile is the name of the tool that reads a file.
const NameReadFile = "sandbox_read_file"

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

func readDef() *mcp.Tool {
	return &mcp.Tool{
		Name:  NameReadFile,
		Title: "Read a file from the sandbox",
		Description: "Read a file from the sandbox's workspace (/workspace). Paths are relative to /workspace. " +
			"Text comes back as utf-8, other bytes as base64 (see encoding). Large files: read a range with offset and length; truncated says the cap cut the read. " +
			"PNG, JPEG, GIF and WebP files also come back as an image you can look at.",
		InputSchema:  inputSchema[ReadIn](nil),
		OutputSchema: outputSchema[ReadOut](),
		Annotations: &mcp.ToolAnnotations{
			Title:         "Read a file from the sandbox",
			ReadOnlyHint:  true,
			OpenWorldHint: ptr(false),
		},
	}
}

func (in ReadIn) target() string { return in.Sandbox }

// checkRead makes in.Path relative to the workspace.
func checkRead(in ReadIn) (ReadIn, error) {
	rel, dec := policy.WorkspacePath(in.Path)
	if !dec.Allow {
		return in, dec.Err()
	}
	if dec := policy.CheckRange(in.Offset, in.Length); !dec.Allow {
		return in, dec.Err()
	}
	in.Path = rel
	return in, nil
}

func (d *Deps) readFile(ctx context.Context, c *call, sb Sandbox, in ReadIn) (*mcp.CallToolResult, ReadOut, error) {
	out := ReadOut{Sandbox: sb.ID()}
	rel := in.Path
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
