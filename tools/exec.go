package tools

import (
	"context"
	"fmt"
	"strings"
	"sync"
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
	Argv      []string          `json:"argv" jsonschema:"The program and its arguments. argv[0] is looked up on the sandbox's PATH, or is a path relative to cwd. No shell is involved unless you run one. At most 64 KiB in all: pass larger input on stdin or in a file."`
	Cwd       string            `json:"cwd,omitempty" jsonschema:"Working directory, relative to /workspace. Default: the workspace root."`
	Env       map[string]string `json:"env,omitempty" jsonschema:"Extra environment variables for the command, at most 64 KiB in all."`
	Stdin     string            `json:"stdin,omitempty" jsonschema:"Text fed to the command's standard input. Default: empty."`
	TimeoutMS int64             `json:"timeout_ms,omitempty" jsonschema:"Kill the command (and everything it started) after this many milliseconds."`
	Sandbox   string            `json:"sandbox,omitempty" jsonschema:"Sandbox id to run in. Default: this session's sandbox."`
}

// ExecOut is sandbox_exec's output.
type ExecOut struct {
	Sandbox         string `json:"sandbox" jsonschema:"The sandbox the command ran in."`
	ExitCode        int    `json:"exit_code" jsonschema:"The command's exit code; 128+N when a signal N ended it."`
	Stdout          string `json:"stdout" jsonschema:"Standard output, up to the cap. Bytes that are not UTF-8 are replaced with U+FFFD."`
	Stderr          string `json:"stderr" jsonschema:"Standard error, up to the cap. Bytes that are not UTF-8 are replaced with U+FFFD."`
	StdoutTruncated bool   `json:"stdout_truncated" jsonschema:"True when stdout was longer than the cap and the rest was dropped."`
	StderrTruncated bool   `json:"stderr_truncated" jsonschema:"True when stderr was longer than the cap and the rest was dropped."`
	TimedOut        bool   `json:"timed_out" jsonschema:"True when the command hit its timeout and was killed."`
	DurationMS      int64  `json:"duration_ms" jsonschema:"How long the command ran, in milliseconds."`
}

func execDef(p policy.Policy) *mcp.Tool {
	desc := "Run a program in this session's sandbox (a Linux container with no network unless the server allows some hosts) and return its exit code and output. " +
		"argv is the program and its arguments, not a shell line: use [\"bash\", \"-c\", \"...\"] for pipes and redirection. " +
		"The working directory is /workspace (or cwd, relative to it); files persist between calls for the session's life. " +
		"A non-zero exit code is a normal result. A command that runs past timeout_ms is killed with every process it started and returns its partial output with timed_out set. " +
		"Output beyond the cap is dropped (stdout_truncated / stderr_truncated)."
	switch p.Exec {
	case policy.ExecAllowlist:
		desc += " Only these commands may run: " + joinComma(p.AllowCmds) + "."
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
		env.PropertyNames = &jsonschema.Schema{Type: "string", Pattern: policy.EnvNamePattern}
		to := s.Properties["timeout_ms"]
		to.Minimum = new(float64(0))
		to.Maximum = new(float64(p.MaxExecTimeout.Milliseconds()))
		to.Description += fmt.Sprintf(" Default %d, at most %d.", p.ExecTimeout.Milliseconds(), p.MaxExecTimeout.Milliseconds())
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

func (in ExecIn) target() string { return in.Sandbox }

// execReq is a command policy let through, as the sandbox runs it.
type execReq struct {
	argv    []string
	cwd     string
	env     []string
	stdin   string
	timeout time.Duration
}

func (d *Deps) checkExec(in ExecIn) (execReq, error) {
	p := d.Policy
	if dec := p.CanExec(); !dec.Allow {
		return execReq{}, dec.Err()
	}
	if dec := policy.CheckArgv(in.Argv); !dec.Allow {
		return execReq{}, dec.Err()
	}
	env, dec := policy.CheckEnv(in.Env)
	if !dec.Allow {
		return execReq{}, dec.Err()
	}
	cwd, dec := policy.WorkspacePath(in.Cwd)
	if !dec.Allow {
		return execReq{}, dec.Err()
	}
	timeout, dec := p.ExecTimeoutFor(in.TimeoutMS)
	if !dec.Allow {
		return execReq{}, dec.Err()
	}
	return execReq{argv: in.Argv, cwd: cwd, env: env, stdin: in.Stdin, timeout: timeout}, nil
}

func (d *Deps) exec(ctx context.Context, c *call, sb Sandbox, in execReq) (*mcp.CallToolResult, ExecOut, error) {
	out := ExecOut{Sandbox: sb.ID()}
	p := d.Policy
	program := ""
	if p.NeedsResolve() {
		// The allowlist names programs: which one argv[0] is depends on
		// the sandbox's PATH and files.
		resolved, err := sb.Resolve(ctx, in.argv[:1], in.cwd)
		if err != nil {
			return nil, out, err
		}
		allowed, err := sb.AllowedPrograms(ctx)
		if err != nil {
			return nil, out, err
		}
		if dec := p.CheckProgram(in.argv[0], resolved[0], allowed); !dec.Allow {
			return nil, out, dec.Err()
		}
		program = resolved[0]
	}
	var stdin []byte
	if in.stdin != "" {
		stdin = []byte(in.stdin)
	}
	req := session.ExecRequest{
		Argv: in.argv, Program: program, Cwd: in.cwd, Env: in.env, Stdin: stdin,
		Timeout: in.timeout, MaxOutput: p.MaxOutputBytes,
	}
	if tok := c.req.Params.GetProgressToken(); tok != nil {
		req.OnOutput = newProgress(ctx, c.req.Session, tok).output
	}
	res, err := sb.Exec(ctx, req)
	if err != nil {
		return nil, out, err
	}
	out.ExitCode = res.ExitCode
	out.Stdout = toText(res.Stdout)
	out.Stderr = toText(res.Stderr)
	out.StdoutTruncated = res.StdoutTruncated
	out.StderrTruncated = res.StderrTruncated
	out.TimedOut = res.TimedOut
	out.DurationMS = res.Duration.Milliseconds()
	c.exit = &out.ExitCode
	c.bytes = int64(len(res.Stdout) + len(res.Stderr))

	text := renderExec(out, in.timeout, p.MaxOutputBytes, res)
	result := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}
	if out.TimedOut {
		result.SetError(timedOut(in.timeout)) // the text above starts with it
	}
	return result, out, nil
}

// toText returns output as valid UTF-8, replacing invalid bytes.
func toText(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// timedOut is the error of a command killed at its timeout.
func timedOut(timeout time.Duration) *errcode.Error {
	return errcode.Errorf(errcode.Timeout, "the command ran longer than its timeout of %s and was killed with every process it started; its partial output follows. Raise timeout_ms, or run long work in the background.", timeout)
}

// renderExec is the text a model reads.
func renderExec(out ExecOut, timeout time.Duration, maxOut int64, res session.ExecResult) string {
	var b strings.Builder
	if out.TimedOut {
		b.WriteString(timedOut(timeout).Error() + "\n")
	} else {
		fmt.Fprintf(&b, "exit code %d (%d ms)\n", out.ExitCode, out.DurationMS)
	}
	section := func(name, s string, truncated bool, raw []byte) {
		if s == "" && !truncated {
			return
		}
		fmt.Fprintf(&b, "--- %s ---\n%s", name, s)
		if s != "" && !strings.HasSuffix(s, "\n") {
			b.WriteByte('\n')
		}
		if truncated {
			fmt.Fprintf(&b, "[%s truncated at %d bytes: the rest was dropped; redirect it to a file and read that in parts]\n", name, maxOut)
		}
		if !utf8.Valid(raw) {
			fmt.Fprintf(&b, "[%s was not valid UTF-8; invalid bytes are shown as U+FFFD. Redirect it to a file and read that for the exact bytes (base64)]\n", name)
		}
	}
	section("stdout", out.Stdout, out.StdoutTruncated, res.Stdout)
	section("stderr", out.Stderr, out.StderrTruncated, res.Stderr)
	return b.String()
}

// progress sends a command's output as progress notifications, at most
// every progressEvery and at most progressChunk bytes each; what is left
// over is dropped (the result carries all of it).
type progress struct {
	ctx   context.Context
	ss    *mcp.ServerSession
	token any

	mu   sync.Mutex
	last time.Time
	sent float64
	buf  []byte
}

const (
	progressEvery = 200 * time.Millisecond
	progressChunk = 4 << 10
)

func newProgress(ctx context.Context, ss *mcp.ServerSession, token any) *progress {
	return &progress{ctx: ctx, ss: ss, token: token}
}

func (p *progress) output(stream string, chunk []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.buf) < progressChunk {
		p.buf = append(p.buf, chunk[:min(len(chunk), progressChunk-len(p.buf))]...)
	}
	now := time.Now()
	if now.Sub(p.last) < progressEvery {
		return
	}
	p.last = now
	p.sent += float64(len(p.buf))
	msg := toText(p.buf)
	p.buf = p.buf[:0]
	if p.ss == nil {
		return
	}
	_ = p.ss.NotifyProgress(p.ctx, &mcp.ProgressNotificationParams{
		ProgressToken: p.token,
		Progress:      p.sent,
		Message:       stream + ": " + msg,
	})
}
