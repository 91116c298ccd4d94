package session

import (
	"context"
	"strconv"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agentclient"
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
type JobResult = agentclient.JobResult

// JobInfo is one listed job.
type JobInfo = agentclient.JobInfo

// jobOpts gives the next exec its job id and the policy's job bounds.
func (s *Sandbox) jobOpts() agentclient.JobOpts {
	p := s.tpl.Policy
	return agentclient.JobOpts{ID: s.jobSeq.Add(1), KeepOutput: p.MaxJobOutputBytes, MaxJobs: p.MaxExecs}
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
	return call(ctx, s, func(ctx context.Context, inst *instance) (JobResult, error) {
		if !inst.conn.KnowsJob(id) {
			return JobResult{}, errcode.Errorf(errcode.NotFound,
				"no job %d in this sandbox: its jobs are the ones sandbox_exec started since it (re)started (a restarted sandbox has none). Call sandbox_job without job to list them", id)
		}
		res, err := inst.conn.Job(ctx, agentproto.JobRequest{
			Job: id, Stdin: req.Stdin, CloseStdin: req.CloseStdin, Signal: req.Signal,
			WaitMillis: req.Wait.Milliseconds(), StdoutOffset: req.StdoutOffset, StderrOffset: req.StderrOffset, Max: req.Max,
			Peek: req.Peek,
		})
		if err == nil {
			res.NetworkRefused = s.m.refusedSince(s.id, time.UnixMilli(res.Status.StartedUnixMilli))
		}
		return res, err
	})
}

// Jobs lists the sandbox's jobs, oldest first.
func (s *Sandbox) Jobs(ctx context.Context) ([]JobInfo, error) {
	if s.idle() {
		return nil, nil
	}
	return call(ctx, s, func(ctx context.Context, inst *instance) ([]JobInfo, error) {
		// The agent keeps the running jobs and as many ended ones.
		return inst.conn.Jobs(ctx, 2*s.tpl.Policy.MaxExecs+1)
	})
}
