package tools

import (
	"bytes"
	"context"
	"errors"
	"image"
	_ "image/gif" // image.DecodeConfig reads the types sandbox_view_image takes
	_ "image/jpeg"
	_ "image/png"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	_ "golang.org/x/image/webp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// NameViewImage is sandbox_view_image's name.
const NameViewImage = "sandbox_view_image"

// ViewImageIn is sandbox_view_image's input.
type ViewImageIn struct {
	Path    string `json:"path" jsonschema:"Image file to look at (PNG, JPEG, GIF or WebP), relative to /workspace."`
	Sandbox string `json:"sandbox,omitempty" jsonschema:"Sandbox handle to read from. Default: this session's own."`
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

// imageMIME are the media types of the formats image.DecodeConfig names.
var imageMIME = map[string]string{"png": "image/png", "jpeg": "image/jpeg", "gif": "image/gif", "webp": "image/webp"}

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
	if imageType(res.Data) == "" {
		return nil, out, errcode.Errorf(errcode.InvalidArgument,
			"%s is not a PNG, JPEG, GIF or WebP image (it looks like %s); read it with sandbox_read_file, or convert it to PNG first", rel, http.DetectContentType(res.Data))
	}
	// The header says what the client would decode: a file that only
	// starts like an image, or one of more pixels than a model is shown,
	// is refused before its bytes travel.
	cfg, format, err := image.DecodeConfig(bytes.NewReader(res.Data))
	mime := imageMIME[format]
	if err != nil || mime == "" || cfg.Width <= 0 || cfg.Height <= 0 {
		if err == nil {
			err = errors.New("no width and height")
		}
		return nil, out, errcode.Errorf(errcode.InvalidArgument,
			"%s starts like a %s image but its header does not decode (%w): it is cut short or damaged; make it again, or check it with `file %s` in sandbox_exec", rel, imageType(res.Data), err, rel)
	}
	if px := int64(cfg.Width) * int64(cfg.Height); px > d.Policy.MaxImagePixels {
		return nil, out, errcode.Errorf(errcode.TooLarge,
			"%s is %d×%d pixels (%.1f megapixels), more than this server's cap of %.1f megapixels (--max-image-pixels); "+
				"scale it down in the sandbox and view the copy, e.g. python3 -c \"from PIL import Image; im = Image.open('%s'); im.thumbnail((2000, 2000)); im.save('small.png')\" or convert %s -resize 2000x2000 small.png",
			rel, cfg.Width, cfg.Height, float64(px)/1e6, float64(d.Policy.MaxImagePixels)/1e6, rel, rel)
	}
	c.bytes = int64(len(res.Data))
	// The image's bytes and their base64 in the response.
	if err := c.resize(int64(cap(res.Data))+policy.ResponseCost(policy.Base64Len(int64(len(res.Data)))), advice); err != nil {
		return nil, out, err
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.ImageContent{Data: res.Data, MIMEType: mime}}}, out, nil
}
