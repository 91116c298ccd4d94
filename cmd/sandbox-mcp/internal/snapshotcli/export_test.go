package snapshotcli

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sandbox-mcp/sandbox-mcp/snapshot"
)

// craftedSnapshot stores a tar made of headers (regular files get one byte)
// straight into the state directory's snapshot store, as a tampered or
// forged snapshot would be.
func craftedSnapshot(t *testing.T, state string, headers ...*tar.Header) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range headers {
		if h.Typeflag == tar.TypeReg {
			h.Size = 1
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write([]byte("x"))
		}
	}
	tw.Close()
	st, err := snapshot.OpenStore(filepath.Join(state, "snapshots"), snapshot.Retention{})
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.For("").Create("crafted", "sb-x", func(w io.Writer) error { _, err := w.Write(buf.Bytes()); return err })
	if err != nil {
		t.Fatal(err)
	}
	return info.ID
}

// exportTree runs `sandbox-mcp snapshot export` in this process and
// returns what it wrote to stderr, and the mode or link target of every
// entry of the exported tree.
func exportTree(t *testing.T, state, id string, flags ...string) (stderr string, tree map[string]string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "export")
	var out, errOut bytes.Buffer
	args := append(append([]string{"export", "--state-dir", state}, flags...), id, dir)
	if code := Run(args, &out, &errOut, stateDirOnly); code != 0 {
		t.Fatalf("export %v: exit %d\n%s", flags, code, errOut.String())
	}
	tree = map[string]string{}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, _ := os.Lstat(p)
		if fi.Mode()&fs.ModeSymlink != 0 {
			target, _ := os.Readlink(p)
			tree[rel] = "-> " + target
		} else {
			tree[rel] = fi.Mode().String()
		}
		return nil
	})
	return errOut.String(), tree
}

// TestSnapshotExportModesAndSymlinks: an archive's 0777 and 0666 modes are
// written through the umask and without group and other write (unless
// --allow-group-write), setuid never; symlinks that lead outside the export
// directory are skipped with a note (unless --symlinks=keep), those that
// stay inside are written.
func TestSnapshotExportModesAndSymlinks(t *testing.T) {
	old := syscall.Umask(0o002) // a umask that lets group write through
	t.Cleanup(func() { syscall.Umask(old) })
	state := t.TempDir()
	id := craftedSnapshot(t, state,
		&tar.Header{Name: "run.sh", Typeflag: tar.TypeReg, Mode: 0o777},
		&tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o777},
		&tar.Header{Name: "d/data", Typeflag: tar.TypeReg, Mode: 0o666},
		&tar.Header{Name: "suid", Typeflag: tar.TypeReg, Mode: 0o4777},
		&tar.Header{Name: "abs", Typeflag: tar.TypeSymlink, Linkname: "/etc/shadow"},
		&tar.Header{Name: "up", Typeflag: tar.TypeSymlink, Linkname: "../outside"},
		&tar.Header{Name: "d/up2", Typeflag: tar.TypeSymlink, Linkname: "../../outside"},
		&tar.Header{Name: "d/detour", Typeflag: tar.TypeSymlink, Linkname: "sub/../.."},
		&tar.Header{Name: "d/sibling", Typeflag: tar.TypeSymlink, Linkname: "../run.sh"},
		&tar.Header{Name: "here", Typeflag: tar.TypeSymlink, Linkname: "./d/data"},
	)

	stderr, tree := exportTree(t, state, id)
	want := map[string]string{
		"run.sh": "-rwxr-xr-x", "d": "drwxr-xr-x", "d/data": "-rw-r--r--", "suid": "-rwxr-xr-x",
		"d/sibling": "-> ../run.sh", "here": "-> ./d/data",
	}
	if !equalTrees(tree, want) {
		t.Errorf("exported:\n%v\nwant\n%v", tree, want)
	}
	for _, name := range []string{"abs -> /etc/shadow", "up -> ../outside", "d/up2 -> ../../outside", "d/detour -> sub/../.."} {
		if !strings.Contains(stderr, "skipped the symlink "+name+": it leads outside") {
			t.Errorf("stderr does not name the skipped symlink %s:\n%s", name, stderr)
		}
	}

	_, tree = exportTree(t, state, id, "--allow-group-write", "--symlinks", "keep")
	want = map[string]string{
		"run.sh": "-rwxrwxr-x", "d": "drwxrwxr-x", "d/data": "-rw-rw-r--", "suid": "-rwxrwxr-x",
		"abs": "-> /etc/shadow", "up": "-> ../outside", "d/up2": "-> ../../outside", "d/detour": "-> sub/../..",
		"d/sibling": "-> ../run.sh", "here": "-> ./d/data",
	}
	if !equalTrees(tree, want) {
		t.Errorf("exported with --allow-group-write --symlinks keep:\n%v\nwant\n%v", tree, want)
	}

	var out, errOut bytes.Buffer
	if code := Run([]string{"export", "--symlinks=all", id, t.TempDir()}, &out, &errOut, stateDirOnly); code != 2 || !strings.Contains(errOut.String(), "use inside") {
		t.Errorf("--symlinks=all: exit %d\n%s", code, errOut.String())
	}
}

func equalTrees(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// stateDirOnly parses the one server flag these tests pass, --state-dir,
// as the server's parser does.
func stateDirOnly(args []string) (string, []string, error) {
	var dir string
	var rest []string
	for i := 0; i < len(args); i++ {
		if args[i] == "--state-dir" && i+1 < len(args) {
			dir = args[i+1]
			i++
			continue
		}
		rest = append(rest, args[i])
	}
	if dir == "" {
		return "", nil, errors.New("--state-dir is required here")
	}
	return dir, rest, nil
}
