package main

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/docker"
	"github.com/sandbox-mcp/sandbox-mcp/snapshot"
)

// listedSnapshots returns the snapshots resources/list shows: a client at
// sessionsVersion's (on 2026-07-28 lists never depend on earlier calls, and
// list the policy alone).
func listedSnapshots(t *testing.T, s *server) map[string]*mcp.Resource {
	t.Helper()
	res, err := s.cs.ListResources(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*mcp.Resource{}
	for _, r := range res.Resources {
		if strings.HasPrefix(r.URI, "sandbox://snapshots/") {
			out[r.Name] = r
		}
	}
	return out
}

// TestSnapshotsAcrossRestarts: snapshot, restore in the same session, then
// a new server process on the same state directory lists the snapshot and
// restores it into a new session (a fork, across a restart).
func TestSnapshotsAcrossRestarts(t *testing.T) {
	state := t.TempDir()
	a := startServer(t, serverOpts{args: []string{"--state-dir", state}, protocol: sessionsVersion})
	a.ok("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", "mkdir -p src && echo v1 > src/a.txt && ln -s src/a.txt link"}})
	snap := a.ok("sandbox_snapshot", map[string]any{"label": "v1"})
	id := snap["id"].(string)
	if r, ok := listedSnapshots(t, a)[id]; !ok || r.Title != "v1" || r.MIMEType != "application/x-tar" || r.URI != snap["uri"] {
		t.Fatalf("resources/list: %v", listedSnapshots(t, a))
	}
	a.ok("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", "echo v2 > src/a.txt; rm link; touch junk"}})
	res := a.ok("sandbox_restore", map[string]any{"id": id})
	if res["files"].(float64) < 3 {
		t.Fatalf("restore: %v", res)
	}
	if out := a.ok("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", "cat src/a.txt; readlink link; ls"}})["stdout"]; out != "v1\nsrc/a.txt\nlink\nsrc\n" {
		t.Fatalf("after restore: %q", out)
	}
	a.cs.Close()

	b := startServer(t, serverOpts{args: []string{"--state-dir", state}, protocol: sessionsVersion})
	if _, ok := listedSnapshots(t, b)[id]; !ok {
		t.Fatal("the snapshot did not survive the restart")
	}
	b.ok("sandbox_restore", map[string]any{"id": id})
	if out := b.ok("sandbox_exec", map[string]any{"argv": []string{"cat", "src/a.txt"}})["stdout"]; out != "v1\n" {
		t.Fatalf("fork after a restart: %q", out)
	}
	b.ok("sandbox_snapshot_delete", map[string]any{"id": id})
	if _, ok := listedSnapshots(t, b)[id]; ok {
		t.Fatal("deleted snapshot still listed")
	}
	b.fails("sandbox_restore", map[string]any{"id": id}, "NOT_FOUND")
	// What is not an id is a label, compared with the caller's snapshots'
	// labels, never a path.
	b.fails("sandbox_restore", map[string]any{"id": "../../etc/passwd"}, "NOT_FOUND")
}

func TestSnapshotRetentionFlags(t *testing.T) {
	s := startServer(t, serverOpts{args: []string{"--snapshot-max-count", "3", "--snapshot-max-count-per-caller", "2"}, protocol: sessionsVersion})
	var ids []string
	for range 3 {
		ids = append(ids, s.ok("sandbox_snapshot", nil)["id"].(string))
	}
	listed := listedSnapshots(t, s)
	if len(listed) != 2 || listed[ids[0]] != nil {
		t.Fatalf("with --snapshot-max-count-per-caller 2: %v", listed)
	}
}

func sandboxctl(t *testing.T, state string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(bins.Get(t).Server, append([]string{"snapshot", args[0], "--state-dir", state}, args[1:]...)...)
	cmd.Env = []string{"HOME=" + t.TempDir()}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestSnapshotExport: `sandbox-mcp snapshot export ID DIR` writes a
// snapshot's files into DIR, and a hostile archive never writes outside it.
func TestSnapshotExport(t *testing.T) {
	state := t.TempDir()
	s := startServer(t, serverOpts{args: []string{"--state-dir", state}})
	s.ok("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", "mkdir -p d/e && echo hi > d/e/f && ln -s /etc/passwd pw && chmod 700 d"}})
	id := s.ok("sandbox_snapshot", nil)["id"].(string)
	s.cs.Close()

	out, err := sandboxctl(t, state, "list")
	if err != nil || !strings.Contains(out, id) {
		t.Fatalf("list: %v\n%s", err, out)
	}
	dir := filepath.Join(t.TempDir(), "export")
	out, err = sandboxctl(t, state, "export", id, dir)
	if err != nil {
		t.Fatalf("export: %v\n%s", err, out)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "d", "e", "f")); string(b) != "hi\n" {
		t.Fatalf("exported file: %q", b)
	}
	if _, err := os.Lstat(filepath.Join(dir, "pw")); err == nil || !strings.Contains(out, "skipped the symlink pw -> /etc/passwd") {
		t.Fatalf("a symlink out of the export directory was written, or not named (%v):\n%s", err, out)
	}
	kept := filepath.Join(t.TempDir(), "kept")
	if out, err := sandboxctl(t, state, "export", "--symlinks=keep", id, kept); err != nil {
		t.Fatalf("export --symlinks=keep: %v\n%s", err, out)
	}
	if target, err := os.Readlink(filepath.Join(kept, "pw")); err != nil || target != "/etc/passwd" {
		t.Fatalf("symlink with --symlinks=keep: %q %v", target, err)
	}
	if st, _ := os.Stat(filepath.Join(dir, "d")); st.Mode().Perm() != 0o700 {
		t.Fatalf("mode: %v", st.Mode())
	}
	if out, err := sandboxctl(t, state, "export", id, dir); err == nil || !strings.Contains(out, "not empty") {
		t.Fatalf("export into a non-empty directory: %v\n%s", err, out)
	}

	// A hostile archive in the store (a tampered state directory, or an
	// archive forged by a sandbox): export refuses it, even with
	// --symlinks=keep, which writes symlinks as archived.
	st, err := snapshot.OpenStore(filepath.Join(state, "snapshots"), snapshot.Retention{})
	if err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(t.TempDir(), "outside")
	os.Mkdir(outside, 0o755)
	for name, entries := range map[string][]*tar.Header{
		"dot-dot":            {{Name: "../escape", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}},
		"absolute":           {{Name: filepath.Join(outside, "abs"), Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}},
		"symlink-then-write": {{Name: "l", Typeflag: tar.TypeSymlink, Linkname: outside}, {Name: "l/x", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}},
		"hard link out":      {{Name: "h", Typeflag: tar.TypeLink, Linkname: "/etc/passwd"}},
	} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range entries {
			tw.WriteHeader(h)
			if h.Size > 0 {
				tw.Write([]byte("x"))
			}
		}
		tw.Close()
		info, err := st.For("").Create(name, "sb-x", func(w io.Writer) error { _, err := w.Write(buf.Bytes()); return err })
		if err != nil {
			t.Fatal(err)
		}
		target := filepath.Join(outside, "export-"+strings.ReplaceAll(name, " ", "-"))
		if out, err := sandboxctl(t, state, "export", "--symlinks=keep", info.ID, target); err == nil {
			t.Errorf("%s: exported:\n%s", name, out)
		}
	}
	left, _ := os.ReadDir(outside)
	for _, e := range left {
		if !strings.HasPrefix(e.Name(), "export-") {
			t.Errorf("a hostile archive wrote %s outside its directory", e.Name())
		}
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(outside), "escape")); err == nil {
		t.Error("../escape was written")
	}
	if out, err := sandboxctl(t, state, "rm", id); err != nil || !strings.Contains(out, "deleted "+id) {
		t.Fatalf("rm: %v\n%s", err, out)
	}
}

func TestWorkspaceFromFlag(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "main.py"), []byte("print('seeded')\n"), 0o644)
	os.Symlink("/etc/shadow", filepath.Join(dir, "shadow"))
	s := startServer(t, serverOpts{args: []string{"--workspace-from", dir}})
	out := s.ok("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", "cat main.py; readlink shadow"}})
	if out["stdout"] != "print('seeded')\n/etc/shadow\n" {
		t.Fatalf("seeded workspace: %v", out)
	}
	s.fails("sandbox_read_file", map[string]any{"path": "shadow"}, "OUTSIDE_WORKSPACE")
}

// TestWarmPoolFlag: with --warm 1 a container is running before the first
// call, and the first call's sandbox is that container.
func TestWarmPoolFlag(t *testing.T) {
	s := startServer(t, serverOpts{args: []string{"--warm", "1"}})
	pid := strconv.Itoa(s.cmd.Process.Pid)
	deadline := time.Now().Add(60 * time.Second)
	var warm []string
	for {
		warm = testenv.Containers(t, s.cli, docker.LabelPID, pid)
		// Running is not ready: the pool takes the container once its
		// agent has said hello, which the server logs.
		if len(warm) == 1 && strings.Contains(warm[0], "running") && strings.Contains(s.stderr.String(), `msg="sandbox started"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no warm container: %v", warm)
		}
		time.Sleep(50 * time.Millisecond)
	}
	id := s.ok("sandbox_exec", map[string]any{"argv": []string{"true"}})["sandbox"].(string)
	if !strings.Contains(warm[0], "sandbox-mcp-"+id+"-1") {
		t.Fatalf("the first call did not run in the warm container %v (sandbox %s)", warm, id)
	}
	// The pool refills, and every container goes at exit (checked at cleanup).
	deadline = time.Now().Add(60 * time.Second)
	for len(testenv.Containers(t, s.cli, docker.LabelPID, pid)) != 2 {
		if time.Now().After(deadline) {
			t.Fatal("the pool did not refill")
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.cs.Close()
	testenv.WaitNoContainers(t, s.cli, docker.LabelPID, pid, 30*time.Second)
}
