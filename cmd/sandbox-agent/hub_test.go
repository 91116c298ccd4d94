package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agentclient"
	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
)

// TestHubHandsTheAgentOver: the hub runs the agent and lends its stream to
// one attach at a time. The first attach gets the hello and gives a lease
// with a token; a background job starts; a second attach takes the agent
// over at once (no quiet period: the hub hands the agent whole frames
// only), sees the job running on, and the first attach exits with
// ExitSuperseded. A third attach then takes it back, as replicas
// alternating do.
func TestHubHandsTheAgentOver(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("runs the agent as uid 1000: needs root")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "sandbox-agent")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ws := filepath.Join(dir, "ws")
	os.Mkdir(ws, 0o777)
	os.Chmod(dir, 0o755)
	os.Chmod(filepath.Dir(dir), 0o755)
	var b [6]byte
	rand.Read(b[:])
	env := []string{"PATH=/usr/bin:/bin", "SANDBOX_MCP_WORKSPACE=" + ws, "SANDBOX_MCP_HUB_SOCKET=@sandbox-mcp-hub-test-" + hex.EncodeToString(b[:])}
	as1000 := &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000}, Setpgid: true}
	hub := exec.Command(bin, HubCommand, "-user=1000:1000", "-unprivileged")
	hub.Env, hub.SysProcAttr, hub.Stderr = env, as1000, os.Stderr
	if err := hub.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-hub.Process.Pid, syscall.SIGKILL); hub.Wait() })

	type attached struct {
		cmd  *exec.Cmd
		conn *agentclient.Conn
		done chan error
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const token = "0123456789abcdef0123456789abcdef"
	attach := func(first bool) attached {
		t.Helper()
		var cmd *exec.Cmd
		var conn *agentclient.Conn
		for try := 0; ; try++ {
			cmd = exec.Command(bin, AttachCommand)
			cmd.Env, cmd.SysProcAttr = env, as1000
			stdin, _ := cmd.StdinPipe()
			stdout, _ := cmd.StdoutPipe()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			var err error
			start := time.Now()
			if first {
				conn, err = agentclient.New(ctx, stdout, stdin, stdin, time.Minute, token, slog.New(slog.DiscardHandler))
			} else {
				conn, _, err = agentclient.Resume(ctx, stdout, stdin, stdin, token, time.Minute, 0, slog.New(slog.DiscardHandler))
				if err == nil && time.Since(start) > agentproto.FrameStall {
					t.Errorf("the takeover took %v", time.Since(start))
				}
			}
			if err == nil {
				break
			}
			cmd.Process.Kill()
			cmd.Wait()
			if try > 50 {
				t.Fatalf("attach: %v", err)
			}
			time.Sleep(100 * time.Millisecond) // the hub is not listening yet
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		return attached{cmd, conn, done}
	}
	first := attach(true)
	res, err := first.conn.Exec(ctx, agentclient.ExecRequest{Argv: []string{"sh", "-c", "while true; do echo tick; sleep 0.1; done"}, Cwd: ".", MaxOutput: 1 << 16, Background: true},
		agentclient.JobOpts{ID: 1, KeepOutput: 1 << 20, MaxJobs: 4})
	if err != nil || !res.Running {
		t.Fatalf("background job: %+v %v", res, err)
	}
	second := attach(false)
	select {
	case err := <-first.done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != ExitSuperseded {
			t.Errorf("the first attach ended with %v, want exit %d", err, ExitSuperseded)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the first attach did not end when the second took over")
	}
	jobs, err := second.conn.Jobs(ctx, 10)
	if err != nil || len(jobs) != 1 || jobs[0].State != agentproto.JobRunning {
		t.Fatalf("jobs after the takeover: %+v %v", jobs, err)
	}
	third := attach(false)
	jr, err := third.conn.Job(ctx, agentproto.JobRequest{Job: 1, WaitMillis: 1000, StdoutOffset: 0, Max: 1 << 16})
	if err != nil || len(jr.Out[0]) == 0 || jr.Status.State != agentproto.JobRunning {
		t.Fatalf("the job read by the third attach: %+v %v", jr, err)
	}
	select {
	case <-second.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the second attach did not end when the third took over")
	}
}
