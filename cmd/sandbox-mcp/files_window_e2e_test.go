package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// both calls a tool that must succeed and returns what each kind of
// client shows the model: the structured content (Claude Code, Codex, VS
// Code) and the text blocks (Cursor, Claude Desktop, most SDK agents).
func (s *server) both(name string, args map[string]any) (map[string]any, string) {
	s.t.Helper()
	res := s.call(name, args)
	if res.IsError {
		s.t.Fatalf("%s(%v) failed: %s", name, args, text(res))
	}
	m, ok := res.StructuredContent.(map[string]any)
	if !ok {
		s.t.Fatalf("%s: structured content is %T", name, res.StructuredContent)
	}
	return m, text(res)
}

// sh runs a shell line that must exit 0.
func (s *server) sh(script string) {
	s.t.Helper()
	out := s.ok("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", script}})
	if out["exit_code"].(float64) != 0 {
		s.t.Fatalf("%s: %v", script, out)
	}
}

// TestStdioReadsSizedForAModel: sandbox_read_file without a range returns a
// window (2000 lines, or the output cap), with where to read on, in the
// structured result and in the text alike; offset and limit are lines,
// byte_offset and byte_length bytes; long lines are cut with a marker;
// bytes that are not text come back as a base64 window; the names lines
// had before get a sentence naming the right ones.
func TestStdioReadsSizedForAModel(t *testing.T) {
	s := startServer(t, serverOpts{})
	s.sh("seq 1 5000 > log.txt")
	var first2000 strings.Builder
	for i := 1; i <= 2000; i++ {
		fmt.Fprintf(&first2000, "%d\n", i)
	}

	r, txt := s.both("sandbox_read_file", map[string]any{"path": "log.txt"})
	if r["content"] != first2000.String() || r["next_offset"].(float64) != 2001 || r["truncated"] != true || r["total_lines"].(float64) != 5000 ||
		!strings.Contains(r["hint"].(string), "offset=2001") {
		t.Fatalf("a read without a range: %d bytes, %v %v %v %v", len(r["content"].(string)), r["next_offset"], r["truncated"], r["total_lines"], r["hint"])
	}
	if !strings.HasSuffix(txt, "\n"+first2000.String()) || !strings.Contains(txt, "offset=2001") || strings.Contains(txt, "content field") {
		t.Fatalf("the text of a read without a range lacks the content or where to read on: %.300q", txt)
	}
	r, _ = s.both("sandbox_read_file", map[string]any{"path": "log.txt", "offset": 4990})
	if r["content"] != "4990\n4991\n4992\n4993\n4994\n4995\n4996\n4997\n4998\n4999\n5000\n" || r["truncated"] != false || r["next_offset"] != nil {
		t.Fatalf("the last lines: %v", r)
	}
	r, txt = s.both("sandbox_read_file", map[string]any{"path": "log.txt", "offset": 100, "limit": 3})
	if r["content"] != "100\n101\n102\n" || r["next_offset"].(float64) != 103 || !strings.HasSuffix(txt, "\n100\n101\n102\n") {
		t.Fatalf("offset and limit are lines: %v %q", r, txt)
	}
	// A limit reads past the window, up to the file cap.
	if r, _ = s.both("sandbox_read_file", map[string]any{"path": "log.txt", "limit": 5000}); r["truncated"] != false || strings.Count(r["content"].(string), "\n") != 5000 {
		t.Fatalf("a read with a limit of 5000 lines: %v %v", r["truncated"], r["next_offset"])
	}

	// A line of 10,000 characters is cut at 2000, with the byte_offset of
	// its rest, which a read by bytes gets.
	s.sh(`head -c 10000 /dev/zero | tr '\0' x > wide.txt && printf '\nsecond\n' >> wide.txt`)
	r, txt = s.both("sandbox_read_file", map[string]any{"path": "wide.txt"})
	want := strings.Repeat("x", 2000) + " [… 8000 more bytes of this line: byte_offset=2000]\nsecond\n"
	if r["content"] != want || r["truncated"] != true || !strings.Contains(r["hint"].(string), "longer than 2000 characters are cut") || !strings.HasSuffix(txt, want) {
		t.Fatalf("a long line: %q %v", r["content"], r["hint"])
	}
	r, _ = s.both("sandbox_read_file", map[string]any{"path": "wide.txt", "byte_offset": 2000, "byte_length": 8000})
	if r["content"] != strings.Repeat("x", 8000) || r["next_byte_offset"].(float64) != 10000 {
		t.Fatalf("the rest of the line by bytes: %d bytes, %v", len(r["content"].(string)), r["next_byte_offset"])
	}

	// Bytes that are not text: a base64 window, in the text too.
	s.sh("head -c 100000 /dev/urandom > rand.bin")
	r, txt = s.both("sandbox_read_file", map[string]any{"path": "rand.bin"})
	raw, err := base64.StdEncoding.DecodeString(r["content"].(string))
	if err != nil || r["encoding"] != "base64" || len(raw) != 24<<10 || r["next_byte_offset"].(float64) != 24<<10 || r["truncated"] != true {
		t.Fatalf("a binary read: %d bytes, %v %v %v", len(raw), r["encoding"], r["next_byte_offset"], err)
	}
	if !strings.HasSuffix(txt, "\n"+r["content"].(string)) || strings.Contains(txt, "content field") {
		t.Fatalf("the text of a binary read does not carry it: %.200q", txt)
	}

	// The old names for lines, and a mix of lines and bytes.
	msg := s.fails("sandbox_read_file", map[string]any{"path": "log.txt", "start_line": 3, "end_line": 9}, "INVALID_ARGUMENT")
	if !strings.Contains(msg, "takes no end_line") || !strings.Contains(msg, "limit") {
		t.Errorf("end_line: %s", msg)
	}
	s.fails("sandbox_read_file", map[string]any{"path": "log.txt", "offset": 3, "byte_length": 9}, "INVALID_ARGUMENT")
	s.fails("sandbox_read_file", map[string]any{"path": "log.txt", "offset": 5001}, "INVALID_ARGUMENT")
}

// TestStdioHugeSparseReadStopsAtItsBound: a line read of an 8 EiB sparse
// file looks at no more than the file cap (issue 18, item 7): a line past
// it is refused at once, saying how to read further; the window comes back
// as bytes; and the sandbox goes on, its workspace free.
func TestStdioHugeSparseReadStopsAtItsBound(t *testing.T) {
	s := startServer(t, serverOpts{})
	snap := s.ok("sandbox_snapshot", nil)
	s.sh("truncate -s 9223372036854775807 huge")
	start := time.Now()
	msg := s.fails("sandbox_read_file", map[string]any{"path": "huge", "offset": 2}, "INVALID_ARGUMENT")
	if !strings.Contains(msg, "line 2 is not in the first 8388608 bytes") || !strings.Contains(msg, "byte_offset") {
		t.Errorf("a line past the scan: %s", msg)
	}
	r, _ := s.both("sandbox_read_file", map[string]any{"path": "huge"})
	if raw, _ := base64.StdEncoding.DecodeString(r["content"].(string)); r["encoding"] != "base64" || len(raw) != 24<<10 || r["size"].(float64) != 9223372036854775807 {
		t.Fatalf("a window of a huge sparse file: %d bytes, %v", len(raw), r["encoding"])
	}
	// Far below the server's 60 s wait for the agent: the scan stopped at
	// its bound, not at a deadline.
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("the reads took %v", d)
	}
	// A restore takes the workspace alone: nothing is still scanning.
	s.ok("sandbox_restore", map[string]any{"id": snap["id"]})
	s.ok("sandbox_write_file", map[string]any{"path": "after.txt", "content": "ok"})
}

// TestStdioListSizedForAModel: a recursive list is breadth-first, at most
// 200 entries by default, with dependency trees and caches as one entry and
// a count (unless asked for by path), mode and mtime only with details,
// and a pattern that crosses directories.
func TestStdioListSizedForAModel(t *testing.T) {
	s := startServer(t, serverOpts{})
	s.sh(`mkdir -p p/src/pkg p/.git/objects p/target/debug && touch p/README.md p/src/app.py p/src/pkg/util.py p/src/pkg/data.json p/.git/HEAD p/target/debug/app &&
echo 'Signature: 8a477f597d28d172789f06886806bc55' > p/target/CACHEDIR.TAG &&
i=0; while [ $i -lt 300 ]; do mkdir -p p/node_modules/m$i && touch p/node_modules/m$i/index.js; i=$((i+1)); done`)

	l, txt := s.both("sandbox_list", map[string]any{"path": "p", "recursive": true})
	var paths []string
	byPath := map[string]map[string]any{}
	for _, e := range l["entries"].([]any) {
		m := e.(map[string]any)
		paths = append(paths, m["path"].(string))
		byPath[m["path"].(string)] = m
	}
	if fmt.Sprint(paths) != "[p/.git p/README.md p/node_modules p/src p/target p/src/app.py p/src/pkg p/src/pkg/data.json p/src/pkg/util.py]" {
		t.Fatalf("breadth-first, dependency trees pruned: %q", paths)
	}
	if nm := byPath["p/node_modules"]; nm["pruned"] != true || nm["count"].(float64) != 300 || byPath["p/target"]["pruned"] != true || byPath["p/src"]["pruned"] != nil {
		t.Fatalf("pruned entries: %v %v", nm, byPath["p/target"])
	}
	if _, ok := byPath["p/README.md"]["mtime"]; ok || l["truncated"] != false {
		t.Fatalf("mode and mtime without details, or truncated: %v %v", byPath["p/README.md"], l["truncated"])
	}
	if !strings.Contains(txt, "p/node_modules/ (300 entries, not listed") || !strings.Contains(txt, "p/src/pkg/util.py 0") {
		t.Fatalf("the text of the list: %q", txt)
	}

	// A pattern with "/" lists recursively; pruned trees still show.
	l, txt = s.both("sandbox_list", map[string]any{"path": "p", "pattern": "**/*.py"})
	if n := len(l["entries"].([]any)); n != 5 || !strings.Contains(txt, "p/src/pkg/util.py") || strings.Contains(txt, "data.json") {
		t.Fatalf("pattern: %d entries: %q", n, txt)
	}

	// Asked for by path, a dependency tree is listed: 600 entries, cut at
	// the default of 200, with what to do.
	l, txt = s.both("sandbox_list", map[string]any{"path": "p/node_modules", "recursive": true})
	if n := len(l["entries"].([]any)); n != 200 || l["truncated"] != true || !strings.Contains(l["hint"].(string), "max_entries") || !strings.Contains(txt, "max_entries") {
		t.Fatalf("a dependency tree asked for: %d entries, %v %v", n, l["truncated"], l["hint"])
	}
	if first := l["entries"].([]any)[0].(map[string]any)["path"]; first != "p/node_modules/m0" {
		t.Fatalf("first entry %v", first)
	}
	l, _ = s.both("sandbox_list", map[string]any{"path": "p", "details": true})
	if e := l["entries"].([]any)[1].(map[string]any); e["mode"] != "0644" || e["mtime"] == nil {
		t.Fatalf("details: %v", e)
	}
}

// TestStdioMultiEdit: edits apply in order, all or nothing, a failure
// names the edit; a near-miss search on a large file answers promptly
// (issue 18, item 7), and the sandbox goes on.
func TestStdioMultiEdit(t *testing.T) {
	s := startServer(t, serverOpts{})
	s.ok("sandbox_write_file", map[string]any{"path": "a.py", "content": "def f():\n    return 1\n\ndef g():\n    return 1\n"})
	e, txt := s.both("sandbox_edit_file", map[string]any{"path": "a.py", "edits": []map[string]any{
		{"old_string": "def f", "new_string": "def first"},
		{"old_string": "return 1", "new_string": "return 2", "replace_all": true},
		{"old_string": "first", "new_string": "one"},
	}})
	if e["replacements"].(float64) != 4 || !strings.Contains(txt, "made 3 edits") {
		t.Fatalf("three edits: %v %q", e, txt)
	}
	want := "def one():\n    return 2\n\ndef g():\n    return 2\n"
	if r := s.ok("sandbox_read_file", map[string]any{"path": "a.py"}); r["content"] != want {
		t.Fatalf("after the edits: %q", r["content"])
	}
	msg := s.fails("sandbox_edit_file", map[string]any{"path": "a.py", "edits": []map[string]any{
		{"old_string": "def g", "new_string": "def h"},
		{"old_string": "def g", "new_string": "def i"},
	}}, "NOT_FOUND")
	if !strings.Contains(msg, "edit 2 of 2") || !strings.Contains(msg, "no edit was made") {
		t.Errorf("a failed second edit: %s", msg)
	}
	if r := s.ok("sandbox_read_file", map[string]any{"path": "a.py"}); r["content"] != want {
		t.Fatalf("a failed set of edits changed the file: %q", r["content"])
	}
	s.fails("sandbox_edit_file", map[string]any{"path": "a.py", "old_string": "x", "new_string": "y", "edits": []map[string]any{{"old_string": "a", "new_string": "b"}}}, "INVALID_ARGUMENT")

	// 8 MiB of "a" lines against an old_string whose first and last lines
	// match everywhere: lines × old lines comparisons, unless bounded.
	snap := s.ok("sandbox_snapshot", nil)
	s.sh(`head -c 4194304 /dev/zero | tr '\0' '\n' | sed 's/^/a/' > big`)
	old := strings.Repeat("a\n", 10_000) + "b\n" + strings.Repeat("a\n", 10_000) + "a"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	res, err := s.cs.CallTool(ctx, &mcp.CallToolParams{Name: "sandbox_edit_file", Arguments: map[string]any{"path": "big", "old_string": old, "new_string": "x"}})
	if err != nil || !res.IsError || !strings.HasPrefix(text(res), "NOT_FOUND: ") {
		t.Fatalf("a near-miss edit on a large file: %v %.300s", err, text(res))
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("the near-miss edit took %v", d)
	}
	// A restore takes the workspace alone: nothing is still searching.
	s.ok("sandbox_restore", map[string]any{"id": snap["id"]})
	s.ok("sandbox_write_file", map[string]any{"path": "after.txt", "content": "ok"})
}
