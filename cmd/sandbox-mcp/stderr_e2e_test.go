package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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

// pipedServer is a stdio server whose stderr is a pipe the test can close,
// the way mcp-go's stdio client closes it before stdin.
type pipedServer struct {
	t      *testing.T
	cmd    *exec.Cmd
	cs     *mcp.ClientSession
	cli    *client.Client
	audit  string
	stderr *os.File // the read end
	mu     sync.Mutex
	log    strings.Builder
	copied chan struct{}
}

func startPipedServer(t *testing.T, args ...string) *pipedServer {
	t.Helper()
	s := &pipedServer{t: t, cli: testenv.Engine(t), audit: filepath.Join(t.TempDir(), "audit.jsonl"), copied: make(chan struct{})}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	s.stderr = r
	s.cmd = exec.Command(bins.Get(t).Server, append(append(serverArgs(t), "--audit-log", s.audit), args...)...)
	s.cmd.Env = serverEnv(t)
	s.cmd.Stderr = w
	go func() {
		defer close(s.copied)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			s.mu.Lock()
			s.log.WriteString(sc.Text() + "\n")
			s.mu.Unlock()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: "stderr-e2e", Version: "0"}, nil)
	// A long TerminateDuration: the server must exit by itself, never by
	// the transport's SIGTERM.
	cs, err := c.Connect(ctx, &mcp.CommandTransport{Command: s.cmd, TerminateDuration: 2 * time.Minute}, nil)
	w.Close() // the child has its copy
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, s.logged())
	}
	s.cs = cs
	pid := strconv.Itoa(s.cmd.Process.Pid)
	t.Cleanup(func() {
		s.cs.Close()
		testenv.RemoveLabelled(s.cli, docker.LabelPID, pid)
		// A server that died leaves its networks (a later server sweeps
		// them and their rules): remove them now.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, n := range s.networks() {
			s.cli.NetworkRemove(ctx, n, client.NetworkRemoveOptions{})
		}
		if t.Failed() {
			t.Logf("server stderr (until closed):\n%s", s.logged())
		}
	})
	return s
}

func (s *pipedServer) logged() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log.String()
}

// closeStderr closes the reading end of the server's stderr.
func (s *pipedServer) closeStderr() {
	s.stderr.Close()
	<-s.copied
}

// networks lists the names of the engine networks this server made.
func (s *pipedServer) networks() []string {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := s.cli.NetworkList(ctx, client.NetworkListOptions{Filters: make(client.Filters).Add("label", docker.LabelPID+"="+strconv.Itoa(s.cmd.Process.Pid))})
	if err != nil {
		s.t.Fatal(err)
	}
	var names []string
	for _, n := range res.Items {
		names = append(names, n.Name)
	}
	return names
}

// firewallRules returns the firewall rules that name network.
func firewallRules(t *testing.T, network string) []string {
	out, err := exec.Command("nft", "list", "table", "inet", docker.FirewallTable).CombinedOutput()
	if err != nil && !strings.Contains(string(out), "No such file") {
		t.Fatalf("nft list table inet %s: %v %s", docker.FirewallTable, err, out)
	}
	var rules []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "sandbox-mcp:"+network) {
			rules = append(rules, l)
		}
	}
	return rules
}

// waitExit waits for the server to exit by itself and checks that it
// exited with status 0, not killed by a signal.
func (s *pipedServer) waitExit() {
	s.t.Helper()
	exited := make(chan struct{})
	go func() { s.cs.Wait(); s.cs.Close(); close(exited) }()
	select {
	case <-exited:
	case <-time.After(90 * time.Second):
		s.t.Fatal("the server did not exit")
	}
	st := s.cmd.ProcessState
	if st == nil {
		s.t.Fatal("no exit status")
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		s.t.Fatalf("the server was killed by %v", ws.Signal())
	}
	if st.ExitCode() != 0 {
		s.t.Fatalf("the server exited with %d", st.ExitCode())
	}
}

// serverRecords returns the audit log's server records.
func (s *pipedServer) serverRecords() []map[string]any {
	s.t.Helper()
	b, err := os.ReadFile(s.audit)
	if err != nil {
		s.t.Fatal(err)
	}
	var recs []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			s.t.Fatalf("audit line %q: %v", l, err)
		}
		if m["kind"] == "server" {
			recs = append(recs, m)
		}
	}
	return recs
}

// TestStdioStderrClosed: a client that closes the server's stderr (before
// its stdin, as mcp-go's stdio client does, or for good) does not kill the
// server with SIGPIPE: it shuts down as on EOF, removing its container,
// network and firewall rules, and the audit log records the stop.
func TestStdioStderrClosed(t *testing.T) {
	for _, tc := range []struct {
		name string
		// then is what the client does once stderr is closed.
		then   func(s *pipedServer)
		reason string
	}{
		{"then stdin", func(s *pipedServer) { s.cs.Close() }, ""},
		{"then a call", func(s *pipedServer) {
			// The call logs; the server finds its stderr gone and stops
			// by itself, stdin still open.
			go s.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "sandbox_exec", Arguments: map[string]any{"argv": []string{"true"}}})
		}, "stderr was closed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startPipedServer(t, "--network", "allowlist", "--allow-host", "example.com")
			res, err := s.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "sandbox_exec", Arguments: map[string]any{"argv": []string{"true"}}})
			if err != nil || res.IsError {
				t.Fatalf("exec: %v %v", err, res)
			}
			id := res.StructuredContent.(map[string]any)["sandbox"].(string)
			nets := s.networks()
			if len(nets) == 0 {
				t.Fatal("no sandbox network")
			}
			for _, n := range nets {
				if len(firewallRules(t, n)) == 0 {
					t.Fatalf("no firewall rules for %s", n)
				}
			}
			s.closeStderr()
			tc.then(s)
			s.waitExit()
			if left := testenv.Containers(t, s.cli, docker.LabelSandbox, id); len(left) != 0 {
				t.Errorf("containers left: %v", left)
			}
			if left := s.networks(); len(left) != 0 {
				t.Errorf("networks left: %v", left)
			}
			for _, n := range nets {
				if r := firewallRules(t, n); len(r) != 0 {
					t.Errorf("firewall rules left: %v", r)
				}
			}
			recs := s.serverRecords()
			if len(recs) != 2 || recs[0]["event"] != "start" || recs[1]["event"] != "stop" {
				t.Fatalf("audit server records: %v", recs)
			}
			if reason, _ := recs[1]["reason"].(string); !strings.Contains(reason, tc.reason) {
				t.Errorf("stop reason %q, want %q", reason, tc.reason)
			}
		})
	}
}

// TestAllowlistShutdownLogsNoWarning: ending a session whose sandbox has a
// network removes its rules and network once, and the shutdown logs no
// warning.
func TestAllowlistShutdownLogsNoWarning(t *testing.T) {
	s := startServer(t, serverOpts{args: []string{"--network", "allowlist", "--allow-host", "example.com"}})
	s.ok("sandbox_exec", map[string]any{"argv": []string{"true"}})
	if err := s.cs.Close(); err != nil {
		t.Fatal(err)
	}
	if s.cmd.ProcessState == nil || s.cmd.ProcessState.ExitCode() != 0 {
		t.Fatalf("exit: %v", s.cmd.ProcessState)
	}
	log := s.stderr.String()
	if !strings.Contains(log, "sandbox-mcp stopped") {
		t.Fatalf("no stop in the log:\n%s", log)
	}
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
			t.Errorf("shutdown logged: %s", l)
		}
	}
}
