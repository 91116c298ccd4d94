package session

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
)

// leaderlessScript starts, through the intruder, a process in a new
// session whose main thread has ended while another thread runs on,
// holding the command's stdout and stderr; its status reads State Z.
const leaderlessScript = "/tmp/intruder leaderless; echo started; sleep 100"

// noSandboxProcesses waits until no process of the sandbox user is left but
// the one asking, and fails the test if one survives.
func noSandboxProcesses(t *testing.T, sb *Sandbox) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := strings.TrimSpace(string(run(t, sb, "/tmp/intruder", "procs", "1000").Stdout))
		if left == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes survived:\n%s", left)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestExecTimeoutKillsALeaderlessProcess: a process whose main thread
// ended while another thread runs (State Z in its status, alive) is killed
// at the command's timeout, and holding the command's output does not end
// the sandbox: the call returns its result, and the workspace is the same.
func TestExecTimeoutKillsALeaderlessProcess(t *testing.T) {
	m := testManager(t, nil)
	sb := newSandbox(t, m)
	installIntruder(t, sb)
	if _, err := sb.WriteFile(context.Background(), "kept", []byte("x"), false, 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := sb.Exec(context.Background(), ExecRequest{Argv: []string{"sh", "-c", leaderlessScript},
		Cwd: ".", Timeout: 2 * time.Second, MaxOutput: 1 << 10})
	if err != nil || !res.TimedOut {
		t.Fatalf("exec: %+v %v", res, err)
	}
	if lines := strings.Fields(string(res.Stdout)); len(lines) != 2 || lines[1] != "started" {
		t.Fatalf("the command did not start its leaderless process: %q %q", res.Stdout, res.Stderr)
	}
	if res.Killed < 2 {
		t.Errorf("killed %d processes, want the shell and the leaderless process at least", res.Killed)
	}
	noSandboxProcesses(t, sb)
	if r := run(t, sb, "cat", "kept"); string(r.Stdout) != "x" {
		t.Fatalf("the workspace changed: %q %q", r.Stdout, r.Stderr)
	}
}

// TestJobKillKillsALeaderlessProcess: sandbox_job's KILL ends a background
// job's leaderless process too.
func TestJobKillKillsALeaderlessProcess(t *testing.T) {
	m := testManager(t, nil)
	sb := newSandbox(t, m)
	installIntruder(t, sb)
	id := background(t, sb, leaderlessScript)
	waitFor(t, sb, id, func(out string, _ agentproto.JobStatus) bool { return strings.Contains(out, "started") })
	res := job(t, sb, JobRequest{Job: id, Signal: "KILL", StdoutOffset: -1, StderrOffset: -1})
	if res.Status.Killed < 2 {
		t.Errorf("KILL killed %d processes, want the shell and the leaderless process at least", res.Status.Killed)
	}
	noSandboxProcesses(t, sb)
}

// TestHeldPipesDoNotEndTheSandbox: a process of another job reopens a
// command's stdout (/proc/PID/fd/1) and holds it; the command times out and
// is killed, and no process of its own is left to end the wait for its
// output. The call still returns its result (what was read, and that a
// process kept the pipes) before the server's grace runs out, and the
// sandbox lives on with its workspace.
func TestHeldPipesDoNotEndTheSandbox(t *testing.T) {
	m := testManager(t, nil)
	sb := newSandbox(t, m)
	if _, err := sb.WriteFile(context.Background(), "kept", []byte("x"), false, 0o644); err != nil {
		t.Fatal(err)
	}
	background(t, sb, "while [ ! -s /tmp/b.pid ]; do sleep 0.05; done; exec 3>/proc/$(cat /tmp/b.pid)/fd/1; echo held > /tmp/held; exec sleep 300")
	res, err := sb.Exec(context.Background(), ExecRequest{Argv: []string{"sh", "-c",
		"echo $$ > /tmp/b.pid; while [ ! -e /tmp/held ]; do sleep 0.05; done; echo started; sleep 100"},
		Cwd: ".", Timeout: 2 * time.Second, MaxOutput: 1 << 10})
	if err != nil {
		t.Fatalf("exec: %v", err)
	}
	if !res.TimedOut || string(res.Stdout) != "started\n" || !res.PipesHeld {
		t.Fatalf("exec: want a timeout with its output, and the pipes held: %+v", res)
	}
	if r := run(t, sb, "cat", "kept"); string(r.Stdout) != "x" {
		t.Fatalf("the workspace changed: %q %q", r.Stdout, r.Stderr)
	}
}
