package agentclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
)

// PortConn is a byte stream to a TCP port inside the sandbox, relayed by
// the agent over the connection (agentproto.KindPortOpen). It is a
// net.Conn, with CloseWrite for a half-close. What it buffers is bounded:
// at most agentproto.PortWindow bytes from the agent wait for Read (the
// agent sends no more until Read takes them), and Write sends no more than
// the agent has room for, blocking until it acknowledges.
type PortConn struct {
	c    *Conn
	p    *pending
	port int

	ready chan error // the open's answer: nil once connected

	mu   sync.Mutex
	cond *sync.Cond
	buf  [][]byte
	held int64 // bytes in buf
	// unacked counts bytes Read took that the agent has not been told of:
	// acknowledged in batches (a quarter window, or when buf runs dry) so
	// a reader taking a few KiB at a time does not cost a frame each way
	// per read.
	unacked int64
	eof     bool  // the agent half-closed: no more data
	err     error // the stream or the connection failed
	// credit is how many more bytes may be sent before an ack.
	credit   int64
	wclosed  bool // CloseWrite sent
	closed   bool // Close called
	finished bool // the terminal frame came
	opened   bool
	rdl, wdl time.Time
	timers   [2]*time.Timer
}

var _ net.Conn = (*PortConn)(nil)

// errPortClosed is what a PortConn's Read and Write return after Close.
var errPortClosed = fmt.Errorf("agentclient: port stream: %w", net.ErrClosed)

// DialPort opens a stream to 127.0.0.1:port inside the sandbox and waits
// until the agent connected it or ctx ends. When nothing listens there
// the error is a NOT_FOUND *errcode.Error.
// The stream stays open until Close, the agent ends it, or the connection
// ends.
func (c *Conn) DialPort(ctx context.Context, port int, dialTimeout time.Duration) (*PortConn, error) {
	pc := &PortConn{c: c, port: port, ready: make(chan error, 1), credit: agentproto.PortWindow}
	pc.cond = sync.NewCond(&pc.mu)
	c.mu.Lock()
	c.nextID++
	p := &pending{id: c.nextID, frames: make(chan agentproto.Frame, 1), done: make(chan struct{}), port: pc}
	c.calls[p.id] = p
	c.mu.Unlock()
	pc.p = p
	if err := c.send(p.id, agentproto.KindPortOpen, agentproto.PortOpenRequest{
		Port: port, DialTimeoutMillis: dialTimeout.Milliseconds(),
	}, nil); err != nil {
		c.close(p)
		return nil, unavailable(err)
	}
	go pc.watch()
	select {
	case err := <-pc.ready:
		if err != nil {
			c.close(p)
			return nil, err
		}
		return pc, nil
	case <-ctx.Done():
		pc.Close()
		return nil, context.Cause(ctx)
	}
}

// watch fails the stream when the connection ends first.
func (pc *PortConn) watch() {
	select {
	case <-pc.c.dead:
		pc.fail(unavailable(pc.c.Err()))
	case <-pc.p.done:
	}
}

func (pc *PortConn) fail(err error) {
	pc.mu.Lock()
	if pc.err == nil {
		pc.err = err
	}
	opened := pc.opened
	pc.opened = true
	pc.cond.Broadcast()
	pc.mu.Unlock()
	if !opened {
		pc.ready <- err
	}
}

// deliver takes a frame of the stream from the read loop. It never blocks;
// an error means the agent broke the protocol.
func (pc *PortConn) deliver(f agentproto.Frame) error {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	defer pc.cond.Broadcast()
	if pc.finished {
		return nil
	}
	if !pc.opened {
		switch f.Kind {
		case agentproto.KindPortReady:
			pc.opened = true
			pc.ready <- nil
			return nil
		case agentproto.KindError:
			var e agentproto.Error
			if err := f.Decode(&e); err != nil {
				return fmt.Errorf("%w: %v", errProtocol, err)
			}
			err := fromAgent(e)
			pc.opened, pc.finished, pc.err = true, true, err
			pc.ready <- err
			pc.c.close(pc.p)
			return nil
		}
		return fmt.Errorf("%w: a %q frame before a port stream was connected", errProtocol, f.Kind)
	}
	switch f.Kind {
	case agentproto.KindPortData:
		if pc.eof || len(f.Payload) > agentproto.PortChunk || pc.held+int64(len(f.Payload)) > agentproto.PortWindow {
			return fmt.Errorf("%w: port stream data past its window or after its end", errProtocol)
		}
		if pc.closed || len(f.Payload) == 0 {
			return nil
		}
		pc.buf = append(pc.buf, f.Payload)
		pc.held += int64(len(f.Payload))
	case agentproto.KindPortAck:
		var a agentproto.PortAck
		if err := f.Decode(&a); err != nil || a.Bytes <= 0 || pc.credit+a.Bytes > agentproto.PortWindow {
			return fmt.Errorf("%w: a port stream ack for bytes never sent", errProtocol)
		}
		pc.credit += a.Bytes
	case agentproto.KindPortClose:
		pc.eof = true
	case agentproto.KindResult:
		var r agentproto.PortResult
		if err := f.Decode(&r); err != nil {
			return fmt.Errorf("%w: %v", errProtocol, err)
		}
		pc.finished, pc.eof = true, true
		if r.Reset && pc.err == nil && !pc.closed {
			pc.err = &net.OpError{Op: "read", Net: "agent", Err: errors.New("the connection inside the sandbox was reset")}
		}
		pc.c.close(pc.p)
	case agentproto.KindError:
		var e agentproto.Error
		if err := f.Decode(&e); err != nil {
			return fmt.Errorf("%w: %v", errProtocol, err)
		}
		pc.finished, pc.eof = true, true
		if pc.err == nil {
			pc.err = fromAgent(e)
		}
		pc.c.close(pc.p)
	default:
		return fmt.Errorf("%w: a %q frame in a port stream", errProtocol, f.Kind)
	}
	return nil
}

// wait blocks on the stream's condition until ok or the deadline dl (which
// which=0 for reads, 1 for writes) passes.
func (pc *PortConn) wait(which int, ok func() bool) error {
	for !ok() {
		dl := pc.rdl
		if which == 1 {
			dl = pc.wdl
		}
		if !dl.IsZero() && !time.Now().Before(dl) {
			return os.ErrDeadlineExceeded
		}
		pc.cond.Wait()
	}
	return nil
}

// Read reads what the program in the sandbox sent.
func (pc *PortConn) Read(b []byte) (int, error) {
	pc.mu.Lock()
	if err := pc.wait(0, func() bool { return len(pc.buf) > 0 || pc.eof || pc.err != nil || pc.closed }); err != nil {
		pc.mu.Unlock()
		return 0, err
	}
	switch {
	case pc.closed:
		pc.mu.Unlock()
		return 0, errPortClosed
	case len(pc.buf) == 0 && pc.err != nil:
		err := pc.err
		pc.mu.Unlock()
		return 0, err
	case len(pc.buf) == 0:
		pc.mu.Unlock()
		return 0, io.EOF
	}
	n := copy(b, pc.buf[0])
	if n == len(pc.buf[0]) {
		pc.buf = pc.buf[1:]
	} else {
		pc.buf[0] = pc.buf[0][n:]
	}
	pc.held -= int64(n)
	pc.unacked += int64(n)
	var ack int64
	if pc.unacked >= agentproto.PortWindow/4 || len(pc.buf) == 0 {
		ack, pc.unacked = pc.unacked, 0
	}
	finished := pc.finished
	pc.mu.Unlock()
	if !finished && ack > 0 {
		// The agent may send as many more.
		_ = pc.c.send(pc.p.id, agentproto.KindPortAck, agentproto.PortAck{Bytes: ack}, nil)
	}
	return n, nil
}

// Write sends b to the program in the sandbox, waiting for room in the
// window.
func (pc *PortConn) Write(b []byte) (int, error) {
	written := 0
	for len(b) > 0 {
		pc.mu.Lock()
		if err := pc.wait(1, func() bool { return pc.credit > 0 || pc.err != nil || pc.closed || pc.wclosed || pc.finished }); err != nil {
			pc.mu.Unlock()
			return written, err
		}
		switch {
		case pc.closed, pc.wclosed:
			pc.mu.Unlock()
			return written, errPortClosed
		case pc.err != nil:
			err := pc.err
			pc.mu.Unlock()
			return written, err
		case pc.finished:
			pc.mu.Unlock()
			return written, io.ErrClosedPipe
		}
		n := int(min(int64(len(b)), pc.credit, agentproto.PortChunk))
		pc.credit -= int64(n)
		pc.mu.Unlock()
		if err := pc.c.send(pc.p.id, agentproto.KindPortData, nil, b[:n]); err != nil {
			return written, unavailable(err)
		}
		written += n
		b = b[n:]
	}
	return written, nil
}

// CloseWrite tells the program in the sandbox that no more data comes (its
// read sees EOF); reading goes on.
func (pc *PortConn) CloseWrite() error {
	pc.mu.Lock()
	if pc.wclosed || pc.closed || pc.finished {
		pc.mu.Unlock()
		return nil
	}
	pc.wclosed = true
	pc.cond.Broadcast()
	pc.mu.Unlock()
	return pc.c.send(pc.p.id, agentproto.KindPortClose, nil, nil)
}

// Close ends the stream both ways at once: the agent closes the socket.
func (pc *PortConn) Close() error {
	pc.mu.Lock()
	if pc.closed {
		pc.mu.Unlock()
		return nil
	}
	pc.closed = true
	finished := pc.finished
	pc.buf, pc.held = nil, 0
	for _, t := range pc.timers {
		if t != nil {
			t.Stop()
		}
	}
	pc.cond.Broadcast()
	pc.mu.Unlock()
	if !finished {
		pc.c.cancel(pc.p)
	}
	pc.c.close(pc.p)
	return nil
}

// LocalAddr and RemoteAddr name the stream: the sandbox's loopback port.
func (pc *PortConn) LocalAddr() net.Addr { return portAddr("server") }

// RemoteAddr is 127.0.0.1:PORT in the sandbox.
func (pc *PortConn) RemoteAddr() net.Addr {
	return portAddr(fmt.Sprintf("sandbox:127.0.0.1:%d", pc.port))
}

type portAddr string

func (a portAddr) Network() string { return "agent" }
func (a portAddr) String() string  { return string(a) }

// SetDeadline sets both deadlines.
func (pc *PortConn) SetDeadline(t time.Time) error {
	pc.setDeadline(0, t)
	pc.setDeadline(1, t)
	return nil
}

// SetReadDeadline makes a waiting Read fail with os.ErrDeadlineExceeded at t.
func (pc *PortConn) SetReadDeadline(t time.Time) error { pc.setDeadline(0, t); return nil }

// SetWriteDeadline makes a waiting Write fail with os.ErrDeadlineExceeded at t.
func (pc *PortConn) SetWriteDeadline(t time.Time) error { pc.setDeadline(1, t); return nil }

func (pc *PortConn) setDeadline(which int, t time.Time) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if which == 0 {
		pc.rdl = t
	} else {
		pc.wdl = t
	}
	if pc.timers[which] != nil {
		pc.timers[which].Stop()
		pc.timers[which] = nil
	}
	pc.cond.Broadcast()
	if !t.IsZero() && !pc.closed {
		pc.timers[which] = time.AfterFunc(time.Until(t), func() {
			pc.mu.Lock()
			pc.cond.Broadcast()
			pc.mu.Unlock()
		})
	}
}
