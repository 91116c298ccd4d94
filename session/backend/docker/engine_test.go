package docker

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/netproxy"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
)

// unanswered is the real engine, except that its create calls get no
// answer until their context is cut. The engine then carries the request
// out all the same: at once, before the cut call returns, or (late) only
// when the test lets it (land). Every engine call stays real.
type unanswered struct {
	Engine
	late bool
	// waiting is closed when a create call waits for its cut.
	waiting chan struct{}

	mu      sync.Mutex
	pending []func()
}

func (e *unanswered) hang(ctx context.Context, create func()) {
	close(e.waiting)
	<-ctx.Done()
	if !e.late {
		create()
		return
	}
	e.mu.Lock()
	e.pending = append(e.pending, create)
	e.mu.Unlock()
}

func (e *unanswered) land() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, f := range e.pending {
		f()
	}
	e.pending = nil
}

func (e *unanswered) NetworkCreate(ctx context.Context, name string, o client.NetworkCreateOptions) (client.NetworkCreateResult, error) {
	e.hang(ctx, func() { e.Engine.NetworkCreate(context.Background(), name, o) })
	return client.NetworkCreateResult{}, ctx.Err()
}

func (e *unanswered) ContainerCreate(ctx context.Context, o client.ContainerCreateOptions) (client.ContainerCreateResult, error) {
	e.hang(ctx, func() { e.Engine.ContainerCreate(context.Background(), o) })
	return client.ContainerCreateResult{}, ctx.Err()
}

// leftovers lists the containers and networks that carry the instance's
// label.
func leftovers(t *testing.T, cli *client.Client, instance string) []string {
	t.Helper()
	left := testenv.Containers(t, cli, LabelInstance, instance)
	nets, err := cli.NetworkList(context.Background(), client.NetworkListOptions{Filters: make(client.Filters).Add("label", LabelInstance+"="+instance)})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nets.Items {
		left = append(left, "network "+n.Name)
	}
	return left
}

// TestStartCutAfterGrace: a create the engine does not answer is cut
// createGrace after its start was abandoned. If the engine made the object
// all the same, the start finds it by name and removes it; if the engine
// makes it only after the start returned, the backend's Close finds it by
// label and removes it. For the container (no network) and for the
// network.
func TestStartCutAfterGrace(t *testing.T) {
	cli := testenv.Engine(t)
	img := testenv.TestImage(t)
	proxy, err := netproxy.New(netproxy.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		proxy *netproxy.Proxy
		late  bool
	}{
		{"container", nil, false},
		{"container late", nil, true},
		{"network", proxy, false},
		{"network late", proxy, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			instance := "test-cut-" + randomID()
			t.Cleanup(func() {
				testenv.RemoveLabelled(cli, LabelInstance, instance)
				nets, _ := cli.NetworkList(context.Background(), client.NetworkListOptions{Filters: make(client.Filters).Add("label", LabelInstance+"="+instance)})
				for _, n := range nets.Items {
					cli.NetworkRemove(context.Background(), n.ID, client.NetworkRemoveOptions{})
				}
			})
			e := &unanswered{Engine: cli, late: tc.late, waiting: make(chan struct{})}
			d, err := New(Config{Client: e, Instance: instance})
			if err != nil {
				t.Fatal(err)
			}
			d.image = img
			d.createGrace = 200 * time.Millisecond
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				<-e.waiting
				cancel()
			}()
			spec := backend.InstanceSpec{Sandbox: "sb-" + randomID(), Generation: 1, UID: 1000, GID: 1000, Proxy: tc.proxy,
				Limits: backend.Limits{Memory: 64 << 20, NanoCPUs: 1e9, Pids: 64, NoFile: 64, WorkspaceBytes: 1 << 20, TmpBytes: 1 << 20}}
			if _, err := d.Start(ctx, spec); err == nil {
				t.Fatal("Start succeeded with its create cut")
			}
			if !tc.late {
				if left := leftovers(t, cli, instance); len(left) > 0 {
					t.Fatalf("the start left behind: %s", strings.Join(left, "; "))
				}
				return
			}
			e.land()
			if left := leftovers(t, cli, instance); len(left) != 1 {
				t.Fatalf("the late create made %q, want one object", left)
			}
			if err := d.RemoveLeftovers(context.Background()); err != nil {
				t.Fatal(err)
			}
			if left := leftovers(t, cli, instance); len(left) > 0 {
				t.Fatalf("Close left behind: %s", strings.Join(left, "; "))
			}
		})
	}
}

// TestInstallAgent: the agent is copied under its digest, read-only; a
// torn copy is made again; copies unused for AgentKeep go, recent ones and
// the one installed stay.
func TestInstallAgent(t *testing.T) {
	dir := t.TempDir()
	a := agentBinary{data: []byte("\x7fELF agent one"), digest: strings.Repeat("a", 64)}
	path, err := installAgent(dir, a)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o555 || !strings.HasPrefix(path, filepath.Join(dir, strings.Repeat("a", 32))) {
		t.Fatalf("installed %s: %v %v", path, st, err)
	}
	old, recent := filepath.Join(dir, "old"), filepath.Join(dir, "recent")
	for _, d := range []string{old, recent} {
		os.MkdirAll(d, 0o755)
		os.WriteFile(filepath.Join(d, "sandbox-agent"), []byte("x"), 0o555)
	}
	long := time.Now().Add(-AgentKeep - time.Hour)
	os.Chtimes(filepath.Join(old, "sandbox-agent"), long, long)
	os.Chtimes(path, long, long) // in use again now: installAgent touches it
	if _, err := installAgent(dir, a); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Errorf("a copy unused for %s was kept", AgentKeep)
	}
	if _, err := os.Stat(recent); err != nil {
		t.Errorf("a recent copy was removed: %v", err)
	}
	if st, err := os.Stat(path); err != nil || time.Since(st.ModTime()) > time.Minute {
		t.Errorf("the installed copy was not marked used: %v %v", st, err)
	}
	// Another agent's content under the same name is replaced.
	os.Chmod(path, 0o644)
	os.WriteFile(path, []byte("torn"), 0o644)
	if _, err := installAgent(dir, a); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != string(a.data) {
		t.Errorf("a torn copy was kept: %q", b)
	}
}

// TestEngineErrorWrapsItsCause: an engine failure reported as UNAVAILABLE
// keeps the engine's error visible to errors.Is, whether the engine is out
// of reach or failed a call.
func TestEngineErrorWrapsItsCause(t *testing.T) {
	away, err := client.New(client.WithHost("unix://" + filepath.Join(t.TempDir(), "no.sock")))
	if err != nil {
		t.Fatal(err)
	}
	defer away.Close()
	_, unreachable := away.Ping(context.Background(), client.PingOptions{})
	if !client.IsErrConnectionFailed(unreachable) {
		t.Fatalf("an engine at a missing socket: %v, want a connection failure", unreachable)
	}
	for _, cause := range []error{errors.New("no such image"), unreachable} {
		err := engineError("create the container", cause)
		if e, ok := errcode.As(err); !ok || e.Code != errcode.Unavailable {
			t.Fatalf("engineError(%v) = %v, want UNAVAILABLE", cause, err)
		}
		if !errors.Is(err, cause) {
			t.Errorf("engineError(%v) = %v, which does not wrap its cause", cause, err)
		}
	}
}
