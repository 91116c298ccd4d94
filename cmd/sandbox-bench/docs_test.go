package main

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func testBench(rows ...Row) *bench {
	return &bench{log: slog.New(slog.NewTextHandler(io.Discard, nil)), Rows: rows,
		Machine: Machine{Date: "2026-12-01", CPUs: 2, Docker: "20.10"}}
}

var allRows = []Row{
	{Measure: "first `sandbox_exec` of a new session, cold (connect → result)", Value: "193 ms", Baseline: "`docker run --rm IMAGE true`: 242 ms", Ratio: 0.797},
	{Measure: "first `sandbox_exec` of a new session, warm pool (`--warm 1`)", Value: "17.1 ms", Baseline: "`docker run --rm IMAGE true`: 242 ms", Ratio: 0.071},
	{Measure: "warm `sandbox_exec` of `true` vs the CLI", Value: "p50 2.87 ms, p99 5.11 ms", Baseline: "`docker exec CONTAINER true`: p50 54.3 ms", Ratio: 0.053},
	{Measure: "read 1 MiB (`sandbox_read_file`, base64)", Value: "33.4 ms", Baseline: "cat", Ratio: 0.5},
	{Measure: "idle sandboxes: 100 held (Docker)", Value: "6.5 MiB/sandbox", Baseline: "warm exec with 1 sandbox held", Ratio: 1.2},
	{Measure: "idle sandboxes: 351 held of 500 aimed at (Docker)", Value: "7.5 MiB/sandbox", Baseline: "warm exec with 1 sandbox held", Ratio: 1.3},
}

// TestUpdateDocs: the whole table goes to the docs file, four headline
// numbers to the README (of the density rows the largest count), each between its markers, the rest untouched.
func TestUpdateDocs(t *testing.T) {
	dir := t.TempDir()
	doc, readme := filepath.Join(dir, "bench.md"), filepath.Join(dir, "README.md")
	os.WriteFile(doc, []byte("# Bench\n"+tableStart+"\nold table\n"+tableEnd+"\nafter\n"), 0o644)
	os.WriteFile(readme, []byte("# Front\n"+headlineStart+"\nold\n"+headlineEnd+"\nrest\n"), 0o644)
	if err := testBench(allRows...).updateDocs(doc, readme); err != nil {
		t.Fatal(err)
	}
	d, _ := os.ReadFile(doc)
	if s := string(d); !strings.Contains(s, "| read 1 MiB (`sandbox_read_file`, base64) | 33.4 ms |") || strings.Contains(s, "old table") || !strings.HasSuffix(s, tableEnd+"\nafter\n") {
		t.Errorf("docs file:\n%s", s)
	}
	r, _ := os.ReadFile(readme)
	s := string(r)
	if strings.Count(s, "\n- ") != 4 || !strings.Contains(s, "- idle sandboxes on one host: 351 held of 500 aimed at (Docker): **7.5 MiB/sandbox**\n") || !strings.Contains(s, "- a command in a running sandbox: **p50 2.87 ms, p99 5.11 ms**; `docker exec CONTAINER true`: p50 54.3 ms (0.05×)") ||
		strings.Contains(s, "read 1 MiB") || strings.Contains(s, "\nold\n") || !strings.HasSuffix(s, headlineEnd+"\nrest\n") || !strings.Contains(s, "(docs/bench/README.md)") {
		t.Errorf("README:\n%s", s)
	}

	// A run of other rows only (-only read) leaves the headline alone.
	os.WriteFile(readme, []byte(headlineStart+"\nkept\n"+headlineEnd+"\n"), 0o644)
	if err := testBench(allRows[3]).updateDocs("", readme); err != nil {
		t.Fatal(err)
	}
	if r, _ := os.ReadFile(readme); !strings.Contains(string(r), "kept") {
		t.Errorf("headline replaced by a run that measured none of it:\n%s", r)
	}
	// A file without the markers is an error that names them.
	os.WriteFile(readme, []byte("no markers\n"), 0o644)
	if err := testBench(allRows...).updateDocs("", readme); err == nil || !strings.Contains(err.Error(), headlineStart) {
		t.Errorf("no markers: %v", err)
	}
}

// TestRepoBenchMarkers: the files make bench writes into carry their
// markers (the table in docs/bench/README.md, the headline in README.md),
// so `make bench` can update them, and the README no longer carries the
// whole table.
func TestRepoBenchMarkers(t *testing.T) {
	for _, c := range []struct{ file, start, end, absent string }{
		{"../../docs/bench/README.md", tableStart, tableEnd, headlineStart},
		{"../../README.md", headlineStart, headlineEnd, tableStart},
	} {
		b, err := os.ReadFile(c.file)
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		if i, j := strings.Index(s, c.start), strings.Index(s, c.end); i < 0 || j < i {
			t.Errorf("%s lacks the %q ... %q block make bench writes", c.file, c.start, c.end)
		}
		if strings.Contains(s, c.absent) {
			t.Errorf("%s carries %q, which belongs in the other file", c.file, c.absent)
		}
	}
}
