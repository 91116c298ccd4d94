package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// viewImage calls sandbox_view_image, which must answer with exactly one
// image block and no structured content (so every client shows it).
func viewImage(t *testing.T, s *server, path string) *mcp.ImageContent {
	t.Helper()
	res := s.call("sandbox_view_image", map[string]any{"path": path})
	if res.IsError {
		t.Fatalf("view image %s: %s", path, text(res))
	}
	if len(res.Content) != 1 || res.StructuredContent != nil {
		t.Fatalf("view image %s: %d content blocks, structured %v; want one image only", path, len(res.Content), res.StructuredContent)
	}
	img, ok := res.Content[0].(*mcp.ImageContent)
	if !ok {
		t.Fatalf("view image %s: a %T, not an image", path, res.Content[0])
	}
	return img
}

// fileTools runs edit, line reads, move and delete through a client, with
// the errors a model gets, on a server where exec may be denied.
func fileTools(t *testing.T, s *server) {
	s.ok("sandbox_write_file", map[string]any{"path": "app/main.py", "content": "import os\n\ndef main():\n    print('hi')\n    print('hi')\n", "mode": "0755"})
	msg := s.fails("sandbox_edit_file", map[string]any{"path": "app/main.py", "old_string": "print('hi')", "new_string": "print('bye')"}, "INVALID_ARGUMENT")
	if !strings.Contains(msg, "occurs 2 times (lines 4 and 5)") || !strings.Contains(msg, "replace_all") {
		t.Errorf("ambiguous edit: %s", msg)
	}
	msg = s.fails("sandbox_edit_file", map[string]any{"path": "app/main.py", "old_string": "def main():\n\tprint('hi')", "new_string": ""}, "NOT_FOUND")
	if !strings.Contains(msg, "lines 3-4, which differs only in whitespace") {
		t.Errorf("near miss: %s", msg)
	}
	e := s.ok("sandbox_edit_file", map[string]any{"path": "/workspace/app/main.py", "old_string": "    print('hi')\n    print('hi')\n", "new_string": "    print('once')\n"})
	if e["replacements"].(float64) != 1 || e["path"] != "app/main.py" {
		t.Fatalf("edit: %v", e)
	}
	l := s.ok("sandbox_list", map[string]any{"path": "app", "details": true})
	if m := l["entries"].([]any)[0].(map[string]any); m["mode"] != "0755" || m["size"].(float64) != e["size"].(float64) {
		t.Fatalf("the edit did not keep the mode, or the size: %v %v", m, e)
	}

	r := s.ok("sandbox_read_file", map[string]any{"path": "app/main.py", "offset": 3, "limit": 1})
	if r["content"] != "def main():\n" || r["total_lines"].(float64) != 4 || r["next_offset"].(float64) != 4 || r["truncated"] != false {
		t.Fatalf("line read: %v", r)
	}

	m := s.ok("sandbox_move", map[string]any{"from": "app", "to": "src/app"})
	if m["to"] != "src/app" {
		t.Fatalf("move: %v", m)
	}
	s.ok("sandbox_write_file", map[string]any{"path": "other.py", "content": "x"})
	s.fails("sandbox_move", map[string]any{"from": "other.py", "to": "src/app/main.py"}, "INVALID_ARGUMENT")
	s.ok("sandbox_move", map[string]any{"from": "other.py", "to": "src/app/main.py", "overwrite": true})
	s.fails("sandbox_move", map[string]any{"from": "src", "to": "/tmp/src"}, "OUTSIDE_WORKSPACE")
	s.fails("sandbox_delete", map[string]any{"path": "src"}, "INVALID_ARGUMENT")
	d := s.ok("sandbox_delete", map[string]any{"path": "src", "recursive": true})
	if d["deleted"].(float64) != 3 {
		t.Fatalf("delete: %v", d)
	}
	s.fails("sandbox_delete", map[string]any{"path": "/workspace", "recursive": true}, "INVALID_ARGUMENT")
	s.fails("sandbox_delete", map[string]any{"path": "../etc", "recursive": true}, "OUTSIDE_WORKSPACE")
	if l := s.ok("sandbox_list", nil); len(l["entries"].([]any)) != 0 {
		t.Fatalf("the workspace is not empty: %v", l)
	}
}

// TestStdioFileTools: the file tools through the go-sdk client over stdio,
// with exec denied (they must not need it).
func TestStdioFileTools(t *testing.T) {
	s := startServer(t, serverOpts{args: []string{"--exec=deny"}})
	fileTools(t, s)
}

// TestHTTPFileTools: the same over streamable HTTP.
func TestHTTPFileTools(t *testing.T) {
	h := startHTTP(t, httpOpts{})
	fileTools(t, h.connect(""))
}

// TestStdioFileToolsSymlinks: a symlink that leads outside, on either path
// or as the target, never lets edit, delete or move touch the outside.
func TestStdioFileToolsSymlinks(t *testing.T) {
	s := startServer(t, serverOpts{})
	out := s.ok("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", "mkdir -p /tmp/outside && echo secret > /tmp/outside/f && ln -s /tmp/outside out && ln -s /tmp/outside/f outf && ln -s ../tmp dotdot && mkdir real && echo in > real/f && ln -s real inlink"}})
	if out["exit_code"].(float64) != 0 {
		t.Fatalf("setup: %v", out)
	}
	s.fails("sandbox_edit_file", map[string]any{"path": "out/f", "old_string": "secret", "new_string": "pwned"}, "OUTSIDE_WORKSPACE")
	s.fails("sandbox_edit_file", map[string]any{"path": "outf", "old_string": "secret", "new_string": "pwned"}, "INVALID_ARGUMENT")
	s.fails("sandbox_delete", map[string]any{"path": "out/f"}, "INVALID_ARGUMENT")
	s.fails("sandbox_delete", map[string]any{"path": "dotdot/outside", "recursive": true}, "INVALID_ARGUMENT")
	s.fails("sandbox_move", map[string]any{"from": "out/f", "to": "stolen"}, "INVALID_ARGUMENT")
	s.fails("sandbox_move", map[string]any{"from": "real/f", "to": "out/planted"}, "INVALID_ARGUMENT")
	// A symlink inside is refused on delete and move paths too (they never
	// follow one), but edit follows it like read and write do.
	s.fails("sandbox_delete", map[string]any{"path": "inlink/f"}, "INVALID_ARGUMENT")
	s.ok("sandbox_edit_file", map[string]any{"path": "inlink/f", "old_string": "in", "new_string": "edited"})
	// Deleting or moving the links removes or renames the links only.
	s.ok("sandbox_delete", map[string]any{"path": "out", "recursive": true})
	s.ok("sandbox_move", map[string]any{"from": "outf", "to": "moved-link"})
	out = s.ok("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", "cat /tmp/outside/f; ls /tmp/outside; readlink moved-link; cat real/f"}})
	if out["stdout"] != "secret\nf\n/tmp/outside/f\nedited\n" {
		t.Fatalf("the outside changed, or the links were followed: %q", out["stdout"])
	}
}

// TestStdioFileToolsReadOnly: under --read-only the tools that change the
// workspace answer READ_ONLY.
func TestStdioFileToolsReadOnly(t *testing.T) {
	s := startServer(t, serverOpts{args: []string{"--read-only"}})
	s.fails("sandbox_edit_file", map[string]any{"path": "a", "old_string": "", "new_string": "x"}, "READ_ONLY")
	s.fails("sandbox_delete", map[string]any{"path": "a"}, "READ_ONLY")
	s.fails("sandbox_move", map[string]any{"from": "a", "to": "b"}, "READ_ONLY")
}

// TestStdioViewImage: an image a program in the sandbox wrote is shown as
// one image block whose bytes are the file's, and read_file gives its media
// type only (TestDefaultImage draws the picture with python3).
func TestStdioViewImage(t *testing.T) {
	s := startServer(t, serverOpts{})
	png := []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89\x00\x00\x00\rIDATx\x9cc\xf8\xcf\xc0\xf0\x1f\x00\x05\x00\x01\xff\x89\x99=\x1d\x00\x00\x00\x00IEND\xaeB`\x82")
	s.ok("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", "base64 -d > dot.png"}, "stdin": base64.StdEncoding.EncodeToString(png)})
	img := viewImage(t, s, "dot.png")
	if img.MIMEType != "image/png" || !bytes.Equal(img.Data, png) {
		t.Fatalf("view image: %s %d bytes", img.MIMEType, len(img.Data))
	}
	r := s.ok("sandbox_read_file", map[string]any{"path": "dot.png"})
	if r["media_type"] != "image/png" || r["content"] != "" || !strings.Contains(r["hint"].(string), "sandbox_view_image") {
		t.Fatalf("read of an image: %v", r)
	}
	s.ok("sandbox_write_file", map[string]any{"path": "notes.txt", "content": "text"})
	s.fails("sandbox_view_image", map[string]any{"path": "notes.txt"}, "INVALID_ARGUMENT")
	s.fails("sandbox_view_image", map[string]any{"path": "../etc/shadow"}, "OUTSIDE_WORKSPACE")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tools, err := s.cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tools.Tools {
		if tool.Name == "sandbox_view_image" && tool.OutputSchema != nil {
			t.Fatalf("sandbox_view_image declares an output schema")
		}
	}
}
