package audit

import (
	"bytes"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/netproxy"
)

var update = flag.Bool("update", false, "rewrite testdata/lines.golden from the records")

// TestAuditLineFormat fixes the audit log's line format: one record of each
// kind, written at a fixed time by a fixed process, must give the lines in
// testdata/lines.golden byte for byte. The format is what operators' log
// pipelines parse; a change to it shows here and is made on purpose (go
// test -run TestAuditLineFormat -update), never by renaming a field
// elsewhere.
func TestAuditLineFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	a, err := Open(path, testKey, nil)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 678000000, time.UTC)
	a.now = func() time.Time { return at }
	a.pid = 4242

	a.Server("start", "")
	exit := 3
	a.Record(ToolRecord{Time: at, Caller: "tok-1a2b", Session: "sess-1", Sandbox: "sb-1", Tool: "sandbox_exec",
		Args: []byte(`{"argv": ["ls", "-la"]}`), Decision: "allow", ExitCode: &exit, Bytes: 120, Duration: 12.5})
	a.Record(ToolRecord{Kind: "ignored", Time: at, Tool: "sandbox_write_file", ArgDigest: "hmac-sha256:given",
		Decision: "deny", Reason: "POLICY_DENIED: the workspace is read-only", Duration: 0.25})
	a.Proxy(netproxy.Decision{Sandbox: "sb-1", Client: netip.MustParseAddr("198.18.0.2"), Host: "API.example.com.",
		Normalized: "api.example.com", Port: 443, Resolved: []netip.Addr{netip.MustParseAddr("192.0.2.7")},
		Addr: netip.MustParseAddr("192.0.2.7"), Allow: true, Rule: "api.example.com", Status: 200,
		Duration: 1500 * time.Microsecond, Count: 1})
	a.Proxy(netproxy.Decision{Sandbox: "sb-1", Host: "evil.com", Port: 443, Reason: "not allowed", Status: 403, Count: 41, Summary: true})
	a.SecretUse(netproxy.SecretUse{Sandbox: "sb-1", Name: "GITHUB_TOKEN", Host: "api.github.com", Port: 443})
	a.Approval(ApprovalRecord{Time: at, Event: "question", Caller: "tok-1a2b", Session: "sess-1", Sandbox: "sb-1", Tool: "sandbox_exec",
		Host: "registry.npmjs.org", Port: 443, Pattern: "registry.npmjs.org:443", Detail: "The sandbox sb-1 tried to reach registry.npmjs.org:443 ..."})
	a.Approval(ApprovalRecord{Time: at, Event: "answer", Caller: "tok-1a2b", Session: "sess-1", Sandbox: "sb-1", Tool: "sandbox_exec",
		Host: "registry.npmjs.org", Port: 443, Pattern: "registry.npmjs.org:443", Answer: "approved"})
	a.Server("stop", "stdin closed")
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}

	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "lines.golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -run TestAuditLineFormat -update to write it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the audit log's lines changed; if on purpose, run go test -run TestAuditLineFormat -update and say so in docs/egress-and-audit.md\ngot:\n%s\nwant:\n%s", got, want)
	}
}
