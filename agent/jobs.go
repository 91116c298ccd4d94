package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// Bounds of the job table.
const (
	// defaultKeptJobs is the number of ended jobs kept when the request
	// names no MaxJobs.
	defaultKeptJobs = 8
	// stdinWait bounds how long a job request waits for a command to take
	// the input written to it.
	stdinWait = 5 * time.Second
	// quietWait is how long a job wait goes on, once output came that does
	// not end a line, for more of it: a line written in pieces comes back
	// whole.
	quietWait = 150 * time.Millisecond
	// maxLabel bounds a job's label.
	maxLabel = 256
)

// job is one command the agent ran or runs, with its kept output.
type job struct {
	id      uint64
	label   string
	started time.Time
	group   uint32
	// oomBase is the sandbox's OOM kill count when the job started (-1:
	// the count cannot be read here).
	oomBase int64
	// unprivileged: the job has no group of its own; its processes are
	// found by the process tree (see treeMembers).
	unprivileged bool
	// stdin is the write end of the command's stdin pipe while it is open;
	// stdinSem (one token) serialises writes to it.
	stdin    *os.File
	stdinSem chan struct{}

	mu      sync.Mutex
	out     [2]ring  // stdout, stderr
	cursor  [2]int64 // where the last read of each stream ended
	pgid    int      // the command's pid while it runs, else 0
	ended   bool
	status  agentproto.JobStatus // exit fields, once ended
	readers []*os.File           // read ends of the output pipes
	// changed is closed (and replaced) whenever output arrives or the job
	// ends.
	changed chan struct{}
	// live, while set, gets the output as it is read (a foreground exec's
	// output frames); it runs under mu, so nothing is sent after it is
	// cleared.
	live func(stream int, p []byte)
}

// notify wakes the waiters. j.mu is held.
func (j *job) notify() {
	close(j.changed)
	j.changed = make(chan struct{})
}

// statusLocked is the job's status with its current counts. j.mu is held.
func (j *job) statusLocked() agentproto.JobStatus {
	st := j.status
	st.Job, st.Label = j.id, j.label
	st.StartedUnixMilli = j.started.UnixMilli()
	st.State = agentproto.JobRunning
	if j.ended {
		st.State = j.status.State
	}
	st.StdoutBytes, st.StderrBytes = j.out[0].total, j.out[1].total
	st.StdoutDropped, st.StderrDropped = j.out[0].start(), j.out[1].start()
	return st
}

// jobTable holds a connection's jobs.
type jobTable struct {
	mu   sync.Mutex
	jobs map[uint64]*job
	ids  []uint64 // in start order
}

func newJobTable() *jobTable { return &jobTable{jobs: map[uint64]*job{}} }

// add registers j unless maxRunning jobs run already (0: no limit), and
// drops the oldest ended jobs past keep.
func (t *jobTable) add(j *job, maxRunning int) error {
	keep := maxRunning
	if keep <= 0 {
		keep = defaultKeptJobs
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, dup := t.jobs[j.id]; dup {
		return errcode.Errorf(errcode.InvalidArgument, "job id %d is already in use", j.id)
	}
	running, ended := 0, 0
	for _, o := range t.jobs {
		o.mu.Lock()
		if o.ended {
			ended++
		} else {
			running++
		}
		o.mu.Unlock()
	}
	if maxRunning > 0 && running >= maxRunning {
		return errcode.Errorf(errcode.Busy,
			"%d jobs are already running in this sandbox, the most it runs at once; end one (sandbox_job with signal KILL) or wait for one to finish (sandbox_job with wait_ms)", running)
	}
	// Drop the oldest ended jobs so that at most keep stay.
	for i := 0; ended >= keep && i < len(t.ids); {
		o := t.jobs[t.ids[i]]
		o.mu.Lock()
		done := o.ended
		o.mu.Unlock()
		if !done {
			i++
			continue
		}
		o.drop()
		delete(t.jobs, o.id)
		t.ids = append(t.ids[:i], t.ids[i+1:]...)
		ended--
	}
	t.jobs[j.id] = j
	t.ids = append(t.ids, j.id)
	return nil
}

// remove forgets a job that never started.
func (t *jobTable) remove(id uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.jobs, id)
	for i, o := range t.ids {
		if o == id {
			t.ids = append(t.ids[:i], t.ids[i+1:]...)
			break
		}
	}
}

func (t *jobTable) get(id uint64) (*job, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if j := t.jobs[id]; j != nil {
		return j, nil
	}
	return nil, errcode.Errorf(errcode.NotFound,
		"no job %d in this sandbox: it is not one of its jobs, or it ended long ago and was dropped for newer ones, or the sandbox restarted (jobs do not survive that). Call sandbox_job without job to list the jobs", id)
}

func (t *jobTable) list() []*job {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*job, 0, len(t.ids))
	for _, id := range t.ids {
		out = append(out, t.jobs[id])
	}
	return out
}

// drop closes what a job holds, once it is no longer kept. Output readers
// still running (a process it left behind holds the pipe) end.
func (j *job) drop() {
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, r := range j.readers {
		r.Close()
	}
	j.out = [2]ring{}
}

// killAll kills every process of every job, when the connection ends.
func (t *jobTable) killAll() {
	for _, j := range t.list() {
		j.mu.Lock()
		pgid := j.pgid
		j.mu.Unlock()
		killTree(pgid, j.members(pgid))
		j.drop()
	}
}

// pump reads one output stream of j to EOF into its ring, passing it to
// j.live while that is set, so the command never blocks on a full pipe.
func (j *job) pump(stream int, r *os.File) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			j.mu.Lock()
			j.out[stream].write(buf[:n])
			if j.live != nil {
				j.live(stream, buf[:n])
			}
			j.notify()
			j.mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}

// finish records how the job's command ended.
func (j *job) finish(st *os.ProcessState, timedOut bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.ended = true
	j.pgid = 0
	j.status.TimedOut = timedOut
	if n, ok := oomKills(); ok && j.oomBase >= 0 {
		j.status.OOMKills = max(n-j.oomBase, 0)
	}
	j.status.State = agentproto.JobExited
	if st != nil {
		if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			j.status.ExitCode = 128 + int(ws.Signal())
			j.status.Signal = unix.SignalName(ws.Signal())
			j.status.State = agentproto.JobKilled
		} else {
			j.status.ExitCode = st.ExitCode()
		}
	}
	j.notify()
}

// closeStdin closes the command's stdin once.
func (j *job) closeStdin() {
	j.stdinSem <- struct{}{}
	defer func() { <-j.stdinSem }()
	if j.stdin != nil {
		j.stdin.Close()
		j.stdin = nil
	}
}

// writeStdin writes p to the command's stdin, waiting at most stdinWait
// for it to be taken.
func (j *job) writeStdin(ctx context.Context, p []byte) error {
	t := time.NewTimer(stdinWait)
	defer t.Stop()
	select {
	case j.stdinSem <- struct{}{}:
	case <-t.C:
		return errcode.Errorf(errcode.Busy, "job %d's earlier input is still waiting to be read; try again later", j.id)
	case <-ctx.Done():
		return errcode.Errorf(errcode.Timeout, "the request was cancelled")
	}
	defer func() { <-j.stdinSem }()
	if j.stdin == nil {
		return errcode.Errorf(errcode.InvalidArgument, "job %d's stdin is closed (close_stdin was sent, or the job ended); start a new job to give it input", j.id)
	}
	_ = j.stdin.SetWriteDeadline(time.Now().Add(stdinWait))
	n, err := j.stdin.Write(p)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		return errcode.Errorf(errcode.Busy, "job %d took only %d of the %d bytes of stdin within %s: it is not reading its input; the rest was not written", j.id, n, len(p), stdinWait)
	case errors.Is(err, syscall.EPIPE):
		return errcode.Errorf(errcode.InvalidArgument, "job %d no longer reads its stdin (no process has it open)", j.id)
	}
	return fmt.Errorf("write stdin of job %d: %w", j.id, err)
}

// signal sends sig to every process of the job, or with KILL kills its
// whole tree, and returns how many were killed.
func (j *job) signal(name string) (int, error) {
	var sig unix.Signal
	switch name {
	case "INT":
		sig = unix.SIGINT
	case "TERM":
		sig = unix.SIGTERM
	case "HUP":
		sig = unix.SIGHUP
	case "KILL":
		j.mu.Lock()
		pgid := j.pgid
		j.mu.Unlock()
		return killTree(pgid, j.members(pgid)), nil
	default:
		return 0, errcode.Errorf(errcode.InvalidArgument, "signal %q is not one of INT, TERM, HUP, KILL", name)
	}
	j.mu.Lock()
	pgid := j.pgid
	if pgid > 0 {
		// The command's process group, while its leader is not reaped
		// (j.mu keeps finish from clearing it meanwhile).
		_ = unix.Kill(-pgid, sig)
	}
	j.mu.Unlock()
	// And every process that left the group but holds the job's
	// supplementary group (unprivileged: descends from the job's process
	// group).
	isMember := j.members(pgid)
	found := map[int]*member{}
	for _, p := range scanProcs() {
		if p.live && isMember(p, found) {
			if m := openMember(p.pid, found, isMember); m != nil {
				found[p.pid] = m
			}
		}
	}
	for _, m := range found {
		m.signal(sig)
		m.close()
	}
	return 0, nil
}

// members finds the job's processes: by its group, or, unprivileged, by
// the process tree from its process group pgid.
func (j *job) members(pgid int) func(procInfo, map[int]*member) bool {
	if j.unprivileged {
		return treeMembers(pgid, true)
	}
	return groupMembers(j.group)
}

// splitBudget shares max bytes between two streams with a and b bytes to
// give: each gets what it has if that fits, else the one with less keeps
// all of its own and the other takes the rest, or each gets half.
func splitBudget(max, a, b int64) (int64, int64) {
	switch half := max / 2; {
	case a+b <= max:
		return a, b
	case a <= half:
		return a, max - a
	case b <= max-half:
		return max - b, b
	default:
		return half, max - half
	}
}

// jobOp carries out a JobRequest.
func (s *server) jobOp(ctx context.Context, c *call, req agentproto.JobRequest) {
	j, err := s.jobs.get(req.Job)
	if err != nil {
		s.sendError(c.id, err)
		return
	}
	if len(req.Stdin) > 0 {
		if err := j.writeStdin(ctx, req.Stdin); err != nil {
			s.sendError(c.id, err)
			return
		}
	}
	if req.CloseStdin {
		j.closeStdin()
	}
	killed := 0
	if req.Signal != "" {
		if killed, err = j.signal(req.Signal); err != nil {
			s.sendError(c.id, err)
			return
		}
	}
	j.mu.Lock()
	from := [2]int64{req.StdoutOffset, req.StderrOffset}
	for i := range from {
		if from[i] < 0 {
			from[i] = j.cursor[i]
		}
	}
	if req.WaitMillis > 0 {
		j.waitOutput(ctx, from, time.Duration(req.WaitMillis)*time.Millisecond, max(req.Max, 0))
	}
	var data [2][]byte
	var at [2]int64
	for i := range from {
		at[i] = min(max(from[i], j.out[i].start()), j.out[i].total)
	}
	n0, n1 := splitBudget(max(req.Max, 0), j.out[0].total-at[0], j.out[1].total-at[1])
	data[0], at[0] = j.out[0].read(at[0], n0)
	data[1], at[1] = j.out[1].read(at[1], n1)
	if !req.Peek {
		for i := range data {
			j.cursor[i] = at[i] + int64(len(data[i]))
		}
	}
	st := j.statusLocked()
	j.mu.Unlock()
	st.StdoutFrom, st.StderrFrom = at[0], at[1]
	st.Killed = killed
	for i, kind := range []agentproto.Kind{agentproto.KindStdout, agentproto.KindStderr} {
		w := chunkWriter{s: s, id: c.id, kind: kind}
		if _, err := w.Write(data[i]); err != nil {
			s.sendError(c.id, err)
			return
		}
	}
	s.finish(c.id, st, nil)
}

// waitOutput waits, up to d, for the job to end or for output past from:
// output that ends a line in each stream that has some, limit bytes of
// it, or output followed by quietWait of silence. j.mu is held, and
// released while it waits.
func (j *job) waitOutput(ctx context.Context, from [2]int64, d time.Duration, limit int64) {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	var quiet *time.Timer
	var quietC <-chan time.Time
	defer func() {
		if quiet != nil {
			quiet.Stop()
		}
	}()
	for !j.ended {
		if n := j.out[0].total - from[0] + j.out[1].total - from[1]; n > 0 {
			if n >= limit || j.endsLines(from) {
				return
			}
			// Output came that ends no line: wait for the rest of the
			// line, or for quietWait without output.
			if quiet == nil {
				quiet = time.NewTimer(quietWait)
				quietC = quiet.C
			} else {
				quiet.Reset(quietWait)
			}
		}
		ch := j.changed
		j.mu.Unlock()
		stop := false
		select {
		case <-ch:
		case <-quietC:
			stop = true
		case <-deadline.C:
			stop = true
		case <-ctx.Done():
			stop = true
		}
		j.mu.Lock()
		if stop {
			return
		}
	}
}

// endsLines reports whether each stream with output past from ends with a
// line end (or keeps none of it to tell). j.mu is held.
func (j *job) endsLines(from [2]int64) bool {
	for i := range j.out {
		r := &j.out[i]
		if r.total <= from[i] || r.total <= r.start() {
			continue
		}
		if b, _ := r.read(r.total-1, 1); len(b) == 1 && b[0] != '\n' {
			return false
		}
	}
	return true
}

// oomKills reads how many processes the kernel killed for memory in this
// sandbox's memory cgroup: cgroup v2's memory.events or v1's
// memory.oom_control, as a container sees its own cgroup. The workspace
// is a tmpfs, so its files count against that memory too.
func oomKills() (int64, bool) {
	for _, path := range []string{"/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"} {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		for line := range bytes.Lines(b) {
			if f := bytes.Fields(line); len(f) == 2 && string(f[0]) == "oom_kill" {
				if n, err := strconv.ParseInt(string(f[1]), 10, 64); err == nil {
					return n, true
				}
			}
		}
	}
	return 0, false
}

// listJobs answers a JobsRequest.
func (s *server) listJobs(c *call) {
	var out agentproto.JobList
	for _, j := range s.jobs.list() {
		j.mu.Lock()
		out.Jobs = append(out.Jobs, j.statusLocked())
		j.mu.Unlock()
	}
	if out.Jobs == nil {
		out.Jobs = []agentproto.JobStatus{}
	}
	s.finish(c.id, out, nil)
}
