package session

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"
)

// execDone is how a command started by execStarted ended.
type execDone struct {
	res ExecResult
	err error
}

// execStarted runs req in sb in the background and returns once the
// command has written "started" on its standard output, so that what it
// set going before that is running: tests wait on that, not on a sleep.
// The channel gets the result when the command ends.
func execStarted(t *testing.T, ctx context.Context, sb *Sandbox, req ExecRequest) <-chan execDone {
	t.Helper()
	started := make(chan struct{})
	var (
		mu   sync.Mutex
		seen []byte
		once sync.Once
	)
	next := req.OnOutput
	req.OnOutput = func(stream string, p []byte) {
		if next != nil {
			next(stream, p)
		}
		if stream != "stdout" {
			return
		}
		mu.Lock()
		seen = append(seen, p...)
		found := bytes.Contains(seen, []byte("started"))
		mu.Unlock()
		if found {
			once.Do(func() { close(started) })
		}
	}
	if req.Cwd == "" {
		req.Cwd = "."
	}
	if req.MaxOutput == 0 {
		// Output past what the result keeps is not streamed either.
		req.MaxOutput = 1 << 10
	}
	done := make(chan execDone, 1)
	go func() {
		res, err := sb.Exec(ctx, req)
		done <- execDone{res, err}
	}()
	select {
	case <-started:
		return done
	case d := <-done:
		t.Fatalf("%q ended before it wrote \"started\": %+v %v", req.Argv, d.res, d.err)
	case <-time.After(time.Minute):
		t.Fatalf("%q did not write \"started\" within a minute", req.Argv)
	}
	return nil
}

// WarmReady returns the number of warm containers ready to be taken.
func (m *Manager) WarmReady() int { return m.pool.size() }

// listed unpacks a list's result into its entries and whether it was cut.
func listed(res ListResult, err error) ([]Entry, bool, error) { return res.Entries, res.Truncated, err }
