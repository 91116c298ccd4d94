package tools

import (
	"context"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// NameViewImage is sandbox_view_image's name.
const NameViewImage = "sandbox_view_image"

// ViewImageIn is sandbox_view_image's input.
type ViewImageIn struct {
	Path    string `json:"path" jsonschema:"Image file to look at (PNG, JPEG, GIF or WebP), relative to /workspace."`
	Sandbox string `json:"sandbox,omitempty" jsonschema:"Sandbox id to read from. Default: this session's sandbox."`
}

// noOutput is the output of a tool without structured content: the wrapper
// sets none, so a client shows the model the content blocks themselves.
type noOutput struct{}

func viewImageDef() *mcp.Tool {
	return &mcp.Tool{
		Name:  NameViewImage,
		Title: "Look at an image in the sandbox",
		Description: "Use it to look at an image (PNG, JPEG, GIF or WebP), such as a plot a program made, rather than reading its bytes with sandbox_exec or sandbox_read_file. " +
			"Returns the picture itself.",
		InputSchema: inputSchema[ViewImageIn](nil),
		// No output schema: a result with structured content would hide
		// the image from clients that show only that.
		Annotations: &mcp.ToolAnnotations{
			Title:         "Look at an image in the sandbox",
			ReadOnlyHint:  true,
			OpenWorldHint: ptr(false),
		},
	}
}

func (in ViewImageIn) target() string { return in.Sandbox }

// checkViewImage makes in.Path relative to the workspace.
func checkViewImage(in ViewImageIn) (ViewImageIn, error) {
	rel, dec := policy.WorkspacePath(in.Path)
	if !dec.Allow {
		return in, dec.Err()
	}
	in.Path = rel
	return in, nil
}

func (d *Deps) viewImage(ctx context.Context, c *call, sb Sandbox, in ViewImageIn) (*mcp.CallToolResult, noOutput, error) {
	var out noOutput
	rel := in.Path
	const advice = "or make the image smaller"
	if err := d.reserve(ctx, c, policy.ReadReserve(d.Policy.ReadLimit(0)), reserveWait, advice); err != nil {
		return nil, out, err
	}
	res, err := sb.ReadFile(ctx, rel, 0, 0, d.Policy.MaxFileBytes)
	if err != nil {
		return nil, out, err
	}
	if res.Truncated {
		return nil, out, errcode.Errorf(errcode.TooLarge,
			"%s is %d bytes, more than this server's cap of %d (--max-file-bytes); save a smaller image (fewer pixels, or JPEG)", rel, res.Size, d.Policy.MaxFileBytes)
	}
	mime := imageType(res.Data)
	if mime == "" {
		return nil, out, errcode.Errorf(errcode.InvalidArgument,
			"%s is not a PNG, JPEG, GIF or WebP image (it looks like %s); read it with sandbox_read_file, or convert it to PNG first", rel, http.DetectContentType(res.Data))
	}
	c.bytes = int64(len(res.Data))
	// The image's bytes and their base64 in the response.
	if err := c.resize(int64(cap(res.Data))+policy.ResponseCost(policy.Base64Len(int64(len(res.Data)))), advice); err != nil {
		return nil, out, err
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.ImageContent{Data: res.Data, MIMEType: mime}}}, out, nil
}
