package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sandbox-mcp/sandbox-mcp/image/testimage"
)

// DefaultKubeconfig is the admin kubeconfig of the test node that
// ../shared/tools/k8s/k8s-node.sh brings up.
const DefaultKubeconfig = "/var/tmp/k8s-node/pki/admin.kubeconfig"

// KubeNode returns the test node's kubeconfig path and client
// configuration, or skips the test with what to do: the Kubernetes tests
// run where the test node is up (SANDBOX_MCP_KUBECONFIG, or its default
// admin kubeconfig). Under -short they skip. With SANDBOX_MCP_REQUIRE_KUBE
// set (.ci/run, which brings the node up) a missing node fails the test.
func KubeNode(t testing.TB) (string, *rest.Config) {
	t.Helper()
	if testing.Short() {
		t.Skip("Kubernetes node tests skipped under -short")
	}
	kc := os.Getenv("SANDBOX_MCP_KUBECONFIG")
	if kc == "" {
		kc = DefaultKubeconfig
	}
	skip := t.Skipf
	if os.Getenv("SANDBOX_MCP_REQUIRE_KUBE") != "" {
		skip = t.Fatalf // CI brought a node up: a missing one is a failure
	}
	if _, err := os.Stat(kc); err != nil {
		skip("no Kubernetes test node (%s missing): run ../shared/tools/k8s/k8s-node.sh all, then make k8s-images; or set SANDBOX_MCP_KUBECONFIG", kc)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatalf("kubeconfig %s: %v", kc, err)
	}
	rc.Timeout = 10 * time.Second
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Discovery().ServerVersion(); err != nil {
		skip("the Kubernetes test node at %s does not answer (%v): run ../shared/tools/k8s/k8s-node.sh up", rc.Host, err)
	}
	rc.Timeout = 0
	return kc, rc
}

var (
	kubeImagesOnce sync.Once
	kubeAgentImage string
	kubeImagesErr  string
)

// KubeAgentImage builds the agent image and loads it and the test image
// into the test node (hack/k8s-images.sh; quick when they are there), and
// returns the agent image's tag.
func KubeAgentImage(t testing.TB) string {
	t.Helper()
	kubeImagesOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(file), "..", "..")
		cmd := exec.Command("bash", filepath.Join(root, "hack", "k8s-images.sh"), testimage.Tag())
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			kubeImagesErr = "hack/k8s-images.sh: " + err.Error() + "\n" + stderr.String()
			return
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		kubeAgentImage = lines[len(lines)-1]
	})
	if kubeImagesErr != "" {
		t.Fatal(kubeImagesErr)
	}
	return kubeAgentImage
}

// KubeNamespace makes a namespace that enforces Pod Security "restricted"
// and deletes it, with everything in it, when the test ends.
func KubeNamespace(t testing.TB, rc *rest.Config) string {
	t.Helper()
	var b [4]byte
	rand.Read(b[:])
	name := "sbx-test-" + hex.EncodeToString(b[:])
	cs := kubernetes.NewForConfigOrDie(rc)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		"pod-security.kubernetes.io/enforce": "restricted", "io.sandbox-mcp.test": "1"}}}
	if _, err := cs.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		zero := int64(0)
		_ = cs.CoreV1().Pods(name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		if err := cs.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Logf("delete namespace %s: %v", name, err)
		}
	})
	return name
}
