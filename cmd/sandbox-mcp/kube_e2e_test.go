package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/kube"
)

// The acceptance tests of the Docker backend, on the Kubernetes backend:
// the built binary with --backend kubernetes, driven by the go-sdk client,
// against the real test node (they skip when none is up; .ci/run brings
// one up).

// kubeEnv is one test's namespace on the test node.
type kubeEnv struct {
	kubeconfig, ns, agent string
	cs                    kubernetes.Interface
}

func newKubeEnv(t *testing.T) *kubeEnv {
	t.Helper()
	kc, rc := testenv.KubeNode(t)
	return &kubeEnv{kubeconfig: kc, ns: testenv.KubeNamespace(t, rc), agent: testenv.KubeAgentImage(t),
		cs: kubernetes.NewForConfigOrDie(rc)}
}

// args are the flags that put a server on the test node.
func (k *kubeEnv) args(extra ...string) []string {
	return append([]string{"--backend", "kubernetes", "--kubeconfig", k.kubeconfig, "--namespace", k.ns,
		"--agent-image", k.agent, "--pull-policy", "Never"}, extra...)
}

// pods returns the sandbox pods of a sandbox (all sandboxes for "") that
// are not being deleted, with their phases.
func (k *kubeEnv) pods(t *testing.T, sandbox string) map[string]string {
	t.Helper()
	sel := kube.LabelRole + "=sandbox"
	if sandbox != "" {
		sel += "," + kube.LabelSandbox + "=" + sandbox
	}
	list, err := k.cs.CoreV1().Pods(k.ns).List(context.Background(), metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out[p.Name] = string(p.Status.Phase)
		}
	}
	return out
}

// waitNoPods waits until no pod of the sandbox is left (deleted, or being
// deleted).
func (k *kubeEnv) waitNoPods(t *testing.T, sandbox string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		left := k.pods(t, sandbox)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pods left after %v: %v", timeout, left)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestKubeTools: tools, policy, confinement, timeouts with the kill-tree,
// snapshots and their restore, on pods.
func TestKubeTools(t *testing.T) {
	k := newKubeEnv(t)
	s := startServer(t, serverOpts{args: k.args("--exec", "allowlist", "--allow-cmd", "sh,cat,echo,ls,ps")})
	out := s.ok("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", "echo hi; echo err >&2; id -u; exit 4"}})
	if out["exit_code"].(float64) != 4 || out["stdout"] != "hi\n1000\n" || out["stderr"] != "err\n" {
		t.Fatalf("exec: %v", out)
	}
	id := out["sandbox"].(string)
	if pods := k.pods(t, id); len(pods) != 1 {
		t.Fatalf("pods of %s: %v", id, pods)
	}
	// Policy: a command off the allowlist never reaches the pod.
	s.fails("sandbox_exec", map[string]any{"argv": []string{"id"}}, "POLICY_DENIED")
	// Files, confined to the workspace.
	s.ok("sandbox_write_file", map[string]any{"path": "dir/a.txt", "content": "one\n"})
	if r := s.ok("sandbox_read_file", map[string]any{"path": "dir/a.txt"}); r["content"] != "one\n" {
		t.Fatalf("read: %v", r)
	}
	s.fails("sandbox_read_file", map[string]any{"path": "../etc/passwd"}, "OUTSIDE_WORKSPACE")
	s.ok("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", "ln -s /etc /workspace/link"}})
	s.fails("sandbox_read_file", map[string]any{"path": "link/passwd"}, "OUTSIDE_WORKSPACE")
	// A timeout kills the command and what it left behind.
	res := s.call("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", "(setsid sh -c 'sleep 301' &); echo partial; sleep 300"}, "timeout_ms": 1000})
	if !res.IsError || !strings.HasPrefix(text(res), "TIMEOUT: ") {
		t.Fatalf("timeout: %s", text(res))
	}
	if ps := s.ok("sandbox_exec", map[string]any{"argv": []string{"ps", "-o", "args"}}); strings.Contains(ps["stdout"].(string), "sleep 30") {
		t.Fatalf("the kill-tree left processes:\n%s", ps["stdout"])
	}
	// Snapshot, change, restore.
	snap := s.ok("sandbox_snapshot", map[string]any{"label": "v1"})
	s.ok("sandbox_write_file", map[string]any{"path": "dir/a.txt", "content": "two\n"})
	s.ok("sandbox_restore", map[string]any{"id": snap["id"]})
	if r := s.ok("sandbox_read_file", map[string]any{"path": "dir/a.txt"}); r["content"] != "one\n" {
		t.Fatalf("after restore: %v", r)
	}
	// The session's end removes the pod.
	s.cs.Close()
	k.waitNoPods(t, id, 30*time.Second)
}

// TestKubeLostPod: a pod deleted from outside is reported as lost, and the
// next call gets a fresh pod restored from the latest snapshot.
func TestKubeLostPod(t *testing.T) {
	k := newKubeEnv(t)
	s := startServer(t, serverOpts{args: k.args()})
	id := s.ok("sandbox_write_file", map[string]any{"path": "keep.txt", "content": "kept"})["sandbox"].(string)
	s.ok("sandbox_snapshot", nil)
	for name := range k.pods(t, id) {
		zero := int64(0)
		if err := k.cs.CoreV1().Pods(k.ns).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
	}
	// The server learns of the loss when the exec stream ends; the call
	// that meets it is UNAVAILABLE, and a later one restores.
	deadline := time.Now().Add(60 * time.Second)
	for {
		res := s.call("sandbox_read_file", map[string]any{"path": "keep.txt"})
		if !res.IsError {
			if got := res.StructuredContent.(map[string]any)["content"]; got != "kept" {
				t.Fatalf("after the loss: %v", got)
			}
			break
		}
		if !strings.HasPrefix(text(res), "UNAVAILABLE: ") {
			t.Fatalf("lost pod: %s", text(res))
		}
		if time.Now().After(deadline) {
			t.Fatal("no fresh pod after the loss")
		}
	}
	if pods := k.pods(t, id); len(pods) != 1 {
		t.Fatalf("pods after recovery: %v", pods)
	}
}

// TestKubeKilledServerSwept: after kill -9 the pod's agent hears from no
// server and ends itself when its --lease runs out (the pod's hub keeps
// the agent past its server's stream, so that another server could take
// it over); the next server's sweep leaves no pod.
func TestKubeKilledServerSwept(t *testing.T) {
	k := newKubeEnv(t)
	a := startServer(t, serverOpts{args: append(k.args(), "--lease", "10s")})
	id := a.ok("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", "sleep 1000 &"}})["sandbox"].(string)
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	a.cs.Wait()
	// The pod ends by itself (its agent's lease ran out)...
	deadline := time.Now().Add(90 * time.Second)
	for {
		phases := k.pods(t, id)
		running := false
		for _, ph := range phases {
			running = running || ph == "Running" || ph == "Pending"
		}
		if !running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pod still runs after its server was killed: %v", phases)
		}
		time.Sleep(500 * time.Millisecond)
	}
	// ...and a new server sweeps it.
	b := startServer(t, serverOpts{args: k.args()})
	b.ok("sandbox_exec", map[string]any{"argv": []string{"true"}})
	k.waitNoPods(t, id, 30*time.Second)
}

// TestKubeNetwork: --network=none reaches nothing; with the allowlist, the
// proxy (found through HTTPS_PROXY, with the sandbox's credential) is the
// only way out, and it refuses a request without the credential.
func TestKubeNetwork(t *testing.T) {
	k := newKubeEnv(t)
	const nodeIP = "100.72.0.1"
	target, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	go func() {
		for {
			c, err := target.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hello from target\n"))
			c.Close()
		}
	}()
	tport := target.Addr().(*net.TCPAddr).Port
	other, err := net.Listen("tcp", nodeIP+":0")
	if err != nil {
		t.Skipf("cannot listen on the node's pod-network address: %v", err)
	}
	defer other.Close()
	oport := other.Addr().(*net.TCPAddr).Port
	pl, err := net.Listen("tcp", nodeIP+":0") // a free port for the proxy
	if err != nil {
		t.Fatal(err)
	}
	pport := pl.Addr().(*net.TCPAddr).Port
	pl.Close()

	none := startServer(t, serverOpts{args: k.args()})
	out := none.ok("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", fmt.Sprintf("nc -w 3 %s %d </dev/null && echo open || echo closed", nodeIP, oport)}})
	if out["stdout"] != "closed\n" {
		t.Errorf("network none reached the node: %v", out)
	}

	proxy := fmt.Sprintf("%s:%d", nodeIP, pport)
	al := startServer(t, serverOpts{args: k.args("--network", "allowlist", "--allow-host", fmt.Sprintf("localhost:%d", tport),
		"--allow-private-networks", "--proxy-listen", proxy, "--proxy-advertise", proxy)})
	script := fmt.Sprintf(`p=${HTTPS_PROXY#http://}; cred=${p%%@*}; hp=${p#*@}
auth=$(printf %%s "$cred" | base64)
printf 'CONNECT localhost:%[1]d HTTP/1.1\r\nHost: localhost:%[1]d\r\nProxy-Authorization: Basic %%s\r\n\r\n' "$auth" | nc -w 3 ${hp%%:*} ${hp##*:}
echo ---
printf 'CONNECT localhost:%[1]d HTTP/1.1\r\nHost: localhost:%[1]d\r\n\r\n' | nc -w 3 ${hp%%:*} ${hp##*:} | head -1
echo ---
nc -w 3 %[2]s %[3]d </dev/null && echo open || echo closed`, tport, nodeIP, oport)
	out = al.ok("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", script}, "timeout_ms": 30000})
	parts := strings.Split(out["stdout"].(string), "---\n")
	if len(parts) != 3 || !strings.Contains(parts[0], "200") || !strings.Contains(parts[0], "hello from target") {
		t.Fatalf("through the proxy with the credential:\n%v", out)
	}
	if !strings.Contains(parts[1], "407") {
		t.Errorf("without the credential: %q, want 407", parts[1])
	}
	if parts[2] != "closed\n" {
		t.Errorf("an allowlist pod reached another port of the node: %q", parts[2])
	}
}

// TestKubeWarmPoolAndIdleReap: with --warm 1 a pod waits ahead of need and
// serves the first call; an idle sandbox's pod is saved and removed, and
// the next call gets a fresh pod restored from that snapshot.
func TestKubeWarmPoolAndIdleReap(t *testing.T) {
	k := newKubeEnv(t)
	s := startServer(t, serverOpts{args: k.args("--warm", "1", "--idle-timeout", "4s", "--cpus", "0.5")})
	// The pool fills before any call.
	deadline := time.Now().Add(60 * time.Second)
	for len(k.pods(t, "")) < 1 {
		if time.Now().After(deadline) {
			t.Fatal("the warm pool made no pod")
		}
		time.Sleep(200 * time.Millisecond)
	}
	id := s.ok("sandbox_write_file", map[string]any{"path": "note.txt", "content": "before the reap"})["sandbox"].(string)
	// The idle reaper saves the workspace and removes the pod.
	k.waitNoPods(t, id, 60*time.Second)
	// The first call after it says so (as with Docker); the next restores.
	if msg := s.fails("sandbox_read_file", map[string]any{"path": "note.txt"}, "UNAVAILABLE"); !strings.Contains(msg, "--idle-timeout") {
		t.Errorf("after the reap: %s", msg)
	}
	r := s.ok("sandbox_read_file", map[string]any{"path": "note.txt"})
	if r["content"] != "before the reap" || r["sandbox"] != id {
		t.Fatalf("after the idle reap: %v", r)
	}
	if pods := k.pods(t, id); len(pods) != 1 {
		t.Fatalf("pods of the restored sandbox: %v", pods)
	}
}

// TestKubeDoctor: doctor with --backend kubernetes checks the cluster the
// server would use (API server, namespace, permissions, a real sandbox pod's
// hardening and identities) and leaves nothing behind; a missing namespace
// and credentials without the server's permissions are FAILs that say what
// to do.
func TestKubeDoctor(t *testing.T) {
	k := newKubeEnv(t)
	doctor := func(args ...string) (string, error) {
		cmd := exec.Command(bins.Get(t).Server, append([]string{"doctor", "--image", testenv.TestImage(t), "--state-dir", t.TempDir()}, args...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := doctor(k.args()...)
	if err != nil {
		t.Fatalf("doctor: %v\n%s", err, out)
	}
	t.Logf("doctor:\n%s", out)
	for _, want := range []string{"ok    Kubernetes API server", "enforces Pod Security restricted", "ok    permissions in namespace " + k.ns,
		"ok    sandbox runs commands", "ok    sandbox pod hardening", "ok    commands run as 1000:1000", "io_uring", "sandbox-mcp is ready."} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "FAIL") {
		t.Errorf("doctor failed a check:\n%s", out)
	}
	k.waitNoPods(t, "", 30*time.Second)
	if leases, err := k.cs.CoordinationV1().Leases(k.ns).List(context.Background(), metav1.ListOptions{}); err != nil || len(leases.Items) != 0 {
		t.Errorf("leases left by doctor: %v %v", leases, err)
	}

	// A namespace that does not exist.
	args := k.args()
	for i, a := range args {
		if a == k.ns {
			args[i] = "sbx-test-missing"
		}
	}
	if out, err := doctor(args...); err == nil || !strings.Contains(out, "FAIL  namespace sbx-test-missing does not exist") {
		t.Errorf("doctor in a missing namespace: %v\n%s", err, out)
	}

	// Credentials without the server's Role: a service account nothing is
	// bound to, impersonated by the test node's admin.
	cfg, err := clientcmd.LoadFromFile(k.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range cfg.AuthInfos {
		ai.Impersonate = "system:serviceaccount:" + k.ns + ":nobody"
	}
	weak := filepath.Join(t.TempDir(), "nobody.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, weak); err != nil {
		t.Fatal(err)
	}
	args = k.args()
	for i, a := range args {
		if a == k.kubeconfig {
			args[i] = weak
		}
	}
	out, err = doctor(args...)
	if err == nil || !strings.Contains(out, "FAIL  these credentials may not create pods") || !strings.Contains(out, "deploy/kubernetes/rbac.yaml") {
		t.Errorf("doctor without permissions: %v\n%s", err, out)
	}
	if strings.Contains(out, "ok    sandbox runs commands") {
		t.Errorf("doctor went on to start a sandbox without permissions:\n%s", out)
	}
}

// TestKubeSeccompLocalhost: with --seccomp-localhost-profile the sandbox
// container runs under a profile installed on the node (here the example
// without io_uring), so io_uring_setup fails in the pod where the node
// runtime's default allows it; a profile missing from the node is a start
// failure that says so.
func TestKubeSeccompLocalhost(t *testing.T) {
	k := newKubeEnv(t)
	// The kubelet's seccomp directory: its root directory is beside the
	// test node's pki directory (../shared/tools/k8s/k8s-node.sh).
	seccompDir := filepath.Join(filepath.Dir(filepath.Dir(k.kubeconfig)), "kubelet", "seccomp")
	if _, err := os.Stat(filepath.Dir(seccompDir)); err != nil {
		t.Skipf("the test node's kubelet directory is not on this machine (%v)", err)
	}
	rel := filepath.Join("sandbox-mcp-test-"+k.ns, "no-io_uring.json")
	profile, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "examples", "seccomp-no-io_uring.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(seccompDir, filepath.Dir(rel)), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(filepath.Join(seccompDir, filepath.Dir(rel))) })
	if err := os.WriteFile(filepath.Join(seccompDir, rel), profile, 0o644); err != nil {
		t.Fatal(err)
	}

	s := startServer(t, serverOpts{args: k.args("--seccomp-localhost-profile", rel)})
	out := s.ok("sandbox_exec", map[string]any{"argv": []string{kube.AgentPath, "probe-io-uring"}})
	if got := strings.TrimSpace(out["stdout"].(string)); got != "blocked: EPERM" {
		t.Errorf("io_uring_setup under the node-local profile: %q, want blocked: EPERM", got)
	}
	pods, err := k.cs.CoreV1().Pods(k.ns).List(context.Background(), metav1.ListOptions{LabelSelector: kube.LabelSandbox + "=" + out["sandbox"].(string)})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("the sandbox's pod: %v %v", pods, err)
	}
	if sp := pods.Items[0].Spec.Containers[0].SecurityContext.SeccompProfile; sp == nil || sp.LocalhostProfile == nil || *sp.LocalhostProfile != rel {
		t.Errorf("the pod's seccomp profile: %+v", sp)
	}
	s.cs.Close()
	k.waitNoPods(t, out["sandbox"].(string), 30*time.Second)

	// A profile the node does not have: the pod cannot start, and the call
	// says why rather than hanging.
	missing := startServer(t, serverOpts{args: k.args("--seccomp-localhost-profile", "sandbox-mcp-test-missing/none.json")})
	msg := missing.fails("sandbox_exec", map[string]any{"argv": []string{"true"}}, "UNAVAILABLE")
	t.Logf("with a missing profile: %s", msg)
	if !strings.Contains(msg, "seccomp") {
		t.Errorf("a missing node-local profile: %s", msg)
	}
	k.waitNoPods(t, "", 60*time.Second)
}

// TestKubeFirstStartAnswersAtOnce: with --backend kubernetes the built
// server answers initialize, tools/list, resources/list and ping within
// answerBound of its start, while it prepares the cluster (namespace,
// lease, network policies) in the background; the first tool call then
// runs in a pod.
func TestKubeFirstStartAnswersAtOnce(t *testing.T) {
	k := newKubeEnv(t)
	stderr := &syncBuffer{}
	cmd := exec.Command(bins.Get(t).Server, append(k.args(), "--state-dir", t.TempDir())...)
	cmd.Env = serverEnv(t)
	cmd.Stderr = stderr
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bound := answerBound(t, bins.Get(t).Server)
	start := time.Now()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "kube-first-start", Version: "0"}, nil).
		Connect(ctx, &mcp.CommandTransport{Command: cmd, TerminateDuration: 20 * time.Second}, nil)
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, stderr)
	}
	var sandbox string
	t.Cleanup(func() {
		cs.Close()
		if sandbox != "" {
			k.waitNoPods(t, sandbox, 60*time.Second)
		}
		if t.Failed() {
			t.Logf("server stderr:\n%s", stderr)
		}
	})
	if _, err := cs.ListTools(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.ListResources(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if err := cs.Ping(ctx, nil); err != nil {
		t.Fatal(err)
	}
	answered := time.Since(start)
	t.Logf("initialize, tools/list, resources/list and ping answered %s after the start", answered.Round(time.Millisecond))
	if answered > bound {
		t.Fatalf("answered %s after the start, want within %s (%s and what the load adds to a process start)", answered, bound, answerWithin)
	}
	for try := 1; ; try++ {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "sandbox_exec", Arguments: map[string]any{"argv": []string{"echo", "ran"}}})
		if err != nil {
			t.Fatal(err)
		}
		if !res.IsError {
			out, _ := res.StructuredContent.(map[string]any)
			if out["stdout"] != "ran\n" {
				t.Fatalf("the first call: %v", out)
			}
			sandbox, _ = out["sandbox"].(string)
			return
		}
		if try == 3 || !strings.Contains(text(res), "not ready yet") {
			t.Fatalf("the first call: %s", text(res))
		}
	}
}
