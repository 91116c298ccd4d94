package tools

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/agentclient"
	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session"
)

// NameJob is the name of the tool that reads, waits for, feeds and signals
// jobs.
const NameJob = "sandbox_job"

// JobIn is sandbox_job's input.
type JobIn struct {
	Job          string `json:"job,omitempty" jsonschema:"The job id sandbox_exec returned. Omit it to list the jobs."`
	Stdin        string `json:"stdin,omitempty" jsonschema:"Text written to the job's standard input."`
	CloseStdin   bool   `json:"close_stdin,omitempty" jsonschema:"Close the job's standard input (after stdin, if given)."`
	Signal       string `json:"signal,omitempty" jsonschema:"Send INT, TERM or HUP to the job's processes, or KILL to end it with every process it started."`
	WaitMS       int64  `json:"wait_ms,omitempty" jsonschema:"Wait up to this many milliseconds (at most 60000) for new output or the job's end."`
	WaitFor      string `json:"wait_for,omitempty" jsonschema:"With wait_ms: wait until a new output line matches this regular expression (RE2), e.g. Listening on, instead of the first output."`
	StdoutOffset *int64 `json:"stdout_offset,omitempty" jsonschema:"Read stdout from this byte of the job's kept output. Default: what is new since the last read."`
	StderrOffset *int64 `json:"stderr_offset,omitempty" jsonschema:"Read stderr from this byte. Default: what is new since the last read."`
	Sandbox      string `json:"sandbox,omitempty" jsonschema:"Sandbox handle the job runs in. Default: this session's own."`
}

// JobOut is sandbox_job's output.
type JobOut struct {
	Sandbox       string          `json:"sandbox" jsonschema:"The sandbox of the job."`
	Job           string          `json:"job,omitempty" jsonschema:"The job id."`
	State         string          `json:"state,omitempty" jsonschema:"running, exited or killed."`
	ExitCode      *int            `json:"exit_code,omitempty" jsonschema:"The exit code, once the job ended; 128+N when a signal N ended it."`
	Stdout        string          `json:"stdout" jsonschema:"Standard output read (what is new, or from stdout_offset), at most the output cap."`
	Stderr        string          `json:"stderr" jsonschema:"Standard error read, like stdout."`
	StdoutOffset  int64           `json:"stdout_offset" jsonschema:"The byte after the stdout returned: pass it back to read on."`
	StderrOffset  int64           `json:"stderr_offset" jsonschema:"The byte after the stderr returned."`
	DroppedBytes  int64           `json:"dropped_bytes" jsonschema:"Oldest output no longer kept (past the job's output cap), both streams."`
	NetworkDenied []NetworkDenied `json:"network_denied,omitempty" jsonschema:"Hosts the job could not reach since it started, and why (see sandbox_exec)."`
	Matched       string          `json:"matched,omitempty" jsonschema:"With wait_for: the line that matched."`
	WaitEnded     string          `json:"wait_ended,omitempty" jsonschema:"With wait_for: why the wait ended: matched, job_ended, timed_out or output_cap."`
	Hint          string          `json:"hint,omitempty" jsonschema:"What the result means and what to call next."`
	Jobs          []JobEntry      `json:"jobs,omitempty" jsonschema:"Without job: the sandbox's jobs, oldest first."`
}

// JobEntry is one listed job.
type JobEntry struct {
	Job       string `json:"job"`
	Command   string `json:"command"`
	State     string `json:"state"`
	StartedAt string `json:"started_at" jsonschema:"RFC 3339."`
	ExitCode  *int   `json:"exit_code,omitempty"`
}

func jobDef(p policy.Policy) *mcp.Tool {
	desc := "Use it when a sandbox_exec ran in the background or its output was cut (every exec is a job): read new output or from stdout_offset/stderr_offset, wait_ms for more or the end, write stdin, close_stdin, send a signal. Without job: list the jobs. " +
		fmt.Sprintf("Each job keeps the last %d bytes of each stream; jobs end with the session.", p.MaxJobOutputBytes)
	if p.Exec == policy.ExecDeny {
		desc += " This server does not run commands, so there are no jobs."
	}
	return &mcp.Tool{
		Name:         NameJob,
		Title:        "Read, wait for, feed or signal a job",
		Description:  desc,
		InputSchema:  jobInputSchema(),
		OutputSchema: outputSchema[JobOut](),
		Annotations: &mcp.ToolAnnotations{
			Title:           "Read, wait for, feed or signal a job",
			ReadOnlyHint:    false,
			DestructiveHint: ptr(true), // a signal ends processes
			IdempotentHint:  false,
			OpenWorldHint:   ptr(false),
		},
	}
}

func jobInputSchema() *jsonschema.Schema {
	return inputSchema[JobIn](func(s *jsonschema.Schema) {
		s.Properties["signal"].Enum = []any{"INT", "TERM", "HUP", "KILL"}
		w := s.Properties["wait_ms"]
		w.Minimum, w.Maximum = new(float64(0)), new(float64(policy.MaxJobWait))
		s.Properties["wait_for"].MaxLength = new(policy.MaxWaitFor)
		for _, k := range []string{"stdout_offset", "stderr_offset"} {
			s.Properties[k].Minimum = new(float64(0))
		}
	})
}

func (in JobIn) target() string { return in.Sandbox }

// jobReq is a checked sandbox_job input.
type jobReq struct {
	JobIn
	waitFor *regexp.Regexp
}

func (d *Deps) checkJob(in JobIn) (jobReq, error) {
	req := jobReq{JobIn: in}
	if dec := d.Policy.CanExec(); !dec.Allow {
		return req, dec.Err()
	}
	if in.WaitFor != "" {
		re, dec := policy.CheckWaitFor(in.WaitFor, in.Job, in.WaitMS)
		if !dec.Allow {
			return req, dec.Err()
		}
		req.waitFor = re
	}
	var offsets []int64
	for _, o := range []*int64{in.StdoutOffset, in.StderrOffset} {
		if o != nil {
			offsets = append(offsets, *o)
		}
	}
	if dec := policy.CheckJob(in.Job, in.WaitMS, in.Stdin, in.CloseStdin, in.Signal, offsets...); !dec.Allow {
		return req, dec.Err()
	}
	return req, nil
}

func (d *Deps) job(ctx context.Context, c *call, sb Sandbox, jr jobReq) (*mcp.CallToolResult, JobOut, error) {
	in := jr.JobIn
	out := JobOut{Sandbox: sb.ID()}
	p := d.Policy
	if in.Job == "" {
		jobs, err := sb.Jobs(ctx)
		if err != nil {
			return nil, out, err
		}
		out.Jobs = make([]JobEntry, 0, len(jobs))
		for _, j := range jobs {
			out.Jobs = append(out.Jobs, jobEntry(j))
		}
		if len(out.Jobs) == 0 {
			out.Hint = "No jobs: sandbox_exec starts one (background: true for work that keeps running)"
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: renderJobs(out)}}}, out, nil
	}
	req := session.JobRequest{
		Job: in.Job, Stdin: []byte(in.Stdin), CloseStdin: in.CloseStdin, Signal: in.Signal,
		Wait: time.Duration(in.WaitMS) * time.Millisecond, StdoutOffset: -1, StderrOffset: -1, Max: p.MaxOutputBytes,
		WaitFor: jr.waitFor,
	}
	if in.StdoutOffset != nil {
		req.StdoutOffset = *in.StdoutOffset
	}
	if in.StderrOffset != nil {
		req.StderrOffset = *in.StderrOffset
	}
	res, err := sb.Job(ctx, req)
	if err != nil {
		return nil, out, err
	}
	st := res.Status
	out.Job, out.State = in.Job, st.State
	if st.State != agentproto.JobRunning {
		out.ExitCode = &st.ExitCode
		c.exit = out.ExitCode
	}
	out.Stdout, out.Stderr = toText(res.Out[0]), toText(res.Out[1])
	out.StdoutOffset = res.From[0] + int64(len(res.Out[0]))
	out.StderrOffset = res.From[1] + int64(len(res.Out[1]))
	out.DroppedBytes = st.StdoutDropped + st.StderrDropped
	c.bytes = int64(len(res.Out[0]) + len(res.Out[1]))

	var notes []string
	out.Matched, out.WaitEnded = toText([]byte(res.Match)), res.WaitEnd
	switch res.WaitEnd {
	case agentclient.WaitMatched:
		notes = append(notes, fmt.Sprintf("wait_for matched the line %q", clip(out.Matched, 200)))
	case agentclient.WaitJobEnded:
		notes = append(notes, "The job ended before a line matched wait_for")
	case agentclient.WaitTimedOut:
		notes = append(notes, fmt.Sprintf("No new line matched wait_for within %d ms", in.WaitMS))
	case agentclient.WaitFull:
		notes = append(notes, "The output read reached the result's cap before a line matched wait_for; call again to wait on")
	}
	switch st.State {
	case agentproto.JobRunning:
		if len(res.Out[0])+len(res.Out[1]) == 0 {
			notes = append(notes, fmt.Sprintf("Job %s is still running with no new output; call sandbox_job with wait_ms (up to %d) to wait for more or its end", in.Job, policy.MaxJobWait))
		} else {
			notes = append(notes, fmt.Sprintf("Job %s is still running", in.Job))
		}
	case agentproto.JobKilled:
		notes = append(notes, fmt.Sprintf("Job %s was ended by %s (exit code %d)", in.Job, st.Signal, st.ExitCode))
	default:
		notes = append(notes, fmt.Sprintf("Job %s exited with code %d", in.Job, st.ExitCode))
		notes = append(notes, exitMeaning(st.ExitCode, "", st.StderrBytes > 0))
	}
	if more := (st.StdoutBytes - out.StdoutOffset) + (st.StderrBytes - out.StderrOffset); more > 0 {
		notes = append(notes, fmt.Sprintf("%d more bytes of output are kept: call again to read on (stdout_offset %d, stderr_offset %d)", more, out.StdoutOffset, out.StderrOffset))
	}
	for i, name := range []string{"stdout", "stderr"} {
		asked := []*int64{in.StdoutOffset, in.StderrOffset}[i]
		if asked != nil && *asked < res.From[i] {
			notes = append(notes, fmt.Sprintf("%s before byte %d is no longer kept (each job keeps the last %d bytes of each stream)", name, res.From[i], p.MaxJobOutputBytes))
		}
	}
	if in.Signal != "" && st.Killed > 0 {
		notes = append(notes, fmt.Sprintf("KILL ended %d processes", st.Killed))
	}
	if st.State != agentproto.JobRunning && st.OOMKills > 0 {
		notes = append(notes, outOfMemory(p))
	}
	if out.DroppedBytes > 0 {
		notes = append(notes, longLog)
	}
	failed := st.State != agentproto.JobRunning && st.ExitCode != 0
	finish := func(c *call, answers map[string]approval) (*mcp.CallToolResult, JobOut, error) {
		out := out
		notes := slices.Clone(notes)
		denied, netHint := networkNotes(p, res.NetworkRefused, answers, failed, out.Stdout, out.Stderr)
		out.NetworkDenied = denied
		notes = append(notes, netHint)
		out.Hint = joinHints(notes...)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: renderJob(out)}}}, out, nil
	}
	return approveThen(ctx, d, c, sb, res.NetworkRefused, finish)
}

func jobEntry(j session.JobInfo) JobEntry {
	e := JobEntry{
		Job: fmt.Sprint(j.Job), Command: toText([]byte(j.Label)), State: j.State,
		StartedAt: time.UnixMilli(j.StartedUnixMilli).UTC().Format(time.RFC3339),
	}
	if j.State != agentproto.JobRunning {
		code := j.ExitCode
		e.ExitCode = &code
	}
	return e
}

func renderJobs(out JobOut) string {
	if len(out.Jobs) == 0 {
		return out.Hint + "\n"
	}
	var b strings.Builder
	for _, j := range out.Jobs {
		fmt.Fprintf(&b, "job %s  %s", j.Job, j.State)
		if j.ExitCode != nil {
			fmt.Fprintf(&b, " (exit code %d)", *j.ExitCode)
		}
		fmt.Fprintf(&b, "  started %s  %s\n", j.StartedAt, j.Command)
	}
	return b.String()
}

// renderJob is the text of a job result: its state, the output read and
// the hint, as the structured result has them (see renderExec).
func renderJob(out JobOut) string {
	var b strings.Builder
	fmt.Fprintf(&b, "job %s %s", out.Job, out.State)
	if out.ExitCode != nil {
		fmt.Fprintf(&b, " (exit code %d)", *out.ExitCode)
	}
	fmt.Fprintf(&b, "; stdout_offset %d, stderr_offset %d\n", out.StdoutOffset, out.StderrOffset)
	for _, s := range []struct{ name, text string }{{"stdout", out.Stdout}, {"stderr", out.Stderr}} {
		if s.text == "" {
			continue
		}
		fmt.Fprintf(&b, "--- %s ---\n%s", s.name, s.text)
		if !strings.HasSuffix(s.text, "\n") {
			b.WriteByte('\n')
		}
	}
	if out.Hint != "" {
		b.WriteString("--- hint ---\n" + out.Hint + "\n")
	}
	return b.String()
}
