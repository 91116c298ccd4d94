package session

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/sandbox-mcp/sandbox-mcp/image/testimage"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/kube"
)

// TestReplicasServeEachOthersHandles: two servers (Managers, each its own
// memory and its own Lease) on one namespace of the Kubernetes test node
// and one state directory, with the same replica key, used alternately by
// one caller as a round-robin Service would: a handle made on A is written
// and run on B, a background job started on A is read on B and then on A
// while it runs on (one pod all along, no restore), another caller on B gets
// NOT_FOUND byte for byte as for a handle never made, the handle ended on B
// is ended on A too, and no pod is left.
func TestReplicasServeEachOthersHandles(t *testing.T) {
	_, rc := testenv.KubeNode(t)
	ns := testenv.KubeNamespace(t, rc)
	agentImage := testenv.KubeAgentImage(t)
	state := t.TempDir()
	key := []byte("the replicas' shared key, from a Secret")
	replica := func(name string) *Manager {
		c, err := kube.NewCluster(rc, kube.Config{Namespace: ns, Instance: name, AgentImage: agentImage,
			PullPolicy: corev1.PullNever, LeaseDuration: 6 * time.Second, StartTimeout: 90 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		b, err := kube.NewBackend(kube.BackendConfig{Cluster: c, Image: testimage.Tag()})
		if err != nil {
			t.Fatal(err)
		}
		opts := Options{Backend: b, Policy: policy.Default(), StateDir: state, Instance: name, ReplicaKey: key,
			StartTimeout: 90 * time.Second, Logger: testLogger(t).With("replica", name)}
		opts.Policy.Memory = 128 << 20
		opts.Policy.MaxWorkspaceBytes = 16 << 20
		m, err := NewManager(context.Background(), opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if err := m.Close(ctx); err != nil {
				t.Errorf("Close %s: %v", name, err)
			}
			b.Close(ctx)
		})
		return m
	}
	a, b := replica("replica-a"), replica("replica-b")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	on := func(m *Manager, id string) *Sandbox {
		t.Helper()
		sb, err := m.Find(id, "alice")
		if err != nil {
			t.Fatalf("find %s on %s: %v", id, m.opts.Instance, err)
		}
		return sb
	}
	exec := func(m *Manager, id, script string) string {
		t.Helper()
		start := time.Now()
		res, err := on(m, id).Exec(ctx, ExecRequest{Argv: []string{"sh", "-c", script}, Cwd: ".", Timeout: 30 * time.Second, MaxOutput: 1 << 16})
		if err != nil {
			t.Fatalf("exec %q on %s: %v", script, m.opts.Instance, err)
		}
		t.Logf("exec on %s: %v", m.opts.Instance, time.Since(start).Round(time.Millisecond))
		return string(res.Stdout)
	}

	made, err := a.Create(ctx, "alice", CreateOptions{Label: "shared"})
	if err != nil {
		t.Fatal(err)
	}
	id := made.ID()
	if _, err := on(b, id).WriteFile(ctx, "note.txt", []byte("written on B\n"), false, 0o644); err != nil {
		t.Fatalf("write on B: %v", err)
	}
	if out := exec(b, id, "cat note.txt; echo $$ > /tmp/pid-b"); out != "written on B\n" {
		t.Fatalf("exec on B: %q", out)
	}
	pod := on(b, id).ContainerID()
	res, err := on(a, id).Exec(ctx, ExecRequest{Argv: []string{"sh", "-c", "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.2; done"},
		Cwd: ".", MaxOutput: 1 << 16, Background: true, Label: "ticker"})
	if err != nil || !res.Running || res.Job == "" {
		t.Fatalf("background job on A: %+v %v", res, err)
	}
	if got := on(a, id).ContainerID(); got != pod {
		t.Fatalf("A runs the handle in pod %q, B did in %q: a takeover must keep the pod", got, pod)
	}
	read := func(m *Manager) JobResult {
		t.Helper()
		jr, err := on(m, id).Job(ctx, JobRequest{Job: res.Job, Wait: 2 * time.Second, WaitFor: nil, StdoutOffset: -1, StderrOffset: -1, Max: 1 << 16})
		if err != nil {
			t.Fatalf("read the job on %s: %v", m.opts.Instance, err)
		}
		return jr
	}
	time.Sleep(time.Second)
	first := read(b)
	if !strings.Contains(string(first.Out[0]), "tick 1\n") || first.Status.State != "running" {
		t.Fatalf("the job read on B: %+v %q", first.Status, first.Out[0])
	}
	time.Sleep(time.Second)
	second := read(a)
	if len(second.Out[0]) == 0 || second.Status.State != "running" || second.From[0] <= first.From[0] {
		t.Fatalf("the job read on A after B: %+v from %v %q", second.Status, second.From, second.Out[0])
	}
	if out := exec(a, id, "cat note.txt"); out != "written on B\n" {
		t.Fatalf("the file on A: %q", out)
	}
	for _, m := range []*Manager{a, b} {
		if n := on(m, id).TakeNotice(); n != "" {
			t.Errorf("%s noticed a restart: %s", m.opts.Instance, n)
		}
	}

	// Another caller: NOT_FOUND, the same bytes as a handle never made.
	if _, err := b.Find(id, "mallory"); err == nil || err.Error() != notFound(id).Error() {
		t.Fatalf("another caller on B: %v, want %v", err, notFound(id))
	}
	if _, err := b.Find(strings.Repeat("z", len(id)), "alice"); !isCode(err, errcode.NotFound) {
		t.Fatalf("a handle never made: %v", err)
	}

	if _, err := b.End(ctx, id, "alice", false); err != nil {
		t.Fatalf("end on B: %v", err)
	}
	_, err = on(a, id).Exec(ctx, ExecRequest{Argv: []string{"true"}, Cwd: ".", Timeout: 10 * time.Second})
	if !isCode(err, errcode.NotFound) || !strings.Contains(err.Error(), "ended by sandbox_end") {
		t.Fatalf("a call on A after the end on B: %v", err)
	}
	if _, err := a.Find(id, "alice"); !isCode(err, errcode.NotFound) {
		t.Fatalf("find on A after the end on B: %v", err)
	}
	cs := kubernetes.NewForConfigOrDie(rc)
	deadline := time.Now().Add(30 * time.Second)
	for {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var left []string
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil {
				left = append(left, p.Name+" "+string(p.Status.Phase))
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pods left after the end: %v", left)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// The Kubernetes backend serves replicas: a change of backend.Reattacher
// that it does not follow fails the build, not the replicas at run time
// (shared() asserts the interface dynamically).
var _ SharedBackend = (*kube.Backend)(nil)
