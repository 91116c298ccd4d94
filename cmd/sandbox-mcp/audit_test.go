package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/cmd/sandbox-mcp/internal/audit"
	"github.com/sandbox-mcp/sandbox-mcp/tools"
)

// TestAuditDigestCommand: `audit digest` prints the server's digest of the
// arguments on stdin, and never makes a key of its own.
func TestAuditDigestCommand(t *testing.T) {
	state := t.TempDir()
	env := envFrom(map[string]string{"HOME": t.TempDir()})
	var out, errs bytes.Buffer
	code := run(context.Background(), []string{"audit", "digest", "--state-dir", state}, strings.NewReader(`{"argv":["true"]}`), &out, &errs, env)
	if code == 0 || !strings.Contains(errs.String(), "--state-dir") {
		t.Fatalf("without a key: exit %d, %q", code, errs.String())
	}
	if _, err := os.Stat(filepath.Join(state, audit.KeyFile)); err == nil {
		t.Fatal("audit digest made a key")
	}

	key, err := audit.LoadKey(state) // as the server does at start
	if err != nil {
		t.Fatal(err)
	}
	out.Reset()
	code = run(context.Background(), []string{"audit", "digest", "--state-dir", state}, strings.NewReader("{\"argv\": [\"true\"]}\n"), &out, &errs, env)
	if want := audit.Digest(key, []byte(`{"argv":["true"]}`)); code != 0 || strings.TrimSpace(out.String()) != want {
		t.Fatalf("audit digest: exit %d, %q; want %q", code, out.String(), want)
	}
	if code := run(context.Background(), []string{"audit", "sign"}, nil, &out, &errs, env); code != 2 {
		t.Errorf("an unknown audit verb: exit %d", code)
	}
}

// TestAuditToolCarriesEveryField: each field of what the tools report of a
// call reaches the audit log's record under the same name, so a field the
// tools add is either carried or the test names it.
func TestAuditToolCarriesEveryField(t *testing.T) {
	exit := 7
	r := tools.Record{
		Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Caller: "caller", Session: "session", Sandbox: "sandbox",
		Tool: "tool", ArgDigest: "digest", Args: json.RawMessage(`{"a":1}`), Decision: "deny", Reason: "reason",
		ExitCode: &exit, Bytes: 9, Duration: 1.5,
	}
	in := reflect.ValueOf(r)
	for i := range in.NumField() {
		if in.Field(i).IsZero() {
			t.Fatalf("tools.Record.%s is zero in this test: give it a value so the test checks it is carried", in.Type().Field(i).Name)
		}
	}
	out := reflect.ValueOf(auditTool(r))
	for i := range in.NumField() {
		name := in.Type().Field(i).Name
		got := out.FieldByName(name)
		if !got.IsValid() {
			t.Errorf("audit.ToolRecord has no field %s: the audit log would drop it", name)
			continue
		}
		if !reflect.DeepEqual(got.Interface(), in.Field(i).Interface()) {
			t.Errorf("audit record's %s = %v, want %v", name, got.Interface(), in.Field(i).Interface())
		}
	}
}
