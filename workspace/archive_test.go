package workspace

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// snapshot returns the workspace as a tar archive.
func (e *env) snapshot(lim agentproto.Limits) ([]byte, agentproto.SnapshotResult, error) {
	var b bytes.Buffer
	res, err := e.w.Snapshot(&b, lim)
	return b.Bytes(), res, err
}

// tarEntry is one entry of a test archive.
type tarEntry struct {
	hdr  tar.Header
	data string
}

// makeTar builds an archive from entries; Size is set from data for
// regular files unless already set.
func makeTar(t *testing.T, entries ...tarEntry) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, en := range entries {
		h := en.hdr
		if h.Typeflag == tar.TypeReg && h.Size == 0 {
			h.Size = int64(len(en.data))
		}
		if h.Mode == 0 && h.Typeflag != tar.TypeXGlobalHeader {
			h.Mode = 0o644
		}
		if h.ModTime.IsZero() && h.Typeflag != tar.TypeXGlobalHeader {
			h.ModTime = time.Unix(1700000000, 0)
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("header %q: %v", h.Name, err)
		}
		if _, err := tw.Write([]byte(en.data)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func reg(name, data string) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name}, data: data}
}

func dir(name string) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755}}
}

func symlink(name, target string) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}}
}

func hardlink(name, target string) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target}}
}

// tarNames lists an archive's entries as "type name[ -> link]".
func tarNames(t *testing.T, b []byte) []string {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(b))
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names
		}
		if err != nil {
			t.Fatalf("snapshot is not a valid tar: %v", err)
		}
		s := string(rune(h.Typeflag)) + " " + h.Name
		if h.Linkname != "" {
			s += " -> " + h.Linkname
		}
		names = append(names, s)
	}
}

// populate fills a workspace with one of everything.
func populate(t *testing.T, e *env) {
	t.Helper()
	mt := time.Unix(1600000000, 0)
	e.file("plain.txt", "hello\n")
	e.file("empty", "")
	e.file("dir/nested/deep.bin", strings.Repeat("\x00\x01\x02\xff", 300000)) // 1.2 MB
	e.file("dir/private", "p")
	e.file("ro/inside", "read-only dir content")
	e.file("odd/new\nline", "n")
	e.file("odd/bad\xff\xfe", "b")
	e.file("odd/ünïcode", "u")
	e.file("odd/"+strings.Repeat("long", 50), "long name") // 200 bytes
	e.file(strings.Repeat("p/", 60)+"leaf", "long path")   // > 100 bytes: USTAR prefix or PAX
	e.mkdir("emptydir")
	e.symlink("plain.txt", "link-rel")
	e.symlink("/etc/passwd", "link-abs")
	e.symlink("../../outside/secret", "link-escape")
	e.symlink("nothere", "link-dangling")
	e.symlink("dir", "link-dir")
	if err := os.Link(e.path("plain.txt"), e.path("hard")); err != nil {
		t.Fatal(err)
	}
	for p, mode := range map[string]uint32{
		"plain.txt": 0o644, "dir/private": 0o600, "empty": 0o400, "dir/nested/deep.bin": 0o755,
		"dir/nested": 0o750, "ro": 0o555, "emptydir": 0o700,
	} {
		if err := unix.Chmod(e.path(p), mode); err != nil {
			t.Fatal(err)
		}
	}
	// Times last (deepest first), whole seconds.
	for _, p := range []string{"dir/nested/deep.bin", "dir/private", "dir/nested", "dir", "plain.txt", "empty", "emptydir", "ro"} {
		if err := os.Chtimes(e.path(p), mt, mt); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSnapshotRestoreRoundTrip: contents, modes, symlinks and times come
// back identical, in a fresh workspace and in the same one.
func TestSnapshotRestoreRoundTrip(t *testing.T) {
	src := newEnv(t)
	populate(t, src)
	src.mkfifo("fifo")
	l, err := net.Listen("unix", src.path("sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	want := treeOf(t, src.dir, true)
	delete(want, "fifo")
	delete(want, "sock")

	var sizes []int
	var b bytes.Buffer
	res, err := src.w.Snapshot(writerFunc(func(p []byte) (int, error) { sizes = append(sizes, len(p)); return b.Write(p) }), agentproto.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	archive := b.Bytes()
	if res.Bytes != int64(len(archive)) || res.Files != len(want) || res.Skipped != 2 {
		t.Fatalf("result %+v; archive %d bytes, %d entries expected", res, len(archive), len(want))
	}
	for i, n := range sizes {
		if n > agentproto.ChunkSize || (n != agentproto.ChunkSize && i != len(sizes)-1) {
			t.Fatalf("write %d of %d bytes", i, n)
		}
	}
	names := tarNames(t, archive)
	for _, n := range names {
		name := n[2:]
		if strings.HasPrefix(name, "/") || strings.HasPrefix(name, "./") || strings.Contains(name, "fifo") || strings.Contains(name, "sock") {
			t.Errorf("bad entry %q", n)
		}
		if n[0] == tar.TypeDir && !strings.HasSuffix(name, "/") {
			t.Errorf("directory entry without slash: %q", n)
		}
	}
	for _, n := range []string{"2 link-escape -> ../../outside/secret", "2 link-abs -> /etc/passwd", "0 hard", "5 dir/"} {
		if !strings.Contains(strings.Join(names, "\n"), n) {
			t.Errorf("archive lacks %q: %q", n, names)
		}
	}
	if bytes.Contains(archive, []byte(secret)) {
		t.Fatal("the archive holds outside content")
	}

	// Into a fresh workspace with other contents, some of them hard to
	// delete.
	dst := newEnv(t)
	dst.file("old/file", "old")
	dst.file("ro-old/x", "x")
	dst.file("nox/x", "x")
	dst.file(".sandbox-mcp-tmp-leftover", "x")
	if err := unix.Chmod(dst.path("ro-old"), 0o555); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chmod(dst.path("nox"), 0o000); err != nil {
		t.Fatal(err)
	}
	// Nested directories that an unprivileged owner cannot empty without
	// changing their modes first (no write, no read, no search).
	dst.file("deep/ro/x", "x")
	dst.file("deep/noread/x", "x")
	dst.file("deep/nosearch/x", "x")
	dst.file("deep/none/x", "x")
	for p, mode := range map[string]uint32{"deep/ro": 0o555, "deep/noread": 0o300, "deep/nosearch": 0o600, "deep/none": 0} {
		if err := unix.Chmod(dst.path(p), mode); err != nil {
			t.Fatal(err)
		}
	}
	rres, err := dst.w.Restore(bytes.NewReader(archive), agentproto.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if rres.Files != len(want) || rres.Bytes != int64(len(archive)) || rres.Skipped != 0 {
		t.Fatalf("restore result %+v", rres)
	}
	if d := diffTrees(want, treeOf(t, dst.dir, true)); d != "" {
		t.Fatalf("restored tree differs:\n%s", d)
	}
	dst.checkOutside()
	src.checkOutside()

	// In the same workspace, after changes.
	src.file("plain.txt", "changed")
	src.file("added/x", "x")
	if err := os.RemoveAll(src.path("dir")); err != nil {
		t.Fatal(err)
	}
	if _, err := src.w.Restore(bytes.NewReader(archive), agentproto.Limits{}); err != nil {
		t.Fatal(err)
	}
	if d := diffTrees(want, treeOf(t, src.dir, true)); d != "" {
		t.Fatalf("tree restored in place differs:\n%s", d)
	}
	// A second snapshot of the restored tree is the same archive.
	again, _, err := dst.snapshot(agentproto.Limits{})
	if err != nil || !bytes.Equal(again, archive) {
		t.Fatalf("snapshot of the restored tree differs (%v)", err)
	}
}

// TestSnapshotSparseCap covers path case 25: a 1 TiB sparse file hits the
// byte cap at once, without being read.
func TestSnapshotSparseCap(t *testing.T) {
	e := newEnv(t)
	e.file("a.txt", "a")
	f, err := os.Create(e.path("big"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 40); err != nil {
		t.Skipf("cannot make a 1 TiB sparse file here: %v", err)
	}
	f.Close()
	start := time.Now()
	_, _, err = e.snapshot(agentproto.Limits{MaxBytes: 1 << 20})
	wantCode(t, err, errcode.TooLarge, "big")
	if !strings.Contains(err.Error(), "would exceed 1048576 bytes") {
		t.Errorf("message: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("took %v", d)
	}
}

// TestSnapshotSpecialFiles covers path cases 26 and 27: FIFOs and sockets are
// skipped without blocking; symlinks are stored, never followed.
func TestSnapshotSpecialFiles(t *testing.T) {
	e := newEnv(t)
	e.mkfifo("fifo")
	e.mkdir("sub")
	e.mkfifo("sub/fifo2")
	l, err := net.Listen("unix", e.path("sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	e.symlink(e.outside, "outdir")
	e.symlink(filepath.Join(e.outside, "secret"), "outfile")
	e.symlink("../outside/secret", "outrel")
	var archive []byte
	var res agentproto.SnapshotResult
	within(t, time.Second, "snapshot with FIFOs", func() { archive, res, err = e.snapshot(agentproto.Limits{}) })
	if err != nil {
		t.Fatal(err)
	}
	if res.Skipped != 3 || res.Files != 4 {
		t.Fatalf("result %+v", res)
	}
	got := strings.Join(tarNames(t, archive), "\n")
	want := "2 outdir -> " + e.outside + "\n2 outfile -> " + filepath.Join(e.outside, "secret") + "\n2 outrel -> ../outside/secret\n5 sub/"
	if got != want {
		t.Fatalf("entries:\n%s\nwant:\n%s", got, want)
	}
	if bytes.Contains(archive, []byte(secret)) {
		t.Fatal("outside content in the archive")
	}
}

// TestSnapshotLimits covers path case 28: entry, depth and byte caps, exact
// at the limit.
func TestSnapshotLimits(t *testing.T) {
	e := newEnv(t)
	for i := range 20 {
		e.file(fmt.Sprintf("f%02d", i), "x")
	}
	e.file("a/b/c/d/e", "deep")
	full, res, err := e.snapshot(agentproto.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	entries := res.Files // 20 files + 4 dirs + 1
	if _, _, err := e.snapshot(agentproto.Limits{MaxEntries: entries}); err != nil {
		t.Fatalf("exactly MaxEntries: %v", err)
	}
	_, _, err = e.snapshot(agentproto.Limits{MaxEntries: entries - 1})
	wantCode(t, err, errcode.TooLarge, "")
	if _, _, err := e.snapshot(agentproto.Limits{MaxDepth: 5}); err != nil {
		t.Fatalf("exactly MaxDepth: %v", err)
	}
	_, _, err = e.snapshot(agentproto.Limits{MaxDepth: 4})
	wantCode(t, err, errcode.TooLarge, "a/b/c/d/e")
	if _, _, err := e.snapshot(agentproto.Limits{MaxBytes: int64(len(full))}); err != nil {
		t.Fatalf("exactly MaxBytes: %v", err)
	}
	_, _, err = e.snapshot(agentproto.Limits{MaxBytes: int64(len(full)) - 1})
	wantCode(t, err, errcode.TooLarge, "")
	_, _, err = e.snapshot(agentproto.Limits{MaxBytes: -1})
	wantCode(t, err, invalidCode, "")

	// The caller's writer error comes back unchanged.
	myErr := errors.New("gone")
	if _, err := e.w.Snapshot(writerFunc(func([]byte) (int, error) { return 0, myErr }), agentproto.Limits{}); err != myErr {
		t.Fatalf("writer error: %v", err)
	}
}

// mkdeep makes a chain of n directories named name below the workspace,
// fd-relative (the path is far longer than PATH_MAX).
func mkdeep(t *testing.T, e *env, name string, n int) {
	t.Helper()
	fd, err := unix.Open(e.dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range n {
		if err := unix.Mkdirat(fd, name, 0o755); err != nil {
			t.Fatal(err)
		}
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = next
	}
	unix.Close(fd)
}

// TestDeepTree covers path cases 13 and 28: a 5,000-deep tree is capped
// quickly by snapshot, listed to 64 levels, and removed by a restore.
func TestDeepTree(t *testing.T) {
	e := newEnv(t)
	mkdeep(t, e, "dd", 5000)
	_, _, err := e.snapshot(agentproto.Limits{})
	wantCode(t, err, errcode.TooLarge, "")
	if !strings.Contains(err.Error(), "more than the 4096 a snapshot can hold") {
		t.Errorf("message: %v", err)
	}
	_, _, err = e.snapshot(agentproto.Limits{MaxDepth: 100})
	wantCode(t, err, errcode.TooLarge, "")
	ents, _, err := listAll(e.w, ".", true, 10000)
	if err != nil || len(ents) != listMaxDepth {
		t.Fatalf("list: %d entries, %v", len(ents), err)
	}
	_, err = e.w.Restore(bytes.NewReader(makeTar(t, reg("only", "x"))), agentproto.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if got := treeOf(t, e.dir, false); len(got) != 1 {
		t.Fatalf("after restore: %d entries", len(got))
	}
}

// TestSnapshotDuringChanges covers path case 29: a writer loop changes files
// (sizes, types, deletions) while snapshots run; each completes with a valid
// archive or fails cleanly.
func TestSnapshotDuringChanges(t *testing.T) {
	e := newEnv(t)
	for i := range 20 {
		e.file(fmt.Sprintf("f%d", i), strings.Repeat("x", i*1000))
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			p := e.path(fmt.Sprintf("f%d", i%20))
			switch i % 5 {
			case 0:
				_ = os.WriteFile(p, []byte(strings.Repeat("y", (i%7)*5000)), 0o644)
			case 1:
				_ = os.Remove(p)
				_ = unix.Mkfifo(p, 0o644)
			case 2:
				_ = os.Remove(p)
				_ = os.Symlink(e.outside, p)
			case 3:
				_ = os.Remove(p)
				_ = os.MkdirAll(filepath.Join(p, "sub"), 0o755)
			case 4:
				_ = os.RemoveAll(p)
				if f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
					_, _ = f.WriteString("grow")
					f.Close()
				}
			}
		}
	}()
	deadline := time.Now().Add(700 * time.Millisecond)
	n := 0
	for time.Now().Before(deadline) {
		archive, _, err := e.snapshot(agentproto.Limits{})
		if err != nil {
			if codeOf(err) == "" { // a fault, or not this package's error
				t.Fatalf("snapshot failed uncleanly: %v", err)
			}
			continue
		}
		tarNames(t, archive) // must parse
		if bytes.Contains(archive, []byte(secret)) {
			t.Fatal("outside content in the archive")
		}
		n++
	}
	close(stop)
	wg.Wait()
	if n == 0 {
		t.Fatal("no snapshot completed")
	}
}

// TestRestoreHostile covers path case 30: crafted archives are rejected (and
// the workspace left as it was) or neutralised.
func TestRestoreHostile(t *testing.T) {
	type check func(t *testing.T, e *env)
	bigHeader := func(t *testing.T, size int64) []byte { // a header claiming size, and no data
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "bomb", Size: size, Mode: 0o644}); err != nil {
			t.Fatal(err)
		}
		return append(b.Bytes(), make([]byte, 4096)...)
	}
	cases := []struct {
		name    string
		archive func(t *testing.T, e *env) []byte
		lim     agentproto.Limits
		code    errcode.Code // "" = accepted
		check   check
	}{
		{"dotdot", func(t *testing.T, e *env) []byte { return makeTar(t, reg("../x", "evil")) }, agentproto.Limits{}, invalidCode, nil},
		{"dotdot deep", func(t *testing.T, e *env) []byte { return makeTar(t, reg("a/../../outside/secret", "evil")) }, agentproto.Limits{}, invalidCode, nil},
		{"dotdot into outside", func(t *testing.T, e *env) []byte { return makeTar(t, reg("../outside/new", "evil")) }, agentproto.Limits{}, invalidCode, nil},
		{"absolute", func(t *testing.T, e *env) []byte { return makeTar(t, reg("/etc/x", "evil")) }, agentproto.Limits{}, invalidCode, nil},
		{"absolute canary", func(t *testing.T, e *env) []byte {
			return makeTar(t, reg(filepath.Join(e.outside, "secret"), "evil"))
		}, agentproto.Limits{}, invalidCode, nil},
		{"symlink then write", func(t *testing.T, e *env) []byte {
			return makeTar(t, symlink("link", e.outside), reg("link/secret", "evil"))
		}, agentproto.Limits{}, invalidCode, nil},
		{"symlink to etc then write", func(t *testing.T, e *env) []byte {
			return makeTar(t, symlink("link", "/etc"), reg("link/passwd", "evil"))
		}, agentproto.Limits{}, invalidCode, nil},
		{"relative symlink then new file", func(t *testing.T, e *env) []byte {
			return makeTar(t, symlink("link", "../outside"), reg("link/new", "evil"))
		}, agentproto.Limits{}, invalidCode, nil},
		{"symlink then dir", func(t *testing.T, e *env) []byte {
			return makeTar(t, symlink("link", e.outside), dir("link/sub/"))
		}, agentproto.Limits{}, invalidCode, nil},
		{"symlink then symlink below", func(t *testing.T, e *env) []byte {
			return makeTar(t, symlink("link", e.outside), symlink("link/l2", "x"))
		}, agentproto.Limits{}, invalidCode, nil},
		{"symlink to inside dir then write", func(t *testing.T, e *env) []byte {
			return makeTar(t, dir("real/"), symlink("link", "real"), reg("link/x", "evil"))
		}, agentproto.Limits{}, invalidCode, nil},
		{"symlink then hardlink below", func(t *testing.T, e *env) []byte {
			return makeTar(t, reg("f", "f"), symlink("link", e.outside), hardlink("link/h", "f"))
		}, agentproto.Limits{}, invalidCode, nil},
		{"hardlink to etc shadow", func(t *testing.T, e *env) []byte { return makeTar(t, hardlink("h", "/etc/shadow")) }, agentproto.Limits{}, invalidCode, nil},
		{"hardlink to outside file", func(t *testing.T, e *env) []byte {
			return makeTar(t, hardlink("h", filepath.Join(e.outside, "secret")))
		}, agentproto.Limits{}, invalidCode, nil},
		{"hardlink dotdot", func(t *testing.T, e *env) []byte { return makeTar(t, hardlink("h", "../outside/secret")) }, agentproto.Limits{}, invalidCode, nil},
		{"hardlink through symlink", func(t *testing.T, e *env) []byte {
			return makeTar(t, symlink("link", e.outside), hardlink("h", "link/secret"))
		}, agentproto.Limits{}, invalidCode, nil},
		{"hardlink to symlink", func(t *testing.T, e *env) []byte {
			return makeTar(t, symlink("s", filepath.Join(e.outside, "secret")), hardlink("h", "s"))
		}, agentproto.Limits{}, invalidCode, nil},
		{"hardlink to later file", func(t *testing.T, e *env) []byte { return makeTar(t, hardlink("h", "f"), reg("f", "f")) }, agentproto.Limits{}, invalidCode, nil},
		{"hardlink to dir", func(t *testing.T, e *env) []byte { return makeTar(t, dir("d/"), hardlink("h", "d")) }, agentproto.Limits{}, invalidCode, nil},
		{"empty name", func(t *testing.T, e *env) []byte { return makeTar(t, reg("", "x")) }, agentproto.Limits{}, invalidCode, nil},
		{"root as file", func(t *testing.T, e *env) []byte { return makeTar(t, reg(".", "x")) }, agentproto.Limits{}, invalidCode, nil},
		{"unsupported type", func(t *testing.T, e *env) []byte {
			return makeTar(t, tarEntry{hdr: tar.Header{Typeflag: tar.TypeCont, Name: "c"}})
		}, agentproto.Limits{}, invalidCode, nil},
		{"file then dir", func(t *testing.T, e *env) []byte { return makeTar(t, reg("a", "x"), dir("a/")) }, agentproto.Limits{}, invalidCode, nil},
		{"dir then file", func(t *testing.T, e *env) []byte { return makeTar(t, dir("a/"), reg("a", "x")) }, agentproto.Limits{}, invalidCode, nil},
		{"file below file", func(t *testing.T, e *env) []byte { return makeTar(t, reg("a", "x"), reg("a/b", "x")) }, agentproto.Limits{}, invalidCode, nil},
		{"not a tar", func(t *testing.T, e *env) []byte { return bytes.Repeat([]byte("garbage!"), 200) }, agentproto.Limits{}, invalidCode, nil},
		{"truncated", func(t *testing.T, e *env) []byte {
			b := makeTar(t, reg("a", strings.Repeat("x", 5000)))
			return b[:2000]
		}, agentproto.Limits{}, invalidCode, nil},
		{"entry count bomb", func(t *testing.T, e *env) []byte {
			var ents []tarEntry
			for i := range 5000 {
				ents = append(ents, reg(fmt.Sprintf("f%d", i), ""))
			}
			return makeTar(t, ents...)
		}, agentproto.Limits{MaxEntries: 1000}, errcode.TooLarge, nil},
		{"byte bomb header", func(t *testing.T, e *env) []byte { return bigHeader(t, 1<<40) }, agentproto.Limits{MaxBytes: 1 << 20}, errcode.TooLarge, nil},
		{"byte bomb zeros", func(t *testing.T, e *env) []byte {
			return makeTar(t, reg("zeros", string(make([]byte, 8<<20))))
		}, agentproto.Limits{MaxBytes: 1 << 20}, errcode.TooLarge, nil},
		{"byte bomb many files", func(t *testing.T, e *env) []byte {
			var ents []tarEntry
			for i := range 40 {
				ents = append(ents, reg(fmt.Sprintf("f%d", i), strings.Repeat("z", 100<<10)))
			}
			return makeTar(t, ents...)
		}, agentproto.Limits{MaxBytes: 1 << 20}, errcode.TooLarge, nil},
		{"trailing junk past the cap", func(t *testing.T, e *env) []byte {
			return append(makeTar(t, reg("a", "x")), make([]byte, 1<<20)...)
		}, agentproto.Limits{MaxBytes: 64 << 10}, errcode.TooLarge, nil},
		{"depth bomb", func(t *testing.T, e *env) []byte {
			return makeTar(t, reg(strings.Repeat("d/", 50)+"x", "x"))
		}, agentproto.Limits{MaxDepth: 20}, errcode.TooLarge, nil},
		{"name over 4096 bytes", func(t *testing.T, e *env) []byte {
			return makeTar(t, reg(strings.Repeat("d/", 2100)+"x", "x"))
		}, agentproto.Limits{}, invalidCode, nil},

		// Neutralised, and accepted.
		{"devices and fifo skipped", func(t *testing.T, e *env) []byte {
			return makeTar(t,
				tarEntry{hdr: tar.Header{Typeflag: tar.TypeChar, Name: "null", Devmajor: 1, Devminor: 3}},
				tarEntry{hdr: tar.Header{Typeflag: tar.TypeBlock, Name: "sda", Devmajor: 8}},
				tarEntry{hdr: tar.Header{Typeflag: tar.TypeFifo, Name: "fifo"}},
				reg("ok", "ok"))
		}, agentproto.Limits{}, "", func(t *testing.T, e *env) {
			if got := treeOf(t, e.dir, false); len(got) != 1 || got["ok"].Type != "file" {
				t.Fatalf("tree: %v", got)
			}
		}},
		{"setuid setgid sticky stripped", func(t *testing.T, e *env) []byte {
			return makeTar(t,
				tarEntry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "suid", Mode: 0o4755}, data: "#!/bin/sh\n"},
				tarEntry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "sgid", Mode: 0o2755}, data: "x"},
				tarEntry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "sticky/", Mode: 0o1777}},
				tarEntry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "gdir/", Mode: 0o2775}})
		}, agentproto.Limits{}, "", func(t *testing.T, e *env) {
			got := treeOf(t, e.dir, false)
			for p, want := range map[string]os.FileMode{"suid": 0o755, "sgid": 0o755, "sticky": 0o777, "gdir": 0o775} {
				if got[p].Perm != want {
					t.Errorf("%s: %v, want %v", p, got[p].Perm, want)
				}
			}
		}},
		{"symlinks stored verbatim, confined on use", func(t *testing.T, e *env) []byte {
			return makeTar(t, symlink("etc", "/etc"), symlink("up", "../outside/secret"), symlink("proc", "/proc/self/root"))
		}, agentproto.Limits{}, "", func(t *testing.T, e *env) {
			for _, p := range []string{"etc/passwd", "up", "proc/etc/passwd"} {
				if _, _, err := e.read(p); codeOf(err) != outsideCode {
					t.Errorf("read %s through a restored symlink: %v", p, err)
				}
			}
		}},
		{"hard link inside", func(t *testing.T, e *env) []byte {
			return makeTar(t, reg("dir/a", "shared"), hardlink("b", "dir/a"), hardlink("./c", "./dir/a"))
		}, agentproto.Limits{}, "", func(t *testing.T, e *env) {
			a, _ := os.Stat(e.path("dir/a"))
			b, _ := os.Stat(e.path("b"))
			c, _ := os.Stat(e.path("c"))
			if !os.SameFile(a, b) || !os.SameFile(a, c) || e.hostRead("b") != "shared" {
				t.Error("hard links not restored as links")
			}
		}},
		{"later entry wins", func(t *testing.T, e *env) []byte {
			return makeTar(t, reg("a", "first"), reg("a", "second"), symlink("s", "x"), reg("s", "file now"), reg("l", "f"), symlink("l", "a"))
		}, agentproto.Limits{}, "", func(t *testing.T, e *env) {
			if e.hostRead("a") != "second" || e.hostRead("s") != "file now" {
				t.Error("later entry did not win")
			}
			if target, _ := os.Readlink(e.path("l")); target != "a" {
				t.Error("l is not the symlink")
			}
		}},
		{"implicit parents, dot prefixes, global header", func(t *testing.T, e *env) []byte {
			return makeTar(t,
				tarEntry{hdr: tar.Header{Typeflag: tar.TypeXGlobalHeader, PAXRecords: map[string]string{"comment": "x"}}},
				dir("./"), reg("./x/y/z", "z"), dir("./x/"))
		}, agentproto.Limits{}, "", func(t *testing.T, e *env) {
			if e.hostRead("x/y/z") != "z" {
				t.Error("content")
			}
		}},
		{"exactly at every limit", func(t *testing.T, e *env) []byte {
			return makeTar(t, dir("a/"), dir("a/b/"), reg("a/b/c", "x"))
		}, agentproto.Limits{MaxEntries: 3, MaxDepth: 3}, "", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.file("existing.txt", "keep me")
			e.file("olddir/x", "old")
			e.symlink("existing.txt", "oldlink")
			before := treeOf(t, e.dir, true)
			archive := tc.archive(t, e)
			var res agentproto.RestoreResult
			var err error
			within(t, 5*time.Second, "restore", func() { res, err = e.w.Restore(bytes.NewReader(archive), tc.lim) })
			if tc.code == "" {
				if err != nil {
					t.Fatalf("restore: %v", err)
				}
			} else {
				if codeOf(err) != tc.code {
					t.Fatalf("got %v, want %s", err, tc.code)
				}
				if !strings.Contains(err.Error(), "the workspace was left unchanged") {
					t.Errorf("message: %v", err)
				}
				if d := diffTrees(before, treeOf(t, e.dir, true)); d != "" {
					t.Fatalf("workspace changed by a rejected restore:\n%s", d)
				}
			}
			t.Logf("%+v %v", res, err)
			if tc.check != nil {
				tc.check(t, e)
			}
			noTemps(t, e.dir)
			e.checkOutside()
		})
	}
}

// TestRestoreSourceError: the caller's reader error comes back unchanged
// and the workspace is untouched.
func TestRestoreSourceError(t *testing.T) {
	e := newEnv(t)
	e.file("keep", "k")
	archive := makeTar(t, reg("a", strings.Repeat("x", 100000)))
	myErr := errors.New("connection lost")
	_, err := e.w.Restore(io.MultiReader(bytes.NewReader(archive[:50000]), errReader{myErr}), agentproto.Limits{})
	if err != myErr {
		t.Fatalf("got %v, want the reader's error unchanged", err)
	}
	if got := treeOf(t, e.dir, false); len(got) != 1 {
		t.Fatalf("workspace changed: %v", got)
	}
	noTemps(t, e.dir)
}

// TestRestoreExactBytes: MaxBytes is the archive's size in bytes, exactly.
func TestRestoreExactBytes(t *testing.T) {
	e := newEnv(t)
	archive := makeTar(t, reg("a", strings.Repeat("x", 3000)), dir("d/"))
	if res, err := e.w.Restore(bytes.NewReader(archive), agentproto.Limits{MaxBytes: int64(len(archive))}); err != nil || res.Bytes != int64(len(archive)) {
		t.Fatalf("exact: %+v %v", res, err)
	}
	_, err := e.w.Restore(bytes.NewReader(archive), agentproto.Limits{MaxBytes: int64(len(archive)) - 1})
	wantCode(t, err, errcode.TooLarge, "")
}

// TestRestoreGNUTar restores what GNU tar makes of a directory ("./"
// names, its own record padding).
func TestRestoreGNUTar(t *testing.T) {
	if _, err := exec.LookPath("tar"); err != nil {
		t.Skip("no tar here")
	}
	src := newEnv(t)
	populate(t, src)
	out, err := exec.Command("tar", "-C", src.dir, "--format=pax", "-cf", "-", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	dst := newEnv(t)
	if _, err := dst.w.Restore(bytes.NewReader(out), agentproto.Limits{}); err != nil {
		t.Fatal(err)
	}
	want := treeOf(t, src.dir, true)
	got := treeOf(t, dst.dir, true)
	// GNU tar stores sub-second times; compare whole seconds only (treeOf
	// does), and it keeps hard links as links: same content either way.
	if d := diffTrees(want, got); d != "" {
		t.Fatalf("differs:\n%s", d)
	}
	// And GNU tar reads what Snapshot makes.
	archive, _, err := dst.snapshot(agentproto.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	x := t.TempDir()
	cmd := exec.Command("tar", "-C", x, "-xf", "-")
	cmd.Stdin = bytes.NewReader(archive)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("GNU tar cannot read the snapshot: %v\n%s", err, out)
	}
	if d := diffTrees(want, treeOf(t, x, true)); d != "" {
		t.Fatalf("GNU tar extraction differs:\n%s", d)
	}
}

// TestRestoreConcurrentOps: reads and writes during a restore see either
// the old or the new workspace and never fail strangely; the final state
// is the archive.
func TestRestoreConcurrentOps(t *testing.T) {
	e := newEnv(t)
	var ents []tarEntry
	for i := range 200 {
		ents = append(ents, reg(fmt.Sprintf("new/f%d", i), "new"))
	}
	archive := makeTar(t, ents...)
	e.file("old/a", "old")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, _, err := e.read("old/a"); err != nil && codeOf(err) != notFoundCode {
				t.Errorf("read during restore: %v", err)
			}
			if _, _, err := listAll(e.w, ".", true, 1000); err != nil {
				t.Errorf("list during restore: %v", err)
			}
		}
	}()
	for range 5 {
		if _, err := e.w.Restore(bytes.NewReader(archive), agentproto.Limits{}); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if got := treeOf(t, e.dir, false); len(got) != 201 {
		t.Fatalf("%d entries after restore", len(got))
	}
}

// TestEntryComps checks archive name validation directly.
func TestEntryComps(t *testing.T) {
	for name, ok := range map[string]bool{
		"a": true, "./a": true, "a/b/": true, "a//b": true, "./": true,
		"": false, "/a": false, "a/../b": false, "..": false, "a\x00b": false, strings.Repeat("a", 4097): false,
	} {
		_, problem := entryComps(name)
		if (problem == "") != ok {
			t.Errorf("%q: problem %q", name, problem)
		}
	}
}
