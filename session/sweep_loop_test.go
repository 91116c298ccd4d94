package session

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
)

// sweepCounter is a backend that starts nothing and counts its sweeps.
type sweepCounter struct {
	sweeps atomic.Int64
	swept  chan struct{} // one value per sweep, never blocking
	fail   bool
}

func (b *sweepCounter) Prepare(context.Context, func(backend.Step)) error { return nil }
func (b *sweepCounter) Start(context.Context, backend.InstanceSpec) (backend.Instance, error) {
	return nil, errcode.Errorf(errcode.Unavailable, "this test backend starts nothing")
}
func (b *sweepCounter) Sweep(context.Context) error {
	b.sweeps.Add(1)
	select {
	case b.swept <- struct{}{}:
	default:
	}
	if b.fail {
		return errors.New("the cluster is away")
	}
	return nil
}

// TestSweepEvery: with SweepEvery the backend is swept at the start and
// then again and again (what lets a surviving replica remove a dead one's
// sandboxes), a failed sweep does not stop the loop, and Close stops it.
func TestSweepEvery(t *testing.T) {
	for _, fail := range []bool{false, true} {
		be := &sweepCounter{swept: make(chan struct{}, 1), fail: fail}
		m, err := NewManager(context.Background(), Options{Backend: be, StateDir: t.TempDir(), Policy: policy.Default(), SweepEvery: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		for range 3 { // the one at the start, then at least two more
			select {
			case <-be.swept:
			case <-time.After(time.Minute):
				t.Fatalf("fail=%v: %d sweeps, want more: the loop does not run", fail, be.sweeps.Load())
			}
		}
		if err := m.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		n := be.sweeps.Load()
		// After Close returns the loop is gone: no sweep can start. The
		// sweep count is read twice around a yield to catch a straggler.
		time.Sleep(10 * time.Millisecond)
		if got := be.sweeps.Load(); got != n {
			t.Errorf("fail=%v: %d sweeps after Close, want none", fail, got-n)
		}
	}
}

// TestSweepOnceByDefault: without SweepEvery the backend is swept once, at
// the start, as before.
func TestSweepOnceByDefault(t *testing.T) {
	be := &sweepCounter{swept: make(chan struct{}, 8)}
	m, err := NewManager(context.Background(), Options{Backend: be, StateDir: t.TempDir(), Policy: policy.Default()})
	if err != nil {
		t.Fatal(err)
	}
	// The sweep follows the preparation, in the background.
	if err := m.WaitPrepared(context.Background(), 0, 0, nil); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := be.sweeps.Load(); n != 1 {
		t.Errorf("%d sweeps, want 1 (at the start)", n)
	}
}
