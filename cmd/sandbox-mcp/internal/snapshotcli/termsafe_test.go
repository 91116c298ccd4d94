package snapshotcli

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sandbox-mcp/sandbox-mcp/snapshot"
)

func TestTermSafe(t *testing.T) {
	for in, want := range map[string]string{
		"plain label, ünïcode ✓":     "plain label, ünïcode ✓",
		"\x1b[2Jcleared":             `\x1b[2Jcleared`,
		"over\rwrite":                `over\rwrite`,
		"tab\tnew\nline\x00\x7f":     `tab\tnew\nline\x00\x7f`,
		"c1 \u009b2J":                `c1 \u009b2J`,
		"raw \x9b byte":              `raw \x9b byte`,
		"txt.\u202eexe":              `txt.\u202eexe`,
		"iso\u2066late\u2069 \u200f": `iso\u2066late\u2069 \u200f`,
		"line\u2028sep":              `line\u2028sep`,
		`a\x1b literal`:              `a\\x1b literal`,
	} {
		if got := termSafe(in); got != want {
			t.Errorf("termSafe(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestSnapshotListEscapesWhatCallersChose: labels (and a record tampered
// with in the state directory) cannot write control sequences to the
// operator's terminal through `sandbox-mcp snapshot list`.
func TestSnapshotListEscapesWhatCallersChose(t *testing.T) {
	state := t.TempDir()
	st, err := snapshot.OpenStore(filepath.Join(state, "snapshots"), snapshot.Retention{})
	if err != nil {
		t.Fatal(err)
	}
	empty := func(w io.Writer) error { _, err := w.Write(make([]byte, 1024)); return err }
	hostile := "\x1b[2J\x1b]0;owned\x07\rfake line\u009b31m\u202eexe.txt"
	if _, err := st.For("mallory").Create(hostile, "sb-1", empty); err != nil {
		t.Fatal(err)
	}
	tampered, err := st.For("").Create("ok", "sb-2", empty)
	if err != nil {
		t.Fatal(err)
	}
	rec := filepath.Join(state, "snapshots", tampered.ID+".json")
	tampered.Sandbox = "sb-\x1b[31mred\u202e"
	b, _ := json.Marshal(tampered)
	if err := os.WriteFile(rec, b, 0o600); err != nil {
		t.Fatal(err)
	}

	var stdout, stderr bytes.Buffer
	if code := Run([]string{"list", "--state-dir", state}, &stdout, &stderr, stateDirOnly); code != 0 {
		t.Fatalf("list: %d %s", code, stderr.String())
	}
	out := stdout.String()
	for _, bad := range []string{"\x1b", "\r", "\x07", "\u009b", "\u202e"} {
		if strings.Contains(out, bad) {
			t.Errorf("the listing holds %q raw:\n%q", bad, out)
		}
	}
	if !utf8.ValidString(out) || strings.Count(out, "\n") != 3 {
		t.Errorf("want a header and two lines of valid UTF-8:\n%q", out)
	}
	for _, want := range []string{`\x1b[2J\x1b]0;owned\x07\rfake line\u009b31m\u202eexe.txt`, `sb-\x1b[31mred\u202e`} {
		if !strings.Contains(out, want) {
			t.Errorf("the listing does not show %s:\n%s", want, out)
		}
	}
}
