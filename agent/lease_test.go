package agent

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
)

// TestIdleAgentSleepsThroughItsLease: an agent with a lease and no frame
// from the server sleeps until the lease runs out instead of waking on a
// tick (a thousand idle sandboxes woke 4,000 times a second), and still
// ends itself on time when the lease runs out.
func TestIdleAgentSleepsThroughItsLease(t *testing.T) {
	const lease = 1500 * time.Millisecond
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	go io.Copy(io.Discard, outR)
	served := make(chan error, 1)
	go func() {
		served <- Serve(context.Background(), inR, outW, Options{Workspace: t.TempDir(), User: User{UID: 1000, GID: 1000}})
		outW.Close()
	}()
	defer inW.Close()
	before := leaseWakeups.Load()
	start := time.Now()
	if err := agentproto.NewWriter(inW).Write(1, agentproto.KindLease, agentproto.Lease{TTLMillis: lease.Milliseconds()}, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-served:
		if !errors.Is(err, ErrLeaseExpired) {
			t.Fatalf("the agent ended with %v, want its lease expired", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the agent outlived its lease")
	}
	took := time.Since(start)
	if took < lease || took > lease+time.Second {
		t.Errorf("the agent ended %s after its lease of %s was given", took, lease)
	}
	// Its start, the lease's arrival, and the wake-up at the lease's end.
	if n := leaseWakeups.Load() - before; n > 4 {
		t.Errorf("the lease watcher woke %d times over a silent lease of %s, want at most 4", n, lease)
	}
}
