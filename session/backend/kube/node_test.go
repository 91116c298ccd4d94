package kube

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/image/testimage"
	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
)

func testNode(t *testing.T) *rest.Config {
	_, rc := testenv.KubeNode(t)
	return rc
}

func testAgentImage(t *testing.T) string { return testenv.KubeAgentImage(t) }

func testNamespace(t *testing.T, rc *rest.Config) string { return testenv.KubeNamespace(t, rc) }

func testCluster(t *testing.T, rc *rest.Config, ns, instance string) *Cluster {
	t.Helper()
	c, err := NewCluster(rc, Config{Namespace: ns, Instance: instance, AgentImage: testAgentImage(t),
		PullPolicy: corev1.PullNever, LeaseDuration: 6 * time.Second, StartTimeout: 90 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

func sandboxParams(name string) Params {
	return Params{Name: name, Image: testimage.Tag(), UID: 1000, GID: 1000, Env: []string{"PATH=/bin", "GREETING=hi"},
		WorkspaceBytes: 16 << 20, TmpBytes: 8 << 20, Memory: 128 << 20, NanoCPUs: 500_000_000}
}

// agentExec runs one command over the protocol and returns its stdout and
// result.
func agentExec(t *testing.T, r *agentproto.Reader, w *agentproto.Writer, id uint64, req agentproto.ExecRequest) (string, agentproto.ExecResult) {
	t.Helper()
	if err := w.Write(id, agentproto.KindExec, req, nil); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	for {
		f, err := r.Read()
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		switch f.Kind {
		case agentproto.KindStdout:
			out.Write(f.Payload)
		case agentproto.KindExit:
			var res agentproto.ExecResult
			if err := f.Decode(&res); err != nil {
				t.Fatal(err)
			}
			return out.String(), res
		case agentproto.KindError:
			var e agentproto.Error
			f.Decode(&e)
			t.Fatalf("agent error: %+v", e)
		}
	}
}

// TestPodRunsAgent: on a real node, in a namespace that enforces Pod
// Security "restricted", a sandbox pod starts from the unchanged test image,
// the agent answers over the exec stream, a command runs as the pod's
// non-root user with no capability, and Remove leaves no pod.
func TestPodRunsAgent(t *testing.T) {
	rc := testNode(t)
	ns := testNamespace(t, rc)
	c := testCluster(t, rc, ns, "srv-test1")
	t.Cleanup(func() { c.Close(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := c.Start(ctx, "sb-t1", sandboxParams("sandbox-mcp-sb-t1-1"))
	if err != nil {
		t.Fatal(err)
	}
	r := agentproto.NewReader(sb.Stdout())
	w := agentproto.NewWriter(sb.Stdin())
	f, err := r.Read()
	if err != nil || f.Kind != agentproto.KindHello {
		t.Fatalf("first frame %v %v (agent stderr: %s)", f.Kind, err, sb.StderrTail())
	}
	var h agentproto.Hello
	f.Decode(&h)
	if h.UIDs != [3]int{1000, 1000, 1000} || h.Workspace != WorkspaceDir {
		t.Errorf("hello %+v", h)
	}
	out, res := agentExec(t, r, w, 1, agentproto.ExecRequest{Argv: []string{"sh", "-c", "id -u; grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; echo $GREETING; touch /workspace/x && echo ws; touch /x 2>/dev/null || echo rofs"}, Cwd: ".", MaxOutput: 4096, TimeoutMillis: 10000})
	if res.ExitCode != 0 {
		t.Fatalf("exit %d: %s", res.ExitCode, out)
	}
	for _, want := range []string{"1000\n", "CapEff:\t0000000000000000", "NoNewPrivs:\t1", "Seccomp:\t2", "hi\n", "ws\n", "rofs\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// The kill-tree without a group: a command that leaves a daemonised
	// child (double fork into a new session) and times out has every
	// process killed.
	out, res = agentExec(t, r, w, 2, agentproto.ExecRequest{Argv: []string{"sh", "-c", "(setsid sh -c 'sleep 300' &) ; sleep 300"}, Cwd: ".", MaxOutput: 4096, TimeoutMillis: 1000})
	if !res.TimedOut || res.Killed < 2 {
		t.Errorf("timeout: %+v %s", res, out)
	}
	out, _ = agentExec(t, r, w, 3, agentproto.ExecRequest{Argv: []string{"ps", "-o", "pid,ppid,args"}, Cwd: ".", MaxOutput: 4096, TimeoutMillis: 10000})
	if strings.Contains(out, "sleep 300") {
		t.Errorf("a sleep survived the kill-tree:\n%s", out)
	}

	// The container's log holds nothing of the protocol.
	logs, err := c.Clientset().CoreV1().Pods(ns).GetLogs(sb.Name(), &corev1.PodLogOptions{Container: SandboxContainer}).DoRaw(ctx)
	if err != nil || len(logs) != 0 {
		t.Errorf("the container log has %d bytes (%v): the protocol must not reach the node's disk", len(logs), err)
	}

	if err := sb.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sb.Done():
	default:
		t.Error("the stream is still open after Remove")
	}
	pods, _ := c.Clientset().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			t.Errorf("pod %s left after Remove", p.Name)
		}
	}
}

// TestPodStartFailures: a pod that cannot start is UNAVAILABLE with the
// cluster's reason, at once, and is deleted.
func TestPodStartFailures(t *testing.T) {
	rc := testNode(t)
	ns := testNamespace(t, rc)
	c := testCluster(t, rc, ns, "srv-test2")
	t.Cleanup(func() { c.Close(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	p := sandboxParams("sandbox-mcp-sb-t2-1")
	p.Image = "sandbox-mcp-no-such-image:1"
	_, err := c.Start(ctx, "sb-t2", p)
	if err == nil || !isUnavailable(err) || !strings.Contains(err.Error(), "ErrImageNeverPull") {
		t.Errorf("missing image: %v", err)
	}
	p = sandboxParams("sandbox-mcp-sb-t2-2")
	p.Memory = 1 << 50 // no node has a petabyte
	_, err = c.Start(ctx, "sb-t2", p)
	if err == nil || !isUnavailable(err) || !strings.Contains(err.Error(), "Insufficient memory") {
		t.Errorf("unschedulable: %v", err)
	}
	pods, _ := c.Clientset().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			t.Errorf("pod %s left after a failed start", p.Name)
		}
	}
}

// TestSweepByLease: pods of a server whose lease expired are swept by
// another; pods of a live server are not.
func TestSweepByLease(t *testing.T) {
	rc := testNode(t)
	ns := testNamespace(t, rc)
	dead := testCluster(t, rc, ns, "srv-dead")
	live := testCluster(t, rc, ns, "srv-live")
	t.Cleanup(func() { live.Close(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a, err := dead.Start(ctx, "sb-a", sandboxParams("sandbox-mcp-sb-a-1"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := live.Start(ctx, "sb-b", sandboxParams("sandbox-mcp-sb-b-1"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Remove(ctx)
	if n, err := live.Sweep(ctx); err != nil || n != 0 {
		t.Fatalf("sweep with both leases live: %d %v", n, err)
	}
	// The dead server stops renewing (as after kill -9); its stream stays
	// open, like a partitioned server's.
	dead.leaseStop()
	<-dead.leaseDone
	l, err := live.cs.CoordinationV1().Leases(ns).Get(ctx, LeaseName("srv-dead"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wait := time.Until(l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second)) + time.Second
	time.Sleep(wait)
	if n, err := live.Sweep(ctx); err != nil || n != 1 {
		t.Fatalf("sweep after the lease expired: %d %v, want 1", n, err)
	}
	select {
	case <-a.Done():
	case <-ctx.Done():
		t.Fatal("the swept pod's stream did not end")
	}
	if _, err := live.cs.CoreV1().Pods(ns).Get(ctx, b.Name(), metav1.GetOptions{}); err != nil {
		t.Fatalf("the live server's pod is gone: %v", err)
	}
	if _, err := live.cs.CoordinationV1().Leases(ns).Get(ctx, LeaseName("srv-dead"), metav1.GetOptions{}); err == nil {
		t.Error("the expired lease was not deleted")
	}
}

// TestNetworkPolicies: a sandbox pod without network reaches nothing; an
// allowlist pod reaches its server's proxy port and nothing else.
func TestNetworkPolicies(t *testing.T) {
	rc := testNode(t)
	ns := testNamespace(t, rc)
	const nodeIP = "100.72.0.1" // the test node's address on the pod network
	var open []int
	for range 2 {
		ln, err := net.Listen("tcp", nodeIP+":0")
		if err != nil {
			t.Skipf("cannot listen on the test node's pod-network address %s: %v", nodeIP, err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Write([]byte("hello\n"))
				c.Close()
			}
		}()
		open = append(open, ln.Addr().(*net.TCPAddr).Port)
	}
	proxyPort, otherPort := open[0], open[1]
	c, err := NewCluster(rc, Config{Namespace: ns, Instance: "srv-net", AgentImage: testAgentImage(t),
		PullPolicy: corev1.PullNever, StartTimeout: 90 * time.Second,
		Proxy: &Proxy{Port: proxyPort, CIDR: nodeIP + "/32"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := c.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })

	probe := func(network string) string {
		p := sandboxParams("sandbox-mcp-sb-net-" + network)
		p.Network = network
		sb, err := c.Start(ctx, "sb-net-"+network, p)
		if err != nil {
			t.Fatal(err)
		}
		defer sb.Remove(ctx)
		r, w := agentproto.NewReader(sb.Stdout()), agentproto.NewWriter(sb.Stdin())
		if _, err := r.Read(); err != nil {
			t.Fatal(err)
		}
		script := fmt.Sprintf("for p in %d %d; do if nc -w 3 %s $p </dev/null | grep -q hello; then echo $p open; else echo $p closed; fi; done", proxyPort, otherPort, nodeIP)
		out, _ := agentExec(t, r, w, 1, agentproto.ExecRequest{Argv: []string{"sh", "-c", script}, Cwd: ".", MaxOutput: 4096, TimeoutMillis: 30000})
		return out
	}
	if out, want := probe(NetworkNone), fmt.Sprintf("%d closed\n%d closed\n", proxyPort, otherPort); out != want {
		t.Errorf("network none:\n%s\nwant\n%s", out, want)
	}
	if out, want := probe(NetworkProxy), fmt.Sprintf("%d open\n%d closed\n", proxyPort, otherPort); out != want {
		t.Errorf("network proxy:\n%s\nwant\n%s", out, want)
	}
}
