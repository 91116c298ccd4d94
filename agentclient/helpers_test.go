package agentclient

import (
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// testLogger logs to the test log while the test runs, and drops what
// background goroutines log after it ended.
func testLogger(t *testing.T) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct {
	t    *testing.T
	mu   sync.Mutex
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// wantCode fails the test unless err is an *errcode.Error with code.
func wantCode(t *testing.T, err error, code errcode.Code) *errcode.Error {
	t.Helper()
	e, ok := errcode.As(err)
	if !ok {
		t.Fatalf("error = %v (%T), want a %s *errcode.Error", err, err, code)
	}
	if e.Code != code {
		t.Fatalf("code = %s (%s), want %s", e.Code, e.Message, code)
	}
	return e
}

func listed(res ListResult, err error) ([]Entry, bool, error) { return res.Entries, res.Truncated, err }
