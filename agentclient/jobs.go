package agentclient

import (
	"context"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
)

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
	// Match is the output line a wait for a pattern matched (without its
	// newline), and WaitEnd why that wait ended: WaitMatched, WaitJobEnded,
	// WaitTimedOut or WaitFull. Both are empty for other reads.
	Match   string
	WaitEnd string
}

// Why a wait for a pattern ended (JobResult.WaitEnd).
const (
	WaitMatched  = "matched"    // a new line matched
	WaitJobEnded = "job_ended"  // the job ended first
	WaitTimedOut = "timed_out"  // the wait passed first
	WaitFull     = "output_cap" // the output read reached the result's cap first
)

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

// Job runs one JobRequest on the agent.
func (c *Conn) Job(ctx context.Context, req agentproto.JobRequest) (JobResult, error) {
	var res JobResult
	var got int64
	timeout := time.Duration(req.WaitMillis)*time.Millisecond + opTimeout
	err := c.roundTrip(ctx, request{
		kind: agentproto.KindJob, body: req, timeout: timeout,
		onStream: func(stream int, p []byte) error {
			if got += int64(len(p)); got > req.Max {
				return fmt.Errorf("%w: a job read returned more than the %d bytes asked for", errProtocol, req.Max)
			}
			res.Out[stream] = append(res.Out[stream], p...)
			return nil
		},
		onResult: func(f agentproto.Frame) error {
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
		},
	})
	return res, err
}

// Jobs lists the agent's jobs; it keeps at most limit.
func (c *Conn) Jobs(ctx context.Context, limit int) ([]JobInfo, error) {
	var out agentproto.JobList
	err := c.roundTrip(ctx, request{
		kind: agentproto.KindJobs, body: agentproto.JobsRequest{}, timeout: opTimeout,
		onResult: func(f agentproto.Frame) error {
			if err := f.Decode(&out); err != nil {
				return fmt.Errorf("%w: %v", errProtocol, err)
			}
			if len(out.Jobs) > limit {
				return fmt.Errorf("%w: the agent lists %d jobs, more than the %d it keeps", errProtocol, len(out.Jobs), limit)
			}
			for _, st := range out.Jobs {
				if !validStatus(st, 0) || !c.KnowsJob(st.Job) {
					return fmt.Errorf("%w: a listed job the server never started, or out of bounds", errProtocol)
				}
			}
			return nil
		},
	})
	return out.Jobs, err
}
