package main

import (
	"context"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestStdioLargeExecKeepsTheWorkspace: an exec past the argv or env cap
// gets a TOO_LARGE that says what to do, one within the caps runs however
// its bytes escape, and the sandbox and its workspace live through all of
// it.
func TestStdioLargeExecKeepsTheWorkspace(t *testing.T) {
	s := startServer(t, serverOpts{})
	w := s.ok("sandbox_write_file", map[string]any{"path": "keep.txt", "content": "kept\n"})
	sandbox := w["sandbox"]
	same := func(step string) {
		t.Helper()
		r := s.ok("sandbox_read_file", map[string]any{"path": "keep.txt"})
		if r["content"] != "kept\n" || r["sandbox"] != sandbox {
			t.Fatalf("after %s: %v", step, r)
		}
	}

	// 11.5 KB of '<' (69 KB once JSON-escaped) runs, intact.
	out := s.ok("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", `printf %s "$1" | wc -c`, "sh", strings.Repeat("<", 11500)}})
	if strings.TrimSpace(out["stdout"].(string)) != "11500" || out["sandbox"] != sandbox {
		t.Fatalf("11.5 KB of '<': %v", out)
	}
	same("11.5 KB of '<' in argv")

	for name, args := range map[string]map[string]any{
		"a 66 KB env value": {"argv": []string{"true"}, "env": map[string]any{"BIG": strings.Repeat("v", 66000)}},
		"70 KB of argv":     {"argv": []string{"echo", strings.Repeat("<", 70000)}},
	} {
		msg := s.fails("sandbox_exec", args, "TOO_LARGE")
		if !strings.Contains(msg, "65536") || !strings.Contains(msg, "stdin") || !strings.Contains(msg, "sandbox_write_file") {
			t.Errorf("%s: the error does not give the limit and what to do: %s", name, msg)
		}
		same(name)
	}

	// The caps are in sandbox://policy.
	res, err := s.cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "sandbox://policy"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"max_argv_bytes": 65536`, `"max_env_bytes": 65536`} {
		if !strings.Contains(res.Contents[0].Text, want) {
			t.Errorf("sandbox://policy lacks %s:\n%s", want, res.Contents[0].Text)
		}
	}
}
