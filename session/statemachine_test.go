package session

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agent"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
)

// The tests in this file drive the sandbox's state machine (lost, reported,
// restored; idle removal with a snapshot; the warm pool's accounting; the
// wait for a removal under way) on fakeBackend: every instance is the real
// agent, served in this process over pipes on a directory of its own, so
// no engine is needed. They run in a synctest bubble: synctest.Wait
// returns once every goroutine of the manager, of its instances and of
// their agents is blocked, so each step is checked after the work it
// started has settled, with no sleep and no polling; time.Sleep only moves
// the bubble's clock.

// fakeBackend runs each instance as agent.Serve over a pair of pipes.
type fakeBackend struct {
	dir string // the instances' workspaces are made in it

	mu      sync.Mutex
	started []*fakeInstance // every instance started, in order
}

func newFakeBackend(t *testing.T) *fakeBackend {
	return &fakeBackend{dir: t.TempDir()}
}

func (b *fakeBackend) Prepare(context.Context, func(backend.Step)) error { return nil }
func (b *fakeBackend) Sweep(context.Context) error                       { return nil }

func (b *fakeBackend) Start(ctx context.Context, spec backend.InstanceSpec) (backend.Instance, error) {
	if err := ctx.Err(); err != nil {
		return nil, err // a start abandoned before it began makes nothing
	}
	ws, err := os.MkdirTemp(b.dir, spec.Sandbox+"-")
	if err != nil {
		return nil, err
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	fi := &fakeInstance{
		name: fmt.Sprintf("fake-%s-%d", spec.Sandbox, spec.Generation), spec: spec, workspace: ws,
		stdout: outR, stdin: inW, agentOut: outW, served: make(chan error, 1), removed: make(chan struct{}),
	}
	go func() {
		err := agent.Serve(context.Background(), inR, outW, agent.Options{Workspace: ws, User: agent.User{UID: 1000, GID: 1000}})
		outW.Close() // the agent's exit ends its stream, as a container's does
		fi.served <- err
	}()
	b.mu.Lock()
	b.started = append(b.started, fi)
	b.mu.Unlock()
	return fi, nil
}

// starts returns the instances started so far.
func (b *fakeBackend) starts() []*fakeInstance {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]*fakeInstance(nil), b.started...)
}

// fakeInstance is one instance of fakeBackend.
type fakeInstance struct {
	name      string
	spec      backend.InstanceSpec
	workspace string
	stdout    *io.PipeReader
	stdin     *io.PipeWriter
	agentOut  *io.PipeWriter // the agent's end of stdout
	served    chan error
	// gate, if set before the instance's removal starts, holds Remove
	// until it is closed (a slow engine).
	gate chan struct{}

	// removing is set by the first Remove; removed is closed when it has
	// finished. (Not a sync.Once: a goroutine waiting on a mutex would not
	// count as blocked for synctest.Wait.)
	removing atomic.Bool
	removed  chan struct{}
}

func (f *fakeInstance) Name() string          { return f.name }
func (f *fakeInstance) Stdout() io.Reader     { return f.stdout }
func (f *fakeInstance) Stdin() io.WriteCloser { return f.stdin }
func (f *fakeInstance) StderrTail() string    { return "none" }

func (f *fakeInstance) Remove(context.Context) error {
	if f.removing.CompareAndSwap(false, true) {
		if f.gate != nil {
			<-f.gate
		}
		f.stdin.Close()
		f.stdout.Close()
		<-f.served
		close(f.removed)
	}
	<-f.removed
	return nil
}

// die ends the instance's stream as a container that died would.
func (f *fakeInstance) die() { f.agentOut.CloseWithError(io.EOF) }

// isRemoved reports whether Remove has finished.
func (f *fakeInstance) isRemoved() bool {
	select {
	case <-f.removed:
		return true
	default:
		return false
	}
}

// fakeManager makes a Manager on b inside the bubble; Close runs at the
// end of the bubble.
func fakeManager(t *testing.T, b *fakeBackend, edit func(*Options)) *Manager {
	t.Helper()
	opts := Options{Backend: b, Policy: policy.Default(), StateDir: t.TempDir(), Instance: "fake", Logger: testLogger(t)}
	opts.Policy.MaxWorkspaceBytes = 16 << 20
	if edit != nil {
		edit(&opts)
	}
	m, err := NewManager(context.Background(), opts)
	if err != nil {
		t.Fatalf("NewManager: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
		for _, fi := range b.starts() {
			if !fi.isRemoved() {
				t.Errorf("instance %s was not removed by Close", fi.name)
			}
		}
	})
	return m
}

func write(t *testing.T, sb *Sandbox, path, content string) {
	t.Helper()
	if _, err := sb.WriteFile(context.Background(), path, []byte(content), false, 0o644); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
}

func read(t *testing.T, sb *Sandbox, path string) string {
	t.Helper()
	res, err := sb.ReadFile(context.Background(), path, 0, 0, 1<<20)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return string(res.Data)
}

// TestLostInstanceIsReportedThenRestored: an instance that dies between
// calls is removed; the next call says so, naming the latest snapshot the
// next instance starts from; the call after that runs in a fresh instance
// (generation 2) whose workspace is that snapshot.
func TestLostInstanceIsReportedThenRestored(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newFakeBackend(t)
		m := fakeManager(t, b, nil)
		sb, err := m.Sandbox("k", "alice")
		if err != nil {
			t.Fatal(err)
		}
		write(t, sb, "f", "saved")
		snap, err := sb.Snapshot(context.Background(), "before")
		if err != nil {
			t.Fatal(err)
		}
		write(t, sb, "f", "lost")
		first := b.starts()[0]

		first.die()
		synctest.Wait()
		if !first.isRemoved() {
			t.Fatal("the dead instance was not removed")
		}

		_, err = sb.ReadFile(context.Background(), "f", 0, 0, 1<<20)
		e := wantCode(t, err, errcode.Unavailable)
		for _, want := range []string{"lost its workspace", "its container stopped", "from its latest snapshot " + snap.ID} {
			if !strings.Contains(e.Message, want) {
				t.Errorf("the report %q does not say %q", e.Message, want)
			}
		}
		if n := len(b.starts()); n != 1 {
			t.Fatalf("the call that reports the loss started an instance (%d started)", n)
		}

		if got := read(t, sb, "f"); got != "saved" {
			t.Fatalf("the fresh instance holds %q, want the snapshot's %q", got, "saved")
		}
		starts := b.starts()
		if len(starts) != 2 || starts[1].spec.Generation != 2 || starts[1].spec.Sandbox != sb.ID() {
			t.Fatalf("want one fresh instance, generation 2 of %s; got %d instances", sb.ID(), len(starts))
		}
		if sb.ContainerID() != starts[1].name {
			t.Errorf("ContainerID = %q, want %q", sb.ContainerID(), starts[1].name)
		}
	})
}

// TestLostInstanceWithoutSnapshotStartsEmpty: with no snapshot the report
// says the next instance is empty, and it is.
func TestLostInstanceWithoutSnapshotStartsEmpty(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newFakeBackend(t)
		m := fakeManager(t, b, nil)
		sb, _ := m.Sandbox("k", "")
		write(t, sb, "f", "gone")
		b.starts()[0].die()
		synctest.Wait()
		_, _, err := listed(sb.List(context.Background(), ".", ListOptions{Recursive: false, MaxEntries: 10}))
		if e := wantCode(t, err, errcode.Unavailable); !strings.Contains(e.Message, "fresh, empty sandbox") {
			t.Errorf("report: %s", e.Message)
		}
		entries, _, err := listed(sb.List(context.Background(), ".", ListOptions{Recursive: false, MaxEntries: 10}))
		if err != nil || len(entries) != 0 {
			t.Fatalf("the fresh workspace holds %v (%v), want nothing", entries, err)
		}
	})
}

// TestIdleRemovalSavesTheWorkspace: a sandbox unused for --idle-timeout
// loses its instance after its workspace is saved; the next call reports
// that with the snapshot's id, the one after runs on a fresh instance
// restored from it.
func TestIdleRemovalSavesTheWorkspace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newFakeBackend(t)
		m := fakeManager(t, b, func(o *Options) { o.IdleTimeout = time.Minute })
		sb, _ := m.Sandbox("k", "bob")
		write(t, sb, "work", "kept")
		first := b.starts()[0]

		time.Sleep(30 * time.Second) // the bubble's clock: not idle long enough yet
		synctest.Wait()
		if first.isRemoved() {
			t.Fatal("removed after 30s of a 1m idle timeout")
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if !first.isRemoved() {
			t.Fatal("not removed after the idle timeout")
		}
		mine, err := m.Snapshots().For("bob").List()
		if err != nil || len(mine) != 1 || !strings.HasPrefix(mine[0].Label, "auto:") {
			t.Fatalf("the idle sandbox's snapshots: %v (%v), want one auto snapshot", mine, err)
		}

		_, err = sb.ReadFile(context.Background(), "work", 0, 0, 1<<20)
		e := wantCode(t, err, errcode.Unavailable)
		for _, want := range []string{"unused (--idle-timeout)", "saved as snapshot " + mine[0].ID, "from its latest snapshot " + mine[0].ID} {
			if !strings.Contains(e.Message, want) {
				t.Errorf("the report %q does not say %q", e.Message, want)
			}
		}
		if got := read(t, sb, "work"); got != "kept" {
			t.Fatalf("the restored workspace holds %q", got)
		}
	})
}

// TestWarmPoolCountsAgainstMaxSessions: warm instances count against
// --max-sandboxes, so the pool stops filling when sandboxes plus warm
// instances reach it, a new session takes a warm instance instead of
// starting one, and a sandbox's end makes room for another warm one.
func TestWarmPoolCountsAgainstMaxSessions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newFakeBackend(t)
		m := fakeManager(t, b, func(o *Options) { o.Warm = 2; o.MaxSandboxes = 3 })
		synctest.Wait()
		check := func(step string, warm, started int) {
			t.Helper()
			synctest.Wait()
			if got := m.WarmReady(); got != warm {
				t.Errorf("%s: %d warm, want %d", step, got, warm)
			}
			if got := len(b.starts()); got != started {
				t.Errorf("%s: %d instances started, want %d", step, got, started)
			}
		}
		check("at start", 2, 2)

		a, err := m.Sandbox("a", "")
		if err != nil {
			t.Fatal(err)
		}
		if a.ContainerID() != b.starts()[0].name {
			t.Errorf("sandbox a runs %q, not the first warm instance", a.ContainerID())
		}
		check("one sandbox", 2, 3) // 1 sandbox + 2 warm = 3
		if _, err := m.Sandbox("b", ""); err != nil {
			t.Fatal(err)
		}
		check("two sandboxes", 1, 3) // 2 + 1: the cap, no refill
		if _, err := m.Sandbox("c", ""); err != nil {
			t.Fatal(err)
		}
		check("three sandboxes", 0, 3)
		_, err = m.Sandbox("d", "")
		wantCode(t, err, errcode.Busy)

		m.Release("a")
		check("a released", 1, 4)
	})
}

// TestNewSandboxWaitsForABackgroundRemoval: at the cap, a new session's
// sandbox waits for a removal under way (ReleaseSoon) instead of refusing,
// and gets its sandbox when the removal ends.
func TestNewSandboxWaitsForABackgroundRemoval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newFakeBackend(t)
		m := fakeManager(t, b, func(o *Options) { o.MaxSandboxes = 1 })
		a, _ := m.Sandbox("a", "")
		write(t, a, "f", "a")
		gate := make(chan struct{})
		b.starts()[0].gate = gate // a slow engine
		open := sync.OnceFunc(func() { close(gate) })
		t.Cleanup(open) // before Close, which waits for the removal

		if !m.ReleaseSoon("a") {
			t.Fatal("ReleaseSoon found no sandbox")
		}
		type result struct {
			sb  *Sandbox
			err error
		}
		got := make(chan result, 1)
		go func() {
			sb, err := m.Sandbox("b", "")
			got <- result{sb, err}
		}()
		synctest.Wait()
		select {
		case r := <-got:
			t.Fatalf("at the cap, with a removal under way, Sandbox returned at once: %v", r.err)
		default:
		}

		open()
		r := <-got
		if r.err != nil {
			t.Fatalf("after the removal: %v", r.err)
		}
		write(t, r.sb, "f", "b")
	})
}

// TestNewSandboxGivesUpOnAStuckRemoval: a removal that does not end within
// the wait leaves the new session BUSY, saying so.
func TestNewSandboxGivesUpOnAStuckRemoval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newFakeBackend(t)
		m := fakeManager(t, b, func(o *Options) { o.MaxSandboxes = 1 })
		a, _ := m.Sandbox("a", "")
		write(t, a, "f", "a")
		gate := make(chan struct{})
		b.starts()[0].gate = gate
		t.Cleanup(func() { close(gate) }) // before Close, which waits for the removal
		m.ReleaseSoon("a")
		_, err := m.Sandbox("b", "") // the bubble's clock runs to the wait's end
		if e := wantCode(t, err, errcode.Busy); !strings.Contains(e.Message, "took longer than") {
			t.Errorf("report: %s", e.Message)
		}
	})
}

// TestCloseEndsABoundedNumberAtOnce: Close ends its sandboxes at most
// closeParallel at a time, so a server holding hundreds does not hand the
// engine hundreds of removals at once.
func TestCloseEndsABoundedNumberAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newFakeBackend(t)
		const n = closeParallel + 9
		m := fakeManager(t, b, nil)
		for i := range n {
			sb, err := m.Sandbox(fmt.Sprint("k", i), fmt.Sprint("caller", i))
			if err != nil {
				t.Fatal(err)
			}
			write(t, sb, "f", "x")
		}
		gate := make(chan struct{})
		starts := b.starts()
		if len(starts) != n {
			t.Fatalf("%d instances started, want %d", len(starts), n)
		}
		for _, fi := range starts {
			fi.gate = gate // a slow engine: every removal waits
		}
		closed := make(chan error, 1)
		go func() { closed <- m.Close(context.Background()) }()
		synctest.Wait()
		removing := 0
		for _, fi := range starts {
			if fi.removing.Load() {
				removing++
			}
		}
		if removing != closeParallel {
			t.Errorf("%d removals under way at once, want %d", removing, closeParallel)
		}
		close(gate)
		if err := <-closed; err != nil {
			t.Fatal(err)
		}
	})
}
