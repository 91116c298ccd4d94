package agent

import (
	"testing"
	"time"
)

// TestOutputIsWaitedForWhenNothingHoldsThePipes: a command that exited
// with its output still unread (readers late) gets all of it, past the
// grace, when none of its processes is left; while one lingers, the call
// ends after the grace.
func TestOutputIsWaitedForWhenNothingHoldsThePipes(t *testing.T) {
	const grace = 20 * time.Millisecond
	late := func() chan struct{} {
		done := make(chan struct{})
		time.AfterFunc(10*grace, func() { close(done) })
		return done
	}

	done := late()
	if !waitForOutput(done, nil, nil, grace, time.Minute, func() bool { return false }) {
		t.Fatal("with no process left, the wait ended before the output was read")
	}
	select {
	case <-done:
	default:
		t.Fatal("waitForOutput reported the output read before it was")
	}

	done = late()
	if waitForOutput(done, nil, nil, grace, time.Minute, func() bool { return true }) {
		t.Fatal("with a process holding the pipes, the wait went on past the grace until the readers ended")
	}

	never := make(chan struct{})
	if waitForOutput(never, nil, nil, grace, 2*grace, func() bool { return false }) {
		t.Fatal("readers that never end were reported done")
	}

	// The server's cancel or detach ends the wait for readers that nothing
	// of the command holds up (another job's process holds the pipe).
	for _, which := range []string{"stop", "detach"} {
		stop, detach := make(chan struct{}), make(chan struct{})
		ch := map[string]chan struct{}{"stop": stop, "detach": detach}[which]
		time.AfterFunc(grace/2, func() { close(ch) })
		start := time.Now()
		if waitForOutput(never, stop, detach, grace, time.Minute, func() bool { return false }) {
			t.Fatalf("%s: readers that never end were reported done", which)
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("%s did not end the wait", which)
		}
	}
}
