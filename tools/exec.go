package tools

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session"
)

// NameExec is the name of the tool that runs a command.
const NameExec = "sandbox_exec"

// ExecIn is sandbox_exec's input.
type ExecIn struct {
	Argv       []string          `json:"argv,omitempty" jsonschema:"The program and its arguments, one item each (no shell): [\"ls\", \"-la\"]. Give argv or command."`
	Command    string            `json:"command,omitempty" jsonschema:"A shell line run by bash -c (sh -c where the image has no bash): pipes, &&, redirection. Give argv or command."`
	Cwd        string            `json:"cwd,omitempty" jsonschema:"Working directory, relative to /workspace. Default: the workspace root."`
	Env        map[string]string `json:"env,omitempty" jsonschema:"Extra environment variables for the command, at most 64 KiB in all."`
	Stdin      string            `json:"stdin,omitempty" jsonschema:"Text fed to the command's standard input. Default: empty."`
	TimeoutMS  int64             `json:"timeout_ms,omitempty" jsonschema:"Kill the command (and everything it started) after this many milliseconds."`
	Background bool              `json:"background,omitempty" jsonschema:"Return at once with the job id; read its output, wait, send stdin or a signal with sandbox_job. For servers, watchers, long builds."`
	Sandbox    string            `json:"sandbox,omitempty" jsonschema:"Sandbox handle to run in. Default: this session's own."`
}

// ExecOut is sandbox_exec's output.
type ExecOut struct {
	Sandbox         string          `json:"sandbox" jsonschema:"The sandbox the command ran in."`
	Job             string          `json:"job" jsonschema:"The command's job id: pass it to sandbox_job to read the output kept, or to wait for, feed or signal a background job."`
	Running         bool            `json:"running,omitempty" jsonschema:"True while the command runs on as its job: started in the background, or still running at the server's call wait (hint says how to follow it)."`
	ExitCode        *int            `json:"exit_code,omitempty" jsonschema:"The command's exit code, once it ended; 128+N when a signal N ended it."`
	Stdout          string          `json:"stdout" jsonschema:"Standard output; a long one keeps its head and tail with a line saying what was left out. Bytes that are not UTF-8 are replaced with U+FFFD."`
	Stderr          string          `json:"stderr" jsonschema:"Standard error, like stdout."`
	StdoutTruncated bool            `json:"stdout_truncated" jsonschema:"True when part of stdout was left out (hint says how to read it)."`
	StderrTruncated bool            `json:"stderr_truncated" jsonschema:"True when part of stderr was left out (hint says how to read it)."`
	TimedOut        bool            `json:"timed_out" jsonschema:"True when the command hit its timeout and was killed."`
	DurationMS      *int64          `json:"duration_ms,omitempty" jsonschema:"How long the command ran, in milliseconds, once it ended."`
	NetworkDenied   []NetworkDenied `json:"network_denied,omitempty" jsonschema:"Hosts the command could not reach while it ran, and why (hint says it too): refused by the egress proxy, or, for a failed command, names its output shows did not resolve."`
	Hint            string          `json:"hint,omitempty" jsonschema:"What the result means and what to call next, when there is something to say."`
}

func execDef(p policy.Policy) *mcp.Tool {
	desc := "Run a command in the sandbox (a Linux container) and return its exit code and output. " +
		"Give argv (a program and its arguments, no shell) or command (a shell line). " +
		"The working directory is /workspace (or cwd, relative to it); files persist between calls, the shell's cd and variables do not. " +
		"A non-zero exit code is a normal result. Past timeout_ms the command is killed with every process it started. " +
		"Long output keeps its head and tail; the rest is read with sandbox_job. background: true returns at once (servers, watchers, long builds)."
	switch p.Exec {
	case policy.ExecAllowlist:
		desc += " Only these commands may run: " + joinComma(p.AllowCmds) + "."
		if !p.ShellLines() {
			desc += " argv only; shell lines (command) are refused here."
		}
	case policy.ExecDeny:
		desc += " This server does not run commands; every call is refused."
	}
	return &mcp.Tool{
		Name:         NameExec,
		Title:        "Run a command in the sandbox",
		Description:  desc,
		InputSchema:  execInputSchema(p),
		OutputSchema: outputSchema[ExecOut](),
		Annotations: &mcp.ToolAnnotations{
			Title:           "Run a command in the sandbox",
			ReadOnlyHint:    false,
			DestructiveHint: ptr(true),
			IdempotentHint:  false,
			OpenWorldHint:   ptr(p.Network != policy.NetworkNone),
		},
	}
}

func execInputSchema(p policy.Policy) *jsonschema.Schema {
	return inputSchema[ExecIn](func(s *jsonschema.Schema) {
		argv := s.Properties["argv"]
		argv.MinItems, argv.MaxItems = intp(1), intp(policy.MaxArgv)
		argv.Items.MinLength = nil
		env := s.Properties["env"]
		env.PropertyNames = &jsonschema.Schema{Type: "string", Pattern: `^[A-Za-z_][A-Za-z0-9_]*$`}
		to := s.Properties["timeout_ms"]
		to.Minimum = new(float64(0))
		to.Maximum = new(float64(p.MaxExecTimeout.Milliseconds()))
		to.Description += fmt.Sprintf(" Default %d, at most %d.", p.ExecTimeout.Milliseconds(), p.MaxExecTimeout.Milliseconds())
		if p.Exec == policy.ExecAllowlist && !p.ShellLines() {
			s.Properties["command"].Description = "Refused here: this server's allowlist has no shell. Use argv."
		}
	})
}

func joinComma(s []string) string {
	out := ""
	for i, v := range s {
		if i > 0 {
			out += ", "
		}
		out += v
	}
	return out
}

// maxLabel bounds a job's label (the command as listed).
const maxLabel = 200

func (in ExecIn) target() string { return in.Sandbox }

// execReq is a command policy let through: the input with its cwd made
// relative to the workspace, and what the checks found.
type execReq struct {
	ExecIn
	env     []string
	timeout time.Duration // 0: a background job without a timeout
	// mistake is what looks wrong in argv without being refused (a shell
	// line in one item, say), told to the model with the result.
	mistake string
}

func (d *Deps) checkExec(in ExecIn) (execReq, error) {
	p := d.Policy
	if dec := p.CanExec(); !dec.Allow {
		return execReq{}, dec.Err()
	}
	if dec := policy.CheckCommand(in.Argv, in.Command); !dec.Allow {
		return execReq{}, dec.Err()
	}
	req := execReq{ExecIn: in}
	if in.Command == "" {
		m, refuse := policy.ArgvMistake(in.Argv)
		if refuse {
			return execReq{}, errcode.Errorf(errcode.InvalidArgument, "%s", m)
		}
		req.mistake = m
		if dec := policy.CheckArgv(in.Argv); !dec.Allow {
			return execReq{}, dec.Err()
		}
	}
	var dec policy.Decision
	if req.env, dec = policy.CheckEnv(in.Env); !dec.Allow {
		return execReq{}, dec.Err()
	}
	if req.Cwd, dec = policy.WorkspacePath(in.Cwd); !dec.Allow {
		return execReq{}, dec.Err()
	}
	if req.timeout, dec = p.ExecTimeoutFor(in.TimeoutMS); !dec.Allow {
		return execReq{}, dec.Err()
	}
	if in.Background && in.TimeoutMS == 0 {
		req.timeout = 0 // a background job runs until it ends or is signalled
	}
	return req, nil
}

// program is what a command runs as, as the sandbox answered once: the
// argv the agent runs, the program argv[0] must resolve to there, and the
// resolved allowlist the policy decides on.
type program struct {
	argv    []string
	shell   string            // a command line: the name of the shell it runs through
	path    string            // what argv[0] resolves to; "" when not found, or not looked up (no allowlist, argv)
	allowed map[string]string // the resolved allowlist, when the policy has one
}

// findProgram asks the sandbox what in would run in one question, answered
// by one container: for a command line its shell, for argv under an
// allowlist the program argv[0] resolves to, with that container's
// resolved allowlist. argv without an allowlist asks nothing. Nothing is
// asked again after the policy decided on the answer (decide): the exec
// that follows runs the very path decided on (ExecRequest.Program), so the
// agent does not resolve argv[0] a second time.
func findProgram(ctx context.Context, sb Sandbox, p policy.Policy, in execReq) (program, error) {
	pr := program{argv: in.Argv}
	var ans session.Program
	var err error
	switch {
	case in.Command != "":
		// The image's bash, else its sh, runs the line.
		if ans, err = sb.Program(ctx, "", in.Cwd, true); err != nil {
			return pr, err
		}
		pr.shell = ans.Name
		pr.argv = []string{pr.shell, "-c", in.Command}
	case p.NeedsResolve():
		if ans, err = sb.Program(ctx, in.Argv[0], in.Cwd, false); err != nil {
			return pr, err
		}
	default:
		return pr, nil
	}
	pr.path = ans.Path
	if p.NeedsResolve() {
		pr.allowed = ans.Allowed
	}
	return pr, nil
}

// decide is the policy's decision on the program found: pure, made on the
// one answer findProgram got.
func (pr program) decide(p policy.Policy, in execReq) policy.Decision {
	switch {
	case in.Command != "":
		return p.CheckShell(pr.shell, pr.path, pr.allowed)
	case p.NeedsResolve():
		return p.CheckProgram(in.Argv[0], pr.path, pr.allowed)
	}
	return p.CanExec()
}

func (d *Deps) exec(ctx context.Context, c *call, sb Sandbox, in execReq) (*mcp.CallToolResult, ExecOut, error) {
	out := ExecOut{Sandbox: sb.ID()}
	p := d.Policy
	cwd, env, timeout, mistake := in.Cwd, in.env, in.timeout, in.mistake

	pr, err := findProgram(ctx, sb, p, in)
	if err != nil {
		return nil, out, err
	}
	if dec := pr.decide(p, in); !dec.Allow {
		return nil, out, dec.Err()
	}
	label := strings.Join(in.Argv, " ")
	if in.Command != "" {
		label = in.Command
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
		Argv: pr.argv, Program: pr.path, Cwd: cwd, Env: env, Stdin: stdin,
		Timeout: timeout, MaxOutput: p.MaxOutputBytes, Background: in.Background, Label: label,
	}
	if !in.Background {
		// Clients cap a whole call (about 60 s): past this the command
		// goes on as its job, and the result says how to follow it.
		// The time the call waited for sandboxes to be prepared is
		// part of it.
		req.MaxWait = p.MaxCallWait
		if p.MaxCallWait > 0 && c.waited > 0 {
			req.MaxWait = max(p.MaxCallWait-c.waited, time.Second)
		}
	}
	var prog *progress
	stopBeating := func() {}
	followCtx, stopFollowing := context.WithCancel(ctx)
	var following sync.WaitGroup
	if tok := c.req.Params.GetProgressToken(); tok != nil && !in.Background {
		prog = newProgress(ctx, c.req.Session, tok)
		prog.sent = c.progressed // after the preparation's, if any
		stopBeating = prog.keepAlive(d.beat(), time.Now())
		req.OnOutput = prog.output
		// Past the live output (the result's cap per stream), progress
		// follows the job's kept output.
		var job atomic.Pointer[string]
		req.OnStart = func(id string) { job.Store(&id) }
		prog.limit = p.MaxOutputBytes
		prog.onCapped = func(stream int) {
			if id := job.Load(); id != nil {
				following.Go(func() { followJob(followCtx, sb.Job, *id, stream, p.MaxOutputBytes, prog) })
			}
		}
	}
	res, err := sb.Exec(ctx, req)
	stopFollowing()
	following.Wait()
	stopBeating()
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
	if res.Running && in.Background {
		out.Running = true
		out.Hint = fmt.Sprintf("Job %s runs in the background. Read its output with sandbox_job (job %q, wait_ms up to 60000 to wait for more or its end); send stdin, close_stdin or a signal (TERM, KILL) the same way", res.Job, res.Job)
		if mistake != "" {
			out.Hint = joinHints(out.Hint, mistake)
		}
		c.bytes = 0
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "job " + res.Job + " started in the background\n" + out.Hint + "\n"}}}, out, nil
	}
	streams := [2]cutStream{
		{name: "stdout", head: res.Stdout, tail: res.StdoutTail, omitted: res.StdoutOmitted, dropped: res.StdoutDropped, job: res.Job},
		{name: "stderr", head: res.Stderr, tail: res.StderrTail, omitted: res.StderrOmitted, dropped: res.StderrDropped, job: res.Job},
	}
	out.Stdout = streams[0].text()
	out.Stderr = streams[1].text()
	out.StdoutTruncated = res.StdoutTruncated
	out.StderrTruncated = res.StderrTruncated
	out.TimedOut = res.TimedOut
	var notes []string
	switch {
	case res.Running:
		// Still running at the call wait: it goes on as its job.
		out.Running = true
		notes = append(notes, fmt.Sprintf("The command still runs after %s (this server's longest wait for a call), so the call returned; it goes on as job %s, "+
			"and its timeout of %s still applies. Follow it with sandbox_job (job %q, wait_ms up to %d) for its new output and its end; signal KILL stops it",
			p.MaxCallWait, res.Job, timeout, res.Job, policy.MaxJobWait))
	case res.TimedOut:
		notes = append(notes, timedOut(timeout).Message)
	default:
		notes = append(notes, exitMeaning(res.ExitCode, res.Signal, len(res.Stderr)+len(res.StderrTail) > 0 || res.StderrOmitted > 0))
	}
	if !res.Running {
		out.ExitCode, out.DurationMS = &res.ExitCode, ptr(res.Duration.Milliseconds())
	}
	if res.OOMKills > 0 {
		notes = append(notes, outOfMemory(p))
	}
	failed := res.TimedOut || (!res.Running && res.ExitCode != 0)
	finish := func(c *call, answers map[string]approval) (*mcp.CallToolResult, ExecOut, error) {
		out := out
		notes := slices.Clone(notes)
		denied, netHint := networkNotes(p, res.NetworkRefused, answers, failed, out.Stdout, out.Stderr)
		out.NetworkDenied = denied
		notes = append(notes, netHint)
		if res.PipesHeld {
			notes = append(notes, fmt.Sprintf("A process the command started (or one that took its output) still holds its stdout or stderr, so the result has what was read until the command ended; "+
				"what it writes later is kept in job %s (sandbox_job reads it). Redirect a background process's output (> file 2>&1 &) so the call need not wait for it", res.Job))
		}
		for _, s := range streams {
			notes = append(notes, s.note())
			if !utf8.Valid(s.head) || !utf8.Valid(s.tail) {
				notes = append(notes, s.name+" was not valid UTF-8 (invalid bytes are shown as U+FFFD); redirect it to a file and read that with sandbox_read_file for the exact bytes (base64)")
			}
		}
		// Output past a few results' worth, or more than its job keeps, is
		// better sent to a file and searched.
		if res.StdoutOmitted+res.StderrOmitted > 3*p.MaxOutputBytes || res.StdoutDropped+res.StderrDropped > 0 {
			notes = append(notes, longLog)
		}
		notes = append(notes, mistake)
		out.Hint = joinHints(notes...)
		c.exit = out.ExitCode
		c.bytes = int64(len(out.Stdout) + len(out.Stderr))

		// Every client shows the model one of the two copies, the structured
		// content or the text, so the text carries the output too (the output
		// cap bounds both).
		result := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: renderExec(out)}}}
		if out.TimedOut {
			result.SetError(timedOut(timeout)) // the text below starts with it
		}
		return result, out, nil
	}
	return approveThen(ctx, d, c, sb, res.NetworkRefused, finish)
}

// timedOut is the error of a command killed at its timeout.
func timedOut(timeout time.Duration) *errcode.Error {
	return errcode.Errorf(errcode.Timeout, "the command ran longer than its timeout of %s and was killed with every process it started; its partial output follows. Raise timeout_ms, or run long work with background: true and poll it with sandbox_job", timeout)
}

// renderExec is the text a model reads where a client shows the text: a
// status line, each stream, and the hint.
func renderExec(out ExecOut) string {
	var b strings.Builder
	switch {
	case out.TimedOut:
		b.WriteString("TIMEOUT: ")
	case out.Running:
		fmt.Fprintf(&b, "running as job %s\n", out.Job)
	default:
		fmt.Fprintf(&b, "exit code %d (%d ms, job %s)\n", *out.ExitCode, *out.DurationMS, out.Job)
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

// outOfMemory is the hint of a command during which the kernel killed a
// process of the sandbox for want of memory: its 137 is no timeout.
func outOfMemory(p policy.Policy) string {
	return fmt.Sprintf("The sandbox ran out of memory (limit %s, workspace files included): the kernel killed a process while the command ran "+
		"(it ends with SIGKILL, exit code 137; no timeout). Use less memory at once (fewer parallel jobs, smaller inputs), or delete large files from /workspace", sizeOf(p.Memory))
}

// beat is how often a call that holds a progress token hears from the
// server at least.
func (d *Deps) beat() time.Duration {
	if d.progressBeat > 0 {
		return d.progressBeat
	}
	return defaultProgressBeat
}
