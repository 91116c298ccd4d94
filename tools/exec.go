package tools

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session"
)

// ExecIn is sandbox_exec's input.
type ExecIn struct {
	Argv       []string          `json:"argv,omitempty" jsonschema:"The program and its arguments, one item each (no shell): [\"ls\", \"-la\"]. Give argv or command."`
	Command    string            `json:"command,omitempty" jsonschema:"A shell line run by bash -c (sh -c where the image has no bash): pipes, &&, redirection. Give argv or command."`
	Cwd        string            `json:"cwd,omitempty" jsonschema:"Working directory, relative to /workspace. Default: the workspace root."`
	Env        map[string]string `json:"env,omitempty" jsonschema:"Extra environment variables for the command, at most 64 KiB in all."`
	Stdin      string            `json:"stdin,omitempty" jsonschema:"Text fed to the command's standard input. Default: empty."`
	TimeoutMS  int64             `json:"timeout_ms,omitempty" jsonschema:"Kill the command (and everything it started) after this many milliseconds."`
	Background bool              `json:"background,omitempty" jsonschema:"Return at once with the job id; read its output, wait, send stdin or a signal with sandbox_job. For servers, watchers, long builds."`
	Sandbox    string            `json:"sandbox,omitempty" jsonschema:"Sandbox id to run in. Default: this session's sandbox."`
}

// ExecOut is sandbox_exec's output.
type ExecOut struct {
	Sandbox         string `json:"sandbox" jsonschema:"The sandbox the command ran in."`
	Job             string `json:"job" jsonschema:"The command's job id: pass it to sandbox_job to read the output kept, or to wait for, feed or signal a background job."`
	Running         bool   `json:"running,omitempty" jsonschema:"True when the job runs in the background."`
	ExitCode        int    `json:"exit_code" jsonschema:"The command's exit code; 128+N when a signal N ended it."`
	Stdout          string `json:"stdout" jsonschema:"Standard output; a long one keeps its head and tail with a line saying what was left out. Bytes that are not UTF-8 are replaced with U+FFFD."`
	Stderr          string `json:"stderr" jsonschema:"Standard error, like stdout."`
	StdoutTruncated bool   `json:"stdout_truncated" jsonschema:"True when part of stdout was left out (hint says how to read it)."`
	StderrTruncated bool   `json:"stderr_truncated" jsonschema:"True when part of stderr was left out (hint says how to read it)."`
	TimedOut        bool   `json:"timed_out" jsonschema:"True when the command hit its timeout and was killed."`
	DurationMS      int64  `json:"duration_ms" jsonschema:"How long the command ran, in milliseconds."`
	Hint            string `json:"hint,omitempty" jsonschema:"What the result means and what to call next, when there is something to say."`
}

// maxLabel bounds a job's label (the command as listed).
const maxLabel = 200

func (d *Deps) exec(ctx context.Context, c *call, in ExecIn) (*mcp.CallToolResult, ExecOut, error) {
	var out ExecOut
	p := d.Policy
	if dec := p.CanExec(); !dec.Allow {
		return nil, out, dec.Err()
	}
	if dec := policy.CheckCommand(in.Argv, in.Command); !dec.Allow {
		return nil, out, dec.Err()
	}
	mistake := ""
	if in.Command == "" {
		m, refuse := policy.ArgvMistake(in.Argv)
		if refuse {
			return nil, out, errcode.Errorf(errcode.InvalidArgument, "%s", m)
		}
		mistake = m
		if dec := policy.CheckArgv(in.Argv); !dec.Allow {
			return nil, out, dec.Err()
		}
	}
	env, dec := policy.CheckEnv(in.Env)
	if !dec.Allow {
		return nil, out, dec.Err()
	}
	cwd, dec := policy.WorkspacePath(in.Cwd)
	if !dec.Allow {
		return nil, out, dec.Err()
	}
	timeout, dec := p.ExecTimeoutFor(in.TimeoutMS)
	if !dec.Allow {
		return nil, out, dec.Err()
	}
	if in.Background && in.TimeoutMS == 0 {
		timeout = 0 // a background job runs until it ends or is signalled
	}
	sb, err := d.Sessions.sandbox(c, in.Sandbox)
	if err != nil {
		return nil, out, err
	}
	out.Sandbox = sb.ID()

	argv, label := in.Argv, strings.Join(in.Argv, " ")
	program := ""
	if in.Command != "" {
		label = in.Command
		// The image's bash, else its sh, runs the line.
		shells, err := sb.Resolve(ctx, policy.Shells, ".")
		if err != nil {
			return nil, out, err
		}
		shell, resolved := policy.Shells[0], ""
		for i, r := range shells {
			if r != "" {
				shell, resolved = policy.Shells[i], r
				break
			}
		}
		var allowed map[string]string
		if p.NeedsResolve() {
			if allowed, err = sb.AllowedPrograms(ctx); err != nil {
				return nil, out, err
			}
		}
		if dec := p.CheckShell(shell, resolved, allowed); !dec.Allow {
			return nil, out, dec.Err()
		}
		argv, program = []string{shell, "-c", in.Command}, resolved
	} else if p.NeedsResolve() {
		resolved, err := sb.Resolve(ctx, in.Argv[:1], cwd)
		if err != nil {
			return nil, out, err
		}
		allowed, err := sb.AllowedPrograms(ctx)
		if err != nil {
			return nil, out, err
		}
		if dec := p.CheckProgram(in.Argv[0], resolved[0], allowed); !dec.Allow {
			return nil, out, dec.Err()
		}
		program = resolved[0]
	}
	if len(label) > maxLabel {
		cut := maxLabel
		for cut > 0 && !utf8.RuneStart(label[cut]) {
			cut--
		}
		label = label[:cut] + "..."
	}
	var stdin []byte
	if in.Stdin != "" {
		stdin = []byte(in.Stdin)
	}
	req := session.ExecRequest{
		Argv: argv, Program: program, Cwd: cwd, Env: env, Stdin: stdin,
		Timeout: timeout, MaxOutput: p.MaxOutputBytes, Background: in.Background, Label: label,
	}
	var prog *progress
	if tok := c.req.Params.GetProgressToken(); tok != nil && !in.Background {
		prog = newProgress(ctx, c.req.Session, tok)
		req.OnOutput = prog.output
	}
	res, err := sb.Exec(ctx, req)
	if prog != nil {
		prog.done() // every notification goes before the result
	}
	if err != nil {
		if e, ok := errcode.As(err); ok && e.Code == errcode.NotFound && mistake != "" {
			return nil, out, errcode.Errorf(errcode.NotFound, "%s. %s", strings.TrimSuffix(e.Message, "."), mistake)
		}
		return nil, out, err
	}
	out.Job = res.Job
	if res.Running {
		out.Running = true
		out.Hint = fmt.Sprintf("Job %s runs in the background. Read its output with sandbox_job (job %q, wait_ms up to 60000 to wait for more or its end); send stdin, close_stdin or a signal (TERM, KILL) the same way", res.Job, res.Job)
		if mistake != "" {
			out.Hint = joinHints(out.Hint, mistake)
		}
		c.bytes = 0
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "job " + res.Job + " started in the background\n" + out.Hint + "\n"}}}, out, nil
	}
	streams := [2]cutStream{
		{name: "stdout", head: res.Stdout, tail: res.StdoutTail, omitted: res.StdoutOmitted, job: res.Job},
		{name: "stderr", head: res.Stderr, tail: res.StderrTail, omitted: res.StderrOmitted, job: res.Job},
	}
	out.ExitCode = res.ExitCode
	out.Stdout = streams[0].text()
	out.Stderr = streams[1].text()
	out.StdoutTruncated = res.StdoutTruncated
	out.StderrTruncated = res.StderrTruncated
	out.TimedOut = res.TimedOut
	out.DurationMS = res.Duration.Milliseconds()
	var notes []string
	if res.TimedOut {
		notes = append(notes, timedOut(timeout).Message)
	} else {
		notes = append(notes, exitMeaning(res.ExitCode, res.Signal))
	}
	for _, s := range streams {
		notes = append(notes, s.note())
		if !utf8.Valid(s.head) || !utf8.Valid(s.tail) {
			notes = append(notes, s.name+" was not valid UTF-8 (invalid bytes are shown as U+FFFD); redirect it to a file and read that with sandbox_read_file for the exact bytes (base64)")
		}
	}
	notes = append(notes, mistake)
	out.Hint = joinHints(notes...)
	c.exit = &out.ExitCode
	c.bytes = int64(len(out.Stdout) + len(out.Stderr))

	result := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: renderExec(out)}}}
	if out.TimedOut {
		result.SetError(timedOut(timeout)) // the text below starts with it
	}
	return result, out, nil
}

// timedOut is the error of a command killed at its timeout.
func timedOut(timeout time.Duration) *errcode.Error {
	return errcode.Errorf(errcode.Timeout, "the command ran longer than its timeout of %s and was killed with every process it started; its partial output follows. Raise timeout_ms, or run long work with background: true and poll it with sandbox_job", timeout)
}

// renderExec is the text a model reads where a client shows the text: a
// status line, each stream, and the hint.
func renderExec(out ExecOut) string {
	var b strings.Builder
	if out.TimedOut {
		b.WriteString("TIMEOUT: ")
	} else {
		fmt.Fprintf(&b, "exit code %d (%d ms, job %s)\n", out.ExitCode, out.DurationMS, out.Job)
	}
	if out.TimedOut {
		// The hint starts with the timeout's sentence.
		b.WriteString(out.Hint + "\n")
	}
	section := func(name, s string) {
		if s == "" {
			return
		}
		fmt.Fprintf(&b, "--- %s ---\n%s", name, s)
		if !strings.HasSuffix(s, "\n") {
			b.WriteByte('\n')
		}
	}
	section("stdout", out.Stdout)
	section("stderr", out.Stderr)
	if out.Hint != "" && !out.TimedOut {
		b.WriteString("--- hint ---\n" + out.Hint + "\n")
	}
	return b.String()
}
