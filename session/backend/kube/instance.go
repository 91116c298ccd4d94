package kube

import (
	"context"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
)

// Instance is one running sandbox pod with the agent's exec stream open:
// the Kubernetes backend's backend.Instance. Cluster.Start makes it;
// Backend.Start adds the sandbox's environment, which the agent's setup
// delivers (the pod spec holds none of it), and the proxy credential,
// which Remove gives back.
type Instance struct {
	name   string
	c      *Cluster
	stdin  *io.PipeWriter
	stdinR *io.PipeReader
	stdout *io.PipeReader
	stderr *tailWriter
	cancel context.CancelFunc

	done      chan struct{} // the exec stream ended
	streamErr error         // why; set before done closes

	env    []string // the sandbox's environment (AgentEnv)
	revoke func()   // gives the proxy credential back; nil without one

	removeErr error
	removed   chan struct{}
	removeMu  sync.Mutex
}

var (
	_ backend.Instance = (*Instance)(nil)
	_ backend.AgentEnv = (*Instance)(nil)
)

// Name is the pod's name.
func (p *Instance) Name() string { return p.name }

// Stdout is the agent's frames. It ends when the exec stream ends.
func (p *Instance) Stdout() io.Reader { return p.stdout }

// Stdin is the agent's input. Closing it ends the agent, and the pod
// with it, unless another server took the pod over meanwhile (the pod
// is then that server's): the pod is deleted in the background.
func (p *Instance) Stdin() io.WriteCloser { return stdinCloser{p} }

type stdinCloser struct{ p *Instance }

func (s stdinCloser) Write(b []byte) (int, error) { return s.p.stdin.Write(b) }

func (s stdinCloser) Close() error {
	err := s.p.stdin.Close()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.p.c.release(ctx, s.p.name); err != nil {
			s.p.c.log.Warn("kube: delete sandbox pod after its stream was closed", "pod", s.p.name, "err", err)
		}
	}()
	return err
}

// WholeFrames reports that the agent's stdin gets whole frames only, even
// when a server takes it over from another mid-frame (the pod's hub drops
// the cut frame), so a takeover needs no quiet period.
func (p *Instance) WholeFrames() bool { return true }

// Done is closed when the agent's stream has ended.
func (p *Instance) Done() <-chan struct{} { return p.done }

// AgentEnv is the sandbox's environment, proxy variables included, which
// the pod spec does not hold.
func (p *Instance) AgentEnv() []string { return p.env }

// StderrTail is the last lines the agent wrote to its stderr, or "none".
func (p *Instance) StderrTail() string { return p.stderr.tail() }

// Remove ends the stream and deletes the pod (unless another server took
// it over: then the pod is that server's and stays), waits for the stream
// to end, and gives the proxy credential back. Safe to call more than once and
// concurrently.
func (p *Instance) Remove(ctx context.Context) error {
	p.removeMu.Lock()
	if p.removed == nil {
		p.removed = make(chan struct{})
		p.removeMu.Unlock()
		p.stdin.Close()
		p.removeErr = p.c.release(ctx, p.name)
		// The pod's deletion ends the exec; cancel in case the API server
		// is not reachable any more.
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			p.cancel()
			<-p.done
		}
		p.cancel()
		if p.revoke != nil {
			p.revoke()
		}
		close(p.removed)
		if p.removeErr != nil {
			p.removeErr = apiError("delete sandbox pod "+p.name, p.removeErr)
		}
		return p.removeErr
	}
	ch := p.removed
	p.removeMu.Unlock()
	select {
	case <-ch:
		return p.removeErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// tailWriter keeps the last lines written to it, bounded.
type tailWriter struct {
	mu    sync.Mutex
	buf   []byte
	lines []string
}

const (
	maxTailLine  = 512
	keptTailLine = 8
)

func (t *tailWriter) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range b {
		if c == '\n' || len(t.buf) >= maxTailLine {
			t.emit()
			if c == '\n' {
				continue
			}
		}
		t.buf = append(t.buf, c)
	}
	return len(b), nil
}

func (t *tailWriter) emit() {
	if len(t.buf) == 0 {
		return
	}
	t.lines = append(t.lines, string(t.buf))
	t.buf = t.buf[:0]
	if len(t.lines) > keptTailLine {
		t.lines = t.lines[1:]
	}
}

func (t *tailWriter) tail() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.emit()
	if len(t.lines) == 0 {
		return "none"
	}
	return strings.Join(t.lines, " | ")
}
