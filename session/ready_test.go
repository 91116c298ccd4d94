package session

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
)

// slowStart is fakeBackend whose starts wait until gate is closed (an
// engine slow to start a container).
type slowStart struct {
	*fakeBackend
	gate chan struct{}
}

func (b *slowStart) Start(ctx context.Context, spec backend.InstanceSpec) (backend.Instance, error) {
	select {
	case <-b.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return b.fakeBackend.Start(ctx, spec)
}

// TestCallLeavesASlowStartWithItsOwnContext: while one call starts the
// sandbox's container, a second call on the sandbox waits for that start
// only as long as its own context lasts, and returns that context's error
// at its deadline; the start goes on, and its container is the one the
// calls that wait for it and the next call use (one start in all). Under s.mu the second call waited for
// the start whatever its context said (this test then hangs until the
// test binary's -timeout: a goroutine blocked on a mutex never lets the
// bubble's clock move).
func TestCallLeavesASlowStartWithItsOwnContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newFakeBackend(t)
		slow := &slowStart{fakeBackend: b, gate: make(chan struct{})}
		m := fakeManager(t, b, func(o *Options) { o.Backend = slow })
		sb, err := m.Sandbox("k", "alice")
		if err != nil {
			t.Fatal(err)
		}

		first := make(chan error, 1)
		go func() {
			_, err := sb.WriteFile(context.Background(), "f", []byte("written"), false, 0o644)
			first <- err
		}()
		synctest.Wait() // the first call is in the start, held at the gate

		second := make(chan error, 1)
		began := time.Now()
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, err := sb.ReadFile(ctx, "f", 0, 0, 1<<20)
			second <- err
		}()
		err = <-second
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("the waiting call returned %v, want its context's deadline", err)
		}
		if waited := time.Since(began); waited != 2*time.Second {
			t.Errorf("the waiting call returned after %v, want its deadline (2s)", waited)
		}
		select {
		case err := <-first:
			t.Fatalf("the start ended with the waiting call: %v", err)
		default:
		}
		if n := len(b.starts()); n != 0 {
			t.Fatalf("%d instances started while the start was held", n)
		}

		// A call that comes while the start is still held waits for it,
		// and runs in the instance it starts.
		third := make(chan error, 1)
		go func() {
			_, err := sb.List(context.Background(), ".", ListOptions{})
			third <- err
		}()
		synctest.Wait()
		close(slow.gate)
		if err := <-third; err != nil {
			t.Fatalf("a call that waited for the start: %v", err)
		}
		if err := <-first; err != nil {
			t.Fatalf("the first call, once its start went on: %v", err)
		}
		if got := read(t, sb, "f"); got != "written" {
			t.Fatalf("the next call read %q, want %q from the started instance", got, "written")
		}
		starts := b.starts()
		if len(starts) != 1 {
			t.Fatalf("%d instances started, want the one start the calls shared", len(starts))
		}
		if sb.ContainerID() != starts[0].name {
			t.Errorf("ContainerID = %q, want %q", sb.ContainerID(), starts[0].name)
		}
	})
}

// deafStart is fakeBackend whose starts wait until gate is closed and do
// not heed their context meanwhile (an engine call that does not return
// when it is abandoned).
type deafStart struct {
	*fakeBackend
	gate chan struct{}
}

func (b *deafStart) Start(ctx context.Context, spec backend.InstanceSpec) (backend.Instance, error) {
	<-b.gate
	return b.fakeBackend.Start(context.WithoutCancel(ctx), spec)
}

// TestReleaseWaitsForAStartUnderWay: a sandbox released while its start is
// under way (outside s.mu) is not gone until that start has ended and
// removed what it made; the call that started it hears the session ended.
func TestReleaseWaitsForAStartUnderWay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newFakeBackend(t)
		deaf := &deafStart{fakeBackend: b, gate: make(chan struct{})}
		m := fakeManager(t, b, func(o *Options) { o.Backend = deaf })
		sb, err := m.Sandbox("k", "alice")
		if err != nil {
			t.Fatal(err)
		}
		first := make(chan error, 1)
		go func() {
			_, err := sb.List(context.Background(), ".", ListOptions{})
			first <- err
		}()
		synctest.Wait()

		released := make(chan struct{})
		go func() {
			m.Release("k")
			close(released)
		}()
		synctest.Wait()
		select {
		case <-released:
			t.Fatal("Release returned while the start was under way")
		default:
		}
		close(deaf.gate)
		<-released
		for _, fi := range b.starts() {
			if !fi.isRemoved() {
				t.Errorf("instance %s started for the released sandbox is still there after Release", fi.name)
			}
		}
		e := wantCode(t, <-first, errcode.Unavailable)
		if !strings.Contains(e.Message, "session ended") {
			t.Errorf("the starting call heard %q, want that the session ended", e.Message)
		}
	})
}
