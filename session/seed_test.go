package session

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// seedDir makes a host directory to seed workspaces from, next to a secret
// that must never be read.
func seedDir(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "project")
	os.MkdirAll(filepath.Join(dir, "src", "pkg"), 0o755)
	os.WriteFile(filepath.Join(dir, "README"), []byte("seeded\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "src", "pkg", "run.sh"), []byte("#!/bin/sh\necho ran\n"), 0o755)
	os.WriteFile(filepath.Join(root, "secret"), []byte("HOST-SECRET\n"), 0o600)
	os.Symlink("../secret", filepath.Join(dir, "up"))
	os.Symlink(filepath.Join(root, "secret"), filepath.Join(dir, "abs"))
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// seedFrom loads dir into o.Seed as main does, for o's backend (a test
// Docker backend unless o has one) and workspace mode.
func seedFrom(t *testing.T, o *Options, dir string) {
	t.Helper()
	if o.Backend == nil {
		o.Backend = testDocker(t, *o, nil)
	}
	sd, err := LoadSeed(dir, o.Policy.MaxWorkspaceBytes, o.Policy.ReadOnly, o.Backend)
	if err != nil {
		t.Fatal(err)
	}
	o.Seed = sd
}

func TestWorkspaceFrom(t *testing.T) {
	dir := seedDir(t)
	m := testManager(t, func(o *Options) { seedFrom(t, o, dir) })
	sb := newSandbox(t, m)
	out := string(sh(t, sb, "cat README; ./src/pkg/run.sh; readlink up; readlink abs; ls -A | tr '\\n' ' '").Stdout)
	want := "seeded\nran\n../secret\n" + filepath.Join(filepath.Dir(dir), "secret") + "\nREADME abs src up "
	if out != want {
		t.Fatalf("seeded workspace:\n%q\nwant\n%q", out, want)
	}
	// Symlinks came as symlinks: nothing outside the directory was read.
	if strings.Contains(string(sh(t, sb, "grep -r HOST-SECRET . 2>/dev/null; true").Stdout), "HOST-SECRET") {
		t.Fatal("a file outside --workspace-from was copied")
	}
	_, err := sb.ReadFile(context.Background(), "up", 0, 0, 1024)
	wantCode(t, err, errcode.OutsideWorkspace) // the link climbs out of the workspace
	// Every new workspace starts from it, each its own copy.
	sh(t, sb, "echo changed > README")
	other, _ := m.Sandbox("other", "")
	if got := string(run(t, other, "cat", "README").Stdout); got != "seeded\n" {
		t.Fatalf("second sandbox: %q", got)
	}
}

func TestWorkspaceFromTooLarge(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "big"), make([]byte, 2<<20), 0o644)
	sd, err := LoadSeed(dir, 1<<20, false, nil)
	if err == nil {
		sd.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "larger than the workspace") {
		t.Fatalf("err = %v", err)
	}
}

func TestReadOnlyWorkspaceFrom(t *testing.T) {
	dir := seedDir(t)
	m := testManager(t, func(o *Options) { o.Policy.ReadOnly = true; seedFrom(t, o, dir) })
	sb := newSandbox(t, m)
	if got := string(sh(t, sb, "cat README; ./src/pkg/run.sh; id -u").Stdout); got != "seeded\nran\n1000\n" {
		t.Fatalf("read-only seeded workspace: %q", got)
	}
	res := sh(t, sb, "echo x > README; touch new")
	if res.ExitCode == 0 || !strings.Contains(string(res.Stderr), "Read-only file system") {
		t.Fatalf("wrote to a read-only workspace: %+v", res)
	}
	_, err := sb.WriteFile(context.Background(), "new", []byte("x"), false, 0o644)
	wantCode(t, err, errcode.ReadOnly)
	_, _, err = sb.Restore(context.Background(), "snap-00000000000000000000")
	wantCode(t, err, errcode.ReadOnly)
	start := time.Now()
	if _, err := sb.Snapshot(context.Background(), ""); err != nil {
		t.Fatalf("snapshot of a read-only workspace: %v (%s)", err, time.Since(start))
	}
}

// TestWorkspaceFromRefusesHardLinksFromOutside: a file of the directory
// that is a hard link to a file outside it (a secret another user linked
// in) stops the server at start, naming the file; hard links within the
// directory are fine.
func TestWorkspaceFromRefusesHardLinksFromOutside(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "project")
	os.MkdirAll(filepath.Join(dir, "sub"), 0o755)
	os.WriteFile(filepath.Join(dir, "a"), []byte("mine\n"), 0o644)
	if err := os.Link(filepath.Join(dir, "a"), filepath.Join(dir, "sub", "a-again")); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(root, "shadow")
	os.WriteFile(secret, []byte("HOST-SECRET\n"), 0o600)
	if err := os.Link(secret, filepath.Join(dir, "sub", "innocent.txt")); err != nil {
		t.Fatal(err)
	}
	sd, err := LoadSeed(dir, policy.Default().MaxWorkspaceBytes, false, nil)
	if err == nil {
		sd.Close()
	}
	if err == nil || !strings.Contains(err.Error(), `"sub/innocent.txt" is a hard link to a file with 2 links, only 1 of them in the directory`) {
		t.Fatalf("err = %v", err)
	}

	// With the outside link gone, the tree's own pair seeds both names.
	os.Remove(secret)
	m := testManager(t, func(o *Options) { seedFrom(t, o, dir) })
	sb := newSandbox(t, m)
	if got := string(sh(t, sb, "cat a sub/a-again sub/innocent.txt").Stdout); got != "mine\nmine\nHOST-SECRET\n" {
		t.Fatalf("seeded: %q", got)
	}
}

// TestReadOnlyWorkspaceFromNeedsASeedingBackend: a read-only workspace
// cannot be filled after the start, so its --workspace-from content goes to
// a backend that puts it into what its instances run
// (backend.ReadOnlySeed); a backend that cannot is refused at the start
// rather than given sandboxes whose workspace is silently empty.
func TestReadOnlyWorkspaceFromNeedsASeedingBackend(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a.txt"), []byte("seed\n"), 0o644)
	p := policy.Default()
	p.ReadOnly = true
	sd, err := LoadSeed(dir, p.MaxWorkspaceBytes, true, &sweepCounter{swept: make(chan struct{}, 8)})
	if err == nil {
		sd.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "read-only workspace cannot start with content") {
		t.Fatalf("LoadSeed of a read-only workspace's content for a backend that cannot seed it: %v, want a refusal", err)
	}

	// A seed loaded for the other mode than the manager's is refused too:
	// its content would be in neither the instances nor the workspace.
	sd, err = LoadSeed(dir, p.MaxWorkspaceBytes, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewManager(context.Background(), Options{
		Backend: &sweepCounter{swept: make(chan struct{}, 8)}, StateDir: t.TempDir(), Policy: p, Seed: sd,
	})
	if err == nil {
		m.Close(context.Background())
	}
	if err == nil || !strings.Contains(err.Error(), "another workspace mode") {
		t.Fatalf("NewManager with a writable workspace's seed and a read-only policy: %v, want a refusal", err)
	}
}
