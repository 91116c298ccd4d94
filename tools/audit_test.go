package tools

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestAuditLogLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	// An existing file is appended to, never truncated.
	if err := os.WriteFile(path, []byte(`{"kind":"earlier"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := OpenAuditLog(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a.Path() != path {
		t.Fatalf("Path() = %q", a.Path())
	}

	// Many writers at once, each line long enough that interleaved writes
	// would show.
	const writers, each = 8, 50
	pad := strings.Repeat("x", 8192)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				exit := i
				a.Record(Record{Time: time.Now(), Caller: "caller-a", Tool: NameExec, ArgDigest: "sha256:00", Decision: "allow", Reason: pad, ExitCode: &exit, Bytes: int64(w)})
			}
		})
	}
	wg.Wait()
	if err := a.Write(map[string]any{"kind": "proxy_decision", "host": "example.com:443", "decision": "deny"}); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Write(map[string]string{"kind": "late"}); err == nil {
		t.Fatal("a write after Close succeeded")
	}

	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	kinds := map[string]int{}
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %d is not JSON (%v): %.80s", len(kinds), err, sc.Text())
		}
		kind, _ := m["kind"].(string)
		kinds[kind]++
		if kind == AuditKindTool {
			for _, field := range []string{"time", "caller", "tool", "arg_digest", "decision", "exit_code", "bytes", "duration_ms"} {
				if _, ok := m[field]; !ok {
					t.Fatalf("tool record lacks %q: %.200s", field, sc.Text())
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if kinds["earlier"] != 1 || kinds[AuditKindTool] != writers*each || kinds["proxy_decision"] != 1 || kinds["late"] != 0 {
		t.Fatalf("lines by kind: %v", kinds)
	}
}

func TestAuditLogFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "new.jsonl")
	a, err := OpenAuditLog(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("a new audit log has mode %v, want 0600", fi.Mode().Perm())
	}
	if _, err := OpenAuditLog(dir, nil); err == nil {
		t.Fatal("a directory was accepted as the audit log")
	}
	if _, err := OpenAuditLog(filepath.Join(dir, "missing", "x.jsonl"), nil); err == nil || !strings.Contains(err.Error(), "--audit-log") {
		t.Fatalf("an unwritable path: %v", err)
	}
}
