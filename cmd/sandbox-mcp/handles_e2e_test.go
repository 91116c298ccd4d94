package main

import (
	"strings"
	"testing"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/docker"
)

// TestStdioHandles: through the go-sdk client over stdio (on 2025-11-25,
// a protocol with sessions), a caller makes two sandboxes by handle,
// writes in one, does not find the file from the other, lists both, and
// ends one: its container goes, and a call naming it says it ended.
func TestStdioHandles(t *testing.T) {
	s := startServer(t, serverOpts{protocol: "2025-11-25"})
	one := s.ok("sandbox_create", map[string]any{"label": "one"})
	two := s.ok("sandbox_create", map[string]any{"label": "two"})
	a, b := one["sandbox"].(string), two["sandbox"].(string)
	if a == "" || b == "" || a == b || one["state"] != "new" || !strings.Contains(one["hint"].(string), a) {
		t.Fatalf("created %v and %v", one, two)
	}
	s.ok("sandbox_write_file", map[string]any{"sandbox": a, "path": "only-here.txt", "content": "in one\n"})
	if got := s.ok("sandbox_read_file", map[string]any{"sandbox": a, "path": "only-here.txt"}); got["content"] != "in one\n" || got["sandbox"] != a {
		t.Fatalf("read in one: %v", got)
	}
	s.fails("sandbox_read_file", map[string]any{"sandbox": b, "path": "only-here.txt"}, "NOT_FOUND")
	// Neither call made this session's own sandbox.
	res := s.call("sandbox_status", map[string]any{})
	list, _ := res.StructuredContent.(map[string]any)["sandboxes"].([]any)
	if res.IsError || len(list) != 2 {
		t.Fatalf("status: %s", text(res))
	}
	for i, want := range []string{a, b} {
		e := list[i].(map[string]any)
		if e["sandbox"] != want || e["state"] != "running" || !strings.Contains(text(res), want) {
			t.Errorf("listed %d: %v; text:\n%s", i, e, text(res))
		}
	}
	ended := s.ok("sandbox_end", map[string]any{"sandbox": a, "snapshot": true})
	snap, _ := ended["snapshot"].(string)
	if ended["ended"] != true || !strings.HasPrefix(snap, "snap-") {
		t.Fatalf("end: %v", ended)
	}
	if left := testenv.Containers(t, s.cli, docker.LabelSandbox, a); len(left) != 0 {
		t.Fatalf("the ended sandbox's container is left: %v", left)
	}
	msg := s.fails("sandbox_exec", map[string]any{"sandbox": a, "argv": []string{"true"}}, "NOT_FOUND")
	if !strings.Contains(msg, snap) {
		t.Errorf("a call naming the ended sandbox: %s", msg)
	}
	msg = s.fails("sandbox_exec", map[string]any{"sandbox": "sb-" + strings.Repeat("f", 32), "argv": []string{"true"}}, "NOT_FOUND")
	if !strings.Contains(msg, "sandbox_status") || !strings.Contains(msg, "sandbox_create") {
		t.Errorf("a call naming an unknown sandbox: %s", msg)
	}
	res = s.call("sandbox_status", map[string]any{})
	if list, _ := res.StructuredContent.(map[string]any)["sandboxes"].([]any); len(list) != 1 || strings.Contains(text(res), a) {
		t.Fatalf("status after the end: %s", text(res))
	}
}
