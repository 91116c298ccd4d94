package session

import (
	"context"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
)

// TestExecReturnsAtMaxWait: a foreground command still running at MaxWait
// returns with Running, its job and the output so far; it runs on as its
// job, whose next read starts after that output, and its timeout still
// kills it.
func TestExecReturnsAtMaxWait(t *testing.T) {
	m := testManager(t, nil)
	sb := startedSandbox(t, m)

	res, err := sb.Exec(context.Background(), ExecRequest{Argv: []string{"sh", "-c", "echo first; sleep 3; echo second"},
		Cwd: ".", Timeout: time.Minute, MaxOutput: 1 << 10, MaxWait: time.Second})
	if err != nil || !res.Running || res.Job == "" || string(res.Stdout) != "first\n" {
		t.Fatalf("exec past MaxWait: %+v %v", res, err)
	}
	out, st := waitFor(t, sb, res.Job, func(_ string, st agentproto.JobStatus) bool { return st.State != agentproto.JobRunning })
	if out != "second\n" || st.State != agentproto.JobExited || st.ExitCode != 0 {
		t.Fatalf("the job after the detach: %q %+v", out, st)
	}

	res, err = sb.Exec(context.Background(), ExecRequest{Argv: []string{"sh", "-c", "echo a; sleep 100"},
		Cwd: ".", Timeout: 3 * time.Second, MaxOutput: 1 << 10, MaxWait: time.Second})
	if err != nil || !res.Running {
		t.Fatalf("exec past MaxWait: %+v %v", res, err)
	}
	_, st = waitFor(t, sb, res.Job, func(_ string, st agentproto.JobStatus) bool { return st.State != agentproto.JobRunning })
	if !st.TimedOut || st.State != agentproto.JobKilled {
		t.Fatalf("the detached command outlived its timeout: %+v", st)
	}

	// A command that ends within MaxWait is a plain result.
	res, err = sb.Exec(context.Background(), ExecRequest{Argv: []string{"echo", "quick"}, Cwd: ".", Timeout: time.Minute, MaxOutput: 1 << 10, MaxWait: 10 * time.Second})
	if err != nil || res.Running || string(res.Stdout) != "quick\n" {
		t.Fatalf("a quick command: %+v %v", res, err)
	}
}

// TestJobWaitReturnsWholeLines: a wait returns once the output ends a
// line, not at its first byte; output that ends no line comes back after a
// short quiet period, long before the wait's end.
func TestJobWaitReturnsWholeLines(t *testing.T) {
	m := testManager(t, nil)
	sb := startedSandbox(t, m)

	id := background(t, sb, "sleep 0.5; printf par; sleep 0.05; printf 'tial\\n'; sleep 100")
	res := job(t, sb, JobRequest{Job: id, StdoutOffset: -1, StderrOffset: -1, Wait: 20 * time.Second})
	if string(res.Out[0]) != "partial\n" {
		t.Fatalf("the wait returned %q, want the whole line", res.Out[0])
	}

	id = background(t, sb, "sleep 0.5; printf 'a prompt> '; sleep 100")
	start := time.Now()
	res = job(t, sb, JobRequest{Job: id, StdoutOffset: -1, StderrOffset: -1, Wait: 30 * time.Second})
	if string(res.Out[0]) != "a prompt> " || time.Since(start) > 20*time.Second {
		t.Fatalf("the wait for a line that does not end returned %q after %s", res.Out[0], time.Since(start))
	}
}
