package agentclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// errProtocol marks a reply from the agent that breaks the protocol. The
// connection ends when one is seen.
var errProtocol = errors.New("agent broke the protocol")

// ErrRemoved ends the connection of a sandbox the server removes on
// purpose: that is no fault, and is logged as information.
var ErrRemoved = errors.New("the sandbox was removed")

// Conn is the server's end of the protocol with one sandbox's agent, over a
// stream of frames (for a container, its attach stream as demuxAttach
// splits it). Everything read from it is untrusted.
type Conn struct {
	log   *slog.Logger
	raw   io.Closer // the stream; closing it ends the agent
	hello agentproto.Hello

	wmu sync.Mutex
	w   *agentproto.Writer

	mu     sync.Mutex
	calls  map[uint64]*pending
	nextID uint64
	maxJob uint64 // the highest job id sent; the agent knows no other

	dead    chan struct{}
	deadErr atomic.Pointer[error]
}

// pending is a request in flight on a conn.
type pending struct {
	id     uint64
	frames chan agentproto.Frame
	done   chan struct{} // closed when the caller stops listening
	// port, for a port stream, takes the stream's frames instead of
	// frames: it buffers them within the stream's window, so the read loop
	// never waits for a slow reader.
	port *PortConn
}

// agentKinds are the frame kinds an agent may send after hello.
var agentKinds = map[agentproto.Kind]bool{
	agentproto.KindPong: true, agentproto.KindStdout: true, agentproto.KindStderr: true,
	agentproto.KindExit: true, agentproto.KindData: true, agentproto.KindResult: true,
	agentproto.KindError:     true,
	agentproto.KindPortReady: true, agentproto.KindPortData: true, agentproto.KindPortAck: true,
	agentproto.KindPortClose: true,
}

// newConn returns a connection writing requests to w, not yet reading.
func newConn(w io.Writer, raw io.Closer, log *slog.Logger) *Conn {
	c := &Conn{
		log:   log,
		raw:   raw,
		w:     agentproto.NewWriter(w),
		calls: make(map[uint64]*pending),
		dead:  make(chan struct{}),
	}
	c.w.MaxHeader = agentproto.MaxRequestHeader
	return c
}

// New takes over the agent's stream: r carries the agent's frames and
// nothing else, w takes the server's frames, and closing raw ends both (and
// with them the agent). It waits until ctx ends for the agent's hello, checks
// it, and sends the lease. On any failure raw is closed.
//
// token, if not empty, is given to the agent with the lease: with it a
// later server can take the agent over (Resume) after this one is gone,
// and the agent outlives a stream that breaks inside a frame.
func New(ctx context.Context, r io.Reader, w io.Writer, raw io.Closer, lease time.Duration, token string, log *slog.Logger) (*Conn, error) {
	c := newConn(w, raw, log)
	reader := agentproto.NewReader(r)

	type helloOrErr struct {
		f   agentproto.Frame
		err error
	}
	first := make(chan helloOrErr, 1)
	go func() {
		f, err := reader.Read()
		first <- helloOrErr{f, err}
	}()
	var h helloOrErr
	select {
	case <-ctx.Done():
		raw.Close()
		return nil, fmt.Errorf("waiting for the agent's hello: %w", context.Cause(ctx))
	case h = <-first:
	}
	if err := c.checkHello(h.f, h.err); err != nil {
		raw.Close()
		return nil, err
	}
	if err := c.send(0, agentproto.KindLease, agentproto.Lease{TTLMillis: lease.Milliseconds(), Token: token}, nil); err != nil {
		raw.Close()
		return nil, fmt.Errorf("sending the lease: %w", err)
	}
	go c.readLoop(reader)
	return c, nil
}

// checkHello accepts the agent's first frame (or the error reading it) if it
// is a hello on id 0 in this server's protocol version, and keeps its body.
func (c *Conn) checkHello(f agentproto.Frame, err error) error {
	switch {
	case errors.Is(err, io.EOF):
		return errors.New("waiting for the agent's hello: the agent's stream ended")
	case err != nil:
		return fmt.Errorf("waiting for the agent's hello: %w", err)
	case f.Kind != agentproto.KindHello:
		return fmt.Errorf("%w: the first frame is %q, not hello", errProtocol, f.Kind)
	case f.ID != 0:
		return fmt.Errorf("%w: the hello came on request id %d, not 0", errProtocol, f.ID)
	}
	if err := f.Decode(&c.hello); err != nil {
		return fmt.Errorf("%w: %v", errProtocol, err)
	}
	if c.hello.Version != agentproto.Version {
		return fmt.Errorf("the agent speaks protocol %d, this server speaks %d: rebuild the runtime image with a matching agent (the server builds it from --agent-bin)",
			c.hello.Version, agentproto.Version)
	}
	return nil
}

// readLoop routes the agent's frames to the requests waiting for them.
func (c *Conn) readLoop(r *agentproto.Reader) {
	for {
		f, err := r.Read()
		switch {
		case err == nil:
		case errors.Is(err, io.EOF):
			c.Fail(errors.New("the agent's stream ended"))
			return
		case errors.Is(err, io.ErrUnexpectedEOF):
			c.Fail(errors.New("the agent's stream ended inside a frame"))
			return
		case errors.Is(err, agentproto.ErrFrameTooLarge), errors.Is(err, agentproto.ErrBadHeader):
			c.Fail(fmt.Errorf("%w: %w", errProtocol, err))
			return
		default:
			c.Fail(fmt.Errorf("reading from the agent: %w", err))
			return
		}
		if !agentKinds[f.Kind] {
			c.Fail(fmt.Errorf("%w: unexpected %q frame", errProtocol, f.Kind))
			return
		}
		c.mu.Lock()
		p, asked := c.calls[f.ID], f.ID != 0 && f.ID <= c.nextID
		c.mu.Unlock()
		if !asked {
			c.Fail(fmt.Errorf("%w: a %q frame for request %d, which the server never sent", errProtocol, f.Kind, f.ID))
			return
		}
		if p == nil {
			continue // a request that already ended: late output is dropped
		}
		if p.port != nil {
			if err := p.port.deliver(f); err != nil {
				c.Fail(err)
				return
			}
			continue
		}
		select {
		case p.frames <- f:
		case <-p.done:
		case <-c.dead:
			return
		}
	}
}

// Hello is what the agent said of itself when the connection began.
func (c *Conn) Hello() agentproto.Hello { return c.hello }

// Done is closed when the connection ends.
func (c *Conn) Done() <-chan struct{} { return c.dead }

// Fail ends the connection once, recording why.
func (c *Conn) Fail(err error) {
	if c.deadErr.CompareAndSwap(nil, &err) {
		level := slog.LevelWarn
		if errors.Is(err, ErrRemoved) {
			level = slog.LevelInfo
		}
		c.log.Log(context.Background(), level, "session: agent connection ended", "err", err)
		close(c.dead)
		c.raw.Close()
	}
}

// Err returns why the connection ended, or nil while it is alive.
func (c *Conn) Err() error {
	if p := c.deadErr.Load(); p != nil {
		return *p
	}
	return nil
}

// send writes one frame. A frame the writer refuses before writing a byte
// (too large, or a body that does not encode) fails only its request: the
// stream is intact. Any other write error ends the connection.
func (c *Conn) send(id uint64, kind agentproto.Kind, body any, payload []byte) error {
	return c.write(kind, func(w *agentproto.Writer) error { return w.Write(id, kind, body, payload) })
}

// sendRequest writes a request's first frame, telling the agent to stop
// the request once timeout has passed (0: no limit; see
// agentproto.Header.TimeoutMillis). Errors are as send's.
func (c *Conn) sendRequest(id uint64, kind agentproto.Kind, timeout time.Duration, body any) error {
	return c.write(kind, func(w *agentproto.Writer) error { return w.WriteRequest(id, kind, timeout, body) })
}

// write runs one frame's write under the write lock and sorts its error.
func (c *Conn) write(kind agentproto.Kind, write func(*agentproto.Writer) error) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.Err(); err != nil {
		return err
	}
	err := write(c.w)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, agentproto.ErrFrameTooLarge):
		c.log.Warn("request too large for the agent's protocol", "kind", kind, "err", err)
		return errcode.Errorf(errcode.TooLarge, "the %s request does not fit the sandbox's protocol (at most %d bytes once JSON-encoded, where a control character or <, >, & takes 6); pass large input on stdin or in a file",
			kind, c.w.MaxHeader)
	case errors.Is(err, agentproto.ErrNotSent):
		return errLocal{fmt.Errorf("session: %w", err)}
	default:
		c.Fail(fmt.Errorf("writing to the agent: %w", err))
		return err
	}
}

// noteJob records a job id about to be sent in an exec.
func (c *Conn) noteJob(id uint64) {
	c.mu.Lock()
	c.maxJob = max(c.maxJob, id)
	c.mu.Unlock()
}

// KnowsJob reports whether id is a job id this server sent.
func (c *Conn) KnowsJob(id uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return id != 0 && id <= c.maxJob
}

// open registers a request and sends its first frame. The agent stops the
// request when ctx's deadline passes (the server stops waiting for it
// then); without a deadline it works until it is done or cancelled.
func (c *Conn) open(ctx context.Context, kind agentproto.Kind, body any) (*pending, error) {
	var timeout time.Duration
	if dl, ok := ctx.Deadline(); ok {
		// A deadline already passed still sets one: the agent stops at once.
		timeout = max(time.Until(dl), time.Millisecond)
	}
	c.mu.Lock()
	c.nextID++
	p := &pending{id: c.nextID, frames: make(chan agentproto.Frame, 16), done: make(chan struct{})}
	c.calls[p.id] = p
	c.mu.Unlock()
	if err := c.sendRequest(p.id, kind, timeout, body); err != nil {
		c.close(p)
		return nil, err
	}
	return p, nil
}

// close stops listening for a request's frames.
func (c *Conn) close(p *pending) {
	c.mu.Lock()
	if c.calls[p.id] == p {
		delete(c.calls, p.id)
		close(p.done)
	}
	c.mu.Unlock()
}

// sendData sends a request's input as data frames and an eof frame.
func (c *Conn) sendData(p *pending, data []byte) error {
	for len(data) > 0 {
		n := min(len(data), agentproto.ChunkSize)
		if err := c.send(p.id, agentproto.KindData, nil, data[:n]); err != nil {
			return err
		}
		data = data[n:]
	}
	return c.send(p.id, agentproto.KindEOF, nil, nil)
}

// cancel asks the agent to stop a request.
func (c *Conn) cancel(p *pending) {
	_ = c.send(p.id, agentproto.KindCancel, nil, nil)
}

// next waits for the request's next frame. It fails when ctx ends or the
// connection dies.
func (c *Conn) next(ctx context.Context, p *pending) (agentproto.Frame, error) {
	select {
	case f := <-p.frames:
		return f, nil
	case <-c.dead:
		// Frames delivered before the end are still good.
		select {
		case f := <-p.frames:
			return f, nil
		default:
		}
		return agentproto.Frame{}, c.Err()
	case <-ctx.Done():
		return agentproto.Frame{}, context.Cause(ctx)
	}
}

// Ping checks that the agent answers within ctx. An answer other than pong
// ends the connection; an agent that does not answer in time is the
// caller's to judge (the error is ctx's).
func (c *Conn) Ping(ctx context.Context) error {
	p, err := c.open(ctx, agentproto.KindPing, nil)
	if err != nil {
		return err
	}
	defer c.close(p)
	f, err := c.next(ctx, p)
	if err != nil {
		return err
	}
	if f.Kind != agentproto.KindPong {
		c.Fail(fmt.Errorf("%w: %q frame in answer to ping", errProtocol, f.Kind))
		return c.Err()
	}
	return nil
}
