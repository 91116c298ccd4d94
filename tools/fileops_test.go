package tools

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// The file tools through the MCP client on a real sandbox: edit, delete,
// move, line reads and images, with the errors a model can act on; and they
// work with exec denied.
func TestFileTools(t *testing.T) {
	r := newRig(t, func(p *policy.Policy) { p.Exec = policy.ExecDeny })
	var mu sync.Mutex
	audited := map[string]int{}
	r.d.Audit = func(rec Record) {
		mu.Lock()
		audited[rec.Tool+" "+rec.Decision]++
		mu.Unlock()
	}
	r.ok(NameWriteFile, map[string]any{"path": "src/a.py", "content": "def f():\n\tif x:\n\t\treturn 1\n\treturn 2\n", "mode": "0750"})

	// Edit.
	out := r.ok(NameEditFile, map[string]any{"path": "src/a.py", "old_string": "return 1", "new_string": "return 10"})
	if out["replacements"] != float64(1) || out["path"] != "src/a.py" || out["size"] != float64(38) {
		t.Fatalf("edit: %v", out)
	}
	msg := r.fails(NameEditFile, map[string]any{"path": "src/a.py", "old_string": "return", "new_string": "yield"}, errcode.InvalidArgument)
	if !strings.Contains(msg, "occurs 2 times (lines 3 and 4)") {
		t.Errorf("ambiguous edit: %s", msg)
	}
	msg = r.fails(NameEditFile, map[string]any{"path": "src/a.py", "old_string": "    if x:\n        return 10", "new_string": ""}, errcode.NotFound)
	if !strings.Contains(msg, "lines 2-3, which differs only in whitespace") {
		t.Errorf("near miss: %s", msg)
	}
	out = r.ok(NameEditFile, map[string]any{"path": "src/a.py", "old_string": "return", "new_string": "yield", "replace_all": true})
	if out["replacements"] != float64(2) {
		t.Fatalf("replace all: %v", out)
	}
	out = r.ok(NameEditFile, map[string]any{"path": "new/b.txt", "old_string": "", "new_string": "fresh\n"})
	if out["created"] != true || out["size"] != float64(6) {
		t.Fatalf("create by edit: %v", out)
	}
	r.fails(NameEditFile, map[string]any{"path": "../x", "old_string": "a", "new_string": "b"}, errcode.OutsideWorkspace)
	r.fails(NameEditFile, map[string]any{"path": "src/a.py", "old_string": "yield", "new_string": "yield"}, errcode.InvalidArgument)

	// Read by lines: offset is the first line, limit how many.
	out = r.ok(NameReadFile, map[string]any{"path": "src/a.py", "offset": 2, "limit": 2})
	if out["content"] != "\tif x:\n\t\tyield 10\n" || out["total_lines"] != float64(4) || out["next_offset"] != float64(4) || out["truncated"] != false {
		t.Fatalf("line read: %v", out)
	}
	out = r.ok(NameReadFile, map[string]any{"path": "src/a.py", "offset": 4})
	if out["content"] != "\tyield 2\n" || out["next_offset"] != nil || out["hint"] != nil || out["truncated"] != false {
		t.Fatalf("line read to the end: %v", out)
	}
	r.fails(NameReadFile, map[string]any{"path": "src/a.py", "offset": 9}, errcode.InvalidArgument)
	r.fails(NameReadFile, map[string]any{"path": "src/a.py", "offset": 2, "byte_offset": 3}, errcode.InvalidArgument)
	out = r.ok(NameReadFile, map[string]any{"path": "src/a.py", "byte_length": 4})
	if out["content"] != "def " || out["next_byte_offset"] != float64(4) {
		t.Fatalf("byte read with more to follow: %v", out)
	}
	// The names lines had before are refused with the ones to use.
	if msg := r.fails(NameReadFile, map[string]any{"path": "src/a.py", "start_line": 2}, errcode.InvalidArgument); !strings.Contains(msg, "takes no start_line: offset is the first line") {
		t.Errorf("start_line: %s", msg)
	}

	// Move and delete.
	out = r.ok(NameMove, map[string]any{"from": "src/a.py", "to": "lib/"})
	if out["to"] != "lib/a.py" || out["from"] != "src/a.py" {
		t.Fatalf("move: %v", out)
	}
	r.ok(NameWriteFile, map[string]any{"path": "lib/b.py", "content": "x"})
	r.fails(NameMove, map[string]any{"from": "lib/a.py", "to": "lib/b.py"}, errcode.InvalidArgument)
	r.ok(NameMove, map[string]any{"from": "lib/a.py", "to": "/workspace/lib/b.py", "overwrite": true})
	r.fails(NameMove, map[string]any{"from": "lib/b.py", "to": "../../b.py"}, errcode.OutsideWorkspace)
	r.fails(NameDelete, map[string]any{"path": "lib"}, errcode.InvalidArgument)
	out = r.ok(NameDelete, map[string]any{"path": "lib", "recursive": true})
	if out["deleted"] != float64(2) {
		t.Fatalf("delete: %v", out)
	}
	r.fails(NameDelete, map[string]any{"path": "lib"}, errcode.NotFound)
	for _, root := range []string{".", "/workspace", "", "new/.."} {
		r.fails(NameDelete, map[string]any{"path": root, "recursive": true}, errcode.InvalidArgument)
	}
	r.fails(NameMove, map[string]any{"from": ".", "to": "x"}, errcode.InvalidArgument)
	r.ok(NameReadFile, map[string]any{"path": "new/b.txt"})

	// An image that is not one.
	r.fails(NameViewImage, map[string]any{"path": "new/b.txt"}, errcode.InvalidArgument)
	r.fails(NameViewImage, map[string]any{"path": "nope.png"}, errcode.NotFound)
	r.idle()

	// Each call has its audit record, like every other tool's.
	mu.Lock()
	defer mu.Unlock()
	for _, want := range []string{NameEditFile + " allow", NameEditFile + " deny", NameDelete + " allow", NameDelete + " deny",
		NameMove + " allow", NameMove + " deny", NameViewImage + " deny"} {
		if audited[want] == 0 {
			t.Errorf("no audit record %q: %v", want, audited)
		}
	}
}

// A read without a range returns a window: as many whole lines as fit the
// output cap, up to 2000; its text carries the content as the structured
// result does (each kind of client shows the model one of them), for
// clients of every protocol version; a limit reads the whole file.
func TestReadReturnsAWindow(t *testing.T) {
	r := newRig(t, nil)
	long := strings.Repeat("0123456789abcdef\n", 4096) // 68 KiB, 4096 lines
	r.ok(NameWriteFile, map[string]any{"path": "long.txt", "content": long})
	fit := int(r.d.Policy.MaxOutputBytes) / 17 // whole lines in the output cap
	check := func(res *mcp.CallToolResult) {
		t.Helper()
		sc := res.StructuredContent.(map[string]any)
		if sc["content"] != long[:fit*17] || sc["next_offset"] != float64(fit+1) || sc["truncated"] != true || sc["total_lines"] != float64(4096) {
			t.Fatalf("window: %d bytes, next_offset %v, truncated %v", len(sc["content"].(string)), sc["next_offset"], sc["truncated"])
		}
		if txt := text(res); !strings.HasSuffix(txt, "\n"+long[:fit*17]) || !strings.Contains(txt, fmt.Sprintf("read on with offset=%d", fit+1)) {
			t.Fatalf("the text lacks the content or where to read on: %.300q", txt)
		}
	}
	check(r.call(NameReadFile, map[string]any{"path": "long.txt"}))
	ctx := context.Background()
	old := connect(t, r.d, &mcp.ClientSessionOptions{ProtocolVersion: "2025-03-26"})
	if _, err := old.CallTool(ctx, &mcp.CallToolParams{Name: NameWriteFile, Arguments: map[string]any{"path": "long.txt", "content": long}}); err != nil {
		t.Fatal(err)
	}
	res, err := old.CallTool(ctx, &mcp.CallToolParams{Name: NameReadFile, Arguments: map[string]any{"path": "long.txt"}})
	if err != nil || res.IsError || res.StructuredContent != nil {
		t.Fatalf("an old client's read: %v %.200q, structured %T", err, text(res), res.StructuredContent)
	}
	if txt := text(res); !strings.HasSuffix(txt, "\n"+long[:fit*17]) || !strings.Contains(txt, fmt.Sprintf("read on with offset=%d", fit+1)) {
		t.Fatalf("an old client's text lacks the content or where to read on: %.300q", txt)
	}
	if out := r.ok(NameReadFile, map[string]any{"path": "long.txt", "limit": 5000}); out["content"] != long || out["truncated"] != false || out["next_offset"] != nil {
		t.Fatalf("a read with a limit: %d bytes, %v", len(out["content"].(string)), out["truncated"])
	}
	r.idle()
}

// Under --read-only every tool that changes the workspace answers
// READ_ONLY, and reading still works.
func TestFileToolsReadOnly(t *testing.T) {
	r := newRig(t, func(p *policy.Policy) { p.ReadOnly = true })
	r.fails(NameEditFile, map[string]any{"path": "a", "old_string": "", "new_string": "x"}, errcode.ReadOnly)
	r.fails(NameDelete, map[string]any{"path": "a"}, errcode.ReadOnly)
	r.fails(NameMove, map[string]any{"from": "a", "to": "b"}, errcode.ReadOnly)
	r.fails(NameReadFile, map[string]any{"path": "a"}, errcode.NotFound)
}
