package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandbox-mcp/sandbox-mcp/internal/audit"
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
