package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/image/testimage"
	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/kube"
)

// The Kubernetes test node (../shared/tools/k8s/k8s-node.sh).
const kubeNodeDir = "/var/tmp/k8s-node"

func kubeCtl(t *testing.T, kubeconfig string, args ...string) (string, error) {
	t.Helper()
	bin := filepath.Join(kubeNodeDir, "bin", "kubectl")
	if _, err := os.Stat(bin); err != nil {
		bin = "kubectl"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", kubeconfig}, args...)...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func mustKubeCtl(t *testing.T, kubeconfig string, args ...string) string {
	t.Helper()
	out, err := kubeCtl(t, kubeconfig, args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// sandboxPods lists the sandbox pods in ns as "instance/pod" strings.
func sandboxPods(t *testing.T, kubeconfig, ns string) []string {
	t.Helper()
	out := mustKubeCtl(t, kubeconfig, "-n", ns, "get", "pods", "-l", "io.sandbox-mcp.role=sandbox",
		"-o", `jsonpath={range .items[*]}{.metadata.labels.io\.sandbox-mcp\.instance}/{.metadata.name}{"\n"}{end}`)
	return strings.Fields(out)
}

func instancesOf(pods []string) map[string]int {
	m := map[string]int{}
	for _, p := range pods {
		inst, _, _ := strings.Cut(p, "/")
		m[inst]++
	}
	return m
}

// kubeServer is a server process with the Kubernetes backend.
type kubeServer struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	exited chan struct{}
	url    string
}

func startKubeServer(t *testing.T, kubeconfig, ns, stateDir string, extra ...string) *kubeServer {
	t.Helper()
	args := append([]string{
		"--http", "127.0.0.1:0", "--token", tokenA,
		"--backend", "kubernetes", "--kubeconfig", kubeconfig, "--namespace", ns,
		"--agent-image", testenv.KubeAgentImage(t),
		"--image", testimage.Tag(),
		"--pull-policy", "Never",
		"--state-dir", stateDir,
		// Small sandboxes: the node has two CPUs, shared with other tests.
		"--memory", "128MiB", "--cpus", "0.1", "--max-workspace-bytes", "32MiB",
	}, extra...)
	s := &kubeServer{cmd: exec.Command(bins.Get(t).Server, args...), stderr: &syncBuffer{}, exited: make(chan struct{})}
	s.cmd.Stderr = s.stderr
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.cmd.Wait(); close(s.exited) }()
	t.Cleanup(func() {
		s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(90 * time.Second):
			s.cmd.Process.Kill()
			<-s.exited
		}
		if t.Failed() {
			t.Logf("server stderr:\n%s", s.stderr)
		}
		if strings.Contains(s.stderr.String(), "DATA RACE") {
			t.Errorf("the server reported a data race:\n%s", s.stderr)
		}
	})
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if m := servingURL.FindStringSubmatch(s.stderr.String()); m != nil {
			s.url = m[1]
			return s
		}
		select {
		case <-s.exited:
			t.Fatalf("the server exited before serving:\n%s", s.stderr)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server did not start serving:\n%s", s.stderr)
		}
	}
}

func connectURL(t *testing.T, endpoint string) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hc := &http.Client{Transport: bearer{tokenA, http.DefaultTransport}}
	// At sessionsVersion: these tests are about sessions and replicas.
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "replicas-e2e", Version: "0"}, nil).
		Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: hc}, &mcp.ClientSessionOptions{ProtocolVersion: sessionsVersion})
	if err != nil {
		t.Fatalf("connect to %s: %v", endpoint, err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func callTool(ctx context.Context, cs *mcp.ClientSession, name string, args map[string]any) (map[string]any, error) {
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		return nil, err
	}
	out, _ := res.StructuredContent.(map[string]any)
	if res.IsError {
		var text string
		if len(res.Content) > 0 {
			if tc, ok := res.Content[0].(*mcp.TextContent); ok {
				text = tc.Text
			}
		}
		return out, fmt.Errorf("%s failed: %s", name, text)
	}
	return out, nil
}

// TestKubeReplicas: two server processes share one namespace and one state
// directory, as two replicas of the deployment do. Each serves its own
// sessions with pods of its own; after `kill -9` of one, a client routed to
// the survivor is told UNAVAILABLE and to start over, gets its snapshot back
// through the survivor, and the survivor deletes the dead server's pod once
// its lease expired, never its own. At the end nothing is left.
func TestKubeReplicas(t *testing.T) {
	kc, rc := testenv.KubeNode(t)
	ns := testenv.KubeNamespace(t, rc)
	state := t.TempDir()
	a := startKubeServer(t, kc, ns, state)
	b := startKubeServer(t, kc, ns, state)

	// The front: what the Service does, sending a client to a live
	// replica. It sends to A until A dies, then to B.
	target := atomic.Pointer[url.URL]{}
	ua, _ := url.Parse(strings.TrimSuffix(a.url, "/mcp"))
	ub, _ := url.Parse(strings.TrimSuffix(b.url, "/mcp"))
	target.Store(ua)
	front := &http.Server{Handler: &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target.Load())
			r.Out.Host = "127.0.0.1"
		},
		FlushInterval: -1,
	}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go front.Serve(ln)
	t.Cleanup(func() { front.Close() })
	frontURL := "http://" + ln.Addr().String() + "/mcp"

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	// Each replica serves its own session, in a pod of its own.
	c1 := connectURL(t, frontURL) // to A
	if _, err := callTool(ctx, c1, "sandbox_exec", map[string]any{"command": "echo kept > f && cat f"}); err != nil {
		t.Fatal(err)
	}
	first := sandboxPods(t, kc, ns)
	if len(first) != 1 {
		t.Fatalf("sandbox pods after one session: %v", first)
	}
	instA, _, _ := strings.Cut(first[0], "/")
	snap, err := callTool(ctx, c1, "sandbox_snapshot", map[string]any{"label": "before the crash"})
	if err != nil {
		t.Fatal(err)
	}
	c2 := connectURL(t, b.url) // to B
	if _, err := callTool(ctx, c2, "sandbox_exec", map[string]any{"command": "true"}); err != nil {
		t.Fatal(err)
	}
	pods := sandboxPods(t, kc, ns)
	insts := instancesOf(pods)
	if len(pods) != 2 || len(insts) != 2 || insts[instA] != 1 {
		t.Fatalf("sandbox pods %v: want one for each server (A is %s)", pods, instA)
	}
	instB := ""
	for i := range insts {
		if i != instA {
			instB = i
		}
	}

	// kill -9 A: nothing of A's runs its shutdown. The Service sends
	// A's clients to B from now on.
	a.cmd.Process.Kill()
	<-a.exited
	target.Store(ub)

	// c1's session was A's: B answers 404 before reading the request (so
	// without its id, which the go-sdk client then reports as the
	// protocol's "session missing": start a new session), with a body that
	// says so for clients that show it.
	_, err = callTool(ctx, c1, "sandbox_exec", map[string]any{"command": "cat f"})
	if err == nil || !errors.Is(err, mcp.ErrSessionMissing) && !(strings.Contains(err.Error(), "UNAVAILABLE") && strings.Contains(err.Error(), "initialize again")) {
		t.Fatalf("a call in the dead replica's session: %v; want the session missing (404), or UNAVAILABLE and to initialize again", err)
	}
	// Starting over through the Service lands on B, where the snapshot
	// made through A is (shared state, the same caller) and restores.
	c3 := connectURL(t, frontURL)
	if _, err := callTool(ctx, c3, "sandbox_restore", map[string]any{"id": snap["id"]}); err != nil {
		t.Fatalf("restore A's snapshot through B: %v", err)
	}
	out, err := callTool(ctx, c3, "sandbox_exec", map[string]any{"command": "cat f"})
	if err != nil || out["stdout"] != "kept\n" {
		t.Fatalf("the restored workspace: %v %v", out, err)
	}

	// B sweeps A's pod once A's lease has expired, and keeps its own; the
	// same sweep then deletes A's lease (a moment after the pods: the test
	// waits for both, so that B's stop below cannot cut that sweep short).
	deadline := time.Now().Add(4 * time.Minute)
	leaseA := "lease.coordination.k8s.io/" + kube.LeaseName(instA)
	for {
		insts = instancesOf(sandboxPods(t, kc, ns))
		leases := mustKubeCtl(t, kc, "-n", ns, "get", "leases", "-o", "name")
		if insts[instA] == 0 && !strings.Contains(leases, leaseA) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dead server's pod or lease is still there after 4 minutes: pods %v, leases %q", insts, leases)
		}
		time.Sleep(2 * time.Second)
	}
	if insts[instB] != 2 {
		t.Fatalf("the surviving server's pods: %v, want its 2 (c2's and c3's)", insts)
	}
	if !strings.Contains(b.stderr.String(), "swept") {
		t.Errorf("B's log does not mention the sweep:\n%s", b.stderr)
	}

	// B stops (SIGTERM): its pods go with it; nothing is left.
	c2.Close()
	c3.Close()
	b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.exited:
	case <-time.After(90 * time.Second):
		t.Fatal("B did not exit within 90 s of SIGTERM")
	}
	if left := sandboxPods(t, kc, ns); len(left) != 0 {
		t.Errorf("pods left after both servers ended: %v", left)
	}
	if leases := mustKubeCtl(t, kc, "-n", ns, "get", "leases", "-o", "name"); leases != "" {
		t.Errorf("leases left: %s", leases)
	}
}
