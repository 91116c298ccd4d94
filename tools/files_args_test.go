package tools

import (
	"slices"
	"strings"
	"testing"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// The names sandbox_read_file's range had before get a sentence naming
// the arguments to use, before any sandbox is made; other unknown
// arguments keep the schema's message.
func TestReadArgumentNamesGetASentence(t *testing.T) {
	r := newFakeRig(t, nil)
	for arg, want := range map[string]string{
		"start_line": "sandbox_read_file takes no start_line: offset is the first line to read (1-based) and limit the number of lines",
		"end_line":   "takes no end_line: give offset (the first line, 1-based) and limit (the number of lines: end_line - offset + 1)",
		"length":     "takes no length: limit is a number of lines (with offset); byte_length a number of bytes (with byte_offset)",
	} {
		res := r.call(NameReadFile, map[string]any{"path": "a", arg: 3})
		if got := text(res); !res.IsError || !strings.HasPrefix(got, "INVALID_ARGUMENT: ") || !strings.Contains(got, want) {
			t.Errorf("%s: %q", arg, got)
		}
	}
	res := r.call(NameReadFile, map[string]any{"path": "a", "nonsense": 3})
	if got := text(res); !res.IsError || !strings.Contains(got, "check the arguments against the tool's input schema") {
		t.Errorf("an unknown argument: %q", got)
	}
	if calls := r.f.made(); len(calls) != 0 {
		t.Errorf("refused calls reached the sandbox: %q", calls)
	}
}

// Several edits reach the sandbox in order; the two forms together, and an
// edit that changes nothing, are refused naming it.
func TestEditForms(t *testing.T) {
	r := newFakeRig(t, nil)
	res := r.call(NameEditFile, map[string]any{"path": "a", "edits": []map[string]any{
		{"old_string": "x", "new_string": "y"}, {"old_string": "p", "new_string": "q", "replace_all": true},
	}})
	if got := text(res); res.IsError || got != "made 2 edits, 2 replacement(s), in a (now 10 bytes)" {
		t.Errorf("two edits: %q", got)
	}
	if msg := text(r.call(NameEditFile, map[string]any{"path": "a", "old_string": "x", "new_string": "y",
		"edits": []map[string]any{{"old_string": "p", "new_string": "q"}}})); !strings.Contains(msg, "not both") {
		t.Errorf("both forms: %q", msg)
	}
	if msg := text(r.call(NameEditFile, map[string]any{"path": "a", "edits": []map[string]any{
		{"old_string": "x", "new_string": "y"}, {"old_string": "p", "new_string": "p"},
	}})); !strings.HasPrefix(msg, "INVALID_ARGUMENT: edit 2 of 2: old_string and new_string are the same") {
		t.Errorf("an edit that changes nothing: %q", msg)
	}
	want := []string{"Sandbox", `EditFile a "x" "y" false`, `EditFile a "p" "q" true`}
	if calls := r.f.made(); !slices.Equal(calls, want) {
		t.Errorf("calls %q, want %q", calls, want)
	}
}

// A pattern with "/" lists recursively; a malformed one is refused before
// the sandbox.
func TestListPattern(t *testing.T) {
	r := newFakeRig(t, nil)
	r.call(NameList, map[string]any{"pattern": "*.py"})
	r.call(NameList, map[string]any{"pattern": "**/*.py"})
	if res := r.call(NameList, map[string]any{"pattern": "src/[a"}); !res.IsError || !strings.Contains(text(res), "malformed") {
		t.Errorf("a malformed pattern: %q", text(res))
	}
	want := []string{"Sandbox", "List . recursive=false max=200", "Sandbox", "List . recursive=true max=200"}
	if calls := r.f.made(); !slices.Equal(calls, want) {
		t.Errorf("calls %q, want %q", calls, want)
	}
}

// markCuts puts a marker after each cut line's kept part, before its line
// end, and says "at least" for a line the scan stopped inside.
func TestMarkCuts(t *testing.T) {
	data := []byte("short\nxxxx\nok\nyyyy")
	cuts := []agentproto.LineCut{{Line: 11, Offset: 20, Rest: 30}, {Line: 13, Offset: 60, Rest: 7}}
	got := markCuts(data, 10, cuts, true)
	want := "short\nxxxx [… 30 more bytes of this line: byte_offset=20]\nok\nyyyy [… at least 7 more bytes of this line: byte_offset=60]"
	if got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
}

// A read without a range asks the agent for a window; one with a limit or
// a byte_length for up to the file cap; a huge limit does not overflow.
func TestReadRequests(t *testing.T) {
	d := &Deps{Policy: policy.Default()}
	p := d.Policy
	for _, c := range []struct {
		in   readReq
		want agentproto.ReadRequest
	}{
		{readReq{ReadIn: ReadIn{Path: "a"}}, agentproto.ReadRequest{Path: "a", StartLine: 1, EndLine: 2000, Max: p.MaxOutputBytes, MaxScan: p.MaxFileBytes, MaxLineChars: 2000}},
		{readReq{ReadIn: ReadIn{Path: "a", Offset: 10, Limit: 5}}, agentproto.ReadRequest{Path: "a", StartLine: 10, EndLine: 14, Max: p.MaxFileBytes, MaxScan: p.MaxFileBytes}},
		{readReq{ReadIn: ReadIn{Path: "a", Offset: 2, Limit: 1 << 62}}, agentproto.ReadRequest{Path: "a", StartLine: 2, EndLine: 2 + 1<<62 - 1, Max: p.MaxFileBytes, MaxScan: p.MaxFileBytes}},
		{readReq{ReadIn: ReadIn{Path: "a", Offset: 5, Limit: 1<<63 - 1}}, agentproto.ReadRequest{Path: "a", StartLine: 5, Max: p.MaxFileBytes, MaxScan: p.MaxFileBytes}},
		{readReq{ReadIn: ReadIn{Path: "a", ByteOffset: 7}, bytes: true}, agentproto.ReadRequest{Path: "a", Offset: 7, Max: p.MaxOutputBytes / 4 * 3}},
		{readReq{ReadIn: ReadIn{Path: "a", ByteLength: 1 << 30}, bytes: true}, agentproto.ReadRequest{Path: "a", Length: 1 << 30, Max: p.MaxFileBytes}},
	} {
		if got := d.request(c.in); got != c.want {
			t.Errorf("%+v: %+v, want %+v", c.in, got, c.want)
		}
	}
}
