package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/docker"
)

// bins are the server and agent built for this test run (the server with
// the race detector when the tests run with -race), on the first
// test that needs them: a `go test -short` run, whose end-to-end tests all
// skip, builds nothing.
var bins = testenv.LazyBinaries{WithServer: true, Race: raceEnabled}

// asServerEnv, set to 1 in its environment, makes the test binary run as
// sandbox-mcp itself (main) instead of running tests, as go-sdk's command
// tests do: a test that needs the program but no engine runs it without a
// build.
const asServerEnv = "SANDBOX_MCP_TEST_AS_SERVER"

func TestMain(m *testing.M) {
	if os.Getenv(asServerEnv) == "1" {
		main()
	}
	code := m.Run()
	bins.Cleanup()
	os.Exit(code)
}

// syncBuffer collects a process's stderr.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// server is a sandbox-mcp process driven by a real MCP client over stdio.
type server struct {
	t      *testing.T
	cmd    *exec.Cmd
	cs     *mcp.ClientSession
	stderr *syncBuffer
	cli    *client.Client
	// sandboxes seen in results, checked for removal at the end
	mu        sync.Mutex
	sandboxes map[string]bool
	// onProgress gets the progress messages of a call, by its token.
	onProgress map[any]func(msg string)
	tokens     int
}

// progressed routes a progress notification to the call that asked for it.
func (s *server) progressed(r *mcp.ProgressNotificationClientRequest) {
	s.mu.Lock()
	f := s.onProgress[r.Params.ProgressToken]
	s.mu.Unlock()
	if f != nil {
		f(r.Params.Message)
	}
}

// callDone is how a call made in the background ended.
type callDone struct {
	res *mcp.CallToolResult
	err error
}

// running starts sh -c script as a sandbox_exec in the background, and
// returns once the script has printed "started" (its output comes back as
// progress notifications), so that what the script started before that is
// running. The channel gets the call's result when it ends.
func (s *server) running(ctx context.Context, script string) <-chan callDone {
	s.t.Helper()
	started := make(chan struct{})
	var once sync.Once
	s.mu.Lock()
	s.tokens++
	token := fmt.Sprintf("running-%d", s.tokens)
	if s.onProgress == nil {
		s.onProgress = map[any]func(string){}
	}
	s.onProgress[token] = func(msg string) {
		if strings.Contains(msg, "started") {
			once.Do(func() { close(started) })
		}
	}
	s.mu.Unlock()
	done := make(chan callDone, 1)
	go func() {
		res, err := s.cs.CallTool(ctx, &mcp.CallToolParams{Name: "sandbox_exec", Meta: mcp.Meta{"progressToken": token},
			Arguments: map[string]any{"argv": []string{"sh", "-c", script}}})
		done <- callDone{res, err}
	}()
	select {
	case <-started:
	case d := <-done:
		s.t.Fatalf("%q ended before it printed \"started\": %v %v", script, d.res, d.err)
	case <-time.After(time.Minute):
		s.t.Fatalf("%q did not print \"started\" within a minute", script)
	}
	return done
}

type serverOpts struct {
	args     []string
	env      []string
	progress func(*mcp.ProgressNotificationClientRequest)
	image    string
	// protocol is the MCP version the client asks for ("": the SDK's).
	protocol string
	// elicit, if set, answers the server's elicitation requests (the
	// client then declares the capability).
	elicit func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error)
}

// startServer runs the built binary with the test image and a fresh state
// directory, and connects the go-sdk client to it over stdio.
func startServer(t *testing.T, o serverOpts) *server {
	t.Helper()
	img := o.image
	if img == "" {
		img = testenv.TestImage(t)
	}
	// The stop at the test's end ends every sandbox, handles included,
	// so that nothing runs on for a lease; a test of the stop gives
	// --end-handles-at-stop=false.
	args := append([]string{"--image", img, "--state-dir", t.TempDir(), "--agent-bin", bins.Get(t).Agent,
		"--memory", "256MiB", "--max-workspace-bytes", "64MiB", "--log-level", "debug", "--end-handles-at-stop"}, o.args...)
	cmd := exec.Command(bins.Get(t).Server, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}, o.env...)
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		cmd.Env = append(cmd.Env, "DOCKER_HOST="+h)
	}
	s := &server{t: t, cmd: cmd, stderr: &syncBuffer{}, cli: testenv.Engine(t), sandboxes: map[string]bool{}}
	cmd.Stderr = s.stderr
	c := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "0"}, &mcp.ClientOptions{ProgressNotificationHandler: func(ctx context.Context, r *mcp.ProgressNotificationClientRequest) {
		if o.progress != nil {
			o.progress(r)
		}
		s.progressed(r)
	}, ElicitationHandler: o.elicit})
	// The server answers at once and prepares its sandboxes in the
	// background; a large image such as the default one may take minutes
	// to prepare on a loaded engine (a probe container of it, a seed image
	// built from it), longer than a call waits: prepare it first, as
	// `make run` does.
	connectTimeout := 60 * time.Second
	if o.image != "" {
		prep := exec.Command(bins.Get(t).Server, append([]string{"prepare"}, args...)...)
		prep.Env = cmd.Env
		if out, err := prep.CombinedOutput(); err != nil {
			t.Fatalf("sandbox-mcp prepare: %v\n%s", err, out)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.CommandTransport{Command: cmd, TerminateDuration: 20 * time.Second}, copts(o.protocol))
	if err != nil {
		t.Fatalf("connect: %v\nserver stderr:\n%s", err, s.stderr)
	}
	s.cs = cs
	t.Cleanup(func() {
		s.cs.Close()
		if t.Failed() {
			t.Logf("server stderr:\n%s", s.stderr)
		}
		s.checkNoSandboxes(20 * time.Second)
		if strings.Contains(s.stderr.String(), "DATA RACE") {
			t.Errorf("the server reported a data race:\n%s", s.stderr)
		}
	})
	return s
}

// checkNoSandboxes fails the test if a container of a sandbox this server
// reported is still on the engine after timeout.
func (s *server) checkNoSandboxes(timeout time.Duration) {
	s.mu.Lock()
	ids := make([]string, 0, len(s.sandboxes))
	for id := range s.sandboxes {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	for _, id := range ids {
		testenv.WaitNoContainers(s.t, s.cli, docker.LabelSandbox, id, timeout)
		testenv.RemoveLabelled(s.cli, docker.LabelSandbox, id)
	}
}

// call calls a tool and returns the result, remembering its sandbox.
func (s *server) call(name string, args map[string]any) *mcp.CallToolResult {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := s.cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	// On a loaded machine the server's preparation may outlast a call's
	// wait: call again, as the error says (see docs/first-start.md).
	for try := 0; err == nil && res.IsError && strings.HasPrefix(text(res), "UNAVAILABLE: sandboxes are not ready yet") && try < 10; try++ {
		s.t.Logf("%s: %s", name, text(res))
		res, err = s.cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	}
	if err != nil {
		s.t.Fatalf("%s(%v): %v", name, args, err)
	}
	if m, ok := res.StructuredContent.(map[string]any); ok {
		if id, ok := m["sandbox"].(string); ok && id != "" {
			s.mu.Lock()
			s.sandboxes[id] = true
			s.mu.Unlock()
		}
	}
	return res
}

// ok calls a tool that must succeed and returns its structured output.
func (s *server) ok(name string, args map[string]any) map[string]any {
	s.t.Helper()
	res := s.call(name, args)
	if res.IsError {
		s.t.Fatalf("%s(%v) failed: %s", name, args, text(res))
	}
	m, ok := res.StructuredContent.(map[string]any)
	if !ok {
		s.t.Fatalf("%s: structured content is %T", name, res.StructuredContent)
	}
	// Every tool that works in a sandbox names it; deleting a snapshot
	// works in none.
	if _, ok := m["sandbox"].(string); !ok && name != "sandbox_snapshot_delete" {
		s.t.Fatalf("%s: result has no sandbox id: %v", name, m)
	}
	return s.followRunning(name, args, m)
}

// fails calls a tool that must fail with code and returns the error text.
func (s *server) fails(name string, args map[string]any, code string) string {
	s.t.Helper()
	res := s.call(name, args)
	if !res.IsError {
		s.t.Fatalf("%s(%v) succeeded, want %s: %s", name, args, code, text(res))
	}
	msg := text(res)
	if !strings.HasPrefix(msg, code+": ") {
		s.t.Fatalf("%s(%v): error %q does not start with %s", name, args, msg, code)
	}
	return msg
}

func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func TestStdioTools(t *testing.T) {
	s := startServer(t, serverOpts{})

	// exec
	out := s.ok("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", "echo hi; echo err >&2; exit 4"}})
	if out["exit_code"].(float64) != 4 || out["stdout"] != "hi\n" || out["stderr"] != "err\n" || out["timed_out"] != false {
		t.Fatalf("exec: %v", out)
	}
	sandbox := out["sandbox"].(string)
	if !strings.HasPrefix(sandbox, "sb-") {
		t.Fatalf("sandbox id %q", sandbox)
	}
	out = s.ok("sandbox_exec", map[string]any{"argv": []string{"cat"}, "stdin": "piped", "env": map[string]any{"X": "1"}})
	if out["stdout"] != "piped" || out["sandbox"] != sandbox {
		t.Fatalf("exec with stdin: %v", out)
	}

	// write, read, list
	w := s.ok("sandbox_write_file", map[string]any{"path": "dir/hello.txt", "content": "hello\n"})
	if w["bytes_written"].(float64) != 6 || w["size"].(float64) != 6 || w["path"] != "dir/hello.txt" {
		t.Fatalf("write: %v", w)
	}
	w = s.ok("sandbox_write_file", map[string]any{"path": "/workspace/dir/hello.txt", "content": "again\n", "append": true})
	if w["size"].(float64) != 12 {
		t.Fatalf("append: %v", w)
	}
	r := s.ok("sandbox_read_file", map[string]any{"path": "dir/hello.txt"})
	if r["content"] != "hello\nagain\n" || r["encoding"] != "utf-8" || r["size"].(float64) != 12 || r["truncated"] != false {
		t.Fatalf("read: %v", r)
	}
	r = s.ok("sandbox_read_file", map[string]any{"path": "dir/hello.txt", "byte_offset": 6, "byte_length": 3})
	if r["content"] != "aga" || r["next_byte_offset"].(float64) != 9 {
		t.Fatalf("read range: %v", r)
	}
	r = s.ok("sandbox_read_file", map[string]any{"path": "dir/hello.txt", "offset": 2})
	if r["content"] != "again\n" || r["total_lines"].(float64) != 2 {
		t.Fatalf("read from line 2: %v", r)
	}
	bin := []byte{0, 1, 2, 0xff, 0xfe, 'x'}
	s.ok("sandbox_write_file", map[string]any{"path": "bin.dat", "content": base64.StdEncoding.EncodeToString(bin), "encoding": "base64", "mode": "0600"})
	r = s.ok("sandbox_read_file", map[string]any{"path": "bin.dat"})
	if r["encoding"] != "base64" || r["content"] != base64.StdEncoding.EncodeToString(bin) {
		t.Fatalf("binary round trip: %v", r)
	}
	l := s.ok("sandbox_list", map[string]any{"recursive": true, "details": true})
	entries := l["entries"].([]any)
	seen := map[string]map[string]any{}
	for _, e := range entries {
		m := e.(map[string]any)
		seen[m["path"].(string)] = m
	}
	if seen["dir"]["type"] != "dir" || seen["dir/hello.txt"]["type"] != "file" || seen["bin.dat"]["mode"] != "0600" || seen["dir/hello.txt"]["size"].(float64) != 12 {
		t.Fatalf("list: %v", entries)
	}
	if _, err := time.Parse(time.RFC3339, seen["bin.dat"]["mtime"].(string)); err != nil {
		t.Fatalf("mtime: %v", err)
	}

	// An image file reads as its media type; sandbox_view_image shows it.
	png := []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89\x00\x00\x00\rIDATx\x9cc\xf8\xcf\xc0\xf0\x1f\x00\x05\x00\x01\xff\x89\x99=\x1d\x00\x00\x00\x00IEND\xaeB`\x82")
	s.ok("sandbox_write_file", map[string]any{"path": "plot.png", "content": base64.StdEncoding.EncodeToString(png), "encoding": "base64"})
	r = s.ok("sandbox_read_file", map[string]any{"path": "plot.png"})
	if r["media_type"] != "image/png" || r["content"] != "" || r["size"].(float64) != float64(len(png)) {
		t.Fatalf("image read: %v", r)
	}
	if img := viewImage(t, s, "plot.png"); img.MIMEType != "image/png" || !bytes.Equal(img.Data, png) {
		t.Fatalf("view image: %s, %d bytes", img.MIMEType, len(img.Data))
	}

	// Errors the model can act on.
	s.fails("sandbox_read_file", map[string]any{"path": "../../etc/passwd"}, "OUTSIDE_WORKSPACE")
	s.fails("sandbox_read_file", map[string]any{"path": "/etc/passwd"}, "OUTSIDE_WORKSPACE")
	s.ok("sandbox_exec", map[string]any{"argv": []string{"ln", "-s", "/etc", "etc"}})
	s.fails("sandbox_read_file", map[string]any{"path": "etc/passwd"}, "OUTSIDE_WORKSPACE")
	s.fails("sandbox_write_file", map[string]any{"path": "etc/evil", "content": "x"}, "OUTSIDE_WORKSPACE")
	s.fails("sandbox_list", map[string]any{"path": "etc"}, "OUTSIDE_WORKSPACE")
	s.fails("sandbox_read_file", map[string]any{"path": "missing.txt"}, "NOT_FOUND")
	s.fails("sandbox_read_file", map[string]any{"path": "dir"}, "INVALID_ARGUMENT")
	s.ok("sandbox_exec", map[string]any{"argv": []string{"mkfifo", "fifo"}})
	start := time.Now()
	s.fails("sandbox_read_file", map[string]any{"path": "fifo"}, "INVALID_ARGUMENT")
	if time.Since(start) > 5*time.Second {
		t.Fatal("reading a FIFO blocked")
	}
	s.fails("sandbox_write_file", map[string]any{"path": "x", "content": "%%%", "encoding": "base64"}, "INVALID_ARGUMENT")
	s.fails("sandbox_write_file", map[string]any{"path": "x", "content": "a", "mode": "4755"}, "INVALID_ARGUMENT")
	s.fails("sandbox_exec", map[string]any{"argv": []string{"true"}, "cwd": "../.."}, "OUTSIDE_WORKSPACE")
	// The schema states the ceiling; the SDK's schema errors get a code too.
	msg := s.fails("sandbox_exec", map[string]any{"argv": []string{"true"}, "timeout_ms": 3600000}, "INVALID_ARGUMENT")
	if !strings.Contains(msg, "600000") {
		t.Errorf("the error does not name the ceiling: %s", msg)
	}
	s.fails("sandbox_exec", map[string]any{"argv": []string{"no-such-program"}}, "NOT_FOUND")
	s.fails("sandbox_exec", map[string]any{"argv": []string{"true"}, "sandbox": "sb-0000000000000000"}, "NOT_FOUND")
	// Schema validation happens before the handler.
	if res := s.call("sandbox_exec", map[string]any{"argv": []string{}}); !res.IsError {
		t.Fatal("empty argv accepted")
	}
	if res := s.call("sandbox_exec", map[string]any{"argv": []string{"true"}, "privileged": true}); !res.IsError {
		t.Fatal("an unknown argument was accepted")
	}

	// A timeout is an error result that still carries the partial output.
	res := s.call("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", "echo partial; sleep 30"}, "timeout_ms": 1000})
	if !res.IsError || !strings.HasPrefix(text(res), "TIMEOUT: ") {
		t.Fatalf("timeout result: %v %s", res.IsError, text(res))
	}
	so := res.StructuredContent.(map[string]any)
	if so["timed_out"] != true || so["stdout"] != "partial\n" {
		t.Fatalf("timeout output: %v", so)
	}

	// Snapshot, and read it back as a resource.
	snap := s.ok("sandbox_snapshot", map[string]any{"label": "first"})
	if snap["label"] != "first" || snap["files"].(float64) < 4 || len(snap["sha256"].(string)) != 64 || snap["uri"] != "sandbox://snapshots/"+snap["id"].(string) {
		t.Fatalf("snapshot: %v", snap)
	}
	rr, err := s.cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: snap["uri"].(string)})
	if err != nil {
		t.Fatal(err)
	}
	var tarData []byte
	for _, c := range rr.Contents {
		if c.MIMEType == "application/x-tar" {
			tarData = c.Blob
		}
	}
	names := map[string]string{}
	tr := tar.NewReader(bytes.NewReader(tarData))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("snapshot tar: %v", err)
		}
		b, _ := io.ReadAll(tr)
		names[h.Name] = string(b)
	}
	if names["dir/hello.txt"] != "hello\nagain\n" {
		t.Fatalf("snapshot contents: %v", names)
	}
	if _, err := s.cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "sandbox://snapshots/snap-00000000000000000000"}); err == nil {
		t.Fatal("an unknown snapshot was found")
	}

	// The effective policy.
	pr, err := s.cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "sandbox://policy"})
	if err != nil {
		t.Fatal(err)
	}
	var pol map[string]any
	if err := json.Unmarshal([]byte(pr.Contents[0].Text), &pol); err != nil {
		t.Fatal(err)
	}
	if pol["exec"] != "allow" || pol["max_file_bytes"].(float64) != 8<<20 || pol["exec_timeout_ms"].(float64) != 60000 {
		t.Fatalf("policy: %v", pol)
	}
}

// TestStdioSessionEndRemovesSandbox: closing stdin ends the session, and
// the server removes its container before it exits.
func TestStdioSessionEndRemovesSandbox(t *testing.T) {
	s := startServer(t, serverOpts{})
	out := s.ok("sandbox_exec", map[string]any{"argv": []string{"true"}})
	id := out["sandbox"].(string)
	if len(testenv.Containers(t, s.cli, docker.LabelSandbox, id)) != 1 {
		t.Fatal("no container for the sandbox")
	}
	done := make(chan error, 1)
	go func() { done <- s.cs.Close() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the server did not exit after stdin closed")
	}
	if left := testenv.Containers(t, s.cli, docker.LabelSandbox, id); len(left) != 0 {
		t.Fatalf("container left after the server exited: %v", left)
	}
	if !strings.Contains(s.stderr.String(), "sandbox removed") {
		t.Errorf("no removal in the log:\n%s", s.stderr)
	}
}

// TestStdioSignalEndsCallsAndCleansUp: SIGTERM during a long command ends
// the server promptly, with its sandbox removed.
func TestStdioSignalEndsCallsAndCleansUp(t *testing.T) {
	s := startServer(t, serverOpts{})
	id := s.ok("sandbox_exec", map[string]any{"argv": []string{"true"}})["sandbox"].(string)
	s.running(context.Background(), "echo started; exec sleep 300")
	start := time.Now()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The client session ends when the server closes stdout, at its exit.
	exited := make(chan struct{})
	go func() { s.cs.Wait(); close(exited) }()
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Fatal("the server did not exit within 30s of SIGTERM")
	}
	t.Logf("exited %s after SIGTERM", time.Since(start).Round(time.Millisecond))
	if left := testenv.Containers(t, s.cli, docker.LabelSandbox, id); len(left) != 0 {
		t.Fatalf("container left after SIGTERM: %v", left)
	}
}

// TestKilledServerLeavesNothing: after kill -9 no hook runs, yet the
// sandbox ends itself when its lease runs out with no server taking it
// back (docs/restart.md), and the engine removes it.
func TestKilledServerLeavesNothing(t *testing.T) {
	s := startServer(t, serverOpts{args: []string{"--lease", "5s"}})
	id := s.ok("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", "sleep 1000 &"}})["sandbox"].(string)
	if err := s.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	s.cs.Wait()
	testenv.WaitNoContainers(t, s.cli, docker.LabelSandbox, id, 40*time.Second)
}

// TestTwoServersShareTheEngine: a second server starting up (and sweeping)
// never removes the first one's live sandbox.
func TestTwoServersShareTheEngine(t *testing.T) {
	a := startServer(t, serverOpts{})
	a.ok("sandbox_write_file", map[string]any{"path": "keep.txt", "content": "mine"})
	b := startServer(t, serverOpts{})
	b.ok("sandbox_exec", map[string]any{"argv": []string{"true"}})
	if r := a.ok("sandbox_read_file", map[string]any{"path": "keep.txt"}); r["content"] != "mine" {
		t.Fatalf("the first server's sandbox changed: %v", r)
	}
}

func TestStdioAllowlist(t *testing.T) {
	s := startServer(t, serverOpts{args: []string{"--exec", "allowlist", "--allow-cmd", "ls,cat", "--allow-cmd", "echo"}})
	if out := s.ok("sandbox_exec", map[string]any{"argv": []string{"echo", "ok"}}); out["stdout"] != "ok\n" {
		t.Fatal(out)
	}
	s.ok("sandbox_exec", map[string]any{"argv": []string{"/bin/ls"}})
	msg := s.fails("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", "id"}}, "POLICY_DENIED")
	if !strings.Contains(msg, "allowed: ls, cat, echo") {
		t.Errorf("message does not list the allowlist: %s", msg)
	}
	s.fails("sandbox_exec", map[string]any{"argv": []string{"/bin/../bin/sh"}}, "POLICY_DENIED")
	// A workspace program named like an allowed one.
	s.ok("sandbox_write_file", map[string]any{"path": "ls", "content": "#!/bin/sh\nid\n", "mode": "0755"})
	s.fails("sandbox_exec", map[string]any{"argv": []string{"./ls"}}, "POLICY_DENIED")
	s.fails("sandbox_exec", map[string]any{"argv": []string{"/workspace/ls"}}, "POLICY_DENIED")
	s.fails("sandbox_exec", map[string]any{"argv": []string{"LS"}}, "POLICY_DENIED")
}

func TestStdioExecDeny(t *testing.T) {
	s := startServer(t, serverOpts{args: []string{"--exec=deny"}})
	s.fails("sandbox_exec", map[string]any{"argv": []string{"true"}}, "POLICY_DENIED")
	s.ok("sandbox_write_file", map[string]any{"path": "a", "content": "still works"})
}

func TestStdioReadOnly(t *testing.T) {
	s := startServer(t, serverOpts{args: []string{"--read-only"}})
	msg := s.fails("sandbox_write_file", map[string]any{"path": "a", "content": "x"}, "READ_ONLY")
	if !strings.Contains(msg, "--read-only") {
		t.Errorf("message: %s", msg)
	}
	// The mount enforces it: exec cannot write either.
	out := s.ok("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", "touch /workspace/x"}})
	if out["exit_code"].(float64) == 0 || !strings.Contains(out["stderr"].(string), "Read-only file system") {
		t.Fatalf("exec wrote to a read-only workspace: %v", out)
	}
	s.ok("sandbox_list", nil)
	s.ok("sandbox_snapshot", nil)
}

func TestStdioProgressCarriesOutput(t *testing.T) {
	var mu sync.Mutex
	var msgs []string
	s := startServer(t, serverOpts{progress: func(r *mcp.ProgressNotificationClientRequest) {
		mu.Lock()
		msgs = append(msgs, r.Params.Message)
		mu.Unlock()
	}})
	ctx := context.Background()
	res, err := s.cs.CallTool(ctx, &mcp.CallToolParams{
		Name:      "sandbox_exec",
		Arguments: map[string]any{"argv": []string{"sh", "-c", "for i in 1 2 3 4 5 6; do echo tick $i; sleep 0.3; done"}},
		Meta:      mcp.Meta{"progressToken": "p1"},
	})
	if err != nil || res.IsError {
		t.Fatalf("%v %v", err, res)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(msgs) < 2 || !strings.Contains(strings.Join(msgs, ""), "tick") {
		t.Fatalf("progress messages: %q", msgs)
	}
}

func TestStdioCancelKillsTheCommand(t *testing.T) {
	s := startServer(t, serverOpts{})
	s.ok("sandbox_exec", map[string]any{"argv": []string{"true"}})
	ctx, cancel := context.WithCancel(context.Background())
	done := s.running(ctx, "setsid sleep 1001 & echo started; sleep 1002")
	cancel()
	<-done
	deadline := time.Now().Add(10 * time.Second)
	for {
		out := s.ok("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", "ps -o args | grep '[s]leep 100' || true"}})
		if out["stdout"] == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes survived the cancel: %s", out["stdout"])
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestStdioSecrets: nothing of the server's environment enters a sandbox
// but what --env names, and env values never reach the log.
func TestStdioSecrets(t *testing.T) {
	s := startServer(t, serverOpts{
		args: []string{"--env", "GIVEN=given-value-7c1", "--env", "PASSED"},
		env:  []string{"SECRET_CANARY=canary-value-9f2", "PASSED=passed-value-3d4"},
	})
	out := s.ok("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", "env; cat /proc/1/environ | tr '\\0' '\\n'"}})
	env := out["stdout"].(string)
	if strings.Contains(env, "canary-value-9f2") || strings.Contains(env, "SECRET_CANARY") {
		t.Fatalf("the server's environment leaked into the sandbox:\n%s", env)
	}
	if !strings.Contains(env, "GIVEN=given-value-7c1") || !strings.Contains(env, "PASSED=passed-value-3d4") {
		t.Fatalf("--env variables missing:\n%s", env)
	}
	log := s.stderr.String()
	for _, secret := range []string{"given-value-7c1", "passed-value-3d4", "canary-value-9f2"} {
		if strings.Contains(log, secret) {
			t.Errorf("the log holds the value %q", secret)
		}
	}
	if !strings.Contains(log, "env=GIVEN,PASSED") {
		t.Errorf("the policy log does not name the variables:\n%s", log)
	}
}

// thisProgram returns a command that runs sandbox-mcp's main with args:
// the test binary itself, told by asServerEnv to be the server.
func thisProgram(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, args...)
	cmd.Env = append(os.Environ(), asServerEnv+"=1")
	return cmd
}

func TestVersionAndHelp(t *testing.T) {
	out, err := thisProgram(t, "version").Output()
	if err != nil || !strings.HasPrefix(string(out), "sandbox-mcp ") {
		t.Fatalf("version: %q %v", out, err)
	}
	out, err = thisProgram(t, "--help").Output()
	if err != nil || !strings.Contains(string(out), "--max-file-bytes") || !strings.Contains(string(out), "SANDBOX_MCP_MAX_FILE_BYTES") {
		t.Fatalf("help: %q %v", out, err)
	}
	cmd := thisProgram(t, "--exec", "sometimes")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err == nil || !strings.Contains(stderr.String(), "allow, allowlist, deny") {
		t.Fatalf("a bad flag: %v %q", err, stderr.String())
	}
}

func TestDoctor(t *testing.T) {
	img := testenv.TestImage(t) // skips under -short before the build
	cmd := exec.Command(bins.Get(t).Server, "doctor", "--image", img, "--agent-bin", bins.Get(t).Agent, "--state-dir", t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("doctor failed: %v\n%s", err, out)
	}
	for _, want := range []string{"ok    Docker engine", "ok    image", "ok    sandbox runs commands", "ok    sandbox hardening", "ok    commands run as 1000:1000", "sandbox-mcp is ready."} {
		if !strings.Contains(string(out), want) {
			t.Errorf("doctor output lacks %q:\n%s", want, out)
		}
	}
	cmd = exec.Command(bins.Get(t).Server, "doctor", "--image", "sandbox-mcp-no-such-image:0", "--agent-bin", bins.Get(t).Agent, "--state-dir", t.TempDir())
	out, err = cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "FAIL  image sandbox-mcp-no-such-image:0 is not on this engine") || !strings.Contains(string(out), "make image") {
		t.Fatalf("doctor with a missing image: %v\n%s", err, out)
	}
}

// TestDefaultImage runs the tools in the default image (make image), which
// gives agents what they expect: bash, coreutils, python3, git, curl, tar,
// procps.
func TestDefaultImage(t *testing.T) {
	s := startServer(t, serverOpts{image: testenv.DefaultImage(t)})
	script := `set -e
bash --version | head -1
python3 -c 'import sys; print("python", sys.version_info[0])'
git --version
curl --version | head -1
tar --version | head -1
ps -o pid,comm | head -1
id -un
cd /workspace && git init -q repo && cd repo && git -c user.email=a@b -c user.name=a commit -q --allow-empty -m init && git log --oneline | wc -l`
	out := s.ok("sandbox_exec", map[string]any{"argv": []string{"bash", "-c", script}})
	if out["exit_code"].(float64) != 0 {
		t.Fatalf("default image tools: %v", out)
	}
	for _, want := range []string{"GNU bash", "python 3", "git version", "curl ", "tar (GNU tar)", "PID", "sandbox", "\n1\n"} {
		if !strings.Contains(out["stdout"].(string), want) {
			t.Errorf("output lacks %q:\n%s", want, out["stdout"])
		}
	}
	// A plot made in the sandbox comes back as an image.
	s.ok("sandbox_exec", map[string]any{"argv": []string{"python3", "-c", `
import struct, zlib
def chunk(t, d): return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
raw = b"".join(b"\x00" + b"\xff\x00\x00" * 4 for _ in range(4))
png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 4, 4, 8, 2, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
open("plot.png", "wb").write(png)`}})
	img := viewImage(t, s, "plot.png")
	raw := s.ok("sandbox_read_file", map[string]any{"path": "plot.png", "encoding": "base64"})
	want, err := base64.StdEncoding.DecodeString(raw["content"].(string))
	if err != nil || img.MIMEType != "image/png" || !bytes.Equal(img.Data, want) || !bytes.HasPrefix(want, []byte("\x89PNG")) {
		t.Fatalf("the plot seen (%s, %d bytes) is not the file (%d bytes, %v)", img.MIMEType, len(img.Data), len(want), err)
	}
}
