package workspace

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// secret is the canary content of the file outside the workspace.
const secret = "TOP-SECRET-OUTSIDE"

// env is a workspace directory with an "outside" directory next to it that
// holds a canary file. Nothing a test does through the Workspace may ever
// change, read or create anything in outside.
type env struct {
	t       *testing.T
	base    string // parent of both
	dir     string // the workspace directory
	outside string
	w       *Workspace
}

func newEnv(t *testing.T) *env {
	t.Helper()
	base := t.TempDir()
	e := &env{t: t, base: base, dir: filepath.Join(base, "ws"), outside: filepath.Join(base, "outside")}
	for _, d := range []string{e.dir, e.outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(e.outside, "secret"), []byte(secret), 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := Open(e.dir)
	if err != nil {
		t.Fatal(err)
	}
	e.w = w
	t.Cleanup(func() {
		_ = w.Close()
		// Make everything removable for t.TempDir's cleanup when the tests
		// run unprivileged.
		_ = filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
			if d != nil && d.IsDir() {
				_ = os.Chmod(p, 0o755)
			}
			return nil
		})
	})
	return e
}

// path is the host path of a workspace-relative path.
func (e *env) path(rel string) string { return filepath.Join(e.dir, rel) }

func (e *env) file(rel, content string) {
	e.t.Helper()
	p := e.path(rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		e.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) mkdir(rel string) {
	e.t.Helper()
	if err := os.MkdirAll(e.path(rel), 0o755); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) symlink(target, rel string) {
	e.t.Helper()
	if err := os.MkdirAll(filepath.Dir(e.path(rel)), 0o755); err != nil {
		e.t.Fatal(err)
	}
	if err := os.Symlink(target, e.path(rel)); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) mkfifo(rel string) {
	e.t.Helper()
	if err := unix.Mkfifo(e.path(rel), 0o644); err != nil {
		e.t.Fatal(err)
	}
}

// read reads a whole file through the workspace.
func (e *env) read(rel string) (string, agentproto.ReadResult, error) {
	var b bytes.Buffer
	res, err := e.w.ReadFile(context.Background(), rel, 0, 0, 1<<30, &b)
	return b.String(), res, err
}

// write writes a whole file through the workspace.
func (e *env) write(rel, content string) (agentproto.WriteResult, error) {
	return e.w.WriteFile(rel, strings.NewReader(content), int64(len(content)), false, 0o644)
}

func (e *env) mustRead(rel string) string {
	e.t.Helper()
	s, _, err := e.read(rel)
	if err != nil {
		e.t.Fatalf("read %q: %v", rel, err)
	}
	return s
}

// hostRead reads a file directly.
func (e *env) hostRead(rel string) string {
	e.t.Helper()
	b, err := os.ReadFile(e.path(rel))
	if err != nil {
		e.t.Fatalf("host read %q: %v", rel, err)
	}
	return string(b)
}

// checkOutside fails the test unless outside holds exactly the canary, as
// created, and nothing else exists next to the workspace.
func (e *env) checkOutside() {
	e.t.Helper()
	ents, err := os.ReadDir(e.outside)
	if err != nil {
		e.t.Fatal(err)
	}
	if len(ents) != 1 || ents[0].Name() != "secret" {
		var names []string
		for _, d := range ents {
			names = append(names, d.Name())
		}
		e.t.Errorf("outside directory changed: %q", names)
	}
	b, err := os.ReadFile(filepath.Join(e.outside, "secret"))
	if err != nil || string(b) != secret {
		e.t.Errorf("outside canary changed: %q, %v", b, err)
	}
	ents, err = os.ReadDir(e.base)
	if err != nil {
		e.t.Fatal(err)
	}
	if len(ents) != 2 {
		var names []string
		for _, d := range ents {
			names = append(names, d.Name())
		}
		e.t.Errorf("files appeared next to the workspace: %q", names)
	}
}

// codeOf is the code of err, or "" when err is not an *errcode.Error.
func codeOf(err error) errcode.Code {
	if e, ok := errcode.As(err); ok {
		return e.Code
	}
	return ""
}

// wantCode fails unless err has the code (and, when the code is not "", is an
// *errcode.Error whose message names the path).
func wantCode(t *testing.T, err error, code errcode.Code, rel string) {
	t.Helper()
	if code == "" {
		if err != nil {
			t.Fatalf("unexpected error: %v", err)
		}
		return
	}
	if err == nil {
		t.Fatalf("got no error, want %s", code)
	}
	if got := codeOf(err); got != code {
		t.Fatalf("got %v (code %q), want code %s", err, got, code)
	}
	if rel != "" && !strings.Contains(err.Error(), quote(rel)) && len(rel) < 64 {
		t.Errorf("message does not name the path %s: %v", quote(rel), err)
	}
}

// node is what treeOf records about one file.
type node struct {
	Type   string
	Perm   fs.FileMode // permission bits plus setuid/setgid/sticky
	Size   int64
	Sum    string // sha256 of a regular file
	Target string
	MTime  int64 // seconds
}

// treeOf records every file below dir (not following symlinks).
func treeOf(t *testing.T, dir string, withTimes bool) map[string]node {
	t.Helper()
	m := map[string]node{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		n := node{Perm: fi.Mode().Perm() | fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)}
		if withTimes {
			n.MTime = fi.ModTime().Unix()
		}
		switch {
		case fi.Mode().IsRegular():
			n.Type = "file"
			n.Size = fi.Size()
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			s := sha256.Sum256(b)
			n.Sum = hex.EncodeToString(s[:])
		case fi.IsDir():
			n.Type = "dir"
		case fi.Mode()&fs.ModeSymlink != 0:
			n.Type = "symlink"
			n.Target, _ = os.Readlink(p)
			n.Perm = 0
		default:
			n.Type = "other"
		}
		m[rel] = n
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// diffTrees describes the differences between two treeOf results.
func diffTrees(want, got map[string]node) string {
	var b strings.Builder
	for p, w := range want {
		g, ok := got[p]
		if !ok {
			b.WriteString("missing " + quote(p) + "\n")
		} else if g != w {
			b.WriteString("differs " + quote(p) + ": want " + fmtNode(w) + " got " + fmtNode(g) + "\n")
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			b.WriteString("extra " + quote(p) + "\n")
		}
	}
	return b.String()
}

func fmtNode(n node) string { return fmt.Sprintf("%+v", n) }
