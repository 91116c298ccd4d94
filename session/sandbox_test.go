package session

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
)

func newSandbox(t *testing.T, m *Manager) *Sandbox {
	t.Helper()
	sb, err := m.Sandbox(t.Name(), "")
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

// startedSandbox is newSandbox with its container already started, for
// tests that time a command: a container start under load takes seconds,
// and it is not what they measure.
func startedSandbox(t *testing.T, m *Manager) *Sandbox {
	t.Helper()
	sb := newSandbox(t, m)
	if _, err := sb.Exec(context.Background(), ExecRequest{Argv: []string{"true"}, Cwd: ".", Timeout: time.Minute}); err != nil {
		t.Fatal(err)
	}
	return sb
}

func wantCode(t *testing.T, err error, code errcode.Code) *errcode.Error {
	t.Helper()
	e, ok := errcode.As(err)
	if !ok {
		t.Fatalf("error = %v (%T), want a %s *errcode.Error", err, err, code)
	}
	if e.Code != code {
		t.Fatalf("code = %s (%s), want %s", e.Code, e.Message, code)
	}
	return e
}

func TestExecBasics(t *testing.T) {
	m := testManager(t, nil)
	sb := newSandbox(t, m)
	ctx := context.Background()

	res := run(t, sb, "echo", "hello", "world")
	if res.ExitCode != 0 || string(res.Stdout) != "hello world\n" || len(res.Stderr) != 0 {
		t.Fatalf("echo: %+v", res)
	}
	if res := sh(t, sb, "echo oops >&2; exit 3"); res.ExitCode != 3 || string(res.Stderr) != "oops\n" {
		t.Fatalf("exit 3: %+v", res)
	}
	if res := run(t, sb, "id", "-u"); strings.TrimSpace(string(res.Stdout)) != "1000" {
		t.Fatalf("id -u = %q, want 1000 (non-root)", res.Stdout)
	}
	// stdin, env, cwd.
	res, err := sb.Exec(ctx, ExecRequest{Argv: []string{"cat"}, Cwd: ".", Stdin: []byte("from stdin"), Timeout: 10 * time.Second, MaxOutput: 1 << 20})
	if err != nil || string(res.Stdout) != "from stdin" {
		t.Fatalf("stdin: %+v %v", res, err)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB, several frames
	res, err = sb.Exec(ctx, ExecRequest{Argv: []string{"wc", "-c"}, Cwd: ".", Stdin: big, Timeout: 10 * time.Second, MaxOutput: 1 << 20})
	if err != nil || strings.TrimSpace(string(res.Stdout)) != strconv.Itoa(len(big)) {
		t.Fatalf("big stdin: %q %v", res.Stdout, err)
	}
	res, err = sb.Exec(ctx, ExecRequest{Argv: []string{"sh", "-c", "echo $GREETING"}, Cwd: ".", Env: []string{"GREETING=hi there"}, Timeout: 10 * time.Second, MaxOutput: 1 << 20})
	if err != nil || string(res.Stdout) != "hi there\n" {
		t.Fatalf("env: %+v %v", res, err)
	}
	sh(t, sb, "mkdir -p sub/dir")
	res, err = sb.Exec(ctx, ExecRequest{Argv: []string{"pwd"}, Cwd: "sub/dir", Timeout: 10 * time.Second, MaxOutput: 1 << 20})
	if err != nil || string(res.Stdout) != "/workspace/sub/dir\n" {
		t.Fatalf("cwd: %q %v", res.Stdout, err)
	}
	// A cwd that escapes, or is a symlink out, is refused by the agent.
	sh(t, sb, "ln -s /etc etclink; ln -s /proc/self/fd fdlink")
	for _, cwd := range []string{"etclink", "fdlink", "../..", "missing"} {
		_, err := sb.Exec(ctx, ExecRequest{Argv: []string{"pwd"}, Cwd: cwd, Timeout: 10 * time.Second})
		if err == nil {
			t.Errorf("cwd %q: ran, want a refusal", cwd)
			continue
		}
		if _, ok := errcode.As(err); !ok {
			t.Errorf("cwd %q: %v is not a tool error", cwd, err)
		}
	}
	// A program that does not exist.
	_, err = sb.Exec(ctx, ExecRequest{Argv: []string{"no-such-program"}, Cwd: ".", Timeout: 10 * time.Second})
	wantCode(t, err, errcode.NotFound)
	// Output that is not text comes back as bytes; the tools layer encodes it.
	if res := sh(t, sb, `printf '\377\376\000x'`); !bytes.Equal(res.Stdout, []byte{0xff, 0xfe, 0, 'x'}) {
		t.Fatalf("binary stdout = %q", res.Stdout)
	}
}

func TestExecOutputCap(t *testing.T) {
	m := testManager(t, nil)
	sb := newSandbox(t, m)
	ctx := context.Background()
	// 3 MiB on each stream against a 64 KiB cap for both: the command runs
	// to the end, never blocked on a full pipe; each stream keeps a quarter
	// of its half as head and three quarters as tail, and the counts say
	// what was left out between.
	res, err := sb.Exec(ctx, ExecRequest{
		Argv: []string{"sh", "-c", "head -c 3145728 /dev/zero; head -c 3145728 /dev/zero >&2; echo done > marker"},
		Cwd:  ".", Timeout: 30 * time.Second, MaxOutput: 64 << 10,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 || len(res.Stdout) != 8<<10 || len(res.StdoutTail) != 24<<10 || len(res.Stderr) != 8<<10 || len(res.StderrTail) != 24<<10 ||
		!res.StdoutTruncated || !res.StderrTruncated || res.StdoutOmitted != 3<<20-32<<10 || res.StdoutBytes != 3<<20 {
		t.Fatalf("got exit %d, %d+%d/%d+%d bytes, omitted %d, truncated %v/%v", res.ExitCode, len(res.Stdout), len(res.StdoutTail),
			len(res.Stderr), len(res.StderrTail), res.StdoutOmitted, res.StdoutTruncated, res.StderrTruncated)
	}
	if res := run(t, sb, "cat", "marker"); string(res.Stdout) != "done\n" {
		t.Fatalf("the command did not run to its end: %q", res.Stdout)
	}
	// An endless flood stops at the timeout with the cap's worth of output.
	start := time.Now()
	res, err = sb.Exec(ctx, ExecRequest{Argv: []string{"yes"}, Cwd: ".", Timeout: time.Second, MaxOutput: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if !res.TimedOut || !res.StdoutTruncated || len(res.Stdout)+len(res.StdoutTail) != 1<<20 || time.Since(start) > 10*time.Second {
		t.Fatalf("yes: timed_out %v truncated %v len %d+%d after %s", res.TimedOut, res.StdoutTruncated, len(res.Stdout), len(res.StdoutTail), time.Since(start))
	}
	res, err = sb.Exec(ctx, ExecRequest{Argv: []string{"sh", "-c", "yes >&2"}, Cwd: ".", Timeout: time.Second, MaxOutput: 1 << 20})
	if err != nil || !res.TimedOut || !res.StderrTruncated || len(res.Stderr)+len(res.StderrTail) != 1<<20 || string(res.StderrTail[:2]) != "y\n" {
		t.Fatalf("yes >&2: %v timed_out %v truncated %v len %d", err, res.TimedOut, res.StderrTruncated, len(res.Stderr))
	}
}

// sleepers lists the sleep processes in the sandbox.
func sleepers(t *testing.T, sb *Sandbox) string {
	t.Helper()
	res := sh(t, sb, "ps -o pid,comm,args | grep '[s]leep 10' || true")
	return strings.TrimSpace(string(res.Stdout))
}

const survivors = "sleep 1000 & nohup sleep 1001 >/dev/null 2>&1 & setsid sleep 1002 & (sleep 1003 &); sh -c 'sleep 1005 &'; sleep 1004"

func TestExecTimeoutKillsEveryProcess(t *testing.T) {
	m := testManager(t, nil)
	sb := startedSandbox(t, m)
	start := time.Now()
	res, err := sb.Exec(context.Background(), ExecRequest{Argv: []string{"sh", "-c", "echo started; " + survivors}, Cwd: ".", Timeout: 2 * time.Second, MaxOutput: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if !res.TimedOut || string(res.Stdout) != "started\n" || took > 6*time.Second {
		t.Fatalf("timed_out %v, stdout %q, took %s", res.TimedOut, res.Stdout, took)
	}
	if res.Killed < 5 {
		t.Errorf("killed %d processes, want the shell's five sleeps at least", res.Killed)
	}
	if left := sleepers(t, sb); left != "" {
		t.Fatalf("processes survived the timeout:\n%s", left)
	}
}

func TestExecCancelKillsEveryProcess(t *testing.T) {
	m := testManager(t, nil)
	sb := startedSandbox(t, m)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(time.Second, cancel)
	start := time.Now()
	_, err := sb.Exec(ctx, ExecRequest{Argv: []string{"sh", "-c", survivors}, Cwd: ".", Timeout: time.Minute, MaxOutput: 1 << 20})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if took := time.Since(start); took > 6*time.Second {
		t.Fatalf("cancel took %s", took)
	}
	if left := sleepers(t, sb); left != "" {
		t.Fatalf("processes survived the cancel:\n%s", left)
	}
}

func TestExecBackgroundChildDoesNotStall(t *testing.T) {
	m := testManager(t, nil)
	sb := startedSandbox(t, m)
	// The background child keeps stdout and stderr open; the call must end
	// when the shell does (container case 8 of docs/attack-cases.md), not
	// when the child does.
	start := time.Now()
	res := sh(t, sb, "sleep 100 & echo parent-done")
	if took := time.Since(start); took > 3*time.Second || string(res.Stdout) != "parent-done\n" {
		t.Fatalf("took %s, stdout %q", took, res.Stdout)
	}
	start = time.Now()
	sh(t, sb, "sleep 1000 >/dev/null 2>&1 &")
	if res := run(t, sb, "echo", "hi"); string(res.Stdout) != "hi\n" || time.Since(start) > 3*time.Second {
		t.Fatalf("next exec: %q after %s", res.Stdout, time.Since(start))
	}
}

func TestExecBusy(t *testing.T) {
	m := testManager(t, func(o *Options) { o.Policy.MaxExecs = 2 })
	sb := newSandbox(t, m)
	run(t, sb, "true") // start the container first
	// Two commands take both places, and run until cancelled.
	ctx, cancel := context.WithCancel(context.Background())
	long := ExecRequest{Argv: []string{"sh", "-c", "echo started; exec sleep 60"}, Timeout: time.Minute}
	first, second := execStarted(t, ctx, sb, long), execStarted(t, ctx, sb, long)
	_, err := sb.Exec(context.Background(), ExecRequest{Argv: []string{"true"}, Cwd: ".", Timeout: 10 * time.Second})
	e := wantCode(t, err, errcode.Busy)
	if !strings.Contains(e.Message, "2 commands") {
		t.Errorf("message does not name the limit: %s", e.Message)
	}
	cancel()
	<-first
	<-second
	run(t, sb, "true") // free again
}

func TestZombiesAreReaped(t *testing.T) {
	m := testManager(t, func(o *Options) { o.Policy.Pids = 64 })
	sb := newSandbox(t, m)
	// 300 short-lived orphans, far more than the PID limit: init reaps them.
	sh(t, sb, "i=0; while [ $i -lt 300 ]; do (sleep 0 &) ; i=$((i+1)); done")
	res := sh(t, sb, "ps -o stat | grep -c '^Z' || true")
	if n, _ := strconv.Atoi(strings.TrimSpace(string(res.Stdout))); n > 2 {
		t.Fatalf("%d zombies left", n)
	}
}

func TestAgentDeathIsReportedThenReplaced(t *testing.T) {
	m := testManager(t, nil)
	sb := newSandbox(t, m)
	sh(t, sb, "echo precious > file")
	first := sb.ContainerID()
	err := execKillingAgent(t, m, sb)
	e := wantCode(t, err, errcode.Unavailable)
	if !strings.Contains(e.Message, "next call") {
		t.Errorf("UNAVAILABLE does not say what happens next: %s", e.Message)
	}
	// The next call gets a fresh, empty sandbox.
	res, err := sb.Exec(context.Background(), ExecRequest{Argv: []string{"ls", "-A"}, Cwd: ".", Timeout: 10 * time.Second, MaxOutput: 1 << 10})
	if err != nil {
		t.Fatalf("after the agent died: %v", err)
	}
	if len(res.Stdout) != 0 {
		t.Fatalf("fresh workspace holds %q", res.Stdout)
	}
	if sb.ContainerID() == first {
		t.Fatal("still the old container")
	}
	waitGone(t, testenv.Engine(t), first)
}

func TestContainerRemovedFromOutside(t *testing.T) {
	m := testManager(t, nil)
	sb := newSandbox(t, m)
	run(t, sb, "true")
	id := sb.ContainerID()
	if _, err := testenv.Engine(t).ContainerRemove(context.Background(), id, client.ContainerRemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, testenv.Engine(t), id)
	// The next call says the workspace is lost, and what happens next ...
	_, err := sb.Exec(context.Background(), ExecRequest{Argv: []string{"true"}, Cwd: ".", Timeout: 10 * time.Second})
	e := wantCode(t, err, errcode.Unavailable)
	if !strings.Contains(e.Message, "lost its workspace") || !strings.Contains(e.Message, "next call") {
		t.Errorf("message: %s", e.Message)
	}
	// ... and the one after that works in a fresh container.
	run(t, sb, "true")
	if sb.ContainerID() == id || sb.ContainerID() == "" {
		t.Fatal("no fresh container")
	}
}

func waitGone(t *testing.T, cli *client.Client, id string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, err := cli.ContainerInspect(context.Background(), id, client.ContainerInspectOptions{})
		if isGone(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %s still exists (%v)", id, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestReleaseRemovesTheContainer(t *testing.T) {
	m := testManager(t, nil)
	sb := newSandbox(t, m)
	run(t, sb, "true")
	id := sb.ContainerID()
	m.Release(t.Name())
	if _, err := testenv.Engine(t).ContainerInspect(context.Background(), id, client.ContainerInspectOptions{}); !isGone(err) {
		t.Fatalf("container %s still there after Release: %v", id, err)
	}
	_, err := sb.Exec(context.Background(), ExecRequest{Argv: []string{"true"}, Cwd: ".", Timeout: time.Second})
	wantCode(t, err, errcode.Unavailable)
}

func TestReleaseCancelsCallsInFlight(t *testing.T) {
	m := testManager(t, nil)
	sb := newSandbox(t, m)
	run(t, sb, "true")
	done := execStarted(t, context.Background(), sb, ExecRequest{Argv: []string{"sh", "-c", "echo started; exec sleep 60"}, Timeout: time.Minute})
	start := time.Now()
	m.Release(t.Name())
	select {
	case d := <-done:
		if err := d.err; err == nil {
			t.Fatal("the call in flight returned no error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call in flight did not end")
	}
	if time.Since(start) > 10*time.Second {
		t.Fatalf("release took %s", time.Since(start))
	}
}

func TestLeaseEndsAnOrphanedSandbox(t *testing.T) {
	m := testManager(t, func(o *Options) { o.Lease = 1500 * time.Millisecond })
	sb := newSandbox(t, m)
	run(t, sb, "true")
	inst := sb.cur
	id := inst.box.Name()
	// A server that is alive but silent (frozen, say): stop its pings. The
	// agent ends itself after its lease, and the engine removes the
	// container.
	m.stopKeepAlive(inst)
	waitGone(t, testenv.Engine(t), id)
	_, err := sb.Exec(context.Background(), ExecRequest{Argv: []string{"true"}, Cwd: ".", Timeout: time.Second})
	wantCode(t, err, errcode.Unavailable)
}

func TestIdleTimeoutRemovesTheContainer(t *testing.T) {
	m := testManager(t, func(o *Options) { o.IdleTimeout = time.Second })
	sb := newSandbox(t, m)
	sh(t, sb, "echo x > f")
	id := sb.ContainerID()
	waitGone(t, testenv.Engine(t), id)
	_, err := sb.Exec(context.Background(), ExecRequest{Argv: []string{"true"}, Cwd: ".", Timeout: time.Second})
	e := wantCode(t, err, errcode.Unavailable)
	if !strings.Contains(e.Message, "--idle-timeout") {
		t.Errorf("message does not say why: %s", e.Message)
	}
	run(t, sb, "true")
}

func TestMaxSandboxes(t *testing.T) {
	m := testManager(t, func(o *Options) { o.MaxSandboxes = 2 })
	for _, k := range []string{"a", "b"} {
		if _, err := m.Sandbox(k, ""); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.Sandbox("a", ""); err != nil {
		t.Fatalf("an existing sandbox must stay reachable: %v", err)
	}
	_, err := m.Sandbox("c", "")
	e := wantCode(t, err, errcode.Busy)
	if !strings.Contains(e.Message, "--max-sandboxes") {
		t.Errorf("message: %s", e.Message)
	}
	m.Release("a")
	if _, err := m.Sandbox("c", ""); err != nil {
		t.Fatalf("after a release: %v", err)
	}
}

// TestReleaseSoonTellsCallsTheSessionEnded: a call in flight when its
// session ends (an HTTP DELETE) is told the session ended, not to call
// again: there is no next call in that session.
func TestReleaseSoonTellsCallsTheSessionEnded(t *testing.T) {
	for round := range 3 {
		m := testManager(t, nil)
		sb := newSandbox(t, m)
		run(t, sb, "true")
		done := execStarted(t, context.Background(), sb, ExecRequest{Argv: []string{"sh", "-c", "echo started; exec sleep 60"}, Timeout: time.Minute, MaxOutput: 1024})
		m.ReleaseSoon(t.Name())
		var err error
		select {
		case d := <-done:
			err = d.err
		case <-time.After(20 * time.Second):
			t.Fatal("the call in flight did not end")
		}
		wantCode(t, err, errcode.Unavailable)
		if msg := err.Error(); !strings.Contains(msg, "the session ended") || strings.Contains(msg, "Call again") {
			t.Fatalf("round %d: the call in flight was told %q", round, msg)
		}
	}
}
