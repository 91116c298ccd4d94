package main

import (
	"fmt"
	"os"
	"strings"
)

// The whole results table lives in docs/bench/README.md between the table
// markers; README.md keeps three headline numbers between the headline
// markers. make bench rewrites both blocks.
const (
	tableStart    = "<!-- bench:start (make bench writes this table) -->"
	tableEnd      = "<!-- bench:end -->"
	headlineStart = "<!-- bench:headline:start (make bench writes these lines) -->"
	headlineEnd   = "<!-- bench:headline:end -->"
)

// headlineRows are the measures README.md shows, by the start of their
// name: the first call of a new session (cold, then from the warm pool) and
// a command in a running sandbox, and the most idle sandboxes held (the
// last density row: the largest count).
var headlineRows = []struct {
	measure, label string
	last           bool // the last row of that name, not the first
}{
	{"first `sandbox_exec` of a new session, cold", "a new session's first command, cold", false},
	{"first `sandbox_exec` of a new session, warm pool", "a new session's first command, from the warm pool (`--warm 1`)", false},
	{"warm `sandbox_exec` of `true` vs the CLI", "a command in a running sandbox", false},
	{"idle sandboxes: ", "idle sandboxes on one host", true},
}

// updateDocs writes the table into doc and the headline into readme (either
// may be "" to skip it). A run that measured none of the headline rows
// (-only) leaves readme as it was; one that measured only some writes them.
func (b *bench) updateDocs(doc, readme string) error {
	if doc != "" {
		if err := replaceBlock(doc, tableStart, tableEnd, b.markdown()); err != nil {
			return err
		}
	}
	if readme != "" {
		h := b.headline()
		if h == "" {
			b.log.Info("the README's headline is left as it was: this run measured none of its rows", "file", readme)
			return nil
		}
		return replaceBlock(readme, headlineStart, headlineEnd, h)
	}
	return nil
}

// headline renders the headline rows this run measured, one bullet each,
// and the machine; "" when it measured none.
func (b *bench) headline() string {
	var s strings.Builder
	for _, h := range headlineRows {
		var row *Row
		for i, r := range b.Rows {
			if strings.HasPrefix(r.Measure, h.measure) && (row == nil || h.last) {
				row = &b.Rows[i]
			}
		}
		if row == nil {
			continue
		}
		if h.last {
			// The row's name carries the count held.
			fmt.Fprintf(&s, "- %s: %s: **%s**", h.label, strings.TrimPrefix(row.Measure, h.measure), row.Value)
		} else {
			fmt.Fprintf(&s, "- %s: **%s**; %s", h.label, row.Value, row.Baseline)
		}
		if row.Ratio > 0 && !h.last {
			fmt.Fprintf(&s, " (%.2f×)", row.Ratio)
		}
		s.WriteString("\n")
	}
	if s.Len() == 0 {
		return ""
	}
	fmt.Fprintf(&s, "\nMeasured %s on %d CPUs with Docker %s through a real MCP client; every measure, its baseline and goal: [docs/bench/](docs/bench/README.md).\n",
		b.Machine.Date, b.Machine.CPUs, b.Machine.Docker)
	return s.String()
}

// replaceBlock replaces what lies between the markers start and end in the
// file path with text.
func replaceBlock(path, start, end, text string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s := string(b)
	i, j := strings.Index(s, start), strings.Index(s, end)
	if i < 0 || j < i {
		return fmt.Errorf("%s has no %q ... %q block for make bench to write into", path, start, end)
	}
	s = s[:i+len(start)] + "\n" + text + s[j:]
	return os.WriteFile(path, []byte(s), 0o644)
}
