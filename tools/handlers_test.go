package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session"
	"github.com/sandbox-mcp/sandbox-mcp/snapshot"
)

// fakeSandboxes is a registry of one fake sandbox that records every call
// made on it or on the sandbox, in order, and answers with what a test set.
type fakeSandboxes struct {
	sb    *fakeSandbox
	snaps *snapshot.Store
	// named, if set, is what Lookup returns for sb's id (a templated
	// sandbox).
	named Sandbox

	mu    sync.Mutex
	calls []string
}

func (f *fakeSandboxes) record(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
}

// made returns the calls recorded so far, leaving out the Release a
// session's end makes (it depends on when the test closes it).
func (f *fakeSandboxes) made() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.DeleteFunc(slices.Clone(f.calls), func(c string) bool { return strings.HasPrefix(c, "Release") })
}

func (f *fakeSandboxes) Sandbox(key, owner string) (Sandbox, error) {
	f.record("Sandbox")
	return f.sb, nil
}

func (f *fakeSandboxes) Lookup(id, owner string) (Sandbox, error) {
	f.record("Lookup %s", id)
	if id != f.sb.ID() {
		return nil, errcode.Errorf(errcode.NotFound, "no sandbox %q belongs to you; sandbox_status lists yours and sandbox_create makes one (or omit \"sandbox\" to use this session's own)", id)
	}
	if f.named != nil {
		return f.named, nil
	}
	return f.sb, nil
}

func (f *fakeSandboxes) Release(key string) { f.record("Release") }

func (f *fakeSandboxes) ReleaseSoon(key string) bool { f.record("ReleaseSoon"); return true }

func (f *fakeSandboxes) Snapshots() *snapshot.Store { f.record("Snapshots"); return f.snaps }

// fakeSandbox answers with the results a test set, and records each call
// with the arguments the handler passed.
type fakeSandbox struct {
	f *fakeSandboxes

	exec    session.ExecResult
	read    session.ReadResult
	entries []session.Entry
	// written is what WriteFileFrom read from its reader.
	written []byte
	// notice is what TakeNotice returns once.
	notice string
}

func (s *fakeSandbox) ID() string { return "sb-fake" }

func (s *fakeSandbox) TakeNotice() string {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	n := s.notice
	s.notice = ""
	return n
}

func (s *fakeSandbox) Owner() string { return "" }

func (s *fakeSandbox) Exec(ctx context.Context, req session.ExecRequest) (session.ExecResult, error) {
	s.f.record("Exec %q cwd=%s env=%q timeout=%s program=%q stdin=%q", req.Argv, req.Cwd, req.Env, req.Timeout, req.Program, req.Stdin)
	return s.exec, nil
}

// Program answers as a sandbox whose programs are all in /usr/bin, with
// bash, and an allowlist of echo.
func (s *fakeSandbox) Program(ctx context.Context, name, cwd string, shell bool) (session.Program, error) {
	allowed := map[string]string{"/usr/bin/echo": "echo"}
	if shell {
		s.f.record("Program shell")
		return session.Program{Name: "bash", Path: "/usr/bin/bash", Allowed: allowed}, nil
	}
	s.f.record("Program %q", name)
	return session.Program{Name: name, Path: "/usr/bin/" + name, Allowed: allowed}, nil
}

func (s *fakeSandbox) ReadFile(ctx context.Context, path string, offset, length, maxBytes int64) (session.ReadResult, error) {
	s.f.record("ReadFile %s %d %d", path, offset, length)
	return s.read, nil
}

func (s *fakeSandbox) WriteFileFrom(ctx context.Context, path string, r io.Reader, size int64, appendTo bool, mode uint32) (session.WriteResult, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return session.WriteResult{}, err
	}
	s.written = b
	s.f.record("WriteFileFrom %s size=%d append=%v mode=%04o", path, size, appendTo, mode)
	return session.WriteResult{Written: int64(len(b)), Size: int64(len(b))}, nil
}

func (s *fakeSandbox) Job(ctx context.Context, req session.JobRequest) (session.JobResult, error) {
	s.f.record("Job %s", req.Job)
	return session.JobResult{}, errcode.Errorf(errcode.NotFound, "the fake has no jobs")
}

func (s *fakeSandbox) Jobs(ctx context.Context) ([]session.JobInfo, error) {
	s.f.record("Jobs")
	return nil, nil
}

func (s *fakeSandbox) Read(ctx context.Context, req session.ReadRequest) (session.ReadResult, error) {
	s.f.record("Read %s %d %d", req.Path, req.StartLine, req.EndLine)
	return s.read, nil
}

func (s *fakeSandbox) EditFile(ctx context.Context, path string, edits []session.Edit, maxFile int64) (session.EditResult, error) {
	for _, e := range edits {
		s.f.record("EditFile %s %q %q %v", path, e.OldText, e.NewText, e.ReplaceAll)
	}
	return session.EditResult{Replacements: len(edits), Size: 10}, nil
}

func (s *fakeSandbox) Delete(ctx context.Context, path string, recursive bool) (session.DeleteResult, error) {
	s.f.record("Delete %s %v", path, recursive)
	return session.DeleteResult{Deleted: 1, Type: "file"}, nil
}

func (s *fakeSandbox) Move(ctx context.Context, from, to string, overwrite bool) (session.MoveResult, error) {
	s.f.record("Move %s %s %v", from, to, overwrite)
	return session.MoveResult{To: to, Type: "file"}, nil
}

func (s *fakeSandbox) List(ctx context.Context, path string, o session.ListOptions) (session.ListResult, error) {
	s.f.record("List %s recursive=%v max=%d", path, o.Recursive, o.MaxEntries)
	return session.ListResult{Entries: s.entries}, nil
}

func (s *fakeSandbox) Snapshot(ctx context.Context, label string) (snapshot.Info, error) {
	s.f.record("Snapshot %q", label)
	return snapshot.Info{}, errcode.Errorf(errcode.Unavailable, "the fake makes no snapshots")
}

func (s *fakeSandbox) Restore(ctx context.Context, id string) (snapshot.Info, session.RestoreResult, error) {
	s.f.record("Restore %s", id)
	return snapshot.Info{}, session.RestoreResult{}, errcode.Errorf(errcode.Unavailable, "the fake restores nothing")
}

// fakeRig is the tools served over the go-sdk's in-memory transports, on a
// fake registry, and a client talking to them.
type fakeRig struct {
	t   *testing.T
	f   *fakeSandboxes
	sb  *fakeSandbox
	cs  *mcp.ClientSession
	log *strings.Builder
}

func newFakeRig(t *testing.T, edit func(*policy.Policy)) *fakeRig {
	t.Helper()
	p := policy.Default()
	if edit != nil {
		edit(&p)
	}
	snaps, err := snapshot.OpenStore(t.TempDir(), snapshot.Retention{})
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeSandboxes{snaps: snaps}
	f.sb = &fakeSandbox{f: f}
	r := &fakeRig{t: t, f: f, sb: f.sb, log: &strings.Builder{}}
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, r.log}, nil))
	r.cs = connect(t, &Deps{Policy: p, Sessions: SessionsOver(f), Logger: logger}, nil)
	return r
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

func (r *fakeRig) call(name string, args map[string]any) *mcp.CallToolResult {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := r.cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		r.t.Fatalf("%s: %v", name, err)
	}
	return res
}

// structured returns the result's structured content as the client got it.
func structured(t *testing.T, res *mcp.CallToolResult) map[string]any {
	t.Helper()
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("structured content %s: %v", b, err)
	}
	return m
}

// TestRefusalsComeBeforeTheSandbox: an argument the schema refuses, or a
// call policy refuses, is answered with its code before the call asks for a
// sandbox at all: a refused call neither makes a sandbox nor touches one.
func TestRefusalsComeBeforeTheSandbox(t *testing.T) {
	readOnly := func(p *policy.Policy) { p.ReadOnly = true }
	for _, tc := range []struct {
		name string
		edit func(*policy.Policy)
		tool string
		args map[string]any
		code errcode.Code
		want string // in the text
	}{
		{"exec denied", func(p *policy.Policy) { p.Exec = policy.ExecDeny }, NameExec, map[string]any{"argv": []string{"true"}}, errcode.PolicyDenied, ""},
		{"exec without argv", nil, NameExec, map[string]any{}, errcode.InvalidArgument, "argv"},
		{"exec empty argv", nil, NameExec, map[string]any{"argv": []string{}}, errcode.InvalidArgument, ""},
		{"exec cwd outside", nil, NameExec, map[string]any{"argv": []string{"true"}, "cwd": "../etc"}, errcode.OutsideWorkspace, "climbs out"},
		{"exec bad env name", nil, NameExec, map[string]any{"argv": []string{"true"}, "env": map[string]string{"A-B": "1"}}, errcode.InvalidArgument, ""},
		{"exec timeout over the ceiling", nil, NameExec, map[string]any{"argv": []string{"true"}, "timeout_ms": 1 << 40}, errcode.InvalidArgument, ""},
		{"read outside", nil, NameReadFile, map[string]any{"path": "/etc/passwd"}, errcode.OutsideWorkspace, "outside the workspace"},
		{"read negative offset", nil, NameReadFile, map[string]any{"path": "a", "offset": -1}, errcode.InvalidArgument, ""},
		{"read bytes and lines", nil, NameReadFile, map[string]any{"path": "a", "offset": 1, "start_line": 2}, errcode.InvalidArgument, ""},
		{"edit read-only", readOnly, NameEditFile, map[string]any{"path": "a", "old_string": "x", "new_string": "y"}, errcode.ReadOnly, ""},
		{"edit outside", nil, NameEditFile, map[string]any{"path": "../a", "old_string": "x", "new_string": "y"}, errcode.OutsideWorkspace, ""},
		{"delete the root", nil, NameDelete, map[string]any{"path": "/workspace", "recursive": true}, errcode.InvalidArgument, ""},
		{"delete read-only", readOnly, NameDelete, map[string]any{"path": "a"}, errcode.ReadOnly, ""},
		{"move outside", nil, NameMove, map[string]any{"from": "a", "to": "/etc/a"}, errcode.OutsideWorkspace, ""},
		{"view an image outside", nil, NameViewImage, map[string]any{"path": "/etc/x.png"}, errcode.OutsideWorkspace, ""},
		{"job with exec denied", func(p *policy.Policy) { p.Exec = policy.ExecDeny }, NameJob, map[string]any{}, errcode.PolicyDenied, ""},
		{"write read-only", readOnly, NameWriteFile, map[string]any{"path": "a", "content": "x"}, errcode.ReadOnly, "--read-only"},
		{"write the root", nil, NameWriteFile, map[string]any{"path": "/workspace", "content": "x"}, errcode.InvalidArgument, "workspace root"},
		{"write setuid", nil, NameWriteFile, map[string]any{"path": "a", "content": "x", "mode": "4755"}, errcode.InvalidArgument, "setuid"},
		{"write bad base64", nil, NameWriteFile, map[string]any{"path": "a", "content": "!!!!", "encoding": "base64"}, errcode.InvalidArgument, "not valid base64"},
		{"write too large", func(p *policy.Policy) { p.MaxFileBytes = 4 }, NameWriteFile, map[string]any{"path": "a", "content": "12345"}, errcode.TooLarge, "--max-file-bytes"},
		{"list outside", nil, NameList, map[string]any{"path": "../.."}, errcode.OutsideWorkspace, ""},
		{"list too many", nil, NameList, map[string]any{"max_entries": policy.MaxListEntries + 1}, errcode.InvalidArgument, ""},
		{"restore read-only", readOnly, NameRestore, map[string]any{"id": "snap-0123456789abcdef0123"}, errcode.ReadOnly, ""},
		{"restore empty id", nil, NameRestore, map[string]any{"id": ""}, errcode.InvalidArgument, "list: true"},
		{"snapshot unknown argument", nil, NameSnapshot, map[string]any{"labels": "x"}, errcode.InvalidArgument, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newFakeRig(t, tc.edit)
			res := r.call(tc.tool, tc.args)
			got := text(res)
			if !res.IsError || !strings.HasPrefix(got, string(tc.code)+": ") || !strings.Contains(got, tc.want) {
				t.Errorf("isError %v, text %q; want a %s error mentioning %q", res.IsError, got, tc.code, tc.want)
			}
			if calls := r.f.made(); len(calls) != 0 {
				t.Errorf("a refused call reached the sandboxes: %q", calls)
			}
		})
	}
}

// TestNamedSandboxNotFound: a call naming a sandbox that is not the
// caller's asks the registry for that one only, and never makes the
// session's own.
func TestNamedSandboxNotFound(t *testing.T) {
	r := newFakeRig(t, nil)
	res := r.call(NameExec, map[string]any{"argv": []string{"true"}, "sandbox": "sb-other"})
	if got := text(res); !res.IsError || !strings.HasPrefix(got, "NOT_FOUND: ") || !strings.Contains(got, "omit \"sandbox\"") {
		t.Errorf("isError %v, text %q", res.IsError, got)
	}
	if calls := r.f.made(); !slices.Equal(calls, []string{"Lookup sb-other"}) {
		t.Errorf("calls %q, want only the lookup", calls)
	}
	// Policy comes first even for a named sandbox.
	res = r.call(NameReadFile, map[string]any{"path": "/etc", "sandbox": "sb-other"})
	if got := text(res); !strings.HasPrefix(got, "OUTSIDE_WORKSPACE: ") {
		t.Errorf("text %q", got)
	}
	// A named sandbox is looked up (for its template's policy, before
	// the check), never made or called.
	if calls := r.f.made(); !slices.Equal(calls, []string{"Lookup sb-other", "Lookup sb-other"}) {
		t.Errorf("calls %q after a refused call", calls)
	}
}

// templatedSandbox is a fake sandbox made from an operator's template.
type templatedSandbox struct {
	*fakeSandbox
	tpl string
	p   policy.Policy
}

func (s templatedSandbox) Template() string      { return s.tpl }
func (s templatedSandbox) Policy() policy.Policy { return s.p }

// TestTemplatePolicyApplies: a call naming a sandbox made from a template
// is checked against that template's policy, not the server's, before the
// sandbox is touched: a read-only template refuses a write, an exec-deny
// one a command, while the server's own policy allows both; the server's
// limits apply to a default sandbox named the same way.
func TestTemplatePolicyApplies(t *testing.T) {
	r := newFakeRig(t, nil)
	locked := policy.Default()
	locked.ReadOnly, locked.Exec = true, policy.ExecDeny
	locked.MaxFileBytes = 4
	r.f.named = templatedSandbox{fakeSandbox: r.sb, tpl: "locked", p: locked}
	for _, tc := range []struct {
		tool string
		args map[string]any
		code errcode.Code
	}{
		{NameWriteFile, map[string]any{"path": "a", "content": "x", "sandbox": "sb-fake"}, errcode.ReadOnly},
		{NameEditFile, map[string]any{"path": "a", "old_string": "x", "new_string": "y", "sandbox": "sb-fake"}, errcode.ReadOnly},
		{NameExec, map[string]any{"argv": []string{"true"}, "sandbox": "sb-fake"}, errcode.PolicyDenied},
		{NameJob, map[string]any{"sandbox": "sb-fake"}, errcode.PolicyDenied},
	} {
		res := r.call(tc.tool, tc.args)
		if got := text(res); !res.IsError || !strings.HasPrefix(got, string(tc.code)+": ") {
			t.Errorf("%s on the locked template's sandbox: %q, want %s", tc.tool, got, tc.code)
		}
	}
	if calls := slices.DeleteFunc(r.f.made(), func(c string) bool { return strings.HasPrefix(c, "Lookup") }); len(calls) != 0 {
		t.Errorf("refused calls reached the sandbox: %q", calls)
	}
	// The same calls on the session's own sandbox: the server's policy.
	if res := r.call(NameWriteFile, map[string]any{"path": "a", "content": "x"}); res.IsError {
		t.Errorf("write to the default sandbox: %q", text(res))
	}
	// A sandbox of the default template named by id: the server's policy.
	r.f.named = templatedSandbox{fakeSandbox: r.sb, tpl: session.DefaultTemplate, p: locked}
	if res := r.call(NameWriteFile, map[string]any{"path": "a", "content": "x", "sandbox": "sb-fake"}); res.IsError {
		t.Errorf("write to a default sandbox named by id: %q", text(res))
	}
}

// TestExecRendering: what the sandbox is asked (the arguments as policy
// made them) and what the model reads, in the text and in the structured
// result.
func TestExecRendering(t *testing.T) {
	r := newFakeRig(t, nil)
	r.sb.exec = session.ExecResult{Job: "j1", ExitCode: 3, Stdout: []byte("hi\n"), Stderr: []byte("bad \xff"), Duration: 12 * time.Millisecond}
	res := r.call(NameExec, map[string]any{"argv": []string{"sh", "-c", "x"}, "cwd": "/workspace/sub/", "env": map[string]string{"A": "1"}, "stdin": "in"})
	if res.IsError {
		t.Fatalf("error: %s", text(res))
	}
	wantCalls := []string{"Sandbox", fmt.Sprintf("Exec %q cwd=sub/ env=%q timeout=%s program=\"\" stdin=\"in\"", []string{"sh", "-c", "x"}, []string{"A=1"}, policy.Default().ExecTimeout)}
	if calls := r.f.made(); !slices.Equal(calls, wantCalls) {
		t.Errorf("calls\n%q\nwant\n%q", calls, wantCalls)
	}
	wantText := "exit code 3 (12 ms, job j1)\n--- stdout ---\nhi\n--- stderr ---\nbad \uFFFD\n--- hint ---\n" +
		"stderr was not valid UTF-8 (invalid bytes are shown as U+FFFD); redirect it to a file and read that with sandbox_read_file for the exact bytes (base64).\n"
	if got := text(res); got != wantText {
		t.Errorf("text\n%q\nwant\n%q", got, wantText)
	}
	out := structured(t, res)
	if out["sandbox"] != "sb-fake" || out["exit_code"] != 3.0 || out["stdout"] != "hi\n" || out["stderr"] != "bad \uFFFD" ||
		out["timed_out"] != false || out["duration_ms"] != 12.0 {
		t.Errorf("structured %v", out)
	}
	if log := r.log.String(); !strings.Contains(log, "tool=sandbox_exec") || !strings.Contains(log, "sandbox=sb-fake") || !strings.Contains(log, "exit_code=3") {
		t.Errorf("no log line of the call:\n%s", log)
	}

	// A command that ran past its timeout: an error result that still
	// carries the output.
	r.sb.exec = session.ExecResult{Job: "j2", ExitCode: 137, Stdout: []byte("partial"), TimedOut: true, Duration: time.Second}
	res = r.call(NameExec, map[string]any{"argv": []string{"sleep", "9"}, "timeout_ms": 1000})
	if got := text(res); !res.IsError || !strings.HasPrefix(got, "TIMEOUT: ") || !strings.Contains(got, "--- stdout ---\npartial\n") {
		t.Errorf("isError %v, text %q", res.IsError, got)
	}
	if out := structured(t, res); out["timed_out"] != true || out["stdout"] != "partial" {
		t.Errorf("structured %v", out)
	}
}

// TestExecAllowlistAsksTheSandbox: with an allowlist, which program argv[0]
// is depends on the sandbox, so that check comes after the sandbox is
// resolved, and before anything runs.
func TestExecAllowlistAsksTheSandbox(t *testing.T) {
	r := newFakeRig(t, func(p *policy.Policy) { p.Exec, p.AllowCmds = policy.ExecAllowlist, []string{"echo"} })
	res := r.call(NameExec, map[string]any{"argv": []string{"rm", "-rf", "x"}})
	if got := text(res); !res.IsError || !strings.HasPrefix(got, "POLICY_DENIED: ") {
		t.Errorf("isError %v, text %q", res.IsError, got)
	}
	if calls := r.f.made(); !slices.Equal(calls, []string{"Sandbox", `Program "rm"`}) {
		t.Errorf("calls %q", calls)
	}
	res = r.call(NameExec, map[string]any{"argv": []string{"echo", "hi"}})
	if res.IsError {
		t.Fatalf("error: %s", text(res))
	}
	if calls := r.f.made(); !strings.Contains(calls[len(calls)-1], `program="/usr/bin/echo"`) {
		t.Errorf("calls %q", calls)
	}
}

// TestCommandRunsThroughTheShell: a command string runs as the sandbox's
// shell given it with -c; under an allowlist without that shell it is
// refused after the sandbox said which shell it is, before anything runs.
func TestCommandRunsThroughTheShell(t *testing.T) {
	r := newFakeRig(t, nil)
	if res := r.call(NameExec, map[string]any{"command": "ls | head"}); res.IsError {
		t.Fatalf("error: %s", text(res))
	}
	if calls := r.f.made(); !slices.Equal(calls[1:], []string{"Program shell", `Exec ["bash" "-c" "ls | head"] cwd=. env=[] timeout=1m0s program="/usr/bin/bash" stdin=""`}) {
		t.Errorf("calls %q", calls)
	}
	r = newFakeRig(t, func(p *policy.Policy) { p.Exec, p.AllowCmds = policy.ExecAllowlist, []string{"echo"} })
	res := r.call(NameExec, map[string]any{"command": "echo hi"})
	if got := text(res); !res.IsError || !strings.HasPrefix(got, "POLICY_DENIED: ") || !strings.Contains(got, "shell bash") {
		t.Errorf("isError %v, text %q", res.IsError, got)
	}
	if calls := r.f.made(); !slices.Equal(calls, []string{"Sandbox", "Program shell"}) {
		t.Errorf("calls %q", calls)
	}
}

// TestFileRendering: read, write and list ask the sandbox with paths made
// relative to the workspace, and render text and structured results.
func TestFileRendering(t *testing.T) {
	r := newFakeRig(t, func(p *policy.Policy) { p.MaxFileBytes = 5 })
	// A window read whose first line goes on past the cap.
	r.sb.read = session.ReadResult{Data: []byte("hello"), Size: 10, Truncated: true, End: 5, StartLine: 1, EndLine: 1, TotalLines: 2, Scanned: 10}
	res := r.call(NameReadFile, map[string]any{"path": "/workspace/a.txt"})
	wantText := "a.txt: lines 1-1 of 2 (5 bytes of 10); line 1 goes on past the 5 bytes this read returns: read the rest of it with byte_offset=5, or skip to offset=2\nhello"
	if got := text(res); res.IsError || got != wantText {
		t.Errorf("read: text %q, want %q", got, wantText)
	}
	if out := structured(t, res); out["path"] != "a.txt" || out["content"] != "hello" || out["encoding"] != "utf-8" || out["truncated"] != true ||
		out["size"] != 10.0 || out["next_offset"] != 2.0 || out["next_byte_offset"] != 5.0 || out["total_lines"] != 2.0 {
		t.Errorf("read: structured %v", out)
	}

	// Bytes that are not text: the window is read again as bytes, and
	// both the text and the structured result carry the base64.
	r.sb.read = session.ReadResult{Data: []byte{0xff, 0}, Size: 2, End: 2, StartLine: 1, EndLine: 1, TotalLines: 1, Scanned: 2}
	res = r.call(NameReadFile, map[string]any{"path": "bin"})
	if got := text(res); !strings.Contains(got, "not text: base64 below") || !strings.HasSuffix(got, "\n/wA=") {
		t.Errorf("read binary: text %q", got)
	}
	if out := structured(t, res); out["content"] != "/wA=" || out["encoding"] != "base64" {
		t.Errorf("read binary: structured %v", out)
	}

	res = r.call(NameWriteFile, map[string]any{"path": "/workspace/d/f", "content": "aGk=", "encoding": "base64", "mode": "0755"})
	if got := text(res); res.IsError || got != "wrote 2 bytes to d/f (now 2 bytes)" {
		t.Errorf("write: text %q", got)
	}
	if string(r.sb.written) != "hi" {
		t.Errorf("write: the sandbox got %q, want the decoded content", r.sb.written)
	}
	if out := structured(t, res); out["path"] != "d/f" || out["bytes_written"] != 2.0 || out["sandbox"] != "sb-fake" {
		t.Errorf("write: structured %v", out)
	}

	mtime := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	r.sb.entries = []session.Entry{
		{Path: "d", Type: "dir", Mode: 0o755, MTime: mtime},
		{Path: "d/l", Type: "symlink", Mode: 0o777, MTime: mtime, Target: "../x"},
	}
	res = r.call(NameList, map[string]any{"recursive": true})
	if got := text(res); res.IsError || got != "d/\nd/l -> ../x\n" {
		t.Errorf("list: text %q", got)
	}
	out := structured(t, res)
	entries, _ := out["entries"].([]any)
	if out["path"] != "." || len(entries) != 2 || entries[1].(map[string]any)["target"] != "../x" || entries[0].(map[string]any)["mtime"] != nil {
		t.Errorf("list: structured %v", out)
	}
	// Mode and mtime come with details.
	res = r.call(NameList, map[string]any{"recursive": true, "details": true})
	if got := text(res); res.IsError || got != "0755 2026-01-02T03:04:05Z d/\n0777 2026-01-02T03:04:05Z d/l -> ../x\n" {
		t.Errorf("list with details: text %q", got)
	}
	if e := structured(t, res)["entries"].([]any)[0].(map[string]any); e["mtime"] != "2026-01-02T03:04:05Z" || e["mode"] != "0755" {
		t.Errorf("list with details: structured %v", e)
	}

	want := []string{
		"Sandbox", "Read a.txt 1 2000",
		"Sandbox", "Read bin 1 2000", "Read bin 0 0",
		"Sandbox", "WriteFileFrom d/f size=2 append=false mode=0755",
		"Sandbox", "List . recursive=true max=200",
		"Sandbox", "List . recursive=true max=200",
	}
	if calls := r.f.made(); !slices.Equal(calls, want) {
		t.Errorf("calls\n%q\nwant\n%q", calls, want)
	}
}

// TestSandboxErrorsReachTheModel: an error the sandbox returns with a code
// is the tool's error, as "CODE: message".
func TestSandboxErrorsReachTheModel(t *testing.T) {
	r := newFakeRig(t, nil)
	res := r.call(NameSnapshot, map[string]any{"label": "x"})
	if got := text(res); !res.IsError || got != "UNAVAILABLE: the fake makes no snapshots" {
		t.Errorf("isError %v, text %q", res.IsError, got)
	}
	if calls := r.f.made(); !slices.Equal(calls, []string{"Sandbox", `Snapshot "x"`}) {
		t.Errorf("calls %q", calls)
	}
}

// TestFileOpsAskWithWorkspacePaths: edit, delete, move and line reads reach
// the sandbox with their paths made relative to the workspace, after the
// session's sandbox is resolved, and render what the sandbox answered.
func TestFileOpsAskWithWorkspacePaths(t *testing.T) {
	r := newFakeRig(t, nil)
	r.sb.read = session.ReadResult{Data: []byte("two\n"), Size: 8}
	for _, c := range []struct {
		tool string
		args map[string]any
		want string // in the text
	}{
		{NameEditFile, map[string]any{"path": "/workspace/e.txt", "old_string": "a", "new_string": "b"}, "replaced 1 occurrence(s) in e.txt (now 10 bytes)"},
		{NameDelete, map[string]any{"path": "/workspace/d/x"}, "deleted d/x (a file)"},
		{NameMove, map[string]any{"from": "/workspace/a", "to": "/workspace/b/a"}, "moved a (a file) to b/a"},
		{NameReadFile, map[string]any{"path": "/workspace/l.txt", "offset": 2, "limit": 1}, "two"},
	} {
		res := r.call(c.tool, c.args)
		if got := text(res); res.IsError || !strings.Contains(got, c.want) {
			t.Errorf("%s: isError %v, text %q; want %q in it", c.tool, res.IsError, got, c.want)
		}
	}
	want := []string{
		"Sandbox", `EditFile e.txt "a" "b" false`,
		"Sandbox", "Delete d/x false",
		"Sandbox", "Move a b/a false",
		"Sandbox", "Read l.txt 2 2",
	}
	if calls := r.f.made(); !slices.Equal(calls, want) {
		t.Errorf("calls\n%q\nwant\n%q", calls, want)
	}
}

// TestSnapshotDeleteWorksInNoSandbox: deleting a snapshot resolves and
// makes no sandbox, deletes the caller's own snapshot, and answers another
// caller's as it answers an id never made.
func TestSnapshotDeleteWorksInNoSandbox(t *testing.T) {
	r := newFakeRig(t, nil)
	fill := func(w io.Writer) error { _, err := w.Write(make([]byte, 1024)); return err }
	mine, err := r.f.snaps.For("").Create("mine", "sb-1", fill)
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := r.f.snaps.For("someone else").Create("theirs", "sb-2", fill)
	if err != nil {
		t.Fatal(err)
	}
	res := r.call(NameDeleteSnapshot, map[string]any{"id": theirs.ID})
	if got := text(res); !res.IsError || !strings.HasPrefix(got, "NOT_FOUND: no snapshot") {
		t.Errorf("another caller's snapshot: isError %v, text %q", res.IsError, got)
	}
	if _, err := r.f.snaps.Get(theirs.ID); err != nil {
		t.Errorf("another caller's snapshot is gone: %v", err)
	}
	if res := r.call(NameDeleteSnapshot, map[string]any{"id": mine.ID}); res.IsError {
		t.Fatalf("own snapshot: %s", text(res))
	}
	if _, err := r.f.snaps.Get(mine.ID); !errors.Is(err, snapshot.ErrNotFound) {
		t.Errorf("own snapshot still there: %v", err)
	}
	if calls := r.f.made(); slices.ContainsFunc(calls, func(c string) bool { return c != "Snapshots" }) {
		t.Errorf("deleting a snapshot asked the sandboxes for %q, want the snapshot store only", calls)
	}
	if res := r.call(NameDeleteSnapshot, map[string]any{"id": mine.ID, "sandbox": "sb-1"}); !res.IsError || !strings.HasPrefix(text(res), "INVALID_ARGUMENT") {
		t.Errorf("a sandbox argument: isError %v, text %q", res.IsError, text(res))
	}
}

// TestSnapshotListMakesNoSandbox: sandbox_snapshot's list mode lists the
// caller's snapshots alone, newest first, in the text and the structured
// result, and resolves and makes no sandbox; sandbox_restore turns a
// label and latest into the caller's ids before it asks the sandbox.
func TestSnapshotListMakesNoSandbox(t *testing.T) {
	r := newFakeRig(t, nil)
	fill := func(w io.Writer) error { _, err := w.Write(make([]byte, 1024)); return err }
	old, err := r.f.snaps.For("").Create("old", "sb-1", fill)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond) // distinct creation times
	newer, err := r.f.snaps.For("").Create("", "sb-1", fill)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.f.snaps.For("someone else").Create("theirs", "sb-2", fill); err != nil {
		t.Fatal(err)
	}
	res := r.call(NameSnapshot, map[string]any{"list": true})
	out := structured(t, res)
	snaps, _ := out["snapshots"].([]any)
	if res.IsError || len(snaps) != 2 || snaps[0].(map[string]any)["id"] != newer.ID || snaps[1].(map[string]any)["label"] != "old" {
		t.Fatalf("list: %v", out)
	}
	if txt := text(res); !strings.Contains(txt, newer.ID) || !strings.Contains(txt, `label "old"`) || strings.Contains(txt, "theirs") || strings.Index(txt, newer.ID) > strings.Index(txt, old.ID) {
		t.Errorf("text %q", txt)
	}
	if calls := r.f.made(); slices.ContainsFunc(calls, func(c string) bool { return c != "Snapshots" }) {
		t.Errorf("a list asked the sandboxes for %q, want the snapshot store only", calls)
	}
	for args, code := range map[string]errcode.Code{`{"list": true, "label": "x"}`: errcode.InvalidArgument, `{"id": "theirs"}`: errcode.NotFound} {
		tool := NameSnapshot
		if strings.Contains(args, "id") {
			tool = NameRestore
		}
		var m map[string]any
		json.Unmarshal([]byte(args), &m)
		if got := text(r.call(tool, m)); !strings.HasPrefix(got, string(code)+": ") {
			t.Errorf("%s %s: %q, want %s", tool, args, got, code)
		}
	}
	for name, id := range map[string]string{"old": old.ID, "latest": newer.ID} {
		r.call(NameRestore, map[string]any{"id": name}) // the fake restores nothing
		if calls := r.f.made(); !slices.Contains(calls, fmt.Sprintf("Restore %s", id)) {
			t.Errorf("restore %q asked %q, want %s", name, calls, id)
		}
	}
}

// TestExecResolvesOnce: a call asks the sandbox what would run in one
// question at most (one container's answer: the program or shell and the
// allowlist together), the policy decides on that answer, and the exec runs
// the path decided on with nothing asked in between.
func TestExecResolvesOnce(t *testing.T) {
	allowlist := func(p *policy.Policy) { p.Exec, p.AllowCmds = policy.ExecAllowlist, []string{"echo", "bash"} }
	for _, tc := range []struct {
		name     string
		policy   func(*policy.Policy)
		args     map[string]any
		question string // "": none
		exec     string
	}{
		{"argv", nil, map[string]any{"argv": []string{"echo", "hi"}},
			"", `Exec ["echo" "hi"] cwd=. env=[] timeout=1m0s program="" stdin=""`},
		{"command", nil, map[string]any{"command": "echo hi"},
			"Program shell", `Exec ["bash" "-c" "echo hi"] cwd=. env=[] timeout=1m0s program="/usr/bin/bash" stdin=""`},
		{"argv under an allowlist", allowlist, map[string]any{"argv": []string{"echo", "hi"}},
			`Program "echo"`, `Exec ["echo" "hi"] cwd=. env=[] timeout=1m0s program="/usr/bin/echo" stdin=""`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newFakeRig(t, tc.policy)
			if res := r.call(NameExec, tc.args); res.IsError {
				t.Fatalf("error: %s", text(res))
			}
			calls := r.f.made()
			if len(calls) < 2 || calls[0] != "Sandbox" || calls[len(calls)-1] != tc.exec {
				t.Fatalf("calls %q, want Sandbox, a question at most, then %s", calls, tc.exec)
			}
			want := []string{}
			if tc.question != "" {
				want = append(want, tc.question)
			}
			if asked := calls[1 : len(calls)-1]; !slices.Equal(asked, want) {
				t.Errorf("asked the sandbox %d times before the exec (%q), want %q", len(asked), asked, want)
			}
		})
	}
}

// TestProgramDecide: the policy's decision on what the sandbox answered,
// without a sandbox.
func TestProgramDecide(t *testing.T) {
	allow, deny := policy.Default(), policy.Default()
	deny.Exec = policy.ExecDeny
	list := policy.Default()
	list.Exec, list.AllowCmds = policy.ExecAllowlist, []string{"echo", "bash"}
	allowed := map[string]string{"/usr/bin/echo": "echo", "/usr/bin/bash": "bash"}
	argv := func(a ...string) execReq { return execReq{ExecIn: ExecIn{Argv: a}} }
	line := execReq{ExecIn: ExecIn{Command: "echo hi"}}
	for _, tc := range []struct {
		name string
		p    policy.Policy
		pr   program
		in   execReq
		want string // "" allowed, else the refusal's code
	}{
		{"argv, no allowlist", allow, program{}, argv("rm"), ""},
		{"argv, exec denied", deny, program{}, argv("echo"), "POLICY_DENIED"},
		{"argv on the allowlist", list, program{path: "/usr/bin/echo", allowed: allowed}, argv("echo"), ""},
		{"argv resolving off the allowlist", list, program{path: "/tmp/echo", allowed: allowed}, argv("echo"), "POLICY_DENIED"},
		{"argv not found", list, program{allowed: allowed}, argv("echo"), "POLICY_DENIED"},
		{"line, no allowlist", allow, program{shell: "sh", path: "/bin/sh"}, line, ""},
		{"line, no shell", allow, program{shell: "bash"}, line, "NOT_FOUND"},
		{"line, shell on the allowlist", list, program{shell: "bash", path: "/usr/bin/bash", allowed: allowed}, line, ""},
		{"line, shell off the allowlist", list, program{shell: "sh", path: "/bin/sh", allowed: allowed}, line, "POLICY_DENIED"},
	} {
		dec := tc.pr.decide(tc.p, tc.in)
		got := ""
		if !dec.Allow {
			e, _ := errcode.As(dec.Err())
			got = string(e.Code)
		}
		if got != tc.want {
			t.Errorf("%s: %q (%v), want %q", tc.name, got, dec.Err(), tc.want)
		}
	}
}
