package audit

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/netproxy"
)

func TestAuditLogLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	// An existing file is appended to, never truncated.
	if err := os.WriteFile(path, []byte(`{"kind":"earlier"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := Open(path, testKey, nil)
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
				a.Record(ToolRecord{Time: time.Now(), Caller: "caller-a", Tool: "sandbox_exec", Args: []byte(`{"argv":["true"]}`), Decision: "allow", Reason: pad, ExitCode: &exit, Bytes: int64(w)})
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
		if kind == KindTool {
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
	if kinds["earlier"] != 1 || kinds[KindTool] != writers*each || kinds["proxy_decision"] != 1 || kinds["late"] != 0 {
		t.Fatalf("lines by kind: %v", kinds)
	}
}

func TestAuditLogFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "new.jsonl")
	a, err := Open(path, testKey, nil)
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
	if _, err := Open(dir, testKey, nil); err == nil {
		t.Fatal("a directory was accepted as the audit log")
	}
	if _, err := Open(filepath.Join(dir, "missing", "x.jsonl"), testKey, nil); err == nil || !strings.Contains(err.Error(), "--audit-log") {
		t.Fatalf("an unwritable path: %v", err)
	}
}

var testKey = []byte("0123456789abcdef0123456789abcdef")

// TestAuditDigestIsKeyed: the digest of a call's arguments depends on the
// server's key, so a reader of the log who guesses the arguments cannot
// confirm the guess; with the key, spacing does not change it.
func TestAuditDigestIsKeyed(t *testing.T) {
	args := []byte(`{"argv":["sh","-c","echo $TOKEN"],"env":{"TOKEN":"hunter2 with spaces"}}`)
	other := []byte("fedcba9876543210fedcba9876543210")
	d := Digest(testKey, args)
	if !strings.HasPrefix(d, "hmac-sha256:") || len(d) != len("hmac-sha256:")+32 {
		t.Fatalf("digest %q: want hmac-sha256: and 32 hex digits", d)
	}
	if Digest(other, args) == d {
		t.Fatal("two keys give the same digest")
	}
	plain := sha256.Sum256(args)
	if strings.Contains(d, hex.EncodeToString(plain[:8])) {
		t.Fatal("the digest is the unkeyed SHA-256 of the arguments")
	}
	spaced := []byte("{ \"argv\" : [\"sh\", \"-c\",\n \"echo $TOKEN\"],\t\"env\": {\"TOKEN\": \"hunter2 with spaces\"} }\n")
	if Digest(testKey, spaced) != d {
		t.Error("whitespace between tokens changed the digest")
	}
	// Whitespace inside a string is the argument itself.
	if Digest(testKey, []byte(`{"argv":["sh","-c","echo $TOKEN"],"env":{"TOKEN":"hunter2  with spaces"}}`)) == d {
		t.Error("a changed string gave the same digest")
	}
	// Escaped quotes do not end a string.
	a := Digest(testKey, []byte(`{"s":"a\" b"}`))
	if b := Digest(testKey, []byte(`{"s":"a\"b"}`)); a == b {
		t.Error("a space after an escaped quote was taken for whitespace between tokens")
	}

	// The log writes the keyed digest, never the arguments.
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	log, err := Open(path, testKey, nil)
	if err != nil {
		t.Fatal(err)
	}
	log.Record(ToolRecord{Time: time.Now(), Tool: "sandbox_exec", Args: args, Decision: "allow"})
	log.Close()
	raw, _ := os.ReadFile(path)
	if !strings.Contains(string(raw), `"arg_digest":"`+d+`"`) || strings.Contains(string(raw), "hunter2") {
		t.Fatalf("audit line: %s", raw)
	}
	if _, err := Open(path, nil, nil); err == nil {
		t.Error("an audit log without a key opened")
	}
}

// TestAuditKeyFile: the key is made once, mode 0600, and reused after, so
// digests stay comparable across restarts.
func TestAuditKeyFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state") // not there yet
	if _, err := ReadKey(dir); err == nil {
		t.Fatal("ReadKey made or found a key in an empty state dir")
	}
	k1, err := LoadKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || fi.Size() != KeyBytes {
		t.Fatalf("key file: mode %v, %d bytes; want 0600 and %d", fi.Mode().Perm(), fi.Size(), KeyBytes)
	}
	k2, err := LoadKey(dir) // a restart
	if err != nil {
		t.Fatal(err)
	}
	if string(k1) != string(k2) {
		t.Fatal("a restart made a new key")
	}
	if other, _ := LoadKey(t.TempDir()); string(other) == string(k1) {
		t.Fatal("two state dirs got the same key")
	}
	left, _ := filepath.Glob(filepath.Join(dir, ".audit.key-*"))
	if len(left) > 0 {
		t.Errorf("temporary key files left: %v", left)
	}

	// Servers starting together agree on one key.
	shared := t.TempDir()
	keys := make([][]byte, 8)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() {
			k, err := LoadKey(shared)
			if err != nil {
				t.Error(err)
			}
			keys[i] = k
		})
	}
	wg.Wait()
	for _, k := range keys[1:] {
		if string(k) != string(keys[0]) {
			t.Fatal("servers starting together made different keys")
		}
	}

	// A key others can read, or a damaged one, is refused with what to do.
	os.Chmod(filepath.Join(dir, KeyFile), 0o644)
	if _, err := LoadKey(dir); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a world-readable key: %v", err)
	}
	os.WriteFile(filepath.Join(shared, KeyFile), []byte("short"), 0o600)
	if _, err := LoadKey(shared); err == nil || !strings.Contains(err.Error(), "remove it") {
		t.Errorf("a short key: %v", err)
	}
}

// TestAuditProxySummary: a proxy record says how many requests it stands
// for, whether it sums up repeated refusals, and where they came from.
func TestAuditProxySummary(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	a, err := Open(path, testKey, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.Proxy(netproxy.Decision{Sandbox: "sb-1", Client: netip.MustParseAddr("198.18.0.2"), Host: "evil.com", Port: 443, Status: 403, Reason: "not allowed", Count: 41, Summary: true})
	a.Proxy(netproxy.Decision{Sandbox: "sb-1", Host: "api.example.com", Port: 443, Allow: true, Status: 200, Count: 1})
	a.Close()
	raw, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	var sum, one map[string]any
	if len(lines) != 2 || json.Unmarshal([]byte(lines[0]), &sum) != nil || json.Unmarshal([]byte(lines[1]), &one) != nil {
		t.Fatalf("audit lines: %s", raw)
	}
	if sum["count"] != float64(41) || sum["summary"] != true || sum["client"] != "198.18.0.2" || sum["decision"] != "deny" {
		t.Errorf("summary record: %v", sum)
	}
	if one["count"] != float64(1) || one["summary"] != nil || one["decision"] != "allow" {
		t.Errorf("single record: %v", one)
	}
}
