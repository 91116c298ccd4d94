package session

import (
	"context"
	"net"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// portDialTimeout bounds the connect inside the sandbox.
const portDialTimeout = 5 * time.Second

// portProbeEvery is how often WaitPort tries the port again while nothing
// listens on it.
const portProbeEvery = 100 * time.Millisecond

// Done is closed when the sandbox ends (its session ended, it was ended
// by handle, or the server stops).
func (s *Sandbox) Done() <-chan struct{} { return s.ctx.Done() }

// DialPort opens a byte stream to 127.0.0.1:port inside the sandbox's
// running container, through its agent: the sandbox needs no network for
// it, and nothing new listens anywhere. It does not start a container: a
// sandbox whose container is not running has nothing listening
// (UNAVAILABLE). Nothing listening on the port is NOT_FOUND. The stream
// ends with the container; a dial counts as use of the sandbox (its idle
// timer starts again).
func (s *Sandbox) DialPort(ctx context.Context, port int) (net.Conn, error) {
	s.mu.Lock()
	inst, closed := s.cur, s.closed
	s.mu.Unlock()
	if closed {
		return nil, errcode.Errorf(errcode.Unavailable, "the sandbox ended")
	}
	if inst == nil || inst.conn.Err() != nil {
		return nil, errcode.Errorf(errcode.Unavailable, "the sandbox has no running container, so nothing listens on port %d; run the server again with sandbox_exec", port)
	}
	s.lastUsed.Store(time.Now().UnixNano())
	return inst.conn.DialPort(ctx, port, portDialTimeout)
}

// WaitPort waits up to wait for something to listen on port inside the
// sandbox (starting its container if it has none) and reports whether
// something does. It tries a connect every portProbeEvery, inside the
// sandbox, and closes what it opened.
func (s *Sandbox) WaitPort(ctx context.Context, port int, wait time.Duration) (bool, error) {
	return call(ctx, s, func(ctx context.Context, inst *instance) (bool, error) {
		deadline := time.Now().Add(wait)
		for {
			c, err := inst.conn.DialPort(ctx, port, portDialTimeout)
			if err == nil {
				c.Close()
				return true, nil
			}
			if e, ok := errcode.As(err); !ok || e.Code != errcode.NotFound {
				return false, err
			}
			left := time.Until(deadline)
			if left <= 0 {
				return false, nil
			}
			select {
			case <-time.After(min(left, portProbeEvery)):
			case <-ctx.Done():
				return false, context.Cause(ctx)
			}
		}
	})
}
