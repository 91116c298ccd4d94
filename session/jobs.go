package session

import (
	"context"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// JobRequest acts on a job and reads its output (see agentproto.JobRequest).
type JobRequest struct {
	Job        string
	Stdin      []byte
	CloseStdin bool
	Signal     string // INT, TERM, HUP, KILL or ""
	Wait       time.Duration
	// StdoutOffset and StderrOffset start the reads there; -1 reads on from
	// where the last read of the stream ended.
	StdoutOffset, StderrOffset int64
	// Max bounds the output returned, both streams together.
	Max int64
	// Peek reads without moving where the next read of new output starts.
	Peek bool
}

// JobResult is a job's state and the output read.
type JobResult struct {
	Status agentproto.JobStatus
	// Out holds what was read of stdout and stderr; From where each
	// begins in its stream.
	Out  [2][]byte
	From [2]int64
	// NetworkRefused lists what the egress proxy refused the sandbox
	// since the job started (see ExecResult.NetworkRefused).
	NetworkRefused []NetworkRefusal
}

// JobInfo is one listed job.
type JobInfo = agentproto.JobStatus

// Bounds on what the server takes from the agent about jobs.
const (
	maxJobLabel = 1 << 10
	maxSignal   = 16
)

// validStatus checks a job status from the agent against the job asked
// about (0: any job this conn knows is checked by the caller).
func validStatus(st agentproto.JobStatus, job uint64) bool {
	switch st.State {
	case agentproto.JobRunning, agentproto.JobExited, agentproto.JobKilled:
	default:
		return false
	}
	ok := func(from, total, dropped int64) bool {
		return from >= 0 && from <= total && dropped >= 0 && dropped <= total
	}
	return (job == 0 || st.Job == job) && len(st.Label) <= maxJobLabel && utf8.ValidString(st.Label) &&
		len(st.Signal) <= maxSignal && st.Killed >= 0 && st.OOMKills >= 0 &&
		ok(st.StdoutFrom, st.StdoutBytes, st.StdoutDropped) && ok(st.StderrFrom, st.StderrBytes, st.StderrDropped)
}

// job runs one JobRequest on the agent.
func (c *conn) job(ctx context.Context, req agentproto.JobRequest) (JobResult, error) {
	var res JobResult
	var got int64
	timeout := time.Duration(req.WaitMillis)*time.Millisecond + opTimeout
	err := c.roundTripStreams(ctx, timeout, agentproto.KindJob, req,
		func(stream int, p []byte) error {
			if got += int64(len(p)); got > req.Max {
				return fmt.Errorf("%w: a job read returned more than the %d bytes asked for", errProtocol, req.Max)
			}
			res.Out[stream] = append(res.Out[stream], p...)
			return nil
		},
		func(f agentproto.Frame) error {
			if err := f.Decode(&res.Status); err != nil {
				return fmt.Errorf("%w: %v", errProtocol, err)
			}
			st := res.Status
			if !validStatus(st, req.Job) ||
				st.StdoutFrom+int64(len(res.Out[0])) > st.StdoutBytes || st.StderrFrom+int64(len(res.Out[1])) > st.StderrBytes {
				return fmt.Errorf("%w: a job status out of bounds", errProtocol)
			}
			res.From = [2]int64{st.StdoutFrom, st.StderrFrom}
			return nil
		})
	return res, err
}

// jobs lists the agent's jobs; it keeps at most limit.
func (c *conn) jobs(ctx context.Context, limit int) ([]JobInfo, error) {
	var out agentproto.JobList
	err := c.roundTrip(ctx, opTimeout, agentproto.KindJobs, agentproto.JobsRequest{}, nil, nil,
		func(f agentproto.Frame) error {
			if err := f.Decode(&out); err != nil {
				return fmt.Errorf("%w: %v", errProtocol, err)
			}
			if len(out.Jobs) > limit {
				return fmt.Errorf("%w: the agent lists %d jobs, more than the %d it keeps", errProtocol, len(out.Jobs), limit)
			}
			for _, st := range out.Jobs {
				if !validStatus(st, 0) || !c.knowsJob(st.Job) {
					return fmt.Errorf("%w: a listed job the server never started, or out of bounds", errProtocol)
				}
			}
			return nil
		})
	return out.Jobs, err
}

// jobOpts gives the next exec its job id and the policy's job bounds.
func (s *Sandbox) jobOpts() jobOpts {
	p := s.m.opts.Policy
	return jobOpts{id: s.jobSeq.Add(1), keepOutput: p.MaxJobOutputBytes, maxJobs: p.MaxExecs}
}

// parseJob reads a job id as the model passes it.
func parseJob(id string) (uint64, error) {
	n, err := strconv.ParseUint(id, 10, 64)
	if err != nil || n == 0 {
		return 0, errcode.Errorf(errcode.InvalidArgument, "job %q is not a job id; pass the job a sandbox_exec result gave, or call sandbox_job without job to list them", clipID(id))
	}
	return n, nil
}

func clipID(s string) string {
	if len(s) > 32 {
		return s[:32] + "..."
	}
	return s
}

// idle reports whether the sandbox has no container yet and nothing to
// report about a lost one: it has no jobs, and asking about them need not
// start one.
func (s *Sandbox) idle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur == nil && s.lost == "" && s.restoreFrom == "" && !s.closed
}

// Job acts on one of the sandbox's jobs and reads its output.
func (s *Sandbox) Job(ctx context.Context, req JobRequest) (JobResult, error) {
	id, err := parseJob(req.Job)
	if err != nil {
		return JobResult{}, err
	}
	if s.idle() {
		return JobResult{}, errcode.Errorf(errcode.NotFound, "no job %d in this sandbox: no command has run in its current container (jobs do not survive a restart); sandbox_exec starts jobs", id)
	}
	ctx, end := s.begin(ctx)
	defer end()
	inst, err := s.ready(ctx)
	if err != nil {
		return JobResult{}, err
	}
	if !inst.conn.knowsJob(id) {
		return JobResult{}, errcode.Errorf(errcode.NotFound,
			"no job %d in this sandbox: its jobs are the ones sandbox_exec started since it (re)started (a restarted sandbox has none). Call sandbox_job without job to list them", id)
	}
	res, err := inst.conn.job(ctx, agentproto.JobRequest{
		Job: id, Stdin: req.Stdin, CloseStdin: req.CloseStdin, Signal: req.Signal,
		WaitMillis: req.Wait.Milliseconds(), StdoutOffset: req.StdoutOffset, StderrOffset: req.StderrOffset, Max: req.Max,
		Peek: req.Peek,
	})
	if err == nil {
		res.NetworkRefused = s.m.refusedSince(s.id, time.UnixMilli(res.Status.StartedUnixMilli))
	}
	return res, s.failed(inst, err)
}

// Jobs lists the sandbox's jobs, oldest first.
func (s *Sandbox) Jobs(ctx context.Context) ([]JobInfo, error) {
	if s.idle() {
		return nil, nil
	}
	ctx, end := s.begin(ctx)
	defer end()
	inst, err := s.ready(ctx)
	if err != nil {
		return nil, err
	}
	// The agent keeps the running jobs and as many ended ones.
	out, err := inst.conn.jobs(ctx, 2*s.m.opts.Policy.MaxExecs+1)
	return out, s.failed(inst, err)
}
