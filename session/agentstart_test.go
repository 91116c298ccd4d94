package session

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
)

// mutedBackend starts instances whose agent's stream fails at once with
// cause, as a container's output cut by the engine would.
type mutedBackend struct {
	*fakeBackend
	cause error
}

func (b *mutedBackend) Start(context.Context, backend.InstanceSpec) (backend.Instance, error) {
	r, w := io.Pipe()
	w.CloseWithError(b.cause)
	return &mutedInstance{stdout: r}, nil
}

type mutedInstance struct {
	stdout *io.PipeReader
}

type discard struct{ io.Writer }

func (discard) Close() error { return nil }

func (f *mutedInstance) Name() string                 { return "muted" }
func (f *mutedInstance) Stdout() io.Reader            { return f.stdout }
func (f *mutedInstance) Stdin() io.WriteCloser        { return discard{io.Discard} }
func (f *mutedInstance) StderrTail() string           { return "none" }
func (f *mutedInstance) Remove(context.Context) error { return nil }

// TestAgentThatDidNotStartKeepsItsCause: the UNAVAILABLE error of an agent
// that did not start wraps why (errors.Is sees the stream's error).
func TestAgentThatDidNotStartKeepsItsCause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &mutedBackend{fakeBackend: newFakeBackend(t), cause: errors.New("the engine cut the stream")}
		m := fakeManager(t, b.fakeBackend, func(o *Options) { o.Backend = b })
		_, err := m.startInstance(context.Background(), "k", 1, m.def)
		e := wantCode(t, err, errcode.Unavailable)
		if !strings.Contains(e.Message, "agent did not start") {
			t.Fatalf("got %v, want the agent's start failure", err)
		}
		if !errors.Is(err, b.cause) {
			t.Fatalf("got %v, which does not wrap the stream's error", err)
		}
	})
}
