// Package kubernetes_test applies the manifests of deploy/kubernetes to the
// test node (../shared/tools/k8s/k8s-node.sh) and uses what they make: two
// server replicas from the server's own image, with the namespace's Pod
// Security "restricted" enforced, the Role the servers get and nothing more,
// one MCP session through a replica that starts a sandbox pod, and nothing
// left after `kubectl delete`.
package kubernetes_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/image/testimage"
	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
)

// The test node's facts (see ../shared/tools/k8s/README.md): the API server
// listens on the host's loopback only and there is no kube-proxy, so a pod
// reaches the API server through a forwarder this test runs on the node's
// bridge address, and the host reaches a replica at its pod IP.
const (
	nodeDir    = "/var/tmp/k8s-node"
	nodeIP     = "100.72.0.1"
	apiAddr    = "127.0.0.1:16443"
	testToken  = "deploy-test-token-5d1f0c8a9b2e"
	serverPort = 8080
)

var kubeconfig string // set by TestDeployManifests from testenv.KubeNode

func kubectl(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, kubectlBin(), append([]string{"--kubeconfig", kubeconfig}, args...)...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// kubectlBin prefers the node's own kubectl (its version), else PATH's.
func kubectlBin() string {
	if b := filepath.Join(nodeDir, "bin", "kubectl"); fileExists(b) {
		return b
	}
	return "kubectl"
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func mustKubectl(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	out, err := kubectl(t, stdin, args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// loadImage puts a local Docker image into the node's containerd (the node
// has no registry; pods use imagePullPolicy Never).
func loadImage(t *testing.T, tag string) {
	t.Helper()
	sock := filepath.Join(nodeDir, "containerd", "containerd.sock")
	cmd := exec.Command("bash", "-c", `set -o pipefail; docker save "$1" | ctr --address "$2" -n k8s.io images import -`, "load", tag, sock)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("load %s into the node: %v\n%s", tag, err, out)
	}
}

// forwardAPI listens on the node's bridge address and forwards each
// connection to the API server, until the test ends. It returns the port.
func forwardAPI(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(nodeIP, "0"))
	if err != nil {
		t.Fatalf("listen on the node's bridge address: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("tcp", apiAddr)
				if err != nil {
					return
				}
				defer u.Close()
				go io.Copy(u, c)
				io.Copy(c, u)
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

func TestDeployManifests(t *testing.T) {
	kubeconfig, _ = testenv.KubeNode(t)
	agentImage := testenv.KubeAgentImage(t) // loads the test image too
	sandboxImage := testimage.Tag()
	server := testenv.ServerImage(t)
	loadImage(t, server)

	suffix := make([]byte, 4)
	rand.Read(suffix)
	ns := "sandbox-mcp-deploy-" + hex.EncodeToString(suffix)
	stateDir := t.TempDir()
	if err := os.Chmod(stateDir, 0o777); err != nil { // the server's uid writes here
		t.Fatal(err)
	}
	apiPort := forwardAPI(t)

	// The overlay a test-node operator would write: this namespace, the
	// images loaded above (never pulled), a hostPath volume standing in
	// for the ReadWriteMany storage every replica mounts, and the API
	// server's address (no kube-proxy here).
	overlay := t.TempDir()
	here, _ := filepath.Abs(".")
	base, err := filepath.Rel(overlay, here) // kustomize takes no absolute path
	if err != nil {
		t.Fatal(err)
	}
	serverName, serverTag, _ := strings.Cut(server, ":")
	files := map[string]string{
		"kustomization.yaml": fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: %[1]s
resources:
  - %[2]s
  - pv.yaml
  - secret.yaml
images:
  - {name: sandbox-mcp-server, newName: %[3]s, newTag: "%[4]s"}
patches:
  - path: deployment-patch.yaml
  - path: pvc-patch.yaml
`, ns, base, serverName, serverTag),
		"pv.yaml": fmt.Sprintf(`apiVersion: v1
kind: PersistentVolume
metadata:
  name: %[1]s-state
  labels: {io.sandbox-mcp.test: %[1]s}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteMany]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  claimRef: {namespace: %[1]s, name: sandbox-mcp-state}
  hostPath: {path: %[2]s, type: Directory}
`, ns, stateDir),
		"secret.yaml": fmt.Sprintf(`apiVersion: v1
kind: Secret
metadata: {name: sandbox-mcp-token}
stringData: {token: %s}
`, testToken),
		"pvc-patch.yaml": `apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: sandbox-mcp-state, namespace: sandbox-mcp}
spec:
  storageClassName: ""
  resources: {requests: {storage: 1Gi}}
`,
		"deployment-patch.yaml": fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: sandbox-mcp, namespace: sandbox-mcp}
spec:
  template:
    spec:
      containers:
        - name: server
          imagePullPolicy: Never
          env:
            - {name: KUBERNETES_SERVICE_HOST, value: "%[1]s"}
            - {name: KUBERNETES_SERVICE_PORT, value: "%[2]d"}
            - {name: AGENT_IMAGE, value: "%[3]s"}
            - {name: SANDBOX_IMAGE, value: "%[4]s"}
            - {name: SANDBOX_MCP_PULL_POLICY, value: Never}
            # small sandboxes: the node has two CPUs, shared with other tests
            - {name: SANDBOX_MCP_CPUS, value: "0.1"}
            - {name: SANDBOX_MCP_MEMORY, value: 128MiB}
            - {name: SANDBOX_MCP_MAX_WORKSPACE_BYTES, value: 32MiB}
          resources:
            requests: {cpu: 50m, memory: 64Mi}
`, nodeIP, apiPort, agentImage, sandboxImage),
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(overlay, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	t.Cleanup(func() {
		if t.Failed() {
			out, _ := kubectl(t, "", "-n", ns, "get", "all,events", "-o", "wide")
			t.Logf("namespace %s at the failure:\n%s", ns, out)
			logs, _ := kubectl(t, "", "-n", ns, "logs", "-l", "app.kubernetes.io/component=server", "--tail=40", "--prefix")
			t.Logf("server logs:\n%s", logs)
		}
		if out, err := kubectl(t, "", "delete", "-k", overlay, "--wait=true", "--timeout=120s", "--ignore-not-found"); err != nil {
			t.Errorf("kubectl delete -k: %v\n%s", err, out)
		}
		// Nothing left: the namespace (and every pod in it) and the volume.
		if out, _ := kubectl(t, "", "get", "namespace", ns, "--ignore-not-found", "-o", "name"); out != "" {
			t.Errorf("namespace %s still exists after delete", ns)
		}
		if out, _ := kubectl(t, "", "get", "pv", "-l", "io.sandbox-mcp.test="+ns, "-o", "name"); out != "" {
			t.Errorf("left behind: %s", out)
		}
	})
	mustKubectl(t, "", "apply", "-k", overlay)
	mustKubectl(t, "", "-n", ns, "rollout", "status", "deployment/sandbox-mcp", "--timeout=180s")

	// Pod Security "restricted" is enforced on the namespace, and the
	// replicas passed it.
	if got := mustKubectl(t, "", "get", "namespace", ns, "-o", `jsonpath={.metadata.labels.pod-security\.kubernetes\.io/enforce}`); got != "restricted" {
		t.Errorf("namespace %s enforces %q, want restricted", ns, got)
	}

	// Least privilege: the servers' account may run pods here, and may not
	// read Secrets or act in another namespace.
	sa := "system:serviceaccount:" + ns + ":sandbox-mcp"
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"create", "pods", "-n", ns}, "yes"},
		{[]string{"create", "pods/exec", "-n", ns}, "yes"},
		{[]string{"deletecollection", "pods", "-n", ns}, "yes"},
		{[]string{"update", "leases.coordination.k8s.io", "-n", ns}, "yes"},
		{[]string{"create", "networkpolicies.networking.k8s.io", "-n", ns}, "yes"},
		{[]string{"get", "secrets", "-n", ns}, "no"},
		{[]string{"create", "pods", "-n", "default"}, "no"},
		{[]string{"update", "roles.rbac.authorization.k8s.io", "-n", ns}, "no"},
		{[]string{"list", "nodes"}, "no"},
		{[]string{"list", "events", "-n", ns}, "no"},
	} {
		out, _ := kubectl(t, "", append([]string{"auth", "can-i", "--as", sa}, c.args...)...)
		lines := strings.Fields(out) // the answer is the last word, after any warning
		if got := lines[len(lines)-1]; got != c.want {
			t.Errorf("can the servers %v? %q, want %q", c.args, out, c.want)
		}
	}

	// The Service selects both replicas.
	ips := strings.Fields(mustKubectl(t, "", "-n", ns, "get", "pods", "-l", "app.kubernetes.io/component=server", "-o", "jsonpath={.items[*].status.podIP}"))
	if len(ips) != 2 {
		t.Fatalf("server pods' IPs: %v, want 2", ips)
	}
	// The EndpointSlice controller publishes a ready pod a moment after the
	// rollout reports it, so the slices are read again until both replicas
	// are in them or half a minute has passed.
	var eps string
	missing := ips
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		eps = mustKubectl(t, "", "-n", ns, "get", "endpointslices", "-l", "kubernetes.io/service-name=sandbox-mcp", "-o", "jsonpath={.items[*].endpoints[*].addresses[*]}")
		missing = nil
		for _, ip := range ips {
			if !strings.Contains(" "+eps+" ", " "+ip+" ") {
				missing = append(missing, ip)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, ip := range missing {
		t.Errorf("the Service's endpoints %q lack replica %s after 30 s", eps, ip)
	}

	// One MCP session through a replica (at its pod IP: this node has no
	// kube-proxy to carry the Service's address): a command runs in a
	// sandbox pod the replica made with its service account.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	hc := &http.Client{Transport: bearer{testToken, http.DefaultTransport}}
	url := fmt.Sprintf("http://%s/mcp", net.JoinHostPort(ips[0], fmt.Sprint(serverPort)))
	// At 2025-11-25, which has sessions: the call below uses its
	// session's sandbox (MCP 2026-07-28 over HTTP has none).
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "deploy-test", Version: "0"}, nil).
		Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatalf("connect to %s: %v", url, err)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "sandbox_exec", Arguments: map[string]any{"command": "echo deployed; id -u"}})
	if err != nil {
		t.Fatalf("sandbox_exec: %v", err)
	}
	out, _ := res.StructuredContent.(map[string]any)
	if res.IsError || out == nil || !strings.HasPrefix(fmt.Sprint(out["stdout"]), "deployed\n") {
		t.Fatalf("sandbox_exec through the deployment: %+v", res)
	}
	sandboxes := mustKubectl(t, "", "-n", ns, "get", "pods", "-l", "io.sandbox-mcp.role=sandbox", "-o", "name")
	if len(strings.Fields(sandboxes)) != 1 {
		t.Errorf("sandbox pods after one session: %q, want one", sandboxes)
	}
	if err := cs.Close(); err != nil {
		t.Logf("close the session: %v", err)
	}
}

// bearer adds a token to every request of a client.
type bearer struct {
	token string
	base  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}
