package workspace

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// hugeSparse makes rel a sparse file of about a tebibyte (what the host's
// file system allows; a workspace's tmpfs takes 8 EiB), all zeros with no
// line end, after head.
func (e *env) hugeSparse(rel, head string) int64 {
	e.t.Helper()
	e.file(rel, head)
	for _, size := range []int64{1 << 62, 1 << 40, 1 << 36} {
		if err := os.Truncate(e.path(rel), size); err == nil {
			return size
		}
	}
	e.t.Skip("cannot make a sparse file of 64 GiB here")
	return 0
}

// A line read of a huge sparse file stops at the bytes it may scan: a line
// past them is refused at once, saying how far lines are counted and how to
// read further; the first line comes back cut, with what was left out.
func TestReadLinesStopsAtItsScanBound(t *testing.T) {
	e := newEnv(t)
	size := e.hugeSparse("huge", "")
	const scan = 4 << 20
	var b bytes.Buffer
	within(t, 20*time.Second, "a line read past the scan bound", func() {
		_, err := e.w.ReadLines(context.Background(), "huge", Lines{Start: 2, Max: 1 << 20, MaxScan: scan}, &b)
		wantCode(t, err, errcode.InvalidArgument, "huge")
		if msg := err.Error(); !strings.Contains(msg, fmt.Sprintf("line 2 is not in the first %d bytes", scan)) || !strings.Contains(msg, "byte_offset") {
			t.Errorf("message: %s", msg)
		}
	})
	if b.Len() != 0 {
		t.Fatalf("the refused read sent %d bytes", b.Len())
	}
	within(t, 20*time.Second, "a window on a huge sparse file", func() {
		res, err := e.w.ReadLines(context.Background(), "huge", Lines{Start: 1, End: 2000, Max: 32 << 10, MaxScan: scan, MaxLineChars: 2000}, &b)
		want := agentproto.ReadResult{Size: size, Truncated: true, End: scan, StartLine: 1, EndLine: 1, TotalLines: 1, Scanned: scan,
			Cuts: []agentproto.LineCut{{Line: 1, Offset: 2000, Rest: scan - 2000}}}
		if err != nil || !reflect.DeepEqual(res, want) || b.String() != strings.Repeat("\x00", 2000) {
			t.Fatalf("got %d bytes, %+v %v; want %+v", b.Len(), res, err, want)
		}
	})
}

// A line read with no scan bound stops when its context ends: at its
// deadline, or when the server cancels it.
func TestReadLinesStopsAtItsDeadline(t *testing.T) {
	e := newEnv(t)
	e.hugeSparse("huge", "one\n")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	within(t, 20*time.Second, "a line read of a huge file past its deadline", func() {
		var b bytes.Buffer
		_, err := e.w.ReadLines(ctx, "huge", Lines{Start: 2, Max: 1 << 20}, &b)
		wantCode(t, err, errcode.Timeout, "huge")
		if !strings.Contains(err.Error(), "deadline") {
			t.Errorf("message: %v", err)
		}
	})
	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	within(t, 20*time.Second, "a cancelled byte read of a huge file", func() {
		_, err := e.w.ReadFile(ctx, "huge", 0, 0, 1<<62, discard{})
		wantCode(t, err, errcode.Timeout, "huge")
	})
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// Lines over MaxLineChars characters are cut to that many (a multi-byte
// character counts once), keep their line end, and each cut is reported
// with where the rest lies; a read by bytes goes on at End.
func TestReadLinesCutsLongLines(t *testing.T) {
	e := newEnv(t)
	long := strings.Repeat("é", 10) // 20 bytes, 10 characters
	content := "short\n" + long + "\n" + "abcdefghij" + "tail"
	e.file("f", content)
	var b bytes.Buffer
	res, err := e.w.ReadLines(context.Background(), "f", Lines{Start: 1, Max: 100, MaxLineChars: 8}, &b)
	want := agentproto.ReadResult{Size: int64(len(content)), End: int64(len(content)), StartLine: 1, EndLine: 3, TotalLines: 3,
		Scanned: int64(len(content)), Cuts: []agentproto.LineCut{{Line: 2, Offset: 6 + 16, Rest: 4}, {Line: 3, Offset: 27 + 8, Rest: 6}}}
	if err != nil || !reflect.DeepEqual(res, want) || b.String() != "short\n"+strings.Repeat("é", 8)+"\n"+"abcdefgh" {
		t.Fatalf("got %q %+v %v, want %+v", b.String(), res, err, want)
	}
	// The cut lines count for what is sent: Max stops after line 2.
	b.Reset()
	res, err = e.w.ReadLines(context.Background(), "f", Lines{Start: 1, Max: 6 + 17, MaxLineChars: 8}, &b)
	if err != nil || !res.Truncated || res.EndLine != 2 || res.End != 27 || len(res.Cuts) != 1 || b.Len() != 23 {
		t.Fatalf("cut at Max: %q %+v %v", b.String(), res, err)
	}
}

// A near-miss search on a large file stops at its byte budget: a file of
// many equal lines against an old text of many of them would take lines ×
// old lines comparisons. The edit answers NOT_FOUND promptly and changes
// nothing.
func TestEditNearMissIsBounded(t *testing.T) {
	e := newEnv(t)
	content := strings.Repeat("a\n", 2<<20) // 4 MiB, 2 Mi lines
	e.file("big", content)
	// Its first and last lines match everywhere; a line in the middle
	// differs.
	old := strings.Repeat("a\n", 10_000) + "b\n" + strings.Repeat("a\n", 10_000) + "a"
	within(t, 30*time.Second, "a near-miss edit on a large file", func() {
		_, err := e.edit("big", old, "x", false, 8<<20)
		wantCode(t, err, errcode.NotFound, "big")
		if !strings.Contains(err.Error(), "Read the file again") {
			t.Errorf("message: %v", err)
		}
	})
	if e.hostRead("big") != content {
		t.Fatal("the failed edit changed the file")
	}
	// A cancelled edit stops too, and changes nothing.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := e.w.EditFile(ctx, "big", strings.NewReader("a\nx"), []agentproto.EditSpec{{OldSize: 2, NewSize: 1, ReplaceAll: true}}, 8<<20)
	wantCode(t, err, errcode.Timeout, "big")
	if e.hostRead("big") != content {
		t.Fatal("the cancelled edit changed the file")
	}
}

// nearMiss finds the whitespace-only difference on a large file within its
// budget, as it does on a small one.
func TestNearMissStillFindsOnLargeFiles(t *testing.T) {
	data := []byte(strings.Repeat("x = 1\n", 500_000) + "def f():\n\tif y:\n\t\treturn 2\n")
	hint := nearMiss(context.Background(), data, []byte("    if y:\n        return 2"))
	if !strings.Contains(hint, "lines 500002-500003, which differs only in whitespace") {
		t.Fatalf("hint: %s", hint)
	}
}

// readAllFd never reads past its limit, whatever the file grew to.
func TestReadAllStopsAtItsLimit(t *testing.T) {
	e := newEnv(t)
	e.file("f", strings.Repeat("x", 1000))
	f, err := os.Open(e.path("f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	data, err := readAllFd(context.Background(), int(f.Fd()), 10, 100)
	if err != errGrown || len(data) > 101 {
		t.Fatalf("got %d bytes, %v", len(data), err)
	}
	if data, err := readAllFd(context.Background(), int(f.Fd()), 10, 1000); err != nil || len(data) != 1000 {
		t.Fatalf("exactly the limit: %d bytes, %v", len(data), err)
	}
}

// Several edits apply in order, each to what the ones before left, all or
// nothing; a failure names the edit and leaves the file as it was.
func TestEditSeveral(t *testing.T) {
	e := newEnv(t)
	e.file("a.py", "def f():\n    return 1\n\ndef g():\n    return 1\n")
	edits := func(ee ...[3]string) (agentproto.EditResult, error) {
		var specs []agentproto.EditSpec
		var src strings.Builder
		for _, x := range ee {
			specs = append(specs, agentproto.EditSpec{OldSize: int64(len(x[0])), NewSize: int64(len(x[1])), ReplaceAll: x[2] == "all"})
			src.WriteString(x[0] + x[1])
		}
		return e.w.EditFile(context.Background(), "a.py", strings.NewReader(src.String()), specs, 1<<20)
	}
	res, err := edits([3]string{"def f", "def first"}, [3]string{"return 1", "return 2", "all"}, [3]string{"first", "one"})
	if err != nil || res.Replacements != 4 || e.hostRead("a.py") != "def one():\n    return 2\n\ndef g():\n    return 2\n" {
		t.Fatalf("three edits: %+v %v %q", res, err, e.hostRead("a.py"))
	}
	before := e.hostRead("a.py")
	_, err = edits([3]string{"def g", "def h"}, [3]string{"def g", "def i"})
	wantCode(t, err, errcode.NotFound, "a.py")
	if msg := err.Error(); !strings.Contains(msg, "edit 2 of 2") || !strings.Contains(msg, "no edit was made") {
		t.Errorf("message: %s", msg)
	}
	_, err = edits([3]string{"return 2", "return 3"}, [3]string{"x", "y"})
	wantCode(t, err, errcode.InvalidArgument, "a.py")
	if msg := err.Error(); !strings.Contains(msg, "edit 1 of 2") || !strings.Contains(msg, "occurs 2 times (lines 2 and 5)") {
		t.Errorf("message: %s", msg)
	}
	if e.hostRead("a.py") != before {
		t.Fatalf("a failed set of edits changed the file: %q", e.hostRead("a.py"))
	}
	// Creating a file and editing it in one go.
	res, err = e.w.EditFile(context.Background(), "new.txt", strings.NewReader("hello worldworldthere"),
		[]agentproto.EditSpec{{OldSize: 0, NewSize: 11}, {OldSize: 5, NewSize: 5}}, 1<<20)
	if err != nil || !res.Created || res.Replacements != 2 || e.hostRead("new.txt") != "hello there" {
		t.Fatalf("create and edit: %+v %v %q", res, err, e.hostRead("new.txt"))
	}
	if _, err := e.w.EditFile(context.Background(), "a.py", strings.NewReader(""), nil, 1<<20); codeOf(err) != errcode.InvalidArgument {
		t.Fatalf("no edits: %v", err)
	}
}

// listAllWith lists with options and collects the entries.
func listAllWith(e *env, rel string, o ListOptions) ([]agentproto.Entry, agentproto.ListResult, error) {
	var ents []agentproto.Entry
	res, err := e.w.List(context.Background(), rel, o, func(en agentproto.Entry) error { ents = append(ents, en); return nil })
	return ents, res, err
}

// A recursive list leaves dependency trees and tagged caches unentered, as
// one entry with a count, unless one is the path asked for; a pattern
// filters what is listed; the scan bound ends a walk over a large tree.
func TestListPrunesFiltersAndStops(t *testing.T) {
	e := newEnv(t)
	e.file("README.md", "x")
	e.file("src/app.py", "x")
	e.file("src/pkg/util.py", "x")
	e.file("src/pkg/data.json", "x")
	for i := range 50 {
		e.file(fmt.Sprintf("node_modules/m%02d/index.js", i), "x")
	}
	e.file("target/CACHEDIR.TAG", "Signature: 8a477f597d28d172789f06886806bc55")
	e.file("target/debug/app", "x")
	e.file(".git/HEAD", "x")
	prune := []string{"node_modules", ".git"}

	ents, res, err := listAllWith(e, ".", ListOptions{Recursive: true, Max: 100, Prune: prune})
	if err != nil || res.Truncated {
		t.Fatal(err, res)
	}
	got := map[string]agentproto.Entry{}
	for _, en := range ents {
		got[en.Path] = en
	}
	if fmt.Sprint(paths(ents)) != "[.git README.md node_modules src target src/app.py src/pkg src/pkg/data.json src/pkg/util.py]" {
		t.Fatalf("pruned list: %q", paths(ents))
	}
	if nm := got["node_modules"]; !nm.Pruned || nm.Count != 50 || got[".git"].Count != 1 || got["target"].Count != 2 || got["src"].Pruned {
		t.Fatalf("pruned entries: %+v %+v %+v", nm, got[".git"], got["target"])
	}
	// Asked for by path, a pruned tree is listed (its own nested trees
	// pruned again).
	ents, _, err = listAllWith(e, "node_modules", ListOptions{Recursive: true, Max: 200, Prune: prune})
	if err != nil || len(ents) != 100 {
		t.Fatalf("node_modules asked for: %d entries, %v", len(ents), err)
	}
	// A pattern: "**" crosses directories, a name pattern matches at any
	// depth, pruned trees are still shown.
	for pat, want := range map[string]string{
		"**/*.py":  "[.git node_modules target src/app.py src/pkg/util.py]",
		"*.json":   "[.git node_modules target src/pkg/data.json]",
		"src/*.py": "[.git node_modules target src/app.py]",
	} {
		ents, _, err = listAllWith(e, ".", ListOptions{Recursive: true, Max: 100, Prune: prune, Pattern: pat})
		if err != nil || fmt.Sprint(paths(ents)) != want {
			t.Errorf("pattern %q: %q %v, want %s", pat, paths(ents), err, want)
		}
	}
	// The scan bound: a list that must look at more entries stops,
	// truncated, with what it found.
	ents, res, err = listAllWith(e, ".", ListOptions{Recursive: true, Max: 100, Pattern: "**/nothing", MaxScan: 30})
	if err != nil || !res.Truncated || res.Scanned != 30 || len(ents) != 0 {
		t.Fatalf("scan bound: %d entries %+v %v", len(ents), res, err)
	}
	if _, _, err := listAllWith(e, ".", ListOptions{Recursive: true, Max: 100, Pattern: "src/[a"}); codeOf(err) != errcode.InvalidArgument {
		t.Fatalf("malformed pattern: %v", err)
	}
	// A cancelled list stops.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := e.w.List(ctx, ".", ListOptions{Recursive: true, Max: 100}, func(agentproto.Entry) error { return nil }); codeOf(err) != errcode.Timeout {
		t.Fatalf("cancelled list: %v", err)
	}
}

func TestMatchGlob(t *testing.T) {
	for _, c := range []struct {
		pattern, path string
		want          bool
	}{
		{"**/*.py", "a.py", true},
		{"**/*.py", "src/pkg/a.py", true},
		{"**/*.py", "src/pkg/a.pyc", false},
		{"*.py", "src/a.py", true},
		{"src/*.py", "src/a.py", true},
		{"src/*.py", "src/pkg/a.py", false},
		{"src/**", "src/pkg/a.py", true},
		{"src/**", "src", true},
		{"src/**/test_*.py", "src/test_a.py", true},
		{"src/**/test_*.py", "src/x/y/test_a.py", true},
		{"src/**/test_*.py", "lib/test_a.py", false},
		{"**/**/**/x", "a/b/c/x", true},
		{"a/?/c", "a/b/c", true},
		{"[ab]*", "dir/bx", true},
		{"*", "anything/at/all", true},
		{"**", "a/b", true},
		{"src/[a", "src/[a", false},
	} {
		if got := MatchGlob(c.pattern, c.path); got != c.want {
			t.Errorf("MatchGlob(%q, %q) = %v, want %v", c.pattern, c.path, got, c.want)
		}
	}
	// Many "**" against a deep path stays cheap.
	deep := strings.Repeat("d/", 200) + "x"
	within(t, 10*time.Second, "a pattern of many ** on a deep path", func() {
		if MatchGlob(strings.Repeat("**/", 50)+"y", deep) {
			t.Error("matched")
		}
	})
}
