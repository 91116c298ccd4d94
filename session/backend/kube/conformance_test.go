package kube

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/sandbox-mcp/sandbox-mcp/image/testimage"
	"github.com/sandbox-mcp/sandbox-mcp/netproxy"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/backendtest"
)

// TestBackendConformance runs backend's conformance suite
// (session/backend/backendtest) on the Kubernetes backend and the test
// node: each backend has a namespace of its own, so what it leaves is the
// pods in it. A pod whose deletion the API server accepted counts as gone:
// the kubelet finishes it, and it holds no sandbox any more. A start fails
// on a memory limit no node has (BreakSpec). It skips
// without a node, and fails without one under SANDBOX_MCP_REQUIRE_KUBE.
func TestBackendConformance(t *testing.T) {
	rc := testNode(t)
	cs := kubernetes.NewForConfigOrDie(rc)
	namespaces := map[backend.Backend]string{}
	backendtest.Run(t, backendtest.Harness{
		New: func(t *testing.T) backend.Backend {
			ns := testNamespace(t, rc)
			c := testCluster(t, rc, ns, "srv-conformance")
			b, err := NewBackend(BackendConfig{Cluster: c, Image: testimage.Tag(), ProxyListen: "127.0.0.1:0", ProxyAdvertise: "127.0.0.1:3128"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close(context.Background()) })
			namespaces[b] = ns
			return b
		},
		Spec: backend.InstanceSpec{UID: 1000, GID: 1000, Env: []string{"PATH=/bin"},
			Limits: backend.Limits{Memory: 128 << 20, NanoCPUs: 1e8, Pids: 64, NoFile: 256, WorkspaceBytes: 8 << 20, TmpBytes: 8 << 20}},
		RemoveFromOutside: func(t *testing.T, b backend.Backend, inst backend.Instance) {
			zero := int64(0)
			if err := cs.CoreV1().Pods(namespaces[b]).Delete(context.Background(), inst.Name(), metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
				t.Fatalf("delete pod %s: %v", inst.Name(), err)
			}
		},
		Leftovers: func(t *testing.T, b backend.Backend) []string {
			pods, err := cs.CoreV1().Pods(namespaces[b]).List(context.Background(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var left []string
			for _, p := range pods.Items {
				if p.DeletionTimestamp == nil {
					left = append(left, "pod "+p.Name+" "+string(p.Status.Phase))
				}
			}
			return left
		},
		// No node has a petabyte: the pod is created, the scheduler
		// marks it unschedulable, and the start fails after it made it.
		BreakSpec: func(spec *backend.InstanceSpec) { spec.Limits.Memory = 1 << 50 },
		Proxy: func(t *testing.T) *netproxy.Proxy {
			p, err := netproxy.New(netproxy.Config{})
			if err != nil {
				t.Fatal(err)
			}
			return p
		},
	})
}
