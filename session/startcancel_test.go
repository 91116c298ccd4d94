package session

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/docker"
)

// cutEngine is the real engine, except that one call, once armed, cancels
// the context of the start it serves as it begins: a client that gives up
// while its request is on its way. If the call's own context ends with
// that, the call returns the context's error at once, as moby's client
// does, and its request reaches the engine only later, when the test lets
// it land: an engine that carries out a request after its client gave up
// on it, as a loaded engine does. A call whose context the cancel does not
// end runs as usual. The step "hello" cancels as the agent's hello is
// first read from the attach stream. Every engine call stays real.
type cutEngine struct {
	docker.Engine

	mu      sync.Mutex
	at      string
	cancel  context.CancelFunc
	pending []func()
}

// arm makes the next call named at cancel.
func (e *cutEngine) arm(at string, cancel context.CancelFunc) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.at, e.cancel = at, cancel
}

// armed reports whether the armed step was never reached.
func (e *cutEngine) armed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.at != ""
}

// take returns the cancel of step if it is armed, and disarms it.
func (e *cutEngine) take(step string) context.CancelFunc {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.at != step {
		return nil
	}
	cancel := e.cancel
	e.at, e.cancel = "", nil
	return cancel
}

// land sends the requests whose clients gave up, and waits for the
// engine's answers.
func (e *cutEngine) land() {
	e.mu.Lock()
	pending := e.pending
	e.pending = nil
	e.mu.Unlock()
	for _, f := range pending {
		f()
	}
}

// cutCall runs the call named step through e (see cutEngine). drop, if set,
// releases what a landed call returned.
func cutCall[T any](e *cutEngine, step string, ctx context.Context, call func(context.Context) (T, error), drop func(T)) (T, error) {
	cancel := e.take(step)
	if cancel == nil {
		return call(ctx)
	}
	cancel()
	if ctx.Err() == nil {
		return call(ctx)
	}
	e.mu.Lock()
	e.pending = append(e.pending, func() {
		if r, err := call(context.WithoutCancel(ctx)); err == nil && drop != nil {
			drop(r)
		}
	})
	e.mu.Unlock()
	var zero T
	return zero, ctx.Err()
}

func (e *cutEngine) NetworkCreate(ctx context.Context, name string, o client.NetworkCreateOptions) (client.NetworkCreateResult, error) {
	return cutCall(e, "NetworkCreate", ctx, func(ctx context.Context) (client.NetworkCreateResult, error) {
		return e.Engine.NetworkCreate(ctx, name, o)
	}, nil)
}

func (e *cutEngine) ContainerCreate(ctx context.Context, o client.ContainerCreateOptions) (client.ContainerCreateResult, error) {
	return cutCall(e, "ContainerCreate", ctx, func(ctx context.Context) (client.ContainerCreateResult, error) {
		return e.Engine.ContainerCreate(ctx, o)
	}, nil)
}

func (e *cutEngine) ContainerAttach(ctx context.Context, id string, o client.ContainerAttachOptions) (client.ContainerAttachResult, error) {
	att, err := cutCall(e, "ContainerAttach", ctx, func(ctx context.Context) (client.ContainerAttachResult, error) {
		return e.Engine.ContainerAttach(ctx, id, o)
	}, func(att client.ContainerAttachResult) { att.Close() })
	if err == nil {
		if cancel := e.take("hello"); cancel != nil {
			att.Reader = bufio.NewReader(&cancelOnRead{r: att.Reader, cancel: cancel})
		}
	}
	return att, err
}

func (e *cutEngine) ContainerStart(ctx context.Context, id string, o client.ContainerStartOptions) (client.ContainerStartResult, error) {
	return cutCall(e, "ContainerStart", ctx, func(ctx context.Context) (client.ContainerStartResult, error) {
		return e.Engine.ContainerStart(ctx, id, o)
	}, nil)
}

// cancelOnRead cancels as its first read begins.
type cancelOnRead struct {
	r      io.Reader
	cancel context.CancelFunc
	once   sync.Once
}

func (c *cancelOnRead) Read(p []byte) (int, error) {
	c.once.Do(c.cancel)
	return c.r.Read(p)
}

// startSteps are the steps of a container's start, in order, as cutEngine
// names them. With no network there is no NetworkCreate; the container
// joins its network on the engine in ContainerStart.
var startSteps = []string{"before", "NetworkCreate", "ContainerCreate", "ContainerAttach", "ContainerStart", "hello"}

// TestCancelledStartLeavesNothing: a sandbox's first call, cancelled at each
// step of its container's start (before anything, while its network is
// created, while its container is created, attached, started, while the
// agent's hello is read), ends, and nothing of that start is left on the
// engine or in the firewall, even where the engine carries out a create
// after its client gave up on it. The next call starts the sandbox afresh.
func TestCancelledStartLeavesNothing(t *testing.T) {
	for _, network := range []policy.NetworkMode{policy.NetworkNone, policy.NetworkAllowlist} {
		t.Run(string(network), func(t *testing.T) {
			cli := testenv.Engine(t)
			cut := &cutEngine{Engine: cli}
			m := testDockerManager(t, func(o *Options) {
				if network == policy.NetworkAllowlist {
					o.Policy.Network = policy.NetworkAllowlist
					o.Policy.AllowHosts = []string{"api.test:443"}
					o.Resolver = mapResolver{"api.test": {netip.MustParseAddr("192.0.2.1")}}
				}
			}, func(c *docker.Config) { c.Client = cut })
			for _, step := range startSteps {
				if step == "NetworkCreate" && network == policy.NetworkNone {
					continue
				}
				t.Run(step, func(t *testing.T) {
					sb, err := m.Sandbox(step, "")
					if err != nil {
						t.Fatal(err)
					}
					ctx, cancel := context.WithCancel(context.Background())
					defer cancel()
					if step == "before" {
						cancel()
					} else {
						cut.arm(step, cancel)
					}
					_, err = sb.Exec(ctx, ExecRequest{Argv: []string{"true"}, Cwd: ".", Timeout: 30 * time.Second})
					if cut.armed() {
						t.Fatalf("the start never reached %s (the call returned %v)", step, err)
					}
					if !errors.Is(err, context.Canceled) {
						t.Fatalf("the cancelled call returned %v, want context.Canceled", err)
					}
					cut.land()
					if left := leftBehind(t, cli, sb.ID()); len(left) > 0 {
						t.Fatalf("the start cancelled at %s left behind: %s", step, strings.Join(left, "; "))
					}
					if res := run(t, sb, "true"); res.ExitCode != 0 {
						t.Fatalf("the next call: %+v", res)
					}
				})
			}
		})
	}
}

// leftBehind lists what is on the engine and in the firewall for a
// sandbox: its containers, its networks, the rules of its networks.
func leftBehind(t *testing.T, cli *client.Client, sandbox string) []string {
	t.Helper()
	left := testenv.Containers(t, cli, docker.LabelSandbox, sandbox)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nets, err := cli.NetworkList(ctx, client.NetworkListOptions{Filters: make(client.Filters).Add("label", docker.LabelSandbox+"="+sandbox)})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nets.Items {
		left = append(left, "network "+n.Name)
	}
	out, _ := exec.Command("nft", "list", "table", "inet", docker.FirewallTable).Output()
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, sandbox) {
			left = append(left, "rule "+strings.TrimSpace(line))
		}
	}
	return left
}
