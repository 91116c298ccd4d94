package session

import (
	"bytes"
	"context"
	"regexp"
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
	// WaitFor, with Wait, waits until a line of new output (either stream)
	// matches it, the job ends, or Wait passes; JobResult.WaitEnd says
	// which. The output of every read on the way is returned.
	WaitFor *regexp.Regexp
}

// maxPartialLine bounds the start of a line kept between reads while
// waiting for a pattern: a longer line is matched on its last bytes only.
const maxPartialLine = 64 << 10

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
	// A start or a re-adoption under way (busy) may bring jobs back.
	return s.cur == nil && s.busy == nil && s.lost == "" && s.restoreFrom == "" && !s.closed
}

// Job acts on one of the sandbox's jobs and reads its output.
func (s *Sandbox) Job(ctx context.Context, req JobRequest) (JobResult, error) {
	if req.WaitFor != nil && req.Wait > 0 {
		return s.jobWaitFor(ctx, req)
	}
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

// jobWaitFor reads a job's output until a new line matches req.WaitFor,
// the job ends, the wait passes, or the output read fills req.Max. Each
// read waits in the agent for new output (no polling): a read returns when
// a line ends or the job ends.
func (s *Sandbox) jobWaitFor(ctx context.Context, req JobRequest) (JobResult, error) {
	deadline := time.Now().Add(req.Wait)
	var acc JobResult
	var partial [2][]byte
	for first := true; ; first = false {
		r := req
		r.WaitFor, r.Wait = nil, max(time.Until(deadline), 0)
		if !first {
			// Stdin, close and signal were done by the first read; the
			// next reads go on where it ended.
			r.Stdin, r.CloseStdin, r.Signal = nil, false, ""
			r.StdoutOffset, r.StderrOffset = -1, -1
			r.Max = req.Max - int64(len(acc.Out[0])+len(acc.Out[1]))
		}
		res, err := s.Job(ctx, r)
		if err != nil {
			return acc, err
		}
		if first {
			acc = res
		} else {
			acc.Status, acc.NetworkRefused = res.Status, res.NetworkRefused
			acc.Out[0] = append(acc.Out[0], res.Out[0]...)
			acc.Out[1] = append(acc.Out[1], res.Out[1]...)
		}
		ended := res.Status.State != agentproto.JobRunning
		for i := range 2 {
			buf := append(partial[i], res.Out[i]...)
			for {
				line, rest, ok := bytes.Cut(buf, []byte("\n"))
				if !ok {
					break
				}
				if req.WaitFor.Match(line) {
					acc.Match, acc.WaitEnd = string(bytes.TrimSuffix(line, []byte("\r"))), agentclient.WaitMatched
					return acc, nil
				}
				buf = rest
			}
			if ended && len(buf) > 0 && req.WaitFor.Match(buf) {
				acc.Match, acc.WaitEnd = string(buf), agentclient.WaitMatched
				return acc, nil
			}
			if len(buf) > maxPartialLine {
				buf = buf[len(buf)-maxPartialLine:]
			}
			partial[i] = append([]byte(nil), buf...)
		}
		switch {
		case ended:
			acc.WaitEnd = agentclient.WaitJobEnded
			return acc, nil
		case int64(len(acc.Out[0])+len(acc.Out[1])) >= req.Max:
			acc.WaitEnd = agentclient.WaitFull
			return acc, nil
		case !time.Now().Before(deadline):
			acc.WaitEnd = agentclient.WaitTimedOut
			return acc, nil
		}
	}
}
