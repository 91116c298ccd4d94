package agentclient

import (
	"strings"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
)

// TestHostileAgentJobReplies: the replies about jobs are bounded and
// checked like every other: a job read longer than asked for, a status
// for another job or with offsets past the stream, a list longer than the
// agent may keep or naming a job the server never started, and a
// background exec answered with output or a status that is not one all
// end the connection with a protocol error that says so.
func TestHostileAgentJobReplies(t *testing.T) {
	jobRead := func(c *Conn) error {
		_, err := c.Job(ctxFor(t), agentproto.JobRequest{Job: 3, StdoutOffset: -1, StderrOffset: -1, Max: 10})
		return err
	}
	list := func(c *Conn) error {
		c.noteJob(3)
		_, err := c.Jobs(ctxFor(t), 2)
		return err
	}
	background := func(c *Conn) error {
		_, err := c.Exec(ctxFor(t), ExecRequest{Argv: []string{"sleep", "9"}, Cwd: ".", MaxOutput: 10, Background: true}, JobOpts{ID: 3})
		return err
	}
	running := agentproto.JobStatus{Job: 3, State: agentproto.JobRunning}
	for _, tc := range []struct {
		name   string
		call   func(*Conn) error
		answer func(a *agentEnd, req agentproto.Frame)
		why    string
	}{
		{"a job read longer than asked for", jobRead, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindStdout, nil, []byte("0123456"))
			a.send(req.ID, agentproto.KindStderr, nil, []byte("7890"))
			a.send(req.ID, agentproto.KindResult, agentproto.JobStatus{Job: 3, State: agentproto.JobRunning, StdoutBytes: 7, StderrBytes: 4}, nil)
		}, "more than the 10 bytes asked for"},
		{"a status for another job", jobRead, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindResult, agentproto.JobStatus{Job: 4, State: agentproto.JobRunning}, nil)
		}, "job status out of bounds"},
		{"output past what the stream carried", jobRead, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindStdout, nil, []byte("0123"))
			a.send(req.ID, agentproto.KindResult, agentproto.JobStatus{Job: 3, State: agentproto.JobRunning, StdoutFrom: 8, StdoutBytes: 10}, nil)
		}, "job status out of bounds"},
		{"a state that is none", jobRead, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindResult, agentproto.JobStatus{Job: 3, State: "zombie"}, nil)
		}, "job status out of bounds"},
		{"a label past its bound", jobRead, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindResult, agentproto.JobStatus{Job: 3, State: agentproto.JobRunning, Label: strings.Repeat("x", maxJobLabel+1)}, nil)
		}, "job status out of bounds"},
		{"a data frame in answer to a job read", jobRead, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindData, nil, []byte("x"))
		}, "data frame in answer to job"},
		{"a list naming a job never started", list, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindResult, agentproto.JobList{Jobs: []agentproto.JobStatus{{Job: 99, State: agentproto.JobRunning}}}, nil)
		}, "a listed job the server never started"},
		{"a list longer than the agent keeps", list, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindResult, agentproto.JobList{Jobs: []agentproto.JobStatus{running, running, running}}, nil)
		}, "the agent lists 3 jobs, more than the 2 it keeps"},
		{"output from a background exec", background, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindStdout, nil, []byte("x"))
		}, "of stdout asked for"},
		{"a background exec answered with an exit", background, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindExit, agentproto.ExecResult{}, nil)
		}, "exit frame"},
		{"a background exec whose status names another job", background, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindResult, agentproto.JobStatus{Job: 5, State: agentproto.JobRunning}, nil)
		}, "not a background or detached job's status"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, a := hostileConn(t, func(a *agentEnd) {
				if !a.hello() {
					return
				}
				if req, ok := a.next(); ok {
					tc.answer(a, req)
				}
				a.drain()
			})
			start := time.Now()
			err := tc.call(c)
			wantBroken(t, c, a, err, tc.why)
			t.Logf("ended after %s: %v", time.Since(start).Round(time.Millisecond), c.Err())
		})
	}
}
