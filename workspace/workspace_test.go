package workspace

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

const (
	outsideCode  = errcode.OutsideWorkspace
	invalidCode  = errcode.InvalidArgument
	notFoundCode = errcode.NotFound
)

// TestReadConfinement covers the path cases of docs/attack-cases.md 1, 2,
// 4, 5, 6 (read), 8, 9, 12, 13, 15 and 21 for ReadFile: every way out is
// refused with the right code, and the canary never comes back.
func TestReadConfinement(t *testing.T) {
	long := strings.Repeat("n", 256)
	deep := strings.Repeat("a/", 2000) + "x" // 4001 bytes of short components
	cases := []struct {
		name  string
		setup func(e *env)
		path  string
		code  errcode.Code
	}{
		{"dotdot", nil, "../outside/secret", outsideCode},
		{"dotdot deep", nil, "../../../../../../../../etc/passwd", outsideCode},
		{"dotdot via dir", func(e *env) { e.mkdir("a") }, "a/../../outside/secret", outsideCode},
		{"dot dotdot", nil, "./../x", outsideCode},
		{"absolute", nil, "/etc/passwd", outsideCode},
		{"absolute workspace alias", nil, "/workspace/../etc/passwd", outsideCode},
		{"absolute outside canary", nil, "/outside/secret", outsideCode},
		{"absolute symlink", func(e *env) { e.symlink(filepath.Join(e.outside, "secret"), "abs") }, "abs", outsideCode},
		{"relative escaping symlink", func(e *env) { e.symlink("../outside/secret", "rel") }, "rel", outsideCode},
		{"symlink to parent then dotdot", func(e *env) { e.symlink("..", "sub/up") }, "sub/up/../outside/secret", outsideCode},
		{"symlink to root then dotdot", func(e *env) { e.symlink("..", "sub/up") }, "sub/up/../../outside/secret", outsideCode},
		{"parent dir symlink absolute", func(e *env) { e.symlink(e.outside, "d") }, "d/secret", outsideCode},
		{"parent dir symlink relative", func(e *env) { e.symlink("../outside", "d") }, "d/secret", outsideCode},
		{"symlink chain out", func(e *env) { e.symlink("b", "a"); e.symlink("../outside/secret", "b") }, "a", outsideCode},
		{"symlink loop", func(e *env) { e.symlink("b", "a"); e.symlink("a", "b") }, "a", invalidCode},
		{"self loop", func(e *env) { e.symlink("self", "self") }, "self", invalidCode},
		{"loop as parent", func(e *env) { e.symlink("b", "a"); e.symlink("a", "b") }, "a/x", invalidCode},
		{"proc root magic link", func(e *env) { e.symlink("/proc/self/root"+filepath.Join(e.outside, "secret"), "p") }, "p", outsideCode},
		{"proc environ link", func(e *env) { e.symlink("/proc/self/environ", "e") }, "e", outsideCode},
		{"proc environ relative", func(e *env) {
			e.symlink(strings.Repeat("../", 40)+"proc/self/environ", "e")
		}, "e", outsideCode},
		{"proc environ path", nil, "/proc/self/environ", outsideCode},
		{"proc fd path", nil, "/proc/self/fd/0", outsideCode},
		{"dev zero symlink", func(e *env) { e.symlink("/dev/zero", "z") }, "z", outsideCode},
		{"dev urandom symlink", func(e *env) { e.symlink("/dev/urandom", "u") }, "u", outsideCode},
		{"nul byte", func(e *env) { e.file("ok.txt", "ok") }, "ok.txt\x00.png", invalidCode},
		{"name of 256 bytes", nil, long, invalidCode},
		{"path over 4096 bytes", nil, strings.Repeat("a/", 2100), invalidCode},
		{"deep path of short components", nil, deep, notFoundCode},
		{"missing", nil, "nope.txt", notFoundCode},
		{"backslashes", nil, `..\..\etc\passwd`, notFoundCode},
		{"directory", func(e *env) { e.mkdir("sub") }, "sub/", invalidCode},
		{"directory no slash", func(e *env) { e.mkdir("sub") }, "sub", invalidCode},
		{"root", nil, ".", invalidCode},
		{"file as directory", func(e *env) { e.file("ok.txt", "ok") }, "ok.txt/x", invalidCode},
		{"file with trailing slash", func(e *env) { e.file("ok.txt", "ok") }, "ok.txt/", invalidCode},
		{"list dotdot", nil, "..", outsideCode},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			if tc.setup != nil {
				tc.setup(e)
			}
			got, _, err := e.read(tc.path)
			wantCode(t, err, tc.code, tc.path)
			if strings.Contains(got, secret) || got != "" {
				t.Fatalf("read returned content %q", got)
			}
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("message leaks the canary: %v", err)
			}
			e.checkOutside()
		})
	}
}

// TestReadInside covers path case 3 and in-workspace symlinks: paths that stay
// inside work, whatever their spelling.
func TestReadInside(t *testing.T) {
	e := newEnv(t)
	e.file("ok.txt", "ok")
	e.file("sub/f.txt", "in sub")
	e.symlink("ok.txt", "link")
	e.symlink("sub", "dirlink")
	e.symlink("../ok.txt", "sub/up")
	e.symlink(".", "dot")
	e.file("-x", "dash")
	for path, want := range map[string]string{
		"ok.txt":             "ok",
		"./ok.txt":           "ok",
		"sub/../ok.txt":      "ok",
		"sub//f.txt":         "in sub",
		"./sub/./f.txt":      "in sub",
		"link":               "ok",
		"dirlink/f.txt":      "in sub",
		"dirlink/../ok.txt":  "ok",
		"sub/up":             "ok",
		"dot/dot/dot/ok.txt": "ok",
		"-x":                 "dash",
	} {
		got, res, err := e.read(path)
		if err != nil || got != want || res.Size != int64(len(want)) || res.Truncated {
			t.Errorf("read %q = %q, %+v, %v; want %q", path, got, res, err, want)
		}
	}
}

// TestReadRanges checks offset, length and max, and that content arrives in
// writes of at most ChunkSize bytes.
func TestReadRanges(t *testing.T) {
	e := newEnv(t)
	e.file("ten", "0123456789")
	cases := []struct {
		off, length, max int64
		want             string
		truncated        bool
		code             errcode.Code
	}{
		{0, 0, 100, "0123456789", false, ""},
		{3, 0, 100, "3456789", false, ""},
		{3, 4, 100, "3456", false, ""},
		{3, 100, 100, "3456789", false, ""},
		{0, 0, 4, "0123", true, ""},
		{2, 5, 3, "234", true, ""},
		{10, 0, 100, "", false, ""},
		{0, 0, 0, "", true, ""},
		{11, 0, 100, "", false, invalidCode},
		{-1, 0, 100, "", false, invalidCode},
		{0, -1, 100, "", false, invalidCode},
		{0, 0, -1, "", false, invalidCode},
	}
	for _, tc := range cases {
		var b bytes.Buffer
		res, err := e.w.ReadFile(context.Background(), "ten", tc.off, tc.length, tc.max, &b)
		if codeOf(err) != tc.code || (tc.code == "" && err != nil) {
			t.Errorf("%+v: err %v", tc, err)
			continue
		}
		if tc.code != "" {
			continue
		}
		if b.String() != tc.want || res.Truncated != tc.truncated || res.Size != 10 {
			t.Errorf("%+v: got %q %+v", tc, b.String(), res)
		}
	}

	big := bytes.Repeat([]byte("abcdefghijklmnopqrstuvwxyz"), 40000) // ~1 MiB
	if err := os.WriteFile(e.path("big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	var sizes []int
	var got bytes.Buffer
	dst := writerFunc(func(p []byte) (int, error) { sizes = append(sizes, len(p)); return got.Write(p) })
	res, err := e.w.ReadFile(context.Background(), "big", 0, 0, 1<<30, dst)
	if err != nil || !bytes.Equal(got.Bytes(), big) || res.Truncated {
		t.Fatalf("big read: %v, %d bytes, %+v", err, got.Len(), res)
	}
	for _, n := range sizes {
		if n > agentproto.ChunkSize || n == 0 {
			t.Fatalf("write of %d bytes; chunks must be 1..%d", n, agentproto.ChunkSize)
		}
	}

	// The caller's writer error comes back unchanged.
	myErr := errors.New("client went away")
	_, err = e.w.ReadFile(context.Background(), "big", 0, 0, 1<<30, writerFunc(func(p []byte) (int, error) { return 0, myErr }))
	if err != myErr {
		t.Fatalf("writer error: got %v, want it unchanged", err)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// within runs fn and fails the test if it takes longer than d.
func within(t *testing.T, d time.Duration, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); fn() }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s did not return within %v", what, d)
	}
}

// TestSpecialFiles covers path cases 14 and 15: FIFOs and sockets are refused at
// once, never opened in a blocking way.
func TestSpecialFiles(t *testing.T) {
	e := newEnv(t)
	e.mkfifo("f")
	l, err := net.Listen("unix", e.path("sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, p := range []string{"f", "sock"} {
		var err error
		within(t, 100*time.Millisecond, "read of "+p, func() { _, _, err = e.read(p) })
		wantCode(t, err, invalidCode, p)
		if !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("read %s: %v", p, err)
		}
		within(t, 100*time.Millisecond, "append to "+p, func() {
			_, err = e.w.WriteFile(p, strings.NewReader("x"), 1, true, 0o644)
		})
		wantCode(t, err, invalidCode, p)
	}
	// A FIFO with a reader waiting: append still refuses it (not regular).
	rd, err := os.OpenFile(e.path("f"), os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	within(t, 100*time.Millisecond, "append to FIFO with reader", func() {
		_, err = e.w.WriteFile("f", strings.NewReader("x"), 1, true, 0o644)
	})
	wantCode(t, err, invalidCode, "f")
	// A plain write replaces the FIFO with a file (rename), without opening it.
	within(t, 100*time.Millisecond, "write over FIFO", func() { _, err = e.write("f", "now a file") })
	if err != nil || e.hostRead("f") != "now a file" {
		t.Fatalf("write over FIFO: %v", err)
	}
}

// TestReadSparseHuge covers path case 16: a 100 GiB sparse file is not read
// beyond max.
func TestReadSparseHuge(t *testing.T) {
	e := newEnv(t)
	f, err := os.Create(e.path("sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(100 << 30); err != nil {
		t.Skipf("cannot make a sparse file here: %v", err)
	}
	f.Close()
	start := time.Now()
	var b bytes.Buffer
	res, err := e.w.ReadFile(context.Background(), "sparse", 0, 0, 4096, &b)
	if err != nil || b.Len() != 4096 || !res.Truncated || res.Size != 100<<30 {
		t.Fatalf("got %d bytes, %+v, %v", b.Len(), res, err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("took %v", d)
	}
	res, err = e.w.ReadFile(context.Background(), "sparse", 50<<30, 10, 4096, &b)
	if err != nil || res.Truncated {
		t.Fatalf("range in the middle: %+v %v", res, err)
	}
}

// TestWriteBasics: creation, replacement, modes, missing parents, bad
// targets and exact sizes; no temporary file survives.
func TestWriteBasics(t *testing.T) {
	e := newEnv(t)
	res, err := e.w.WriteFile("new/dir/x.txt", strings.NewReader("hello"), 5, false, 0o640)
	if err != nil || res != (agentproto.WriteResult{Written: 5, Size: 5}) {
		t.Fatalf("write: %+v %v", res, err)
	}
	if e.hostRead("new/dir/x.txt") != "hello" {
		t.Fatal("content")
	}
	for p, want := range map[string]os.FileMode{"new/dir/x.txt": 0o640, "new": 0o755 | os.ModeDir, "new/dir": 0o755 | os.ModeDir} {
		fi, err := os.Stat(e.path(p))
		if err != nil || fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v (%v)", p, fi.Mode(), want, err)
		}
	}
	// Replace with a shorter content and another mode; setuid is dropped.
	if _, err := e.w.WriteFile("new/dir/x.txt", strings.NewReader("hi"), 2, false, 0o4755); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(e.path("new/dir/x.txt")); fi.Mode() != 0o755 || e.hostRead("new/dir/x.txt") != "hi" {
		t.Fatalf("after replace: %v %q", fi.Mode(), e.hostRead("new/dir/x.txt"))
	}
	// Empty file.
	if res, err := e.write("empty", ""); err != nil || res.Size != 0 {
		t.Fatalf("empty: %+v %v", res, err)
	}
	e.file("afile", "x")
	e.mkdir("adir")
	e.file("adir/keep", "keep")
	bad := []struct {
		path string
		code errcode.Code
	}{
		{"", invalidCode},
		{".", invalidCode},
		{"adir", invalidCode},
		{"adir/", invalidCode},
		{"adir/..", invalidCode},
		{"x/.", invalidCode},
		{"afile/x", invalidCode},
		{"afile/deeper/x", invalidCode},
		{"a\x00b", invalidCode},
		{"/abs", outsideCode},
		{"../escape", outsideCode},
		{strings.Repeat("n", 256), invalidCode},
	}
	for _, tc := range bad {
		_, err := e.write(tc.path, "data")
		if codeOf(err) != tc.code {
			t.Errorf("write %q: %v, want %s", tc.path, err, tc.code)
		}
	}
	if e.hostRead("adir/keep") != "keep" {
		t.Fatal("directory was touched")
	}
	// Too few and too many bytes: nothing changes.
	e.file("sized", "original")
	for _, tc := range []struct {
		content string
		size    int64
	}{{"abc", 5}, {"abcdef", 5}, {strings.Repeat("z", 300<<10), 300<<10 + 1}, {strings.Repeat("z", 300<<10), 1}} {
		for _, app := range []bool{false, true} {
			_, err := e.w.WriteFile("sized", strings.NewReader(tc.content), tc.size, app, 0o644)
			if codeOf(err) != invalidCode {
				t.Errorf("size %d with %d bytes (append %v): %v", tc.size, len(tc.content), app, err)
			}
			if e.hostRead("sized") != "original" {
				t.Fatalf("content changed after a size mismatch")
			}
		}
		_, err := e.w.WriteFile("fresh/new", strings.NewReader(tc.content), tc.size, false, 0o644)
		if codeOf(err) != invalidCode {
			t.Errorf("new file with bad size: %v", err)
		}
		if _, err := os.Lstat(e.path("fresh/new")); !os.IsNotExist(err) {
			t.Errorf("a file was created despite the size mismatch")
		}
	}
	// The caller's reader error comes back unchanged, and nothing changes.
	myErr := errors.New("cancelled")
	_, err = e.w.WriteFile("sized", io.MultiReader(strings.NewReader("ab"), errReader{myErr}), 10, false, 0o644)
	if err != myErr || e.hostRead("sized") != "original" {
		t.Fatalf("reader error: %v", err)
	}
	_, err = e.w.WriteFile("sized", io.MultiReader(strings.NewReader("ab"), errReader{myErr}), 10, true, 0o644)
	if err != myErr || e.hostRead("sized") != "original" {
		t.Fatalf("reader error (append): %v", err)
	}
	noTemps(t, e.dir)
	e.checkOutside()
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// noTemps fails if any of the agent's temporary files is left below dir.
func noTemps(t *testing.T, dir string) {
	t.Helper()
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), internalPrefix) {
			t.Errorf("temporary file left behind: %s", p)
		}
		return nil
	})
}

// TestWriteConfinement covers path cases 6 (write), 7, 18 and 19: writes never
// go through a symlink, never land outside.
func TestWriteConfinement(t *testing.T) {
	cases := []struct {
		name  string
		setup func(e *env)
		path  string
		code  errcode.Code
		check func(e *env)
	}{
		{"dotdot", nil, "../outside/evil", outsideCode, nil},
		{"dotdot new dir", nil, "../newdir/evil", outsideCode, nil},
		{"absolute", nil, "/tmp/evil", outsideCode, nil},
		{"parent dir symlink", func(e *env) { e.symlink(e.outside, "d") }, "d/evil", outsideCode, nil},
		{"parent dir symlink relative", func(e *env) { e.symlink("../outside", "d") }, "d/evil", outsideCode, nil},
		{"parent dir symlink, new subdir", func(e *env) { e.symlink(e.outside, "d") }, "d/new/evil", outsideCode, nil},
		{"parent dir symlink onto canary", func(e *env) { e.symlink(e.outside, "d") }, "d/secret", outsideCode, nil},
		{"dangling escaping parent", func(e *env) { e.symlink("../newdir", "dd") }, "dd/evil", outsideCode, nil},
		{"dangling absolute parent", func(e *env) { e.symlink(filepath.Join(e.base, "newdir"), "dd") }, "dd/evil", outsideCode, nil},
		{"dangling inside parent", func(e *env) { e.symlink("nothere", "dd") }, "dd/x", invalidCode, func(e *env) {
			if _, err := os.Lstat(e.path("nothere")); err == nil {
				e.t.Error("the symlink's target was created")
			}
		}},
		{"loop parent", func(e *env) { e.symlink("lb", "la"); e.symlink("la", "lb") }, "la/x", invalidCode, nil},
		{"proc parent", func(e *env) { e.symlink("/proc/self/cwd", "pc") }, "pc/evil", outsideCode, nil},
		{"dangling escaping target is replaced", func(e *env) { e.symlink("../newfile", "dang") }, "dang", "", func(e *env) {
			if fi, err := os.Lstat(e.path("dang")); err != nil || !fi.Mode().IsRegular() {
				e.t.Errorf("dang is not a regular file now: %v %v", fi, err)
			}
		}},
		{"absolute symlink target is replaced", func(e *env) { e.symlink(filepath.Join(e.outside, "secret"), "l") }, "l", "", func(e *env) {
			if e.hostRead("l") != "data" {
				e.t.Error("content")
			}
		}},
		{"inside symlink target is replaced", func(e *env) { e.file("ok.txt", "ok"); e.symlink("ok.txt", "l") }, "l", "", func(e *env) {
			if e.hostRead("ok.txt") != "ok" || e.hostRead("l") != "data" {
				e.t.Error("the link's target was written, or the link not replaced")
			}
			if fi, _ := os.Lstat(e.path("l")); !fi.Mode().IsRegular() {
				e.t.Error("l is still a symlink")
			}
		}},
		{"inside dir symlink parent is followed", func(e *env) { e.mkdir("real"); e.symlink("real", "dl") }, "dl/x", "", func(e *env) {
			if e.hostRead("real/x") != "data" {
				e.t.Error("content")
			}
		}},
	}
	for _, tc := range cases {
		for _, app := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/append=%v", tc.name, app), func(t *testing.T) {
				e := newEnv(t)
				if tc.setup != nil {
					tc.setup(e)
				}
				_, err := e.w.WriteFile(tc.path, strings.NewReader("data"), 4, app, 0o644)
				code := tc.code
				if app && code == "" && strings.Contains(tc.name, "target is replaced") {
					code = invalidCode // append refuses a symlink
				}
				wantCode(t, err, code, tc.path)
				if app && code == invalidCode && strings.Contains(tc.name, "target is replaced") &&
					!strings.Contains(err.Error(), "is a symlink; append to its target instead") {
					t.Errorf("message: %v", err)
				}
				if tc.check != nil && !(app && code != "") {
					tc.check(e)
				}
				e.checkOutside()
				noTemps(t, e.dir)
			})
		}
	}
}

// TestAppend: appending keeps the inode and mode, creates missing files
// with the mode, and spools large inputs.
func TestAppend(t *testing.T) {
	e := newEnv(t)
	e.file("log", "a")
	if err := os.Chmod(e.path("log"), 0o600); err != nil {
		t.Fatal(err)
	}
	before, _ := os.Stat(e.path("log"))
	res, err := e.w.WriteFile("log", strings.NewReader("bc"), 2, true, 0o777)
	if err != nil || res != (agentproto.WriteResult{Written: 2, Size: 3}) || e.hostRead("log") != "abc" {
		t.Fatalf("append: %+v %v", res, err)
	}
	after, _ := os.Stat(e.path("log"))
	if !os.SameFile(before, after) || after.Mode() != 0o600 {
		t.Fatalf("append replaced the file or changed its mode: %v", after.Mode())
	}
	big := strings.Repeat("0123456789abcdef", 40000) // 640 KB: spooled
	res, err = e.w.WriteFile("log", strings.NewReader(big), int64(len(big)), true, 0o644)
	if err != nil || res.Size != int64(3+len(big)) || e.hostRead("log") != "abc"+big {
		t.Fatalf("big append: %+v %v", res, err)
	}
	res, err = e.w.WriteFile("made/by/append", strings.NewReader("x"), 1, true, 0o640)
	if fi, _ := os.Stat(e.path("made/by/append")); err != nil || fi.Mode() != 0o640 || res.Size != 1 {
		t.Fatalf("append create: %+v %v", res, err)
	}
	e.mkdir("d")
	_, err = e.w.WriteFile("d", strings.NewReader("x"), 1, true, 0o644)
	wantCode(t, err, invalidCode, "d")
	noTemps(t, e.dir)
}

// TestConcurrentWrites covers path case 24: the final content is exactly one of
// the inputs.
func TestConcurrentWrites(t *testing.T) {
	e := newEnv(t)
	const writers, rounds, size = 8, 10, 200 << 10
	var wg sync.WaitGroup
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			content := strings.Repeat(string(rune('A'+i)), size)
			for range rounds {
				if _, err := e.write("same.txt", content); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	// Readers see whole versions only.
	stop := make(chan struct{})
	var rwg sync.WaitGroup
	rwg.Add(1)
	go func() {
		defer rwg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			got, _, err := e.read("same.txt")
			if err != nil {
				continue // not created yet
			}
			if len(got) != size || strings.Count(got, got[:1]) != size {
				t.Errorf("a reader saw a mixed or partial file (%d bytes)", len(got))
				return
			}
		}
	}()
	wg.Wait()
	close(stop)
	rwg.Wait()
	got := e.hostRead("same.txt")
	if len(got) != size || strings.Count(got, got[:1]) != size {
		t.Fatalf("final content is not one of the inputs (%d bytes)", len(got))
	}
	noTemps(t, e.dir)
}

// listAll lists and collects the entries.
func listAll(w *Workspace, rel string, recursive bool, max int) ([]agentproto.Entry, agentproto.ListResult, error) {
	var ents []agentproto.Entry
	res, err := w.List(context.Background(), rel, ListOptions{Recursive: recursive, Max: max}, func(en agentproto.Entry) error { ents = append(ents, en); return nil })
	return ents, res, err
}

func paths(ents []agentproto.Entry) []string {
	var p []string
	for _, en := range ents {
		p = append(p, en.Path)
	}
	return p
}

// TestList covers path cases 20 and 23 and the List contract.
func TestList(t *testing.T) {
	e := newEnv(t)
	e.file("b.txt", "bbb")
	e.file("a.txt", "a")
	e.file("sub/z", "z")
	e.file("sub/inner/y", "yy")
	e.symlink("sub", "dirlink")
	e.symlink(e.outside, "outlink")
	e.symlink("nothere", "dangling")
	e.mkfifo("fifo")
	if err := unix.Chmod(e.path("a.txt"), 0o4755); err != nil {
		t.Fatal(err)
	}
	e.mkdir("sticky")
	if err := unix.Chmod(e.path("sticky"), 0o1777); err != nil {
		t.Fatal(err)
	}
	mt := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	if err := os.Chtimes(e.path("b.txt"), mt, mt); err != nil {
		t.Fatal(err)
	}

	ents, res, err := listAll(e.w, ".", false, 100)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a.txt", "b.txt", "dangling", "dirlink", "fifo", "outlink", "sticky", "sub"}
	if fmt.Sprint(paths(ents)) != fmt.Sprint(want) || res.Count != len(want) || res.Truncated {
		t.Fatalf("list: %q %+v", paths(ents), res)
	}
	byPath := map[string]agentproto.Entry{}
	for _, en := range ents {
		byPath[en.Path] = en
	}
	checks := []struct {
		path, typ, target string
		mode              uint32
		size              int64
	}{
		{"a.txt", agentproto.TypeFile, "", 0o4755, 1},
		{"b.txt", agentproto.TypeFile, "", 0o644, 3},
		{"dirlink", agentproto.TypeSymlink, "sub", 0o777, 3},
		{"outlink", agentproto.TypeSymlink, e.outside, 0o777, int64(len(e.outside))},
		{"fifo", agentproto.TypeOther, "", 0o644, 0},
		{"sticky", agentproto.TypeDir, "", 0o1777, -1},
		{"sub", agentproto.TypeDir, "", 0o755, -1},
	}
	for _, c := range checks {
		en := byPath[c.path]
		if en.Type != c.typ || en.Target != c.target || en.Mode != c.mode || (c.size >= 0 && en.Size != c.size) {
			t.Errorf("%s: %+v", c.path, en)
		}
	}
	if !byPath["b.txt"].MTime.Equal(mt) {
		t.Errorf("mtime %v, want %v", byPath["b.txt"].MTime, mt)
	}

	ents, _, err = listAll(e.w, "", true, 100)
	if err != nil {
		t.Fatal(err)
	}
	// Breadth-first: a level at a time, sorted within each directory.
	want = []string{"a.txt", "b.txt", "dangling", "dirlink", "fifo", "outlink", "sticky", "sub", "sub/inner", "sub/z", "sub/inner/y"}
	if fmt.Sprint(paths(ents)) != fmt.Sprint(want) {
		t.Fatalf("recursive list (breadth-first; symlinks must not be entered): %q", paths(ents))
	}

	// Subdirectory, spelled in several ways: paths are workspace-relative.
	for _, start := range []string{"sub", "sub/", "./sub", "sub/inner/.."} {
		ents, _, err = listAll(e.w, start, true, 100)
		if err != nil {
			t.Fatal(err)
		}
		prefix := strings.TrimSuffix(strings.TrimPrefix(start, "./"), "/")
		want := []string{prefix + "/inner", prefix + "/z", prefix + "/inner/y"}
		if fmt.Sprint(paths(ents)) != fmt.Sprint(want) {
			t.Errorf("list %q: %q, want %q", start, paths(ents), want)
		}
	}
	// A symlink to a directory inside, as the start, is followed.
	ents, _, err = listAll(e.w, "dirlink", false, 100)
	if err != nil || fmt.Sprint(paths(ents)) != "[dirlink/inner dirlink/z]" {
		t.Fatalf("list dirlink: %q %v", paths(ents), err)
	}
	// A file, a dangling symlink, a FIFO as start: just that entry.
	for _, p := range []string{"a.txt", "dangling", "fifo"} {
		ents, res, err = listAll(e.w, p, true, 100)
		if err != nil || len(ents) != 1 || ents[0].Path != p || res.Count != 1 {
			t.Errorf("list %s: %+v %v", p, ents, err)
		}
	}
	if ents, _, _ := listAll(e.w, "dangling", false, 100); len(ents) != 1 || ents[0].Target != "nothere" {
		t.Errorf("dangling: %+v", ents)
	}
	// Truncation.
	ents, res, err = listAll(e.w, ".", true, 3)
	if err != nil || len(ents) != 3 || res.Count != 3 || !res.Truncated {
		t.Fatalf("max 3: %q %+v %v", paths(ents), res, err)
	}
	ents, res, err = listAll(e.w, "sub", true, 3)
	if err != nil || len(ents) != 3 || res.Truncated {
		t.Fatalf("exactly max: %q %+v %v", paths(ents), res, err)
	}
	ents, res, err = listAll(e.w, ".", false, 0)
	if err != nil || len(ents) != 0 || !res.Truncated {
		t.Fatalf("max 0: %+v %v", res, err)
	}
	// Ways out (path cases 23, and 6 for list).
	for _, p := range []string{"..", "/", "/etc", "outlink", "outlink/", "../outside", "sub/../.."} {
		_, _, err := listAll(e.w, p, false, 100)
		wantCode(t, err, outsideCode, p)
	}
	_, _, err = listAll(e.w, "missing", false, 100)
	wantCode(t, err, notFoundCode, "missing")
	// The caller's emit error comes back unchanged.
	myErr := errors.New("stop")
	if _, err := e.w.List(context.Background(), ".", ListOptions{Recursive: true, Max: 100}, func(agentproto.Entry) error { return myErr }); err != myErr {
		t.Fatalf("emit error: %v", err)
	}
	e.checkOutside()
}

// TestListOddNames covers path case 20: names with control characters, invalid
// UTF-8 and a leading dash are listed, as valid UTF-8 JSON.
func TestListOddNames(t *testing.T) {
	e := newEnv(t)
	names := []string{"new\nline", "tab\there", "esc\x1b[31m", "cr\rx", "bad\xff\xfe", "-rf", "sp ace", `back\slash`}
	for _, n := range names {
		e.file(n, "x")
	}
	ents, res, err := listAll(e.w, ".", false, 100)
	if err != nil || res.Count != len(names) {
		t.Fatalf("%+v %v", res, err)
	}
	got := map[string]bool{}
	for _, en := range ents {
		if !utf8.ValidString(en.Path) {
			t.Errorf("invalid UTF-8 in %q", en.Path)
		}
		b, err := json.Marshal(en)
		if err != nil {
			t.Fatal(err)
		}
		var back agentproto.Entry
		if err := json.Unmarshal(b, &back); err != nil || back.Path != en.Path {
			t.Errorf("JSON round trip of %q: %q %v", en.Path, back.Path, err)
		}
		got[en.Path] = true
	}
	for _, n := range names {
		if !got[strings.ToValidUTF8(n, "\uFFFD")] {
			t.Errorf("%q not listed", n)
		}
	}
	// Names with control characters can be passed back.
	if e.mustRead("new\nline") != "x" || e.mustRead("-rf") != "x" {
		t.Fatal("read back")
	}
}

// TestListDeep: recursion stops 64 levels below the start; the deeper
// directory is listed but not entered.
func TestListDeep(t *testing.T) {
	e := newEnv(t)
	e.mkdir(strings.Repeat("d/", 70))
	ents, _, err := listAll(e.w, ".", true, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != listMaxDepth {
		t.Fatalf("%d entries, want %d", len(ents), listMaxDepth)
	}
	if last := ents[len(ents)-1].Path; strings.Count(last, "/") != listMaxDepth-1 {
		t.Fatalf("deepest listed: %q", last)
	}
}

// TestOpenDir covers path case 14: a cwd must resolve inside.
func TestOpenDir(t *testing.T) {
	e := newEnv(t)
	e.file("sub/f", "x")
	e.symlink("sub", "dirlink")
	e.symlink(e.outside, "out")
	e.symlink("/proc/self/fd/7", "fd7")
	e.symlink("/proc/self/cwd", "cwd")
	for _, p := range []string{"", ".", "sub", "sub/", "dirlink", "sub/.."} {
		f, err := e.w.OpenDir(p)
		if err != nil {
			t.Fatalf("OpenDir %q: %v", p, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			t.Errorf("OpenDir %q: not a directory", p)
		}
		f.Close()
	}
	for p, code := range map[string]errcode.Code{
		"sub/f":           invalidCode,
		"missing":         notFoundCode,
		"out":             outsideCode,
		"fd7":             outsideCode,
		"cwd":             outsideCode,
		"/proc/self/fd/7": outsideCode,
		"..":              outsideCode,
		"/":               outsideCode,
	} {
		_, err := e.w.OpenDir(p)
		wantCode(t, err, code, p)
	}
	_, err := e.w.OpenDir("sub/f")
	if !strings.Contains(err.Error(), "is not a directory") {
		t.Errorf("message: %v", err)
	}
}

// TestClosed: operations after Close fail cleanly.
func TestClosed(t *testing.T) {
	e := newEnv(t)
	if err := e.w.Close(); err != nil {
		t.Fatal(err)
	}
	_, _, err := e.read("x")
	wantCode(t, err, errcode.Unavailable, "")
	_, err = e.w.Restore(strings.NewReader(""), agentproto.Limits{})
	wantCode(t, err, errcode.Unavailable, "")
	if err := e.w.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	_, err = Open(filepath.Join(e.base, "missing"))
	wantCode(t, err, notFoundCode, "")
}

// TestErrnoMapping checks the code for each errno class.
func TestErrnoMapping(t *testing.T) {
	for errno, code := range map[unix.Errno]errcode.Code{
		unix.ENOENT:       errcode.NotFound,
		unix.EXDEV:        errcode.OutsideWorkspace,
		unix.EROFS:        errcode.ReadOnly,
		unix.ENOSPC:       errcode.TooLarge,
		unix.EDQUOT:       errcode.TooLarge,
		unix.EFBIG:        errcode.TooLarge,
		unix.EISDIR:       errcode.InvalidArgument,
		unix.ENOTDIR:      errcode.InvalidArgument,
		unix.ELOOP:        errcode.InvalidArgument,
		unix.ENAMETOOLONG: errcode.InvalidArgument,
		unix.EACCES:       errcode.InvalidArgument,
		unix.EMFILE:       errcode.Busy,
		unix.EIO:          "", // a fault: no code, INTERNAL on the wire
	} {
		err := fsError("read", "a/b", errno)
		if codeOf(err) != code || !strings.Contains(err.Error(), `read "a/b": `) {
			t.Errorf("%v: %v, want %s", errno, err, code)
		}
	}
	if !strings.Contains(fsError("write", "x", unix.EROFS).Error(), "the workspace is read-only on this server") {
		t.Error("EROFS message")
	}
	if !strings.Contains(fsError("write", "x", unix.ENOSPC).Error(), "the workspace is full") {
		t.Error("ENOSPC message")
	}
	if err := fsError("read", "x", unix.EIO); !strings.Contains(err.Error(), "EIO") || !errors.As(err, new(*faultError)) {
		t.Errorf("EIO: %v (%T), want a fault that names the errno", err, err)
	}
}

// TestMounts (root only): a mount point inside the workspace is not
// crossed (RESOLVE_NO_XDEV), a full tmpfs is TOO_LARGE, and a read-only one
// is READ_ONLY.
func TestMounts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	e := newEnv(t)
	e.mkdir("mnt")
	if err := unix.Mount(e.outside, e.path("mnt"), "", unix.MS_BIND, ""); err != nil {
		t.Skipf("cannot bind mount here: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(e.path("mnt"), unix.MNT_DETACH) })
	_, _, err := e.read("mnt/secret")
	wantCode(t, err, outsideCode, "mnt/secret")
	_, err = e.write("mnt/evil", "x")
	wantCode(t, err, outsideCode, "mnt/evil")
	_, _, err = listAll(e.w, "mnt", false, 10)
	wantCode(t, err, outsideCode, "mnt")
	ents, _, err := listAll(e.w, ".", true, 10)
	if err != nil || fmt.Sprint(paths(ents)) != "[mnt]" {
		t.Fatalf("recursive list entered the mount: %q %v", paths(ents), err)
	}
	var snap bytes.Buffer
	if res, err := e.w.Snapshot(&snap, agentproto.Limits{}); err != nil || bytes.Contains(snap.Bytes(), []byte(secret)) || res.Skipped != 1 {
		t.Fatalf("snapshot entered the mount: %+v %v", res, err)
	}
	// A restore must not empty the mounted directory while it removes the
	// old contents (renaming a mount point fails, and nothing is lost).
	_, err = e.w.Restore(bytes.NewReader(makeTar(t, reg("new", "x"))), agentproto.Limits{})
	if err == nil {
		t.Fatal("restore over a mount point succeeded")
	}
	t.Log(err)
	e.checkOutside()
	if err := unix.Unmount(e.path("mnt"), 0); err != nil {
		t.Fatal(err)
	}
	e.checkOutside()

	small := filepath.Join(e.base, "small")
	if err := os.Mkdir(small, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", small, "tmpfs", 0, "size=64k,nr_inodes=64"); err != nil {
		t.Skipf("cannot mount tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(small, unix.MNT_DETACH) })
	w, err := Open(small)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	// The workspace is a mount root, as in the container: everything works.
	if _, err := w.WriteFile("d/f", strings.NewReader("x"), 1, false, 0o644); err != nil {
		t.Fatal(err)
	}
	snap.Reset()
	if _, err := w.Snapshot(&snap, agentproto.Limits{}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Restore(bytes.NewReader(snap.Bytes()), agentproto.Limits{}); err != nil {
		t.Fatal(err)
	}
	if ents, _, err := listAll(w, ".", true, 10); err != nil || fmt.Sprint(paths(ents)) != "[d d/f]" {
		t.Fatalf("list: %q %v", paths(ents), err)
	}
	// Restoring needs room for the old and the new contents at once.
	half := strings.Repeat("h", 40<<10)
	if _, err := w.WriteFile("d/f", strings.NewReader(half), int64(len(half)), false, 0o644); err != nil {
		t.Fatal(err)
	}
	snap.Reset()
	if _, err := w.Snapshot(&snap, agentproto.Limits{}); err != nil {
		t.Fatal(err)
	}
	_, err = w.Restore(bytes.NewReader(snap.Bytes()), agentproto.Limits{})
	wantCode(t, err, errcode.TooLarge, "")
	if !strings.Contains(err.Error(), "room for the old and the new contents") {
		t.Errorf("message: %v", err)
	}
	if _, err := w.WriteFile("d/f", strings.NewReader(""), 0, false, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Restore(bytes.NewReader(snap.Bytes()), agentproto.Limits{}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Restore(bytes.NewReader(makeTar(t)), agentproto.Limits{}); err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("x", 128<<10)
	_, err = w.WriteFile("big", strings.NewReader(big), int64(len(big)), false, 0o644)
	wantCode(t, err, errcode.TooLarge, "big")
	_, err = w.WriteFile("big", strings.NewReader(big), int64(len(big)), true, 0o644)
	wantCode(t, err, errcode.TooLarge, "big")
	if ents, _, _ := listAll(w, ".", true, 100); len(ents) != 0 {
		t.Fatalf("a failed write left %q", paths(ents))
	}
	var ierr error
	for i := range 100 { // inode exhaustion (path case 22)
		if _, ierr = w.WriteFile(fmt.Sprintf("f%d", i), strings.NewReader(""), 0, false, 0o644); ierr != nil {
			break
		}
	}
	wantCode(t, ierr, errcode.TooLarge, "")
	if err := unix.Mount("", small, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	_, err = w.WriteFile("ro", strings.NewReader("x"), 1, false, 0o644)
	wantCode(t, err, errcode.ReadOnly, "ro")
	if !strings.Contains(err.Error(), "read-only on this server") {
		t.Errorf("message: %v", err)
	}
}

// TestChmodPathFd: the mode of a directory can be changed through an O_PATH
// descriptor (fchmodat2, or /proc/self/fd where seccomp refuses it).
func TestChmodPathFd(t *testing.T) {
	d := filepath.Join(t.TempDir(), "d")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chmod(d, 0); err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(d, 0o755)
	fd, err := unix.Open(d, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := chmodPathFd(fd, 0o700); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(d); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("mode %v %v", fi.Mode(), err)
	}
}
