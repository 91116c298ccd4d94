package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDrawsThePNG: a results.json with two series becomes a PNG; one with
// none is refused with what to do.
func TestDrawsThePNG(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "results.json")
	out := filepath.Join(dir, "latency.png")
	json := `{"machine":{"cpus":2},"series":[{"name":"exec","samples_ms":[1,2,3,40]},{"name":"docker exec","samples_ms":[180,190,200]}]}`
	if err := os.WriteFile(in, []byte(json), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(in, out); err != nil {
		t.Fatal(err)
	}
	png, err := os.ReadFile(out)
	if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) {
		t.Fatalf("the output is not a PNG (%d bytes, %v)", len(png), err)
	}

	if err := os.WriteFile(in, []byte(`{"rows":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(in, out); err == nil || !strings.Contains(err.Error(), "run sandbox-bench first") {
		t.Fatalf("results without series: %v", err)
	}
}
