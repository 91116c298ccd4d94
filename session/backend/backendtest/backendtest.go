// Package backendtest is the conformance suite of session/backend: it
// checks, on a real backend, what backend.Backend and backend.Instance
// promise, as containerd's snapshots/testsuite does for snapshotters. Each
// backend's own tests call Run with a Harness (the in-process fake in
// package session under -short, Docker in session/backend/docker, Kubernetes in
// session/backend/kube on the test node); a new backend is ready when it passes.
//
// The suite speaks the agent's protocol (agentproto) to the instances it
// starts, as session does: an instance is alive when its agent answers a
// ping.
package backendtest

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/netproxy"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
)

// Harness is what the suite needs of one backend.
type Harness struct {
	// New returns a prepared backend (Prepare has succeeded) whose
	// objects are its own: Leftovers sees nothing of other tests. It
	// cleans up after the test (t.Cleanup).
	New func(t *testing.T) backend.Backend
	// Spec is the spec instances start from: small limits, the sandbox
	// user, an environment with PATH. The suite sets Sandbox, Generation
	// and Proxy.
	Spec backend.InstanceSpec
	// RemoveFromOutside removes an instance the way an operator or the
	// engine would (docker rm -f, deleting the pod), never through
	// Instance.Remove.
	RemoveFromOutside func(t *testing.T, b backend.Backend, inst backend.Instance)
	// Leftovers lists what b has made that is still there (containers,
	// pods, networks, instances not removed): after every Remove and every
	// failed start it must be empty.
	Leftovers func(t *testing.T, b backend.Backend) []string
	// Proxy, if set, returns an egress proxy for the proxy checks; nil
	// skips them (a backend that runs no network, like the in-process
	// fake, whose agent has no environment of its own either).
	Proxy func(t *testing.T) *netproxy.Proxy
	// BreakSpec, if set, changes a spec so that Start fails after it has
	// made something (a network, say): the engine refuses the instance.
	// nil skips the check.
	BreakSpec func(spec *backend.InstanceSpec)
	// Timeout bounds each start and each wait of the suite; 0 means two
	// minutes.
	Timeout time.Duration
}

// Run runs every check of the suite on the harness's backend, each as a
// subtest.
func Run(t *testing.T, h Harness) {
	if h.Timeout == 0 {
		h.Timeout = 2 * time.Minute
	}
	for _, c := range []struct {
		name string
		f    func(*testing.T, Harness)
	}{
		{"StartAnswersAndRemoveLeavesNothing", testStartAndRemove},
		{"RemoveIsIdempotentAndConcurrent", testRemoveTwice},
		{"StdoutEndsWhenRemovedFromOutside", testRemovedFromOutside},
		{"ClosingStdinEndsTheInstance", testStdinClose},
		{"SweepSparesALiveInstance", testSweepSparesLive},
		{"EnvironmentCarriesTheProxy", testProxyEnv},
		{"FailedStartLeavesNothing", testFailedStart},
		{"CancelledStartLeavesNothing", testCancelledStart},
	} {
		t.Run(c.name, func(t *testing.T) { c.f(t, h) })
	}
}

var sandboxes struct {
	mu sync.Mutex
	n  int
}

// spec returns the harness's spec for a new sandbox.
func (h Harness) spec(t *testing.T) backend.InstanceSpec {
	sandboxes.mu.Lock()
	sandboxes.n++
	n := sandboxes.n
	sandboxes.mu.Unlock()
	spec := h.Spec
	spec.Sandbox = fmt.Sprintf("bt%d-%d", time.Now().UnixNano()%1e6, n)
	spec.Generation = 1
	spec.Env = slices.Clone(h.Spec.Env)
	return spec
}

// start starts an instance, removed when the test ends.
func (h Harness) start(t *testing.T, b backend.Backend, spec backend.InstanceSpec) backend.Instance {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
	defer cancel()
	inst, err := b.Start(ctx, spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
		defer cancel()
		if err := inst.Remove(ctx); err != nil {
			t.Errorf("Remove at the end of the test: %v", err)
		}
	})
	if inst.Name() == "" {
		t.Error("the instance has no Name")
	}
	return inst
}

// noLeftovers fails the test if b left anything behind, waiting up to the
// harness's timeout for what is being removed to go.
func (h Harness) noLeftovers(t *testing.T, b backend.Backend, after string) {
	t.Helper()
	deadline := time.Now().Add(h.Timeout)
	for {
		left := h.Leftovers(t, b)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s left behind: %s", after, strings.Join(left, "; "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// agent is the suite's end of an instance's protocol stream.
type agent struct {
	t      *testing.T
	inst   backend.Instance
	frames chan frameOrErr
	w      *agentproto.Writer
	next   uint64
	wait   time.Duration
}

type frameOrErr struct {
	f   agentproto.Frame
	err error
}

// connect reads the agent's hello and sends a lease of none, as session
// does, and returns the connection.
func (h Harness) connect(t *testing.T, inst backend.Instance) *agent {
	t.Helper()
	a := &agent{t: t, inst: inst, frames: make(chan frameOrErr, 16), w: agentproto.NewWriter(inst.Stdin()), next: 1, wait: h.Timeout}
	go func() {
		r := agentproto.NewReader(inst.Stdout())
		for {
			f, err := r.Read()
			a.frames <- frameOrErr{f, err}
			if err != nil {
				close(a.frames)
				return
			}
		}
	}()
	f := a.read()
	if f.Kind != agentproto.KindHello {
		t.Fatalf("the first frame is %q, want hello", f.Kind)
	}
	if err := a.w.Write(0, agentproto.KindLease, agentproto.Lease{}, nil); err != nil {
		t.Fatalf("send the lease: %v", err)
	}
	// An instance that keeps the environment out of its definition has
	// the agent's setup deliver it, as session does.
	if ae, ok := inst.(backend.AgentEnv); ok {
		id := a.next
		a.next++
		env := ae.AgentEnv()
		if err := a.w.Write(id, agentproto.KindSetup, agentproto.SetupRequest{Env: env}, nil); err != nil {
			t.Fatalf("send the setup: %v", err)
		}
		var res agentproto.SetupResult
		if f := a.read(); f.Kind != agentproto.KindResult || f.Decode(&res) != nil || res.Env != len(env) {
			t.Fatalf("setup: %q %+v, want a result taking %d variables", f.Kind, res, len(env))
		}
	}
	return a
}

// read returns the next frame, failing the test if the stream ends or
// nothing comes in time.
func (a *agent) read() agentproto.Frame {
	a.t.Helper()
	select {
	case fe, ok := <-a.frames:
		if !ok || fe.err != nil {
			a.t.Fatalf("the agent's stream of %s ended: %v (stderr: %s)", a.inst.Name(), fe.err, a.inst.StderrTail())
		}
		return fe.f
	case <-time.After(a.wait):
		a.t.Fatalf("no frame from %s in %v", a.inst.Name(), a.wait)
	}
	panic("unreachable")
}

// ping checks the agent answers.
func (a *agent) ping() {
	a.t.Helper()
	id := a.next
	a.next++
	if err := a.w.Write(id, agentproto.KindPing, nil, nil); err != nil {
		a.t.Fatalf("send ping: %v", err)
	}
	for {
		if f := a.read(); f.Kind == agentproto.KindPong && f.ID == id {
			return
		}
	}
}

// exec runs argv in the instance and returns its stdout.
func (a *agent) exec(argv ...string) string {
	a.t.Helper()
	id := a.next
	a.next++
	req := agentproto.ExecRequest{Argv: argv, Cwd: ".", MaxOutput: 1 << 16, TimeoutMillis: a.wait.Milliseconds()}
	if err := a.w.Write(id, agentproto.KindExec, req, nil); err != nil {
		a.t.Fatalf("send exec: %v", err)
	}
	var out bytes.Buffer
	for {
		f := a.read()
		if f.ID != id {
			continue
		}
		switch f.Kind {
		case agentproto.KindStdout:
			out.Write(f.Payload)
		case agentproto.KindExit:
			var res agentproto.ExecResult
			if err := f.Decode(&res); err != nil || res.ExitCode != 0 {
				a.t.Fatalf("%q: exit %d, %v; output %q", argv, res.ExitCode, err, out.String())
			}
			return out.String()
		case agentproto.KindError:
			var e agentproto.Error
			f.Decode(&e)
			a.t.Fatalf("%q: agent error %+v", argv, e)
		}
	}
}

// ends waits for the stream to end (io.EOF or an error), failing the test
// if it does not within the timeout.
func (a *agent) ends(why string) {
	a.t.Helper()
	deadline := time.After(a.wait)
	for {
		select {
		case fe, ok := <-a.frames:
			if !ok || fe.err != nil {
				return
			}
		case <-deadline:
			a.t.Fatalf("the stream of %s was still open %v after %s: a backend must end Stdout when its instance ends", a.inst.Name(), a.wait, why)
		}
	}
}

// testStartAndRemove: a started instance's agent answers on its stream;
// Remove leaves nothing of it.
func testStartAndRemove(t *testing.T, h Harness) {
	b := h.New(t)
	inst := h.start(t, b, h.spec(t))
	a := h.connect(t, inst)
	a.ping()
	ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
	defer cancel()
	if err := inst.Remove(ctx); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	a.ends("Remove")
	h.noLeftovers(t, b, "Remove")
}

// testRemoveTwice: Remove called many times at once, and again after,
// returns the same result each time and leaves nothing.
func testRemoveTwice(t *testing.T, h Harness) {
	b := h.New(t)
	inst := h.start(t, b, h.spec(t))
	h.connect(t, inst).ping()
	ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
	defer cancel()
	errs := make([]error, 8)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() { errs[i] = inst.Remove(ctx) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("concurrent Remove %d: %v", i, err)
		}
	}
	h.noLeftovers(t, b, "concurrent Removes")
	if err := inst.Remove(ctx); err != nil {
		t.Errorf("a Remove after the instance is gone: %v", err)
	}
}

// testRemovedFromOutside: an instance removed behind the backend's back
// ends its Stdout, which is how the server learns it is gone; Remove
// then still succeeds and leaves nothing.
func testRemovedFromOutside(t *testing.T, h Harness) {
	b := h.New(t)
	inst := h.start(t, b, h.spec(t))
	a := h.connect(t, inst)
	a.ping()
	h.RemoveFromOutside(t, b, inst)
	a.ends("its removal from outside")
	ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
	defer cancel()
	if err := inst.Remove(ctx); err != nil {
		t.Errorf("Remove of an instance removed from outside: %v", err)
	}
	h.noLeftovers(t, b, "Remove after a removal from outside")
}

// testStdinClose: closing Stdin ends the agent and with it the instance:
// Stdout ends.
func testStdinClose(t *testing.T, h Harness) {
	b := h.New(t)
	inst := h.start(t, b, h.spec(t))
	a := h.connect(t, inst)
	a.ping()
	if err := inst.Stdin().Close(); err != nil {
		t.Fatalf("close Stdin: %v", err)
	}
	a.ends("Stdin was closed")
}

// testSweepSparesLive: Sweep, which removes what gone servers left, never
// touches an instance this backend still holds.
func testSweepSparesLive(t *testing.T, h Harness) {
	b := h.New(t)
	inst := h.start(t, b, h.spec(t))
	a := h.connect(t, inst)
	a.ping()
	ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
	defer cancel()
	if err := b.Sweep(ctx); err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	a.ping()
	if left := h.Leftovers(t, b); len(left) == 0 {
		t.Error("Leftovers lists nothing while an instance runs: the suite's other checks would prove nothing")
	}
}

// testProxyEnv: the instance's environment is the spec's, plus the proxy's
// variables when a proxy is set, and only then.
func testProxyEnv(t *testing.T, h Harness) {
	if h.Proxy == nil {
		t.Skip("the harness runs no proxy")
	}
	proxyVars := []string{"HTTP_PROXY=", "HTTPS_PROXY=", "http_proxy=", "https_proxy=", "NO_PROXY=", "no_proxy="}
	b := h.New(t)
	for _, withProxy := range []bool{false, true} {
		spec := h.spec(t)
		spec.Env = append(spec.Env, "BACKENDTEST_GIVEN=yes")
		if withProxy {
			spec.Proxy = h.Proxy(t)
		}
		inst := h.start(t, b, spec)
		env := strings.Fields(h.connect(t, inst).exec("env"))
		if !slices.Contains(env, "BACKENDTEST_GIVEN=yes") {
			t.Errorf("proxy %v: the spec's variable is not in the environment: %q", withProxy, env)
		}
		for _, v := range proxyVars {
			i := slices.IndexFunc(env, func(e string) bool { return strings.HasPrefix(e, v) })
			switch {
			case withProxy && (i < 0 || len(env[i]) == len(v)):
				t.Errorf("with a proxy the environment lacks %s...: %q", v, env)
			case !withProxy && i >= 0:
				t.Errorf("without a proxy the environment has %s", env[i])
			}
		}
	}
}

// testFailedStart: a start the engine refuses after the backend made
// something for it returns an error and leaves nothing.
func testFailedStart(t *testing.T, h Harness) {
	if h.BreakSpec == nil {
		t.Skip("the harness has no way to make a start fail")
	}
	b := h.New(t)
	for _, withProxy := range []bool{false, true} {
		if withProxy && h.Proxy == nil {
			continue
		}
		spec := h.spec(t)
		if withProxy {
			spec.Proxy = h.Proxy(t)
		}
		h.BreakSpec(&spec)
		ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
		inst, err := b.Start(ctx, spec)
		cancel()
		if err == nil {
			inst.Remove(context.Background())
			t.Fatalf("proxy %v: Start succeeded with a broken spec", withProxy)
		}
		h.noLeftovers(t, b, fmt.Sprintf("a failed start (proxy %v: %v)", withProxy, err))
	}
}

// cancelPoints are when testCancelledStart ends a start's context: before
// it begins, and at points spread over a start's life.
var cancelPoints = []time.Duration{0, time.Millisecond, 10 * time.Millisecond, 50 * time.Millisecond,
	200 * time.Millisecond, 500 * time.Millisecond, 1500 * time.Millisecond}

// testCancelledStart: a start whose context ends at any point either fails
// and leaves nothing when it returns, or returns an instance that Remove
// then removes whole. One whose context ended before it began fails.
func testCancelledStart(t *testing.T, h Harness) {
	b := h.New(t)
	for _, withProxy := range []bool{false, true} {
		if withProxy && h.Proxy == nil {
			continue
		}
		for _, at := range cancelPoints {
			spec := h.spec(t)
			if withProxy {
				spec.Proxy = h.Proxy(t)
			}
			ctx, cancel := context.WithCancel(context.Background())
			if at == 0 {
				cancel()
			} else {
				time.AfterFunc(at, cancel)
			}
			inst, err := b.Start(ctx, spec)
			cancelled := ctx.Err() != nil
			cancel()
			switch {
			case err == nil && at == 0:
				inst.Remove(context.Background())
				t.Errorf("proxy %v: Start with a context already ended succeeded", withProxy)
			case err == nil:
				rctx, rcancel := context.WithTimeout(context.Background(), h.Timeout)
				if err := inst.Remove(rctx); err != nil {
					t.Errorf("proxy %v, cancelled after %v: Remove: %v", withProxy, at, err)
				}
				rcancel()
			case !cancelled:
				t.Errorf("proxy %v, cancelled after %v: Start failed before its context ended: %v", withProxy, at, err)
			}
			// What a start made must be gone when it returns: no waiting.
			if left := h.Leftovers(t, b); len(left) > 0 && err != nil {
				t.Errorf("proxy %v: a start cancelled after %v left behind: %s", withProxy, at, strings.Join(left, "; "))
			}
			h.noLeftovers(t, b, fmt.Sprintf("a start cancelled after %v", at))
		}
	}
}
