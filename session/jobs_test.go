package session

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
)

// background starts script as a background job and returns its id.
func background(t *testing.T, sb *Sandbox, script string) string {
	t.Helper()
	res, err := sb.Exec(context.Background(), ExecRequest{Argv: []string{"sh", "-c", script}, Cwd: ".", MaxOutput: 32 << 10, Background: true, Label: script})
	if err != nil {
		t.Fatalf("background %q: %v", script, err)
	}
	if !res.Running || res.Job == "" {
		t.Fatalf("background %q: %+v", script, res)
	}
	return res.Job
}

// job calls Sandbox.Job and fails the test on an error.
func job(t *testing.T, sb *Sandbox, req JobRequest) JobResult {
	t.Helper()
	if req.Max == 0 {
		req.Max = 32 << 10
	}
	res, err := sb.Job(context.Background(), req)
	if err != nil {
		t.Fatalf("job %+v: %v", req, err)
	}
	return res
}

// waitFor polls the job (each poll waiting for new output or its end)
// until cond holds of everything read so far.
func waitFor(t *testing.T, sb *Sandbox, id string, cond func(out string, st agentproto.JobStatus) bool) (string, agentproto.JobStatus) {
	t.Helper()
	var out strings.Builder
	deadline := time.Now().Add(30 * time.Second)
	for {
		res := job(t, sb, JobRequest{Job: id, StdoutOffset: -1, StderrOffset: -1, Wait: 2 * time.Second})
		out.Write(res.Out[0])
		if cond(out.String(), res.Status) {
			return out.String(), res.Status
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: condition not met; read %q, status %+v", id, out.String(), res.Status)
		}
	}
}

// TestBackgroundJobs: a background loop is started, polled (each read
// returns what is new), listed, and signalled; a background cat is fed
// stdin and echoes it, and ends when its stdin is closed. Unknown jobs
// are NOT_FOUND.
func TestBackgroundJobs(t *testing.T) {
	m := testManager(t, nil)
	sb := startedSandbox(t, m)

	loop := background(t, sb, `trap 'echo got TERM; exit 7' TERM; i=0; while :; do echo line $i; i=$((i+1)); sleep 0.05; done`)
	out, st := waitFor(t, sb, loop, func(out string, _ agentproto.JobStatus) bool { return strings.Contains(out, "line 3\n") })
	if !strings.HasPrefix(out, "line 0\nline 1\n") || st.State != agentproto.JobRunning {
		t.Fatalf("loop: %q %+v", out, st)
	}
	// A read goes on where the last ended.
	next := job(t, sb, JobRequest{Job: loop, StdoutOffset: -1, StderrOffset: -1, Wait: 5 * time.Second})
	if next.From[0] != int64(len(out)) || !strings.HasPrefix(string(next.Out[0]), "line ") {
		t.Fatalf("the next read starts at %d with %q, want %d", next.From[0], next.Out[0], len(out))
	}

	cat := background(t, sb, "cat")
	jobs, err := sb.Jobs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, j := range jobs {
		listed = append(listed, fmt.Sprintf("%d %s %s", j.Job, j.State, j.Label))
	}
	if got := strings.Join(listed, "\n"); !strings.Contains(got, loop+" running trap") || !strings.Contains(got, cat+" running cat") {
		t.Fatalf("jobs listed:\n%s", got)
	}

	job(t, sb, JobRequest{Job: cat, Stdin: []byte("hello cat\n"), StdoutOffset: -1, StderrOffset: -1})
	out, _ = waitFor(t, sb, cat, func(out string, _ agentproto.JobStatus) bool { return out == "hello cat\n" })
	res := job(t, sb, JobRequest{Job: cat, CloseStdin: true, StdoutOffset: -1, StderrOffset: -1, Wait: 10 * time.Second})
	if res.Status.State != agentproto.JobExited || res.Status.ExitCode != 0 {
		t.Fatalf("cat after close_stdin: %+v", res.Status)
	}
	if _, err := sb.Job(context.Background(), JobRequest{Job: cat, Stdin: []byte("more"), Max: 10}); err == nil ||
		!strings.Contains(err.Error(), "stdin is closed") {
		t.Fatalf("stdin after close: %v", err)
	}

	// TERM reaches the loop's shell, whose trap runs.
	job(t, sb, JobRequest{Job: loop, Signal: "TERM", StdoutOffset: -1, StderrOffset: -1})
	out, st = waitFor(t, sb, loop, func(_ string, st agentproto.JobStatus) bool { return st.State != agentproto.JobRunning })
	if st.State != agentproto.JobExited || st.ExitCode != 7 {
		t.Fatalf("loop after TERM: %+v, output ends %q", st, out[max(len(out)-40, 0):])
	}

	_, err = sb.Job(context.Background(), JobRequest{Job: "12345", Max: 10})
	wantCode(t, err, errcode.NotFound)
	_, err = sb.Job(context.Background(), JobRequest{Job: "x", Max: 10})
	wantCode(t, err, errcode.InvalidArgument)
}

// TestJobKillEndsItsTree: KILL ends a background job and every process it
// started, wherever they went.
func TestJobKillEndsItsTree(t *testing.T) {
	m := testManager(t, nil)
	sb := startedSandbox(t, m)
	// "started" comes once every other process is on its way.
	id := background(t, sb, strings.Replace(survivors, "sleep 1004", "echo started; sleep 1004", 1))
	waitFor(t, sb, id, func(out string, _ agentproto.JobStatus) bool { return out == "started\n" })
	res := job(t, sb, JobRequest{Job: id, Signal: "KILL", StdoutOffset: -1, StderrOffset: -1, Wait: 10 * time.Second})
	if res.Status.Killed < 5 {
		t.Errorf("killed %d processes, want the shell's sleeps at least", res.Status.Killed)
	}
	_, st := waitFor(t, sb, id, func(_ string, st agentproto.JobStatus) bool { return st.State != agentproto.JobRunning })
	if st.State != agentproto.JobKilled || st.Signal != "SIGKILL" {
		t.Fatalf("after KILL: %+v", st)
	}
	if left := sleepers(t, sb); left != "" {
		t.Fatalf("processes survived KILL:\n%s", left)
	}
}

// TestCutOutputIsReadableInFull: a foreground exec whose output is far
// past the cap returns its head and tail, and the part left out is read
// back through its job from the offset given, so head + middle + tail is
// the command's whole output.
func TestCutOutputIsReadableInFull(t *testing.T) {
	m := testManager(t, nil)
	sb := startedSandbox(t, m)
	res, err := sb.Exec(context.Background(), ExecRequest{Argv: []string{"seq", "1", "100000"}, Cwd: ".", Timeout: time.Minute, MaxOutput: 32 << 10})
	if err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	for i := 1; i <= 100000; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	if !res.StdoutTruncated || len(res.Stdout) != 8<<10 || len(res.StdoutTail) != 24<<10 || res.StdoutBytes != int64(want.Len()) {
		t.Fatalf("head %d, tail %d, omitted %d, total %d", len(res.Stdout), len(res.StdoutTail), res.StdoutOmitted, res.StdoutBytes)
	}
	got := bytes.NewBuffer(append([]byte{}, res.Stdout...))
	off := int64(len(res.Stdout))
	end := off + res.StdoutOmitted
	for off < end {
		r := job(t, sb, JobRequest{Job: res.Job, StdoutOffset: off, StderrOffset: -1, Max: min(32<<10, end-off)})
		if r.From[0] != off || len(r.Out[0]) == 0 {
			t.Fatalf("read at %d: %d bytes from %d", off, len(r.Out[0]), r.From[0])
		}
		got.Write(r.Out[0])
		off += int64(len(r.Out[0]))
	}
	got.Write(res.StdoutTail)
	if !bytes.Equal(got.Bytes(), want.Bytes()) {
		t.Fatalf("head + middle + tail (%d bytes) is not the output (%d bytes)", got.Len(), want.Len())
	}
}

// TestMaxJobs: with --max-jobs 8, eight background jobs run and the ninth
// is BUSY, saying what to do; a foreground exec then is BUSY too, and once
// one job is killed a new one starts.
func TestMaxJobs(t *testing.T) {
	m := testManager(t, func(o *Options) { o.Policy.MaxExecs = 8 })
	sb := startedSandbox(t, m)
	var ids []string
	for range 8 {
		ids = append(ids, background(t, sb, "sleep 1000"))
	}
	_, err := sb.Exec(context.Background(), ExecRequest{Argv: []string{"sleep", "1000"}, Cwd: ".", Background: true, MaxOutput: 1 << 10})
	if e := wantCode(t, err, errcode.Busy); !strings.Contains(e.Message, "8 jobs") || !strings.Contains(e.Message, "sandbox_job") {
		t.Fatalf("BUSY says: %s", e.Message)
	}
	_, err = sb.Exec(context.Background(), ExecRequest{Argv: []string{"true"}, Cwd: ".", Timeout: time.Minute, MaxOutput: 1 << 10})
	wantCode(t, err, errcode.Busy)
	job(t, sb, JobRequest{Job: ids[0], Signal: "KILL", StdoutOffset: -1, StderrOffset: -1, Wait: 10 * time.Second})
	waitFor(t, sb, ids[0], func(_ string, st agentproto.JobStatus) bool { return st.State != agentproto.JobRunning })
	background(t, sb, "sleep 1000")
}

// TestSessionEndLeavesNoProcess: background jobs end with their sandbox:
// its container is removed with every process in it.
func TestSessionEndLeavesNoProcess(t *testing.T) {
	m := testManager(t, nil)
	sb := startedSandbox(t, m)
	background(t, sb, "sleep 1000")
	background(t, sb, "setsid sleep 1001 & while :; do sleep 1; done")
	cid := sb.ContainerID()
	m.Release(t.Name())
	waitGone(t, testenv.Engine(t), cid)
}

// TestJobsOfAFreshSandboxStartNothing: asking a sandbox that has run
// nothing about its jobs answers without starting a container.
func TestJobsOfAFreshSandboxStartNothing(t *testing.T) {
	m := testManager(t, nil)
	sb := newSandbox(t, m)
	jobs, err := sb.Jobs(context.Background())
	if err != nil || len(jobs) != 0 {
		t.Fatalf("jobs %v, %v", jobs, err)
	}
	_, err = sb.Job(context.Background(), JobRequest{Job: "1", Max: 10})
	wantCode(t, err, errcode.NotFound)
	if id := sb.ContainerID(); id != "" {
		t.Fatalf("asking about jobs started container %s", id)
	}
}

// TestShellIsTheImages: the test image has no bash, so command strings run
// through its sh; the answer is the same when asked again (it is kept per
// container).
func TestShellIsTheImages(t *testing.T) {
	m := testManager(t, nil)
	sb := newSandbox(t, m)
	name, path, err := sb.Shell(context.Background())
	if err != nil || name != "sh" || path == "" {
		t.Fatalf("shell %q %q %v", name, path, err)
	}
	if n2, p2, err := sb.Shell(context.Background()); n2 != name || p2 != path || err != nil {
		t.Fatalf("asked again: %q %q %v", n2, p2, err)
	}
}

// TestJobsDoNotOutliveTheirContainer: when a sandbox's container is lost,
// the next call says its jobs ended with it, and the fresh container has
// none: the old job is NOT_FOUND and the list is empty.
func TestJobsDoNotOutliveTheirContainer(t *testing.T) {
	m := testManager(t, nil)
	sb := startedSandbox(t, m)
	id := background(t, sb, "sleep 1000")
	cid := sb.ContainerID()
	if _, err := testenv.Engine(t).ContainerRemove(context.Background(), cid, client.ContainerRemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, testenv.Engine(t), cid)
	_, err := sb.Jobs(context.Background())
	if e := wantCode(t, err, errcode.Unavailable); !strings.Contains(e.Message, "jobs") {
		t.Fatalf("the loss does not say the jobs ended: %s", e.Message)
	}
	jobs, err := sb.Jobs(context.Background())
	if err != nil || len(jobs) != 0 {
		t.Fatalf("a fresh container's jobs: %v %v", jobs, err)
	}
	_, err = sb.Job(context.Background(), JobRequest{Job: id, Max: 10})
	wantCode(t, err, errcode.NotFound)
}

// TestEndedJobHasAllItsOutput: a background job reads as ended only once
// the output it wrote before it exited is kept. Its last bytes may still
// sit in the pipe when the process is reaped; a read that saw the end
// first, with part of the output missing, made a model (and TestStdioJobs)
// miss a trap's last line.
func TestEndedJobHasAllItsOutput(t *testing.T) {
	m := testManager(t, nil)
	sb := startedSandbox(t, m)
	const size = 30000 // within a pipe's buffer (the writer never waits for the reader) and one read
	for i := range 12 {
		id := background(t, sb, fmt.Sprintf(`sleep 0.2; head -c %d /dev/zero | tr '\0' x; exit 4`, size))
		out, st := waitFor(t, sb, id, func(_ string, st agentproto.JobStatus) bool { return st.State != agentproto.JobRunning })
		if len(out) != size || st.ExitCode != 4 {
			t.Fatalf("run %d: the job read as %s (exit %d) with %d of its %d bytes", i, st.State, st.ExitCode, len(out), size)
		}
	}
}
