package tools

import (
	"context"
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

	// Read by lines.
	out = r.ok(NameReadFile, map[string]any{"path": "src/a.py", "start_line": 2, "end_line": 3})
	if out["content"] != "\tif x:\n\t\tyield 10\n" || out["start_line"] != float64(2) || out["end_line"] != float64(3) ||
		out["total_lines"] != float64(4) || out["next_offset"] != float64(27) || !strings.Contains(out["hint"].(string), "start_line=4") {
		t.Fatalf("line read: %v", out)
	}
	out = r.ok(NameReadFile, map[string]any{"path": "src/a.py", "start_line": 4})
	if out["content"] != "\tyield 2\n" || out["next_offset"] != nil || out["hint"] != nil {
		t.Fatalf("line read to the end: %v", out)
	}
	r.fails(NameReadFile, map[string]any{"path": "src/a.py", "start_line": 9}, errcode.InvalidArgument)
	r.fails(NameReadFile, map[string]any{"path": "src/a.py", "start_line": 2, "offset": 3}, errcode.InvalidArgument)
	out = r.ok(NameReadFile, map[string]any{"path": "src/a.py", "length": 4})
	if out["content"] != "def " || out["next_offset"] != float64(4) || !strings.Contains(out["hint"].(string), "offset=4") {
		t.Fatalf("byte read with more to follow: %v", out)
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

// A long text read carries its content once, in the structured result; a
// short one is in the text too.
func TestLongTextTravelsOnce(t *testing.T) {
	r := newRig(t, nil)
	long := strings.Repeat("0123456789abcdef\n", 4096) // 68 KiB
	r.ok(NameWriteFile, map[string]any{"path": "long.txt", "content": long})
	res := r.call(NameReadFile, map[string]any{"path": "long.txt"})
	sc := res.StructuredContent.(map[string]any)
	if sc["content"] != long {
		t.Fatalf("the structured content lacks the text")
	}
	if txt := text(res); strings.Contains(txt, long[:100]) || !strings.Contains(txt, "in the result's content field") {
		t.Fatalf("the long text travels twice, or the text does not say where it is: %.200q", txt)
	}

	// A client from before structured content reads only the text: it gets
	// the content there.
	ctx := context.Background()
	old := connect(t, r.d, &mcp.ClientSessionOptions{ProtocolVersion: "2025-03-26"})
	if _, err := old.CallTool(ctx, &mcp.CallToolParams{Name: NameWriteFile, Arguments: map[string]any{"path": "long.txt", "content": long}}); err != nil {
		t.Fatal(err)
	}
	res, err := old.CallTool(ctx, &mcp.CallToolParams{Name: NameReadFile, Arguments: map[string]any{"path": "long.txt"}})
	if err != nil || res.IsError || !strings.HasSuffix(text(res), "\n"+long) {
		t.Fatalf("an old client's read: %v %.200q", err, text(res))
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
