package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// defaultDialTimeout bounds the connect of a port stream whose request
// sets none.
const defaultDialTimeout = 5 * time.Second

// portRelay is one port stream: a TCP connection to 127.0.0.1:PORT in the
// sandbox, relayed over the protocol (see agentproto.KindPortOpen). What it
// buffers is bounded by agentproto.PortWindow each way: the server sends no
// more than that un-acknowledged, and the relay reads from the socket only
// as much as the server has room for.
type portRelay struct {
	mu   sync.Mutex
	cond *sync.Cond
	// in holds the server's bytes not yet written to the socket; inBytes
	// counts them.
	in       [][]byte
	inBytes  int64
	inClosed bool // the server sent port_close
	// credit is how many bytes the relay may still send the server.
	credit int64
	// broken is set when the server broke the stream's flow control or
	// the stream was stopped: both loops end.
	broken bool
}

func newPortRelay() *portRelay {
	r := &portRelay{credit: agentproto.PortWindow}
	r.cond = sync.NewCond(&r.mu)
	return r
}

// deliver takes a port frame from the server. It never blocks the frame
// reader.
func (r *portRelay) deliver(f agentproto.Frame) {
	r.mu.Lock()
	defer r.mu.Unlock()
	defer r.cond.Broadcast()
	if r.broken {
		return
	}
	switch f.Kind {
	case agentproto.KindPortData:
		if r.inClosed || len(f.Payload) > agentproto.PortChunk || r.inBytes+int64(len(f.Payload)) > agentproto.PortWindow {
			r.broken = true // the server broke the window: stop the stream
			return
		}
		if len(f.Payload) > 0 {
			r.in = append(r.in, f.Payload)
			r.inBytes += int64(len(f.Payload))
		}
	case agentproto.KindPortAck:
		var a agentproto.PortAck
		if err := f.Decode(&a); err != nil || a.Bytes <= 0 || r.credit+a.Bytes > agentproto.PortWindow {
			r.broken = true
			return
		}
		r.credit += a.Bytes
	case agentproto.KindPortClose:
		r.inClosed = true
	}
}

func (r *portRelay) stop() {
	r.mu.Lock()
	r.broken = true
	r.cond.Broadcast()
	r.mu.Unlock()
}

// portOpen runs a port stream: it dials, relays both ways, and ends the
// request with its PortResult.
func (s *server) portOpen(ctx context.Context, c *call, req agentproto.PortOpenRequest) {
	if req.Port < 1 || req.Port > 65535 {
		s.sendError(c.id, errcode.Errorf(errcode.InvalidArgument, "port %d is not a TCP port; give 1 to 65535", req.Port))
		return
	}
	if n := s.ports.Add(1); n > agentproto.MaxPortStreams {
		s.ports.Add(-1)
		s.sendError(c.id, errcode.Errorf(errcode.Busy, "%d streams to the sandbox's ports are open already; close some first", agentproto.MaxPortStreams))
		return
	}
	defer s.ports.Add(-1)
	timeout := time.Duration(req.DialTimeoutMillis) * time.Millisecond
	if timeout <= 0 {
		timeout = defaultDialTimeout
	}
	addr := fmt.Sprintf("127.0.0.1:%d", req.Port)
	d := net.Dialer{Timeout: timeout}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		switch {
		case errors.Is(err, syscall.ECONNREFUSED):
			err = errcode.Errorf(errcode.NotFound, "nothing listens on port %d in the sandbox (connection refused)", req.Port)
		case ctx.Err() != nil:
			err = errcode.Errorf(errcode.Timeout, "the connect to port %d was stopped", req.Port)
		default:
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				err = errcode.Errorf(errcode.Timeout, "port %d in the sandbox did not accept a connection within %s", req.Port, timeout)
			} else {
				err = errcode.Errorf(errcode.Unavailable, "connect to port %d in the sandbox: %v", req.Port, err)
			}
		}
		s.sendError(c.id, err)
		return
	}
	conn := nc.(*net.TCPConn)
	defer conn.Close()
	r := c.port
	if err := s.send(c.id, agentproto.KindPortReady, nil, nil); err != nil {
		return
	}
	stop := context.AfterFunc(ctx, func() {
		r.stop()
		conn.Close()
	})
	defer stop()

	var res agentproto.PortResult
	var wg sync.WaitGroup
	reset := func() {
		r.stop()
		conn.SetLinger(0)
		conn.Close()
	}
	// To the socket: what the server sent, acknowledged once written.
	wg.Go(func() {
		for {
			r.mu.Lock()
			for len(r.in) == 0 && !r.inClosed && !r.broken {
				r.cond.Wait()
			}
			if r.broken {
				r.mu.Unlock()
				return
			}
			if len(r.in) == 0 { // closed and drained
				r.mu.Unlock()
				conn.CloseWrite()
				return
			}
			p := r.in[0]
			r.in = r.in[1:]
			r.mu.Unlock()
			n, err := conn.Write(p)
			res.ToPort += int64(n)
			r.mu.Lock()
			r.inBytes -= int64(len(p))
			r.mu.Unlock()
			if err != nil {
				reset()
				return
			}
			if s.send(c.id, agentproto.KindPortAck, agentproto.PortAck{Bytes: int64(len(p))}, nil) != nil {
				reset()
				return
			}
		}
	})
	// From the socket: as much as the server has room for.
	wg.Go(func() {
		buf := make([]byte, agentproto.PortChunk)
		for {
			r.mu.Lock()
			for r.credit == 0 && !r.broken {
				r.cond.Wait()
			}
			room := r.credit
			broken := r.broken
			r.mu.Unlock()
			if broken {
				return
			}
			n, err := conn.Read(buf[:min(room, int64(len(buf)))])
			if n > 0 {
				r.mu.Lock()
				r.credit -= int64(n)
				r.mu.Unlock()
				res.FromPort += int64(n)
				if s.send(c.id, agentproto.KindPortData, nil, buf[:n]) != nil {
					reset()
					return
				}
			}
			if err != nil {
				r.mu.Lock()
				broken := r.broken
				r.mu.Unlock()
				if errors.Is(err, io.EOF) && !broken {
					_ = s.send(c.id, agentproto.KindPortClose, nil, nil)
				} else {
					reset()
				}
				return
			}
		}
	})
	wg.Wait()
	r.mu.Lock()
	res.Reset = r.broken
	r.mu.Unlock()
	s.finish(c.id, res, nil)
}
