package kube

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
)

// cutTransport is the real API server, except that one request, once
// armed, cancels the context of the start it serves as it is sent: a
// client that gives up while its request is on its way. If the request's
// own context ends with that, the client gets the context's error at once,
// and the request reaches the API server only later, when the test lets it
// land: an API server that carries out a request after its client gave up.
// A request whose context the cancel does not end goes on as usual.
type cutTransport struct {
	mu      sync.Mutex
	at      string
	cancel  context.CancelFunc
	pending []func()
}

// step names a request: "create" (a pod's create), "watch" (a pod watch),
// "" for others.
func step(req *http.Request) string {
	switch p := req.URL.Path; {
	case req.Method == http.MethodPost && strings.HasSuffix(p, "/pods"):
		return "create"
	case strings.HasSuffix(p, "/pods") && req.URL.Query().Get("watch") != "":
		return "watch"
	}
	return ""
}

func (c *cutTransport) arm(at string, cancel context.CancelFunc) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at, c.cancel = at, cancel
}

func (c *cutTransport) armed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.at != ""
}

// wrap is the rest.Config's WrapTransport: every client's transport goes
// through c.
func (c *cutTransport) wrap(rt http.RoundTripper) http.RoundTripper { return &cutRT{rt: rt, c: c} }

type cutRT struct {
	rt http.RoundTripper
	c  *cutTransport
}

func (r *cutRT) RoundTrip(req *http.Request) (*http.Response, error) {
	c := r.c
	c.mu.Lock()
	var cancel context.CancelFunc
	if c.at != "" && step(req) == c.at {
		cancel = c.cancel
		c.at, c.cancel = "", nil
	}
	c.mu.Unlock()
	if cancel == nil {
		return r.rt.RoundTrip(req)
	}
	cancel()
	if req.Context().Err() == nil {
		return r.rt.RoundTrip(req)
	}
	late := req.Clone(context.WithoutCancel(req.Context()))
	if req.GetBody != nil {
		late.Body, _ = req.GetBody()
	}
	c.mu.Lock()
	c.pending = append(c.pending, func() {
		if resp, err := r.rt.RoundTrip(late); err == nil {
			resp.Body.Close()
		}
	})
	c.mu.Unlock()
	return nil, req.Context().Err()
}

// land sends the requests whose clients gave up, and waits for the
// answers.
func (c *cutTransport) land() {
	c.mu.Lock()
	pending := c.pending
	c.pending = nil
	c.mu.Unlock()
	for _, f := range pending {
		f()
	}
}

// TestCancelledStartLeavesNoPod (issue 18 item 5, on Kubernetes): a
// sandbox start cancelled at each step (before anything, while its pod is
// created, while the pod is watched until it runs, and once Start has
// returned, while the agent's exec opens and its hello is read, where the
// session removes the instance) leaves no pod, even where the API server
// creates the pod after its client gave up; the next start of the same
// sandbox works. (Start opens the agent's exec stream in the background and
// returns: a cancel while the exec opens is the "hello" case.)
func TestCancelledStartLeavesNoPod(t *testing.T) {
	rc := testNode(t)
	ns := testNamespace(t, rc)
	cut := &cutTransport{}
	rc = rest.CopyConfig(rc)
	rc.WrapTransport = cut.wrap
	b, err := NewBackend(BackendConfig{Cluster: testCluster(t, rc, ns, "srv-cancel"), Image: sandboxParams("").Image})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close(context.Background()) })
	for i, at := range []string{"before", "create", "watch", "hello"} {
		t.Run(at, func(t *testing.T) {
			spec := instanceSpec("sb-cancel", i+1)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			switch at {
			case "before":
				cancel()
			case "hello":
			default:
				cut.arm(at, cancel)
			}
			inst, err := b.Start(ctx, spec)
			if at == "hello" {
				// Start returned the instance; the caller gives up as it
				// reads the hello, and removes it (session does).
				if err != nil {
					t.Fatal(err)
				}
				cancel()
				rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer rcancel()
				if err := inst.Remove(rctx); err != nil {
					t.Fatal(err)
				}
			} else {
				if cut.armed() {
					t.Fatalf("the start never reached %s (it returned %v)", at, err)
				}
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("the cancelled start returned %v, %v; want context.Canceled", inst, err)
				}
			}
			cut.land()
			pods, err := b.cfg.Cluster.Clientset().CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: LabelSandbox + "=sb-cancel"})
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range pods.Items {
				t.Errorf("the start cancelled at %s left pod %s (%s, deleting: %v)", at, p.Name, p.Status.Phase, p.DeletionTimestamp != nil)
			}
		})
	}
	// The next start works.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	inst, err := b.Start(ctx, instanceSpec("sb-cancel", 9))
	if err != nil {
		t.Fatal(err)
	}
	if err := inst.Remove(ctx); err != nil {
		t.Fatal(err)
	}
}

// instanceSpec is a small sandbox without network.
func instanceSpec(sandbox string, gen int) backend.InstanceSpec {
	p := sandboxParams("")
	return backend.InstanceSpec{Sandbox: sandbox, Generation: gen, UID: p.UID, GID: p.GID, Env: p.Env,
		Limits: backend.Limits{Memory: p.Memory, NanoCPUs: p.NanoCPUs, Pids: 256, NoFile: 1024,
			WorkspaceBytes: p.WorkspaceBytes, TmpBytes: p.TmpBytes}}
}
