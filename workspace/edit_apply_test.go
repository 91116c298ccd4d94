package workspace

import (
	"context"
	"strings"
	"testing"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// edit is one edit of a table case: its old and new text.
type edit struct {
	old, new string
	all      bool
}

// specs lays edits out as EditFile receives them: the sizes, and the texts
// one after another.
func specs(edits []edit) ([]agentproto.EditSpec, []byte) {
	var es []agentproto.EditSpec
	var texts []byte
	for _, e := range edits {
		es = append(es, agentproto.EditSpec{OldSize: int64(len(e.old)), NewSize: int64(len(e.new)), ReplaceAll: e.all})
		texts = append(texts, e.old+e.new...)
	}
	return es, texts
}

// TestApplyEdits: the pure step of EditFile, on the file's content alone.
func TestApplyEdits(t *testing.T) {
	for _, tc := range []struct {
		name    string
		data    *string // nil: no such file
		edits   []edit
		maxFile int64
		want    string
		n       int
		code    errcode.Code
		msg     []string // in the error's message
	}{
		{name: "one replacement", data: ptr("a b c"), edits: []edit{{old: "b", new: "B"}}, want: "a B c", n: 1},
		{name: "bytes for bytes", data: ptr("x\r\ny"), edits: []edit{{old: "\r\n", new: "\n"}}, want: "x\ny", n: 1},
		{name: "replace all", data: ptr("a a a"), edits: []edit{{old: "a", new: "bb", all: true}}, want: "bb bb bb", n: 3},
		{name: "replace all of one", data: ptr("a b"), edits: []edit{{old: "a", new: "c", all: true}}, want: "c b", n: 1},
		{name: "to nothing", data: ptr("keep drop"), edits: []edit{{old: " drop", new: ""}}, want: "keep", n: 1},
		{name: "in order, each on the last's text", data: ptr("one"), edits: []edit{{old: "one", new: "two"}, {old: "two", new: "three"}},
			want: "three", n: 2},
		{name: "create", data: nil, edits: []edit{{old: "", new: "new file\n"}}, want: "new file\n", n: 1},
		{name: "create empty", data: nil, edits: []edit{{old: "", new: ""}}, want: "", n: 1},
		{name: "create then edit", data: nil, edits: []edit{{old: "", new: "a"}, {old: "a", new: "b"}}, want: "b", n: 2},
		{name: "fill an empty file", data: ptr(""), edits: []edit{{old: "", new: "x"}}, want: "x", n: 1},

		{name: "missing", data: ptr("abc"), edits: []edit{{old: "zzz", new: "y"}}, code: errcode.NotFound, msg: []string{"old_string does not occur"}},
		{name: "near miss", data: ptr("func  main() {}"), edits: []edit{{old: "func main() {}", new: "x"}}, code: errcode.NotFound,
			msg: []string{"does not occur", "whitespace"}},
		{name: "ambiguous", data: ptr("x\ny\nx\n"), edits: []edit{{old: "x", new: "z"}}, code: errcode.InvalidArgument,
			msg: []string{"occurs 2 times", "lines 1 and 3", "replace_all"}},
		{name: "empty old on content", data: ptr("abc"), edits: []edit{{old: "", new: "x"}}, code: errcode.InvalidArgument,
			msg: []string{"old_string is empty, but the file has 3 bytes"}},
		{name: "edit of a missing file", data: nil, edits: []edit{{old: "a", new: "b"}}, code: errcode.NotFound,
			msg: []string{"no such file", "empty old_string to create"}},
		{name: "second of three fails", data: ptr("abc"), edits: []edit{{old: "a", new: "A"}, {old: "a", new: "x"}, {old: "c", new: "C"}},
			code: errcode.NotFound, msg: []string{"edit 2 of 3 (on the text the edits before it left)", "no edit was made"}},
		{name: "first of two fails", data: ptr("abc"), edits: []edit{{old: "q", new: "A"}, {old: "a", new: "x"}},
			code: errcode.NotFound, msg: []string{"edit 1 of 2: ", "no edit was made"}},
		{name: "grows past the cap", data: ptr("aaaa"), maxFile: 6, edits: []edit{{old: "a", new: "bb", all: true}}, code: errcode.TooLarge,
			msg: []string{"would be 8 bytes", "cap of 6"}},
		{name: "at the cap", data: ptr("aaa"), maxFile: 6, edits: []edit{{old: "a", new: "bb", all: true}}, want: "bbbbbb", n: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var data []byte
			if tc.data != nil {
				data = []byte(*tc.data)
			}
			before := string(data)
			es, texts := specs(tc.edits)
			textsBefore := string(texts)
			out, n, err := applyEdits(context.Background(), "f.txt", data, texts, es, tc.maxFile)
			if string(data) != before || string(texts) != textsBefore {
				t.Fatal("applyEdits changed its input")
			}
			if tc.code != "" {
				e, ok := errcode.As(err)
				if !ok || e.Code != tc.code {
					t.Fatalf("err = %v, want %s", err, tc.code)
				}
				for _, m := range tc.msg {
					if !strings.Contains(e.Message, m) {
						t.Errorf("message %q lacks %q", e.Message, m)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(out) != tc.want || n != tc.n || out == nil {
				t.Errorf("got %q, %d replacements (nil %v); want %q, %d", out, n, out == nil, tc.want, tc.n)
			}
		})
	}
}

// TestApplyEditsStopsWithItsContext: an ended context stops the edit with
// TIMEOUT, changing nothing.
func TestApplyEditsStopsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	es, texts := specs([]edit{{old: "a", new: "b"}})
	if _, _, err := applyEdits(ctx, "f", []byte("a"), texts, es, 0); !isCode(err, errcode.Timeout) {
		t.Fatalf("err = %v, want TIMEOUT", err)
	}
}

// TestCheckEdits: the checks of an edit request made before anything is
// read or received.
func TestCheckEdits(t *testing.T) {
	many := make([]agentproto.EditSpec, agentproto.MaxEdits+1)
	for _, tc := range []struct {
		name    string
		rel     string
		edits   []agentproto.EditSpec
		maxFile int64
		texts   int64
		code    errcode.Code
		msg     string
	}{
		{"fine", "a/b.txt", []agentproto.EditSpec{{OldSize: 3, NewSize: 4}, {OldSize: 0, NewSize: 2}}, 100, 9, "", ""},
		{"no cap", "f", []agentproto.EditSpec{{OldSize: 1 << 40, NewSize: 1}}, 0, 1<<40 + 1, "", ""},
		{"texts at twice the cap", "f", []agentproto.EditSpec{{OldSize: 10, NewSize: 10}}, 10, 20, "", ""},
		{"the root", ".", []agentproto.EditSpec{{NewSize: 1}}, 0, 0, errcode.InvalidArgument, "names a directory"},
		{"a directory", "d/", []agentproto.EditSpec{{NewSize: 1}}, 0, 0, errcode.InvalidArgument, "names a directory"},
		{"no edit", "f", nil, 0, 0, errcode.InvalidArgument, "give 1 to 100 edits, not 0"},
		{"too many", "f", many, 0, 0, errcode.InvalidArgument, "not 101"},
		{"negative cap", "f", []agentproto.EditSpec{{NewSize: 1}}, -1, 0, errcode.InvalidArgument, "negative cap"},
		{"negative size", "f", []agentproto.EditSpec{{OldSize: -1}}, 0, 0, errcode.InvalidArgument, "negative sizes"},
		{"one string past the cap", "f", []agentproto.EditSpec{{OldSize: 1, NewSize: 11}}, 10, 0, errcode.TooLarge, "each be at most 10 bytes"},
		{"strings past twice the cap", "f", []agentproto.EditSpec{{OldSize: 10, NewSize: 10}, {OldSize: 1}}, 10, 0, errcode.TooLarge,
			"take 21 bytes together"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := parsePath("edit", tc.rel)
			if err != nil {
				t.Fatal(err)
			}
			texts, err := checkEdits(p, tc.rel, tc.edits, tc.maxFile)
			if tc.code == "" {
				if err != nil || texts != tc.texts {
					t.Fatalf("checkEdits = %d, %v; want %d", texts, err, tc.texts)
				}
				return
			}
			e, ok := errcode.As(err)
			if !ok || e.Code != tc.code || !strings.Contains(e.Message, tc.msg) {
				t.Fatalf("err = %v, want %s with %q", err, tc.code, tc.msg)
			}
		})
	}
}

func ptr(s string) *string { return &s }

func isCode(err error, c errcode.Code) bool {
	e, ok := errcode.As(err)
	return ok && e.Code == c
}
