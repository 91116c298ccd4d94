package main

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/docker"
)

// lastTick is the highest counter a job's output shows ("tick N" lines).
func lastTick(t *testing.T, out string) int {
	t.Helper()
	last := -1
	for _, line := range strings.Split(out, "\n") {
		if n, err := strconv.Atoi(strings.TrimPrefix(line, "tick ")); err == nil && strings.HasPrefix(line, "tick ") {
			last = n
		}
	}
	return last
}

// killServer ends a server with SIGKILL: no hook of its runs.
func killServer(t *testing.T, s *server) {
	t.Helper()
	if err := s.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	s.cs.Wait()
}

// TestKilledServersSandboxIsTakenBack: a server runs a background job (a
// counter) and writes a file in its sandbox, and is killed with SIGKILL. A
// second server started meanwhile on the same state directory gets a slot
// of its own and does not know the sandbox. A server started again takes
// the first one's slot back: the sandbox, addressed by its id, still has
// the file, and the job still runs, its output going on from where it was.
func TestKilledServersSandboxIsTakenBack(t *testing.T) {
	state := t.TempDir()
	args := []string{"--state-dir", state}
	a := startServer(t, serverOpts{args: args})
	loop := a.ok("sandbox_exec", map[string]any{"command": "i=0; while :; do echo tick $i; i=$((i+1)); sleep 0.1; done", "background": true})
	id, job := loop["sandbox"].(string), loop["job"].(string)
	a.ok("sandbox_write_file", map[string]any{"path": "kept.txt", "content": "before the crash"})
	// A server beside it on the same directory: a slot of its own, and
	// none of the first one's sandboxes, now or after the first is gone.
	other := startServer(t, serverOpts{args: args})
	other.fails("sandbox_read_file", map[string]any{"path": "kept.txt", "sandbox": id}, "NOT_FOUND")
	// Pinning the slot the first server holds is refused.
	pinned := exec.Command(bins.Get(t).Server, "--state-dir", state, "--state-slot", "0", "--image", testenv.TestImage(t))
	if out, err := pinned.CombinedOutput(); err == nil || !strings.Contains(string(out), "held by another running server") {
		t.Fatalf("a server pinned to a held slot: %v\n%s", err, out)
	}

	r := a.ok("sandbox_job", map[string]any{"job": job, "wait_ms": 1000})
	before := lastTick(t, r["stdout"].(string))
	if before < 0 {
		t.Fatalf("the job printed no tick: %v", r)
	}
	killServer(t, a)

	b := startServer(t, serverOpts{args: args})
	start := time.Now()
	got := b.ok("sandbox_read_file", map[string]any{"path": "kept.txt", "sandbox": id})
	t.Logf("the first call after the restart took %s", time.Since(start).Round(time.Millisecond))
	if got["content"] != "before the crash" || got["sandbox"] != id {
		t.Fatalf("the file after the restart: %v", got)
	}
	r = b.ok("sandbox_job", map[string]any{"job": job, "wait_ms": 1000, "sandbox": id})
	if r["state"] != "running" {
		t.Fatalf("the job after the restart: %v", r)
	}
	after := lastTick(t, r["stdout"].(string))
	if after <= before {
		t.Fatalf("the job's output did not go on: tick %d before the kill, %d after: %v", before, after, r)
	}
	// New jobs continue the numbering: no id is given twice.
	n := b.ok("sandbox_exec", map[string]any{"argv": []string{"cat", "kept.txt"}, "sandbox": id})
	if n["job"] == job || n["stdout"] != "before the crash" {
		t.Fatalf("an exec after the restart: %v", n)
	}
	other.fails("sandbox_read_file", map[string]any{"path": "kept.txt", "sandbox": id}, "NOT_FOUND")
}

// TestRemovedSandboxComesBackFromItsSnapshot: a killed server's sandbox
// whose container was removed meanwhile comes back from its latest
// snapshot: the first call says so, the next one finds the file.
func TestRemovedSandboxComesBackFromItsSnapshot(t *testing.T) {
	state := t.TempDir()
	args := []string{"--state-dir", state}
	a := startServer(t, serverOpts{args: args})
	w := a.ok("sandbox_write_file", map[string]any{"path": "saved.txt", "content": "in the snapshot"})
	id := w["sandbox"].(string)
	snap := a.ok("sandbox_snapshot", map[string]any{"label": "before"})["id"].(string)
	killServer(t, a)
	cli := testenv.Engine(t)
	list, err := cli.ContainerList(context.Background(), client.ContainerListOptions{All: true,
		Filters: make(client.Filters).Add("label", docker.LabelSandbox+"="+id)})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("the killed server's container: %v %v", list.Items, err)
	}
	if out, err := exec.Command("docker", "rm", "-f", list.Items[0].ID).CombinedOutput(); err != nil {
		t.Fatalf("docker rm: %v %s", err, out)
	}
	b := startServer(t, serverOpts{args: args})
	msg := b.fails("sandbox_read_file", map[string]any{"path": "saved.txt", "sandbox": id}, "UNAVAILABLE")
	if !strings.Contains(msg, "not running when this server started again") || !strings.Contains(msg, snap) {
		t.Fatalf("the first call does not say what happened: %s", msg)
	}
	got := b.ok("sandbox_read_file", map[string]any{"path": "saved.txt", "sandbox": id})
	if got["content"] != "in the snapshot" {
		t.Fatalf("after the restore: %v", got)
	}
}

// TestKilledServersHandleIsTakenBack: a sandbox made by sandbox_create
// outlives a server killed with SIGKILL as a handle, not only as an id: the
// server started again lists it with its label and template in
// sandbox_status, and its job and files are there.
func TestKilledServersHandleIsTakenBack(t *testing.T) {
	state := t.TempDir()
	args := []string{"--state-dir", state}
	a := startServer(t, serverOpts{args: args})
	h := a.ok("sandbox_create", map[string]any{"label": "build"})["sandbox"].(string)
	job := a.ok("sandbox_exec", map[string]any{"command": "while :; do sleep 0.2; done", "background": true, "sandbox": h})["job"].(string)
	a.ok("sandbox_write_file", map[string]any{"path": "kept.txt", "content": "made by handle", "sandbox": h})
	killServer(t, a)

	b := startServer(t, serverOpts{args: args})
	if r := b.ok("sandbox_read_file", map[string]any{"path": "kept.txt", "sandbox": h}); r["content"] != "made by handle" {
		t.Fatalf("the handle's file after the restart: %v", r)
	}
	res := b.call("sandbox_status", map[string]any{})
	if res.IsError {
		t.Fatalf("sandbox_status after the restart: %v", res.Content)
	}
	st, _ := res.StructuredContent.(map[string]any)
	list, _ := st["sandboxes"].([]any)
	var found map[string]any
	for _, e := range list {
		if m, _ := e.(map[string]any); m["sandbox"] == h {
			found = m
		}
	}
	if found == nil || found["label"] != "build" || found["template"] != "default" {
		t.Fatalf("sandbox_status after the restart does not list the handle with its label: %v", st)
	}
	if r := b.ok("sandbox_job", map[string]any{"job": job, "sandbox": h}); r["state"] != "running" {
		t.Fatalf("the handle's job after the restart: %v", r)
	}
}

// stopServer ends a server with SIGTERM, as a supervisor does at an
// upgrade, and waits until it is gone.
func stopServer(t *testing.T, s *server) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	s.cs.Wait()
}

// TestStoppedServersHandleIsTakenBack: a server stopped with SIGTERM (an
// upgrade) leaves its sandbox_create sandbox running for the server
// started next on the same state directory: that one finds its file, and
// its background job still running with its whole output, while the
// connection's own sandbox ended with the first server. Once the handle is
// ended, nothing of either sandbox is left on the engine.
func TestStoppedServersHandleIsTakenBack(t *testing.T) {
	state := t.TempDir()
	args := []string{"--state-dir", state}
	a := startServer(t, serverOpts{args: append(args, "--end-handles-at-stop=false")})
	h := a.ok("sandbox_create", map[string]any{"label": "build"})["sandbox"].(string)
	job := a.ok("sandbox_exec", map[string]any{"command": "i=0; while :; do echo tick $i; i=$((i+1)); sleep 0.1; done", "background": true, "sandbox": h})["job"].(string)
	a.ok("sandbox_write_file", map[string]any{"path": "kept.txt", "content": "made before the stop", "sandbox": h})
	own := a.ok("sandbox_write_file", map[string]any{"path": "gone.txt", "content": "the connection's"})["sandbox"].(string)
	if own == h {
		t.Fatalf("the call without a sandbox used the handle %s", h)
	}
	r := a.ok("sandbox_job", map[string]any{"job": job, "wait_ms": 1000, "sandbox": h})
	before := r["stdout"].(string)
	if lastTick(t, before) < 0 {
		t.Fatalf("the job printed no tick: %v", r)
	}
	stopServer(t, a)
	cli := testenv.Engine(t)
	if left := testenv.Containers(t, cli, docker.LabelSandbox, own); len(left) != 0 {
		t.Fatalf("the connection's own sandbox outlived the stop: %v", left)
	}
	if kept := testenv.Containers(t, cli, docker.LabelSandbox, h); len(kept) != 1 {
		t.Fatalf("the handle's container after the stop: %v", kept)
	}

	b := startServer(t, serverOpts{args: args})
	// The job first: it waits for the re-adoption, as every call does.
	r = b.ok("sandbox_job", map[string]any{"job": job, "stdout_offset": 0, "wait_ms": 500, "sandbox": h})
	out := r["stdout"].(string)
	if r["state"] != "running" || !strings.HasPrefix(out, before) || lastTick(t, out) <= lastTick(t, before) {
		t.Fatalf("the handle's job after the stop: %v (before the stop: %q)", r, before)
	}
	if got := b.ok("sandbox_read_file", map[string]any{"path": "kept.txt", "sandbox": h}); got["content"] != "made before the stop" {
		t.Fatalf("the handle's file after the stop: %v", got)
	}
	b.fails("sandbox_read_file", map[string]any{"path": "gone.txt", "sandbox": own}, "NOT_FOUND")
	b.ok("sandbox_end", map[string]any{"sandbox": h})
	for _, id := range []string{h, own} {
		testenv.WaitNoContainers(t, cli, docker.LabelSandbox, id, 20*time.Second)
	}
}
