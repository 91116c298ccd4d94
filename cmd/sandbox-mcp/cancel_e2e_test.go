package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// rawStdio drives the server with hand-written JSON-RPC lines, to see
// every message it writes (an SDK client hides what it does not expect).
type rawStdio struct {
	t     *testing.T
	cmd   *exec.Cmd
	in    io.WriteCloser
	msgs  chan map[string]json.RawMessage
	seen  []map[string]json.RawMessage
	audit string
}

func startRawStdio(t *testing.T, args ...string) *rawStdio {
	t.Helper()
	r := &rawStdio{t: t, msgs: make(chan map[string]json.RawMessage, 64), audit: filepath.Join(t.TempDir(), "audit.jsonl")}
	args = append(append(serverArgs(t), "--audit-log", r.audit), args...) // skips under -short before the build
	r.cmd = exec.Command(bins.Get(t).Server, args...)
	r.cmd.Env = serverEnv(t)
	stderr := &syncBuffer{}
	r.cmd.Stderr = stderr
	var err error
	if r.in, err = r.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := r.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(r.msgs)
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 64<<20)
		for sc.Scan() {
			var m map[string]json.RawMessage
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				r.msgs <- m
			}
		}
	}()
	t.Cleanup(func() {
		r.in.Close()
		done := make(chan struct{})
		go func() { r.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			r.cmd.Process.Kill()
		}
		if t.Failed() {
			t.Logf("server stderr:\n%s", stderr)
		}
	})
	r.send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}`)
	r.wait(func(m map[string]json.RawMessage) bool { return string(m["id"]) == "1" })
	r.send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	return r
}

func (r *rawStdio) send(line string) {
	r.t.Helper()
	if _, err := io.WriteString(r.in, line+"\n"); err != nil {
		r.t.Fatal(err)
	}
}

// wait reads messages until one matches, and returns it.
func (r *rawStdio) wait(match func(map[string]json.RawMessage) bool) map[string]json.RawMessage {
	r.t.Helper()
	timeout := time.After(2 * time.Minute)
	for {
		select {
		case m, ok := <-r.msgs:
			if !ok {
				r.t.Fatal("the server closed stdout")
			}
			r.seen = append(r.seen, m)
			if match(m) {
				return m
			}
		case <-timeout:
			r.t.Fatal("no matching message")
		}
	}
}

// call sends a tools/call and returns its structured result.
func (r *rawStdio) call(id int, args string) map[string]any {
	r.t.Helper()
	r.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"sandbox_exec","arguments":%s}}`, id, args))
	m := r.wait(func(m map[string]json.RawMessage) bool { return string(m["id"]) == fmt.Sprint(id) })
	var res struct {
		StructuredContent map[string]any `json:"structuredContent"`
	}
	if err := json.Unmarshal(m["result"], &res); err != nil || res.StructuredContent == nil {
		r.t.Fatalf("call %d: %s", id, m["result"])
	}
	return res.StructuredContent
}

// TestStdioCancelledCallIsNotAnswered: a call the client cancels with
// notifications/cancelled gets no response at all; its command is killed
// with its tree, and the audit log records the call as cancelled.
func TestStdioCancelledCallIsNotAnswered(t *testing.T) {
	r := startRawStdio(t)
	r.call(2, `{"argv":["true"]}`)
	r.send(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"sandbox_exec","_meta":{"progressToken":"p3"},"arguments":{"argv":["sh","-c","echo started; setsid sleep 1001 & sleep 1002"]}}}`)
	r.wait(func(m map[string]json.RawMessage) bool {
		return string(m["method"]) == `"notifications/progress"` && strings.Contains(string(m["params"]), "started")
	})
	r.send(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3,"reason":"the user pressed escape"}}`)
	deadline := time.Now().Add(20 * time.Second)
	for id := 4; ; id++ {
		out := r.call(id, `{"argv":["sh","-c","ps -o args | grep '[s]leep 100' || true"]}`)
		if out["stdout"] == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes survived the cancel: %s", out["stdout"])
		}
	}
	// Everything the server will ever write comes before its stdout
	// closes, after stdin does.
	r.in.Close()
	for m := range r.msgs {
		r.seen = append(r.seen, m)
	}
	for _, m := range r.seen {
		if string(m["id"]) == "3" {
			t.Fatalf("the cancelled call was answered: %s %s", m["result"], m["error"])
		}
	}
	b, err := os.ReadFile(r.audit)
	if err != nil {
		t.Fatal(err)
	}
	cancelled := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, `"kind":"tool_call"`) && strings.Contains(l, `"reason":"cancelled"`) {
			cancelled++
		}
	}
	if cancelled != 1 {
		t.Fatalf("%d calls audited as cancelled, want 1:\n%s", cancelled, b)
	}
}
