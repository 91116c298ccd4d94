package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestSnapshotResourceOverTheFileCap: a snapshot whose tar is larger than
// --max-file-bytes is read as its record alone, and the record says the
// tar was left out and how to get it.
func TestSnapshotResourceOverTheFileCap(t *testing.T) {
	s := startServer(t, serverOpts{args: []string{"--max-file-bytes", "4KiB"}})
	s.ok("sandbox_write_file", map[string]any{"path": "a.txt", "content": strings.Repeat("a", 3000)})
	s.ok("sandbox_write_file", map[string]any{"path": "b.txt", "content": strings.Repeat("b", 3000)})
	snap := s.ok("sandbox_snapshot", nil)
	rr, err := s.cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: snap["uri"].(string)})
	if err != nil {
		t.Fatal(err)
	}
	if len(rr.Contents) != 1 || rr.Contents[0].MIMEType != "application/json" {
		t.Fatalf("contents: %d, first %s", len(rr.Contents), rr.Contents[0].MIMEType)
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(rr.Contents[0].Text), &rec); err != nil {
		t.Fatal(err)
	}
	hint, _ := rec["hint"].(string)
	for _, want := range []string{"left out", "--max-file-bytes 4096", "sandbox_restore", "sandbox-mcp snapshot export " + snap["id"].(string)} {
		if !strings.Contains(hint, want) {
			t.Errorf("hint lacks %q: %q", want, hint)
		}
	}
	if rec["id"] != snap["id"] {
		t.Errorf("record: %v", rec)
	}
}
