package tools

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"hash/crc32"
	"image"
	"image/color"
	"image/png"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// pngOf encodes a w×h PNG.
func pngOf(t *testing.T, w, h int) []byte {
	t.Helper()
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for x := range w {
		img.Set(x, x%h, color.NRGBA{R: 255, A: 255})
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// pngHeader is a PNG's signature and a valid IHDR chunk claiming w×h
// pixels, and nothing else: what DecodeConfig reads, a few bytes in all.
func pngHeader(w, h uint32) []byte {
	ihdr := binary.BigEndian.AppendUint32(nil, w)
	ihdr = binary.BigEndian.AppendUint32(ihdr, h)
	ihdr = append(ihdr, 8, 2, 0, 0, 0) // 8-bit RGB
	chunk := append([]byte("IHDR"), ihdr...)
	out := append([]byte("\x89PNG\r\n\x1a\n"), binary.BigEndian.AppendUint32(nil, uint32(len(ihdr)))...)
	out = append(out, chunk...)
	return binary.BigEndian.AppendUint32(out, crc32.ChecksumIEEE(chunk))
}

// TestViewImageDecodesTheHeader: sandbox_view_image reads an image's
// header before returning it, on the real engine through a real client: a
// file that only starts like an image is refused, and so is one of more
// pixels than --max-image-pixels, with a sentence saying how to scale it
// down; an image within the cap comes back with the type its header has.
func TestViewImageDecodesTheHeader(t *testing.T) {
	r := newRig(t, func(p *policy.Policy) { p.MaxImagePixels = 1000 })
	write := func(path string, b []byte) {
		r.ok(NameWriteFile, map[string]any{"path": path, "content": base64.StdEncoding.EncodeToString(b), "encoding": "base64"})
	}
	write("magic.png", []byte("\x89PNG\r\n\x1a\n"))
	write("gif.png", []byte("GIF89a"))
	write("huge.png", pngHeader(8000, 6000))
	write("over.png", pngOf(t, 50, 21)) // 1050 pixels
	small := pngOf(t, 40, 25)           // 1000 pixels: at the cap
	write("small.png", small)

	for _, path := range []string{"magic.png", "gif.png"} {
		if msg := r.fails(NameViewImage, map[string]any{"path": path}, errcode.InvalidArgument); !strings.Contains(msg, "header does not decode") {
			t.Errorf("%s: %q", path, msg)
		}
	}
	msg := r.fails(NameViewImage, map[string]any{"path": "huge.png"}, errcode.TooLarge)
	for _, want := range []string{"8000×6000 pixels (48.0 megapixels)", "--max-image-pixels", "PIL", "convert huge.png -resize"} {
		if !strings.Contains(msg, want) {
			t.Errorf("huge: %q lacks %q", msg, want)
		}
	}
	if msg := r.fails(NameViewImage, map[string]any{"path": "over.png"}, errcode.TooLarge); !strings.Contains(msg, "50×21") {
		t.Errorf("over: %q", msg)
	}
	res := r.call(NameViewImage, map[string]any{"path": "small.png"})
	img, ok := res.Content[0].(*mcp.ImageContent)
	if res.IsError || !ok || img.MIMEType != "image/png" || !bytes.Equal(img.Data, small) {
		t.Fatalf("small: %v %T", res.IsError, res.Content[0])
	}
	r.idle()
}
