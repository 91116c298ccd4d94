package workspace

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

func TestSymlinkStaysInside(t *testing.T) {
	for _, c := range []struct {
		name, target string
		inside       bool
	}{
		{"l", "a", true},
		{"l", ".", true},
		{"l", "./a/b", true},
		{"d/l", "..", true},
		{"d/l", "../x", true},
		{"./d//l", "../x", true},
		{"d/e/l", "../../a/b", true},
		{"d/e/l", "../../../x", false},
		{"l", "..", false},
		{"l", "../x", false},
		{"d/l", "../../x", false},
		{"d/l", "/etc/shadow", false},
		{"d/l", "/", false},
		{"d/l", "x/../..", false}, // "x" could be a symlink deeper down
		{"d/l", "../x/../y", false},
		{"l", "", false},
		{"../l", "a", false},
		{"/l", "a", false},
	} {
		if got := SymlinkStaysInside(c.name, c.target); got != c.inside {
			t.Errorf("SymlinkStaysInside(%q, %q) = %v, want %v", c.name, c.target, got, c.inside)
		}
	}
}

// TestExtractOptions: ClearMode masks files and directories, KeepSymlink
// skips the symlinks it refuses, and Restore (the zero options) keeps both.
func TestExtractOptions(t *testing.T) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o777},
		{Name: "d/f", Typeflag: tar.TypeReg, Mode: 0o4777, Size: 1},
		{Name: "in", Typeflag: tar.TypeSymlink, Linkname: "d/f"},
		{Name: "out", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"},
	} {
		tw.WriteHeader(h)
		if h.Size > 0 {
			tw.Write([]byte("x"))
		}
	}
	tw.Close()
	extract := func(opt ExtractOptions) (string, agentproto.RestoreResult) {
		dir := t.TempDir()
		w, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		res, err := w.Extract(bytes.NewReader(buf.Bytes()), agentproto.Limits{MaxBytes: 1 << 20}, opt)
		if err != nil {
			t.Fatal(err)
		}
		return dir, res
	}
	mode := func(p string) os.FileMode {
		fi, err := os.Lstat(p)
		if err != nil {
			return 0
		}
		return fi.Mode()
	}

	var seen []string
	dir, res := extract(ExtractOptions{ClearMode: 0o027, KeepSymlink: func(name, target string) bool {
		seen = append(seen, name+" -> "+target)
		return SymlinkStaysInside(name, target)
	}})
	if m := mode(filepath.Join(dir, "d")); m != os.ModeDir|0o750 {
		t.Errorf("directory mode %v, want drwxr-x---", m)
	}
	if m := mode(filepath.Join(dir, "d/f")); m != 0o750 {
		t.Errorf("file mode %v, want -rwxr-x---", m)
	}
	if _, err := os.Lstat(filepath.Join(dir, "out")); err == nil {
		t.Error("the refused symlink was written")
	}
	if target, _ := os.Readlink(filepath.Join(dir, "in")); target != "d/f" {
		t.Errorf("the accepted symlink: %q", target)
	}
	if res.Skipped != 1 || len(seen) != 2 {
		t.Errorf("skipped %d, asked about %v", res.Skipped, seen)
	}

	dir, res = extract(ExtractOptions{})
	if m := mode(filepath.Join(dir, "d/f")); m != 0o777 || res.Skipped != 0 {
		t.Errorf("Restore's file mode %v (want -rwxrwxrwx: inside a sandbox the archive's modes hold), skipped %d", m, res.Skipped)
	}
	if target, _ := os.Readlink(filepath.Join(dir, "out")); target != "/etc/passwd" {
		t.Errorf("Restore's symlink: %q", target)
	}
}

// TestSnapshotOwnLinksOnly: with OwnLinksOnly a file hard-linked from
// outside the tree fails the snapshot, naming it, while links within the
// tree pass; a sandbox's Snapshot (no options) archives both.
func TestSnapshotOwnLinksOnly(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "tree")
	os.MkdirAll(filepath.Join(dir, "d"), 0o755)
	os.WriteFile(filepath.Join(dir, "a"), []byte("a"), 0o644)
	os.Link(filepath.Join(dir, "a"), filepath.Join(dir, "d", "b"))
	w, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	snap := func(opt SnapshotOptions) (agentproto.SnapshotResult, error) {
		return w.SnapshotTree(new(bytes.Buffer), agentproto.Limits{MaxBytes: 1 << 20}, opt)
	}
	if res, err := snap(SnapshotOptions{OwnLinksOnly: true}); err != nil || res.Files != 3 {
		t.Fatalf("links within the tree: %+v %v", res, err)
	}
	os.WriteFile(filepath.Join(root, "secret"), []byte("s"), 0o600)
	os.Link(filepath.Join(root, "secret"), filepath.Join(dir, "d", "c"))
	os.Link(filepath.Join(root, "secret"), filepath.Join(dir, "e")) // two names inside, one outside
	_, err = snap(SnapshotOptions{OwnLinksOnly: true})
	if codeOf(err) != errcode.InvalidArgument || !strings.Contains(err.Error(), `"d/c" is a hard link to a file with 3 links, only 2 of them in the directory`) {
		t.Fatalf("a link from outside: %v", err)
	}
	if _, err := snap(SnapshotOptions{}); err != nil {
		t.Fatalf("without OwnLinksOnly: %v", err)
	}
}
