package workspace

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// edit runs EditFile with old and new as its input.
func (e *env) edit(rel, old, repl string, all bool, maxFile int64) (agentproto.EditResult, error) {
	return e.w.EditFile(context.Background(), rel, strings.NewReader(old+repl), []agentproto.EditSpec{{OldSize: int64(len(old)), NewSize: int64(len(repl)), ReplaceAll: all}}, maxFile)
}

func TestEdit(t *testing.T) {
	cases := []struct {
		name    string
		setup   func(e *env)
		path    string
		old     string
		repl    string
		all     bool
		max     int64
		code    errcode.Code
		msg     string // in the error message
		want    string // the file afterwards ("" skips the check)
		repls   int
		created bool
	}{
		{name: "once", setup: func(e *env) { e.file("a.go", "func a() {\n\treturn 1\n}\n") },
			path: "a.go", old: "return 1", repl: "return 2", want: "func a() {\n\treturn 2\n}\n", repls: 1},
		{name: "delete text", setup: func(e *env) { e.file("a", "keep-drop-keep") },
			path: "a", old: "drop-", repl: "", want: "keep-keep", repls: 1},
		{name: "ambiguous", setup: func(e *env) { e.file("a", "x\ny\nx\nz\nx\n") },
			path: "a", old: "x", repl: "w", code: errcode.InvalidArgument, msg: "occurs 3 times (lines 1, 3 and 5)", want: "x\ny\nx\nz\nx\n"},
		{name: "replace all", setup: func(e *env) { e.file("a", "x\ny\nx\nz\nx\n") },
			path: "a", old: "x", repl: "ww", all: true, want: "ww\ny\nww\nz\nww\n", repls: 3},
		{name: "replace all, once", setup: func(e *env) { e.file("a", "ab") },
			path: "a", old: "a", repl: "c", all: true, want: "cb", repls: 1},
		{name: "absent", setup: func(e *env) { e.file("a", "hello\n") },
			path: "a", old: "goodbye", repl: "x", code: errcode.NotFound, msg: "does not occur", want: "hello\n"},
		{name: "absent, whitespace differs", setup: func(e *env) { e.file("a.py", "def f():\n\tif x:\n\t\treturn 1\n") },
			path: "a.py", old: "    if x:\n        return 1", repl: "", code: errcode.NotFound,
			msg: `lines 2-3, which differs only in whitespace (indentation, tabs, spaces or line ends); line 2 is exactly "\tif x:"`},
		{name: "absent, first line only", setup: func(e *env) { e.file("a", "one\ntwo\nthree\n") },
			path: "a", old: "two\nfour", repl: "", code: errcode.NotFound, msg: `first line matches line 2 ("two")`},
		{name: "absent, crlf", setup: func(e *env) { e.file("a", "one\r\ntwo\r\n") },
			path: "a", old: "one\ntwo", repl: "", code: errcode.NotFound, msg: "lines 1-2"},
		{name: "absent, spacing inside a line", setup: func(e *env) { e.file("a.go", "package a\n\n\tx := f(a, b) + 1\n") },
			path: "a.go", old: "x := f(a,b)", repl: "", code: errcode.NotFound, msg: `line 3, which differs only in whitespace`},
		{name: "absent, fragment across lines", setup: func(e *env) { e.file("a", "if x {\n\treturn y\n}\n") },
			path: "a", old: "x  {\n  return y", repl: "", code: errcode.NotFound, msg: `lines 1-2`},
		{name: "absent, nothing near", setup: func(e *env) { e.file("a", "alpha\n") },
			path: "a", old: "omega", repl: "", code: errcode.NotFound, msg: "Read the file again"},
		{name: "create missing", path: "new/dir/f.txt", old: "", repl: "hello", want: "hello", repls: 1, created: true},
		{name: "fill empty", setup: func(e *env) { e.file("e", "") }, path: "e", old: "", repl: "x", want: "x", repls: 1},
		{name: "empty old on content", setup: func(e *env) { e.file("a", "data") },
			path: "a", old: "", repl: "x", code: errcode.InvalidArgument, msg: "sandbox_write_file", want: "data"},
		{name: "missing", path: "nope.txt", old: "a", repl: "b", code: errcode.NotFound, msg: "empty old_string to create"},
		{name: "directory", setup: func(e *env) { e.mkdir("d") }, path: "d", old: "a", repl: "b", code: errcode.InvalidArgument},
		{name: "root", path: ".", old: "a", repl: "b", code: errcode.InvalidArgument},
		{name: "fifo", setup: func(e *env) { e.mkfifo("p") }, path: "p", old: "a", repl: "b", code: errcode.InvalidArgument},
		{name: "file too large", setup: func(e *env) { e.file("a", strings.Repeat("x", 100)) },
			path: "a", old: "x", repl: "y", all: true, max: 50, code: errcode.TooLarge},
		{name: "result too large", setup: func(e *env) { e.file("a", strings.Repeat("x", 10)) },
			path: "a", old: "x", repl: "yyyyyy", all: true, max: 50, code: errcode.TooLarge, want: strings.Repeat("x", 10)},
		{name: "binary", setup: func(e *env) { e.file("b", "\x00\xff\x01") },
			path: "b", old: "\xff", repl: "\xfe\xfe", want: "\x00\xfe\xfe\x01", repls: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			if tc.setup != nil {
				tc.setup(e)
			}
			res, err := e.edit(tc.path, tc.old, tc.repl, tc.all, tc.max)
			wantCode(t, err, tc.code, tc.path)
			if err != nil && !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("message %q does not say %q", err, tc.msg)
			}
			if tc.want != "" && e.hostRead(tc.path) != tc.want {
				t.Errorf("file is %q, want %q", e.hostRead(tc.path), tc.want)
			}
			if err == nil {
				if res.Replacements != tc.repls || res.Created != tc.created || res.Size != int64(len(tc.want)) {
					t.Errorf("result %+v, want %d replacements, created %v, size %d", res, tc.repls, tc.created, len(tc.want))
				}
			}
			noTemps(t, e.dir)
			e.checkOutside()
		})
	}
}

// TestEditKeepsModeAndIsAtomic: the edited file keeps its permission bits,
// is a new inode (renamed into place), and a hard link to the old one keeps
// the old content.
func TestEditKeepsMode(t *testing.T) {
	e := newEnv(t)
	e.file("run.sh", "echo old\n")
	if err := os.Chmod(e.path("run.sh"), 0o751); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(e.path("run.sh"), e.path("old.sh")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.edit("run.sh", "old", "new", false, 0); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(e.path("run.sh"))
	if err != nil || fi.Mode().Perm() != 0o751 {
		t.Fatalf("mode %v, %v; want 0751", fi.Mode(), err)
	}
	if e.hostRead("run.sh") != "echo new\n" || e.hostRead("old.sh") != "echo old\n" {
		t.Errorf("not replaced atomically: %q %q", e.hostRead("run.sh"), e.hostRead("old.sh"))
	}
}

// TestEditConfinement: an edit never reads or writes outside the
// workspace, whatever symlink is on the path or at it.
func TestEditConfinement(t *testing.T) {
	cases := []struct {
		name  string
		setup func(e *env)
		path  string
		code  errcode.Code
	}{
		{"dotdot", nil, "../outside/secret", outsideCode},
		{"absolute", nil, "/etc/passwd", outsideCode},
		{"parent symlink out", func(e *env) { e.symlink(e.outside, "d") }, "d/secret", outsideCode},
		{"parent symlink relative out", func(e *env) { e.symlink("../outside", "d") }, "d/secret", outsideCode},
		{"symlink to outside file", func(e *env) { e.symlink(filepath.Join(e.outside, "secret"), "l") }, "l", invalidCode},
		{"symlink to inside file", func(e *env) { e.file("t", "TOP"); e.symlink("t", "l") }, "l", invalidCode},
		{"proc parent", func(e *env) { e.symlink("/proc/self/cwd", "pc") }, "pc/secret", outsideCode},
	}
	for _, tc := range cases {
		for _, old := range []string{"TOP", ""} {
			t.Run(tc.name+"/old="+old, func(t *testing.T) {
				e := newEnv(t)
				if tc.setup != nil {
					tc.setup(e)
				}
				_, err := e.edit(tc.path, old, "PWNED", true, 0)
				code := tc.code
				wantCode(t, err, code, tc.path)
				e.checkOutside()
				noTemps(t, e.dir)
			})
		}
	}
	// A symlinked parent that stays inside is followed, like every file tool.
	e := newEnv(t)
	e.file("real/f", "a")
	e.symlink("real", "dl")
	if _, err := e.edit("dl/f", "a", "b", false, 0); err != nil || e.hostRead("real/f") != "b" {
		t.Fatalf("edit through an inside symlink: %v", err)
	}
}

func TestDelete(t *testing.T) {
	cases := []struct {
		name      string
		setup     func(e *env)
		path      string
		recursive bool
		code      errcode.Code
		deleted   int64
		gone      []string
		kept      []string
	}{
		{name: "file", setup: func(e *env) { e.file("a", "x") }, path: "a", deleted: 1, gone: []string{"a"}},
		{name: "empty dir", setup: func(e *env) { e.mkdir("d") }, path: "d/", deleted: 1, gone: []string{"d"}},
		{name: "full dir", setup: func(e *env) { e.file("d/a", "x") }, path: "d", code: invalidCode, kept: []string{"d/a"}},
		{name: "recursive", setup: func(e *env) { e.file("d/a", "x"); e.file("d/e/f/g", "y"); e.file("keep", "") },
			path: "d", recursive: true, deleted: 5, gone: []string{"d"}, kept: []string{"keep"}},
		{name: "symlink to outside", setup: func(e *env) { e.symlink(e.outside, "l") }, path: "l", recursive: true, deleted: 1, gone: []string{"l"}},
		{name: "symlink to outside file", setup: func(e *env) { e.symlink(filepath.Join(e.outside, "secret"), "l") }, path: "l", deleted: 1, gone: []string{"l"}},
		{name: "recursive tree with links out", setup: func(e *env) {
			e.file("d/x", "1")
			e.symlink(e.outside, "d/out")
			e.symlink("../../outside", "d/rel")
		}, path: "d", recursive: true, deleted: 4, gone: []string{"d"}},
		{name: "through parent symlink out", setup: func(e *env) { e.symlink(e.outside, "s") }, path: "s/secret", code: invalidCode},
		{name: "through parent symlink inside", setup: func(e *env) { e.file("real/f", "x"); e.symlink("real", "s") }, path: "s/f", code: invalidCode, kept: []string{"real/f"}},
		{name: "dotdot", path: "../outside/secret", code: outsideCode},
		{name: "dotdot dir", path: "../outside", recursive: true, code: outsideCode},
		{name: "absolute", path: "/tmp", code: outsideCode},
		{name: "root", path: ".", recursive: true, code: invalidCode},
		{name: "root empty", path: "", recursive: true, code: invalidCode},
		{name: "root via dotdot", setup: func(e *env) { e.mkdir("a") }, path: "a/..", recursive: true, code: invalidCode, kept: []string{"a"}},
		{name: "missing", path: "nope", code: errcode.NotFound},
		{name: "fifo", setup: func(e *env) { e.mkfifo("p") }, path: "p", deleted: 1, gone: []string{"p"}},
		{name: "unreadable dir", setup: func(e *env) {
			e.file("d/s/f", "x")
			if err := os.Chmod(e.path("d/s"), 0); err != nil {
				e.t.Fatal(err)
			}
		}, path: "d", recursive: true, deleted: 3, gone: []string{"d"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			if tc.setup != nil {
				tc.setup(e)
			}
			res, err := e.w.Delete(tc.path, tc.recursive)
			wantCode(t, err, tc.code, tc.path)
			if err == nil && res.Deleted != tc.deleted {
				t.Errorf("deleted %d, want %d", res.Deleted, tc.deleted)
			}
			for _, g := range tc.gone {
				if _, err := os.Lstat(e.path(g)); !os.IsNotExist(err) {
					t.Errorf("%s still exists", g)
				}
			}
			for _, k := range tc.kept {
				if _, err := os.Lstat(e.path(k)); err != nil {
					t.Errorf("%s was removed", k)
				}
			}
			if _, err := os.Stat(e.dir); err != nil {
				t.Fatalf("the workspace itself is gone")
			}
			e.checkOutside()
		})
	}
}

func TestMove(t *testing.T) {
	cases := []struct {
		name      string
		setup     func(e *env)
		from, to  string
		overwrite bool
		code      errcode.Code
		msg       string
		check     map[string]string // path -> content ("<dir>" for a directory, "<gone>")
		res       agentproto.MoveResult
	}{
		{name: "rename", setup: func(e *env) { e.file("a", "1") }, from: "a", to: "b",
			check: map[string]string{"a": "<gone>", "b": "1"}, res: agentproto.MoveResult{To: "b", Type: "file"}},
		{name: "new parents", setup: func(e *env) { e.file("a", "1") }, from: "a", to: "x/y/b",
			check: map[string]string{"x/y/b": "1"}, res: agentproto.MoveResult{To: "x/y/b", Type: "file"}},
		{name: "into dir", setup: func(e *env) { e.file("a", "1"); e.mkdir("d") }, from: "a", to: "d/",
			check: map[string]string{"d/a": "1"}, res: agentproto.MoveResult{To: "d/a", Type: "file"}},
		{name: "dir", setup: func(e *env) { e.file("d/f", "1") }, from: "d", to: "e",
			check: map[string]string{"e/f": "1", "d": "<gone>"}, res: agentproto.MoveResult{To: "e", Type: "dir"}},
		{name: "no replace", setup: func(e *env) { e.file("a", "1"); e.file("b", "2") }, from: "a", to: "b",
			code: invalidCode, msg: "set overwrite", check: map[string]string{"a": "1", "b": "2"}},
		{name: "overwrite", setup: func(e *env) { e.file("a", "1"); e.file("b", "2") }, from: "a", to: "b", overwrite: true,
			check: map[string]string{"a": "<gone>", "b": "1"}, res: agentproto.MoveResult{To: "b", Type: "file"}},
		{name: "overwrite full dir", setup: func(e *env) { e.mkdir("a"); e.file("b/x", "2") }, from: "a", to: "b", overwrite: true,
			code: invalidCode, msg: "not empty"},
		{name: "file over dir", setup: func(e *env) { e.file("a", "1"); e.mkdir("b") }, from: "a", to: "b", overwrite: true,
			code: invalidCode, msg: "ending the destination with"},
		{name: "into itself", setup: func(e *env) { e.mkdir("a") }, from: "a", to: "a/b", code: invalidCode, msg: "into itself"},
		{name: "symlink moves itself", setup: func(e *env) { e.symlink(e.outside, "l") }, from: "l", to: "m",
			check: map[string]string{"l": "<gone>"}, res: agentproto.MoveResult{To: "m", Type: "symlink"}},
		{name: "from outside", from: "../outside/secret", to: "stolen", code: outsideCode},
		{name: "to outside", setup: func(e *env) { e.file("a", "1") }, from: "a", to: "../outside/planted", code: outsideCode, check: map[string]string{"a": "1"}},
		{name: "to absolute", setup: func(e *env) { e.file("a", "1") }, from: "a", to: "/tmp/x", code: outsideCode},
		{name: "from via symlink out", setup: func(e *env) { e.symlink(e.outside, "s") }, from: "s/secret", to: "stolen", code: invalidCode},
		{name: "to via symlink out", setup: func(e *env) { e.file("a", "1"); e.symlink(e.outside, "s") }, from: "a", to: "s/planted", code: invalidCode, check: map[string]string{"a": "1"}},
		{name: "to via symlink out, new dir", setup: func(e *env) { e.file("a", "1"); e.symlink(e.outside, "s") }, from: "a", to: "s/new/planted", code: invalidCode},
		{name: "to via dangling symlink out", setup: func(e *env) { e.file("a", "1"); e.symlink("../newdir", "s") }, from: "a", to: "s/planted", code: invalidCode},
		{name: "root", from: ".", to: "x", code: invalidCode},
		{name: "dotdot name", setup: func(e *env) { e.mkdir("a/b") }, from: "a/b/..", to: "x", code: invalidCode},
		{name: "missing", from: "nope", to: "x", code: errcode.NotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			if tc.setup != nil {
				tc.setup(e)
			}
			res, err := e.w.Move(tc.from, tc.to, tc.overwrite)
			wantCode(t, err, tc.code, "")
			if err != nil && !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("message %q does not say %q", err, tc.msg)
			}
			if err == nil && res != tc.res {
				t.Errorf("result %+v, want %+v", res, tc.res)
			}
			for p, want := range tc.check {
				fi, err := os.Lstat(e.path(p))
				switch {
				case want == "<gone>":
					if err == nil {
						t.Errorf("%s still exists", p)
					}
				case err != nil:
					t.Errorf("%s: %v", p, err)
				case fi.IsDir() != (want == "<dir>"):
					t.Errorf("%s: dir %v", p, fi.IsDir())
				case !fi.IsDir() && e.hostRead(p) != want:
					t.Errorf("%s holds %q, want %q", p, e.hostRead(p), want)
				}
			}
			e.checkOutside()
			if _, err := os.Lstat(filepath.Join(e.base, "newdir")); err == nil {
				t.Errorf("a directory was created outside")
			}
		})
	}
}

func TestReadLines(t *testing.T) {
	const text = "one\ntwo\nthree\nfour\nfive" // 5 lines, the last without "\n"
	cases := []struct {
		name        string
		content     string
		start, end  int64
		max         int64
		code        errcode.Code
		want        string
		offset      int64
		first, last int64
		endOff      int64
		total       int64
		truncated   bool
	}{
		{name: "all", content: text, start: 1, max: 100, want: text, first: 1, last: 5, endOff: 23, total: 5},
		{name: "middle", content: text, start: 2, end: 3, max: 100, want: "two\nthree\n", offset: 4, first: 2, last: 3, endOff: 14, total: 5},
		{name: "to end", content: text, start: 4, max: 100, want: "four\nfive", offset: 14, first: 4, last: 5, endOff: 23, total: 5},
		{name: "end past last", content: text, start: 5, end: 99, max: 100, want: "five", offset: 19, first: 5, last: 5, endOff: 23, total: 5},
		{name: "one line", content: text, start: 3, end: 3, max: 100, want: "three\n", offset: 8, first: 3, last: 3, endOff: 14, total: 5},
		{name: "cap at a line", content: text, start: 1, max: 10, want: "one\ntwo\n", first: 1, last: 2, endOff: 8, total: 5, truncated: true},
		{name: "cap inside the first line", content: "abcdefghij\nk\n", start: 1, max: 4, want: "abcd", first: 1, last: 1, endOff: 4, total: 2, truncated: true},
		{name: "cap exactly", content: text, start: 2, end: 3, max: 10, want: "two\nthree\n", offset: 4, first: 2, last: 3, endOff: 14, total: 5},
		{name: "trailing newline", content: "a\nb\n", start: 2, max: 100, want: "b\n", offset: 2, first: 2, last: 2, endOff: 4, total: 2},
		{name: "empty file", content: "", start: 1, max: 100, want: "", first: 1, last: 0, endOff: 0, total: 0},
		{name: "past the end", content: text, start: 6, max: 100, code: invalidCode},
		{name: "zero start", content: text, start: 0, max: 100, code: invalidCode},
		{name: "end before start", content: text, start: 3, end: 2, max: 100, code: invalidCode},
		{name: "blank lines", content: "\n\n\n", start: 2, end: 3, max: 100, want: "\n\n", offset: 1, first: 2, last: 3, endOff: 3, total: 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.file("f", tc.content)
			var b bytes.Buffer
			res, err := e.w.ReadLines(context.Background(), "f", Lines{Start: tc.start, End: tc.end, Max: tc.max}, &b)
			wantCode(t, err, tc.code, "f")
			if err != nil {
				return
			}
			want := agentproto.ReadResult{Size: int64(len(tc.content)), Truncated: tc.truncated, Offset: tc.offset, End: tc.endOff,
				StartLine: tc.first, EndLine: tc.last, TotalLines: tc.total, Scanned: int64(len(tc.content))}
			if b.String() != tc.want || !reflect.DeepEqual(res, want) {
				t.Errorf("got %q %+v, want %q %+v", b.String(), res, tc.want, want)
			}
		})
	}
	// Lines across the agent's read chunks are counted once each.
	e := newEnv(t)
	var big strings.Builder
	for i := range 200_000 {
		big.WriteString(strings.Repeat("x", i%7) + "\n")
	}
	e.file("big", big.String())
	var b bytes.Buffer
	res, err := e.w.ReadLines(context.Background(), "big", Lines{Start: 199_999, Max: 1 << 20}, &b)
	if err != nil || res.TotalLines != 200_000 || res.EndLine != 200_000 || b.String() != strings.Repeat("x", 199_998%7)+"\n"+strings.Repeat("x", 199_999%7)+"\n" {
		t.Fatalf("big: %+v %q %v", res, b.String(), err)
	}
	// Confinement is ReadFile's.
	e.symlink(e.outside, "s")
	if _, err := e.w.ReadLines(context.Background(), "s/secret", Lines{Start: 1, Max: 100}, &b); codeOf(err) != outsideCode {
		t.Fatalf("read lines through a symlink out: %v", err)
	}
}
