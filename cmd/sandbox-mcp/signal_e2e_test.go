package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/docker"
)

// TestStdioSignalsWhileStoppingAreHarmless: clients end a stdio server by
// closing its stdin and, a moment later, sending SIGTERM (mcp-go after 2 s,
// then SIGKILL after 3 more). A SIGTERM that lands while the server removes
// its sandbox, or after it has done so and is exiting, must not kill it by
// the signal's default action: it exits 0 and leaves nothing. The client
// here sends SIGTERM every 10 ms from the moment stdin closes, so one lands
// in every phase of the shutdown.
func TestStdioSignalsWhileStoppingAreHarmless(t *testing.T) {
	cli := testenv.Engine(t)
	args := serverArgs(t) // skips under -short before the build
	cmd := exec.Command(bins.Get(t).Server, args...)
	cmd.Env = serverEnv(t)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		if t.Failed() {
			t.Logf("server stderr:\n%s", stderr)
		}
	})
	lines := bufio.NewScanner(stdout)
	lines.Buffer(make([]byte, 1<<20), 1<<20)
	send := func(msg string) {
		t.Helper()
		if _, err := stdin.Write([]byte(msg + "\n")); err != nil {
			t.Fatal(err)
		}
	}
	read := func() map[string]any {
		t.Helper()
		if !lines.Scan() {
			t.Fatalf("the server closed stdout: %v", lines.Err())
		}
		var m map[string]any
		if err := json.Unmarshal(lines.Bytes(), &m); err != nil {
			t.Fatalf("%s: %v", lines.Bytes(), err)
		}
		return m
	}
	send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}`)
	read()
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"sandbox_exec","arguments":{"argv":["true"]}}}`)
	res := read()
	sc, _ := res["result"].(map[string]any)["structuredContent"].(map[string]any)
	id, _ := sc["sandbox"].(string)
	if id == "" {
		t.Fatalf("no sandbox in %v", res)
	}
	stdin.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	sent := 0
	for {
		select {
		case err := <-exited:
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				t.Fatalf("after %d SIGTERMs the server ended with %v, not exit status 0", sent, err)
			}
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(stderr.String(), "sandbox removed") {
				t.Errorf("the server exited without removing its sandbox")
			}
			testenv.WaitNoContainers(t, cli, docker.LabelSandbox, id, 30*time.Second)
			return
		case <-tick.C:
			if err := cmd.Process.Signal(syscall.SIGTERM); err == nil {
				sent++
			}
		}
	}
}
