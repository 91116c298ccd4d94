package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// num reads a JSON number field.
func num(t *testing.T, m map[string]any, key string) int64 {
	t.Helper()
	v, ok := m[key].(float64)
	if !ok {
		t.Fatalf("%s is %T in %v", key, m[key], m)
	}
	return int64(v)
}

// pollJob calls sandbox_job until cond holds of the stdout read so far.
func pollJob(t *testing.T, s *server, job string, cond func(stdout string, r map[string]any) bool) (string, map[string]any) {
	t.Helper()
	var out strings.Builder
	deadline := time.Now().Add(60 * time.Second)
	for {
		r := s.ok("sandbox_job", map[string]any{"job": job, "wait_ms": 2000})
		out.WriteString(r["stdout"].(string))
		if cond(out.String(), r) {
			return out.String(), r
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: condition not met; stdout %q, last %v", job, out.String(), r)
		}
	}
}

// TestStdioJobs: through a real client, the way a model works: a shell
// line as command; a background loop started, polled and signalled; a
// background cat fed stdin; the jobs listed; a foreground exec with output
// far past the cap returns head and tail, with the hint saying where the
// rest is, and the rest read with sandbox_job and stdout_offset gives the
// whole output; argv written as a shell line gets the sentence that fixes
// it; the ninth background job past --max-jobs 8 is BUSY.
func TestStdioJobs(t *testing.T) {
	s := startServer(t, serverOpts{args: []string{"--max-jobs", "8"}})

	if r := s.ok("sandbox_exec", map[string]any{"command": "mkdir -p d && cd d && echo a > f && cat f && exit 3"}); r["stdout"] != "a\n" ||
		num(t, r, "exit_code") != 3 || !strings.Contains(r["hint"].(string), "exit code 3") || r["job"] == "" {
		t.Fatalf("command: %v", r)
	}

	msg := s.fails("sandbox_exec", map[string]any{"argv": []string{"ls -la"}}, "INVALID_ARGUMENT")
	if !strings.Contains(msg, `["ls", "-la"]`) || !strings.Contains(msg, "command") {
		t.Errorf("argv [\"ls -la\"]: %s", msg)
	}
	if msg := s.fails("sandbox_exec", map[string]any{"argv": []string{"cd", "d"}}, "INVALID_ARGUMENT"); !strings.Contains(msg, "cwd") {
		t.Errorf("argv [cd d]: %s", msg)
	}
	if r := s.ok("sandbox_exec", map[string]any{"argv": []string{"echo", "x", "&&", "ls"}}); !strings.Contains(r["hint"].(string), "command") {
		t.Errorf("an && in argv gives no hint: %v", r)
	}
	s.fails("sandbox_exec", map[string]any{"argv": []string{"ls"}, "command": "ls"}, "INVALID_ARGUMENT")

	loop := s.ok("sandbox_exec", map[string]any{"command": "trap 'echo bye; exit 5' TERM; i=0; while :; do echo tick $i; i=$((i+1)); sleep 0.05; done", "background": true})
	if loop["running"] != true || !strings.Contains(loop["hint"].(string), "sandbox_job") {
		t.Fatalf("background: %v", loop)
	}
	loopID := loop["job"].(string)
	out, _ := pollJob(t, s, loopID, func(out string, _ map[string]any) bool { return strings.Contains(out, "tick 2\n") })
	if !strings.HasPrefix(out, "tick 0\ntick 1\n") {
		t.Fatalf("loop output %q", out)
	}

	cat := s.ok("sandbox_exec", map[string]any{"argv": []string{"cat"}, "background": true})["job"].(string)
	// The call that feeds stdin also returns what is new: cat's echo may
	// already be in it.
	fed, _ := s.ok("sandbox_job", map[string]any{"job": cat, "stdin": "echo me\n"})["stdout"].(string)
	if fed != "echo me\n" {
		pollJob(t, s, cat, func(out string, _ map[string]any) bool { return fed+out == "echo me\n" })
	}
	if r := s.ok("sandbox_job", map[string]any{"job": cat, "close_stdin": true, "wait_ms": 10000}); r["state"] != "exited" || num(t, r, "exit_code") != 0 {
		t.Fatalf("cat after close_stdin: %v", r)
	}

	list := s.ok("sandbox_job", nil)["jobs"].([]any)
	var listed []string
	for _, j := range list {
		m := j.(map[string]any)
		listed = append(listed, fmt.Sprintf("%s %s %s", m["job"], m["state"], m["command"]))
	}
	if got := strings.Join(listed, "\n"); !strings.Contains(got, loopID+" running trap") || !strings.Contains(got, cat+" exited cat") {
		t.Fatalf("jobs:\n%s", got)
	}

	term := s.ok("sandbox_job", map[string]any{"job": loopID, "signal": "TERM"})
	out, r := term["stdout"].(string), term
	if r["state"] == "running" {
		var more string
		more, r = pollJob(t, s, loopID, func(_ string, r map[string]any) bool { return r["state"] != "running" })
		out += more
	}
	if r["state"] != "exited" || num(t, r, "exit_code") != 5 || !strings.HasSuffix(out, "bye\n") {
		t.Fatalf("loop after TERM: %v, output ends %q", r, out[max(len(out)-20, 0):])
	}

	// 588,895 bytes of output against the 32 KiB cap.
	var want strings.Builder
	for i := 1; i <= 100000; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	big := s.ok("sandbox_exec", map[string]any{"argv": []string{"seq", "1", "100000"}})
	stdout, hint := big["stdout"].(string), big["hint"].(string)
	if big["stdout_truncated"] != true || len(stdout) > 33<<10 || !strings.HasSuffix(stdout, "99999\n100000\n") || !strings.HasPrefix(stdout, "1\n2\n") {
		t.Fatalf("huge output: %d bytes, truncated %v, ends %q", len(stdout), big["stdout_truncated"], stdout[max(len(stdout)-20, 0):])
	}
	if !strings.Contains(hint, "stdout_offset 8192") || !strings.Contains(stdout, "stdout_offset 8192") {
		t.Fatalf("the hint does not say where the rest is: %q", hint)
	}
	head, tail, _ := strings.Cut(stdout, "\n[... ")
	_, tail, _ = strings.Cut(tail, " ...]\n")
	full := head + "\n"
	off := int64(len(full))
	for !strings.HasSuffix(full, tail) || len(full) < want.Len() {
		r := s.ok("sandbox_job", map[string]any{"job": big["job"], "stdout_offset": off})
		if r["stdout"] == "" {
			t.Fatalf("no more output at %d of %d", off, want.Len())
		}
		full += r["stdout"].(string)
		off = num(t, r, "stdout_offset")
	}
	if full != want.String() {
		t.Fatalf("the output read back (%d bytes) is not the command's (%d)", len(full), want.Len())
	}

	// Eight jobs run (the cat and the loop ended); the ninth is BUSY.
	for i := range 8 {
		s.ok("sandbox_exec", map[string]any{"command": fmt.Sprintf("sleep 100%d", i), "background": true})
	}
	if msg := s.fails("sandbox_exec", map[string]any{"command": "sleep 1009", "background": true}, "BUSY"); !strings.Contains(msg, "sandbox_job") {
		t.Errorf("BUSY: %s", msg)
	}
}

// TestStdioProgressArrivesWhileTheCommandRuns: output reaches the client
// as progress while the command still runs, even when nothing follows it:
// the command prints two lines and then waits for a file the test writes
// only once both lines arrived as progress (a flush on the next chunk
// never sends the second). Streams come apart, labelled, and everything
// arrives.
func TestStdioProgressArrivesWhileTheCommandRuns(t *testing.T) {
	var mu sync.Mutex
	var msgs []string
	both := make(chan struct{})
	var once sync.Once
	s := startServer(t, serverOpts{progress: func(r *mcp.ProgressNotificationClientRequest) {
		mu.Lock()
		defer mu.Unlock()
		msgs = append(msgs, r.Params.Message)
		all := strings.Join(msgs, "|")
		if strings.Contains(all, "part2") && strings.Contains(all, "oops") {
			once.Do(func() { close(both) })
		}
	}})
	s.ok("sandbox_exec", map[string]any{"argv": []string{"true"}})
	go func() {
		<-both
		s.ok("sandbox_write_file", map[string]any{"path": "go", "content": ""})
	}()
	res, err := s.cs.CallTool(context.Background(), &mcp.CallToolParams{
		Name: "sandbox_exec",
		Arguments: map[string]any{"command": "echo part1; echo oops >&2; sleep 0.05; echo part2; while [ ! -e go ]; do sleep 0.05; done; echo end",
			"timeout_ms": 30000},
		Meta: mcp.Meta{"progressToken": "p1"},
	})
	if err != nil || res.IsError {
		t.Fatalf("%v %v", err, text(res))
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		all := strings.Join(msgs, "|")
		mu.Unlock()
		if strings.Contains(all, "end") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the last line never came as progress: %q", all)
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, m := range msgs {
		stream, body, _ := strings.Cut(m, ": ")
		if (stream == "stdout") == strings.Contains(body, "oops") || stream != "stdout" && stream != "stderr" {
			t.Errorf("a notification mixes or mislabels the streams: %q", m)
		}
	}
}

// TestStdioCommandUnderPolicy: under --exec=allowlist a command string runs
// only when the shell it runs through is allowlisted, and the refusal says
// so; under --exec=deny there are no jobs, and sandbox_job says why.
func TestStdioCommandUnderPolicy(t *testing.T) {
	s := startServer(t, serverOpts{args: []string{"--exec", "allowlist", "--allow-cmd", "ls,echo"}})
	msg := s.fails("sandbox_exec", map[string]any{"command": "ls | head"}, "POLICY_DENIED")
	if !strings.Contains(msg, "shell sh") || !strings.Contains(msg, "argv") {
		t.Errorf("command under an allowlist without the shell: %s", msg)
	}
	if r := s.ok("sandbox_exec", map[string]any{"argv": []string{"echo", "hi"}}); r["stdout"] != "hi\n" {
		t.Fatal(r)
	}
	s2 := startServer(t, serverOpts{args: []string{"--exec", "allowlist", "--allow-cmd", "sh"}})
	if r := s2.ok("sandbox_exec", map[string]any{"command": "echo a; echo b"}); r["stdout"] != "a\nb\n" {
		t.Fatalf("command with sh allowlisted: %v", r)
	}
	d := startServer(t, serverOpts{args: []string{"--exec=deny"}})
	d.fails("sandbox_job", nil, "POLICY_DENIED")
	d.fails("sandbox_job", map[string]any{"job": "1"}, "POLICY_DENIED")
	d.fails("sandbox_exec", map[string]any{"command": "true", "background": true}, "POLICY_DENIED")
}

// TestHTTPJobs: over streamable HTTP, a background job outlives the call
// that started it and is fed, read and ended by later calls; another
// caller cannot reach it through its sandbox id.
func TestHTTPJobs(t *testing.T) {
	s := startHTTP(t, httpOpts{env: []string{"SANDBOX_MCP_TOKEN=" + tokenA + "," + tokenB}})
	a := s.connect(tokenA)
	r := a.ok("sandbox_exec", map[string]any{"command": "while read l; do echo \"got $l\"; done", "background": true})
	job, sb := r["job"].(string), r["sandbox"].(string)
	fed, _ := a.ok("sandbox_job", map[string]any{"job": job, "stdin": "one\ntwo\n"})["stdout"].(string) // may hold the echo already
	if fed != "got one\ngot two\n" {
		pollJob(t, a, job, func(out string, _ map[string]any) bool { return fed+out == "got one\ngot two\n" })
	}
	if r := a.ok("sandbox_job", map[string]any{"job": job, "close_stdin": true, "wait_ms": 10000}); r["state"] != "exited" {
		t.Fatalf("after close_stdin: %v", r)
	}
	a.ok("sandbox_exec", map[string]any{"argv": []string{"sleep", "1000"}, "background": true})

	b := s.connect(tokenB)
	if msg := b.fails("sandbox_job", map[string]any{"job": job, "sandbox": sb}, "NOT_FOUND"); !strings.Contains(msg, "sandbox") {
		t.Errorf("another session's sandbox: %s", msg)
	}
	if jobs, _ := b.ok("sandbox_job", nil)["jobs"].([]any); len(jobs) != 0 {
		t.Fatalf("a new session lists jobs: %v", jobs)
	}
}

// TestStdioProgressGoesOnPastTheCap: output written after a stream passed
// the result's cap still reaches the client as progress while the command
// runs: the command prints 100 KB, then a marker, then waits for a file the
// test writes only once the marker came as progress.
func TestStdioProgressGoesOnPastTheCap(t *testing.T) {
	var mu sync.Mutex
	var all strings.Builder
	seen := make(chan struct{})
	var once sync.Once
	s := startServer(t, serverOpts{progress: func(r *mcp.ProgressNotificationClientRequest) {
		mu.Lock()
		defer mu.Unlock()
		all.WriteString(r.Params.Message)
		if strings.Contains(all.String(), "after-the-cap") {
			once.Do(func() { close(seen) })
		}
	}})
	s.ok("sandbox_exec", map[string]any{"argv": []string{"true"}})
	go func() {
		<-seen
		s.ok("sandbox_write_file", map[string]any{"path": "go", "content": ""})
	}()
	res, err := s.cs.CallTool(context.Background(), &mcp.CallToolParams{
		Name: "sandbox_exec",
		Arguments: map[string]any{"command": "seq 1 20000; echo after-the-cap; while [ ! -e go ]; do sleep 0.05; done; echo end",
			"timeout_ms": 30000},
		Meta: mcp.Meta{"progressToken": "p2"},
	})
	if err != nil || res.IsError {
		t.Fatalf("%v %v", err, text(res))
	}
	// The sandbox_job read that follows is not moved by progress's reads.
	sc := res.StructuredContent.(map[string]any)
	if r := s.ok("sandbox_job", map[string]any{"job": sc["job"]}); r["stdout"] != "" {
		t.Fatalf("a read after the exec returns %q", r["stdout"])
	}
}

// TestStdioJobWaitFor: sandbox_job's wait_for waits, in one call, until a
// new line of the job's output matches (returning the line and everything
// read on the way), or says the job ended first or the wait passed first;
// a pattern that is not RE2 is INVALID_ARGUMENT.
func TestStdioJobWaitFor(t *testing.T) {
	s := startServer(t, serverOpts{protocol: "2025-11-25"})
	start := s.ok("sandbox_exec", map[string]any{"command": "echo booting; sleep 1; echo 'Listening on port 8000'; sleep 30", "background": true})
	job := start["job"].(string)
	began := time.Now()
	out := s.ok("sandbox_job", map[string]any{"job": job, "wait_ms": 20000, "wait_for": `Listening on port \d+`})
	if out["wait_ended"] != "matched" || out["matched"] != "Listening on port 8000" || out["state"] != "running" ||
		!strings.Contains(out["stdout"].(string), "booting\nListening on port 8000\n") {
		t.Fatalf("wait_for: %v", out)
	}
	if d := time.Since(began); d > 15*time.Second {
		t.Fatalf("the match took %s", d)
	}
	out = s.ok("sandbox_job", map[string]any{"job": job, "wait_ms": 700, "wait_for": "never printed"})
	if out["wait_ended"] != "timed_out" || !strings.Contains(out["hint"].(string), "No new line matched") {
		t.Fatalf("a pattern that never matches: %v", out)
	}
	done := s.ok("sandbox_exec", map[string]any{"command": "sleep 1; echo bye", "background": true})["job"].(string)
	out = s.ok("sandbox_job", map[string]any{"job": done, "wait_ms": 20000, "wait_for": "hello"})
	if out["wait_ended"] != "job_ended" || out["state"] != "exited" || out["stdout"] != "bye\n" {
		t.Fatalf("a job that ends first: %v", out)
	}
	s.fails("sandbox_job", map[string]any{"job": job, "wait_ms": 100, "wait_for": "(unclosed"}, "INVALID_ARGUMENT")
	s.ok("sandbox_job", map[string]any{"job": job, "signal": "KILL"})
}
