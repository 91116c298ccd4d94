package agentclient

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// The tests in this file run the server's end of the agent protocol (Conn)
// in the test process, against an agent on the other end of two pipes: small
// scripted agents here, each breaking one rule, and the real agent in
// agent_test.go. None of them needs Docker.

// agentEnd is the agent's side of a conn under test: it reads the frames the
// server writes and writes frames, or any bytes, for the server to read.
type agentEnd struct {
	in    *countingReader // the server's frames
	out   *io.PipeWriter  // what the server reads
	r     *agentproto.Reader
	w     *agentproto.Writer
	ended chan struct{} // closed when the agent's script returned
}

// pipeConn runs script as the agent on one end of two pipes and newConn on
// the other, and returns what newConn returned. ctx bounds the wait for the
// hello. When the test ends the pipes are closed, and the script must then
// return.
func pipeConn(t *testing.T, ctx context.Context, script func(a *agentEnd)) (*Conn, *agentEnd, error) {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	a := &agentEnd{in: &countingReader{r: inR}, out: outW, w: agentproto.NewWriter(outW), ended: make(chan struct{})}
	a.r = agentproto.NewReader(a.in)
	a.r.MaxHeader = agentproto.MaxRequestHeader
	raw := closerFunc(func() error {
		inW.Close()
		outR.Close()
		return nil
	})
	go func() {
		defer close(a.ended)
		script(a)
	}()
	t.Cleanup(func() {
		raw.Close()
		select {
		case <-a.ended:
		case <-time.After(10 * time.Second):
			t.Error("the agent's script did not return after the stream closed")
		}
	})
	c, err := New(ctx, outR, inW, raw, time.Minute, "", testLogger(t))
	return c, a, err
}

// hostileConn is pipeConn for an agent that gets past the hello.
func hostileConn(t *testing.T, script func(a *agentEnd)) (*Conn, *agentEnd) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, a, err := pipeConn(t, ctx, script)
	if err != nil {
		t.Fatalf("newConn: %v", err)
	}
	return c, a
}

// hello sends a good hello and reads the lease.
func (a *agentEnd) hello() bool {
	if a.w.Write(0, agentproto.KindHello, agentproto.Hello{Version: agentproto.Version}, nil) != nil {
		return false
	}
	f, ok := a.next()
	return ok && f.Kind == agentproto.KindLease
}

// next reads the server's next frame; false once the stream is closed.
func (a *agentEnd) next() (agentproto.Frame, bool) {
	f, err := a.r.Read()
	return f, err == nil
}

// send writes one frame; the server may have closed the stream already.
func (a *agentEnd) send(id uint64, kind agentproto.Kind, body any, payload []byte) {
	_ = a.w.Write(id, kind, body, payload)
}

// raw writes bytes that need not be a frame.
func (a *agentEnd) raw(b []byte) { _, _ = a.out.Write(b) }

// drain reads the server's frames until the stream closes.
func (a *agentEnd) drain() {
	for {
		if _, ok := a.next(); !ok {
			return
		}
	}
}

// sizes is the start of a frame that announces a header of hl and a payload
// of pl bytes.
func sizes(hl, pl uint32) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint32(b[0:4], hl)
	binary.BigEndian.PutUint32(b[4:8], pl)
	return b
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// callTimeout bounds every call in these tests: a guard that does not work
// shows as a call that waits this long and then fails for the wrong reason.
const callTimeout = 10 * time.Second

// wantBroken checks how a call ends when the agent broke the protocol: the
// caller gets UNAVAILABLE, the connection has ended with a protocol error
// that says why, and the stream was closed (the agent's end saw it).
func wantBroken(t *testing.T, c *Conn, a *agentEnd, err error, why string) {
	t.Helper()
	wantCode(t, err, errcode.Unavailable)
	select {
	case <-c.dead:
	default:
		t.Fatal("the connection is still alive")
	}
	if cerr := c.Err(); !errors.Is(cerr, errProtocol) || !strings.Contains(cerr.Error(), why) {
		t.Fatalf("the connection ended with %v, want a protocol error saying %q", cerr, why)
	}
	select {
	case <-a.ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the stream to the agent is still open")
	}
}

// TestHostileAgentEndsTheConnection: each way an agent can break the
// protocol ends the connection at once, with an error that names the
// violation, and never leaves the call waiting: unknown frames, frames for
// requests never sent, frames over the size limits, streams longer than
// asked for, answers of the wrong kind or shape, and bytes that are not
// frames at all.
func TestHostileAgentEndsTheConnection(t *testing.T) {
	read := func(c *Conn) error {
		_, err := c.ReadFile(ctxFor(t), "f", 0, 0, 10)
		return err
	}
	exec := func(c *Conn) error {
		_, err := c.Exec(ctxFor(t), ExecRequest{Argv: []string{"true"}, Cwd: ".", Timeout: time.Minute, MaxOutput: 10}, JobOpts{})
		return err
	}
	resolve := func(c *Conn) error {
		_, err := c.Resolve(ctxFor(t), []string{"ls"}, ".")
		return err
	}
	port := func(c *Conn) error {
		pc, err := c.DialPort(ctxFor(t), 8000, 0)
		if err != nil {
			return err
		}
		defer pc.Close()
		// Nothing reads: what the agent sends stays buffered.
		select {
		case <-c.Done():
			return unavailable(c.Err())
		case <-time.After(10 * time.Second):
			return nil
		}
	}
	chunk := make([]byte, agentproto.PortChunk)
	for _, tc := range []struct {
		name   string
		call   func(*Conn) error
		answer func(a *agentEnd, req agentproto.Frame)
		why    string
	}{
		{"an unknown frame kind", read, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, "shell", nil, nil)
		}, `unexpected "shell" frame`},
		{"a frame kind only the server sends", read, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindEOF, nil, nil)
		}, `unexpected "eof" frame`},
		{"a second hello", read, func(a *agentEnd, req agentproto.Frame) {
			a.send(0, agentproto.KindHello, agentproto.Hello{Version: agentproto.Version}, nil)
		}, `unexpected "hello" frame`},
		{"a frame for a request never sent", read, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID+1000, agentproto.KindResult, agentproto.ReadResult{}, nil)
		}, fmt.Sprintf("request %d, which the server never sent", 1001)},
		{"a frame for request 0", read, func(a *agentEnd, req agentproto.Frame) {
			a.send(0, agentproto.KindPong, nil, nil)
		}, "request 0, which the server never sent"},
		{"a header over the agent's limit", read, func(a *agentEnd, req agentproto.Frame) {
			a.raw(sizes(agentproto.MaxHeader+1, 0)) // and nothing more: the claim alone ends it
		}, "exceeds size limits"},
		{"a payload over the limit", read, func(a *agentEnd, req agentproto.Frame) {
			a.raw(sizes(20, agentproto.MaxPayload+1))
		}, "exceeds size limits"},
		{"a header of 4 GiB", read, func(a *agentEnd, req agentproto.Frame) {
			a.raw(sizes(1<<32-1, 1<<32-1))
		}, "exceeds size limits"},
		{"garbage bytes", read, func(a *agentEnd, req agentproto.Frame) {
			a.raw([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
		}, "exceeds size limits"},
		{"a header that is not JSON", read, func(a *agentEnd, req agentproto.Frame) {
			a.raw(append(sizes(5, 0), "\x00\xffabc"...))
		}, "bad frame header"},
		{"a read longer than asked for", read, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindData, nil, []byte("0123456789"))
			a.send(req.ID, agentproto.KindData, nil, []byte("!"))
			a.send(req.ID, agentproto.KindResult, agentproto.ReadResult{Size: 11}, nil)
		}, "more than the 10 bytes asked for"},
		{"exec output longer than asked for", exec, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindStderr, nil, []byte("0123456789"))
			a.send(req.ID, agentproto.KindStdout, nil, []byte("012345"))
			a.send(req.ID, agentproto.KindStdout, nil, []byte("6789!"))
			a.send(req.ID, agentproto.KindExit, agentproto.ExecResult{}, nil)
		}, "more than the 10 bytes of stdout asked for"},
		{"a snapshot longer than its limit", func(c *Conn) error {
			_, err := c.Snapshot(ctxFor(t), io.Discard, agentproto.Limits{MaxBytes: 100})
			return err
		}, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindData, nil, make([]byte, 101))
		}, "snapshot stream exceeds 100 bytes"},
		{"a list with more entries than asked for", func(c *Conn) error {
			_, _, err := listed(c.List(ctxFor(t), ".", ListOptions{Recursive: false, MaxEntries: 1}))
			return err
		}, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindData, nil, []byte(`{"path":"a","type":"file"}`+"\n"+`{"path":"b","type":"file"}`+"\n"))
		}, "list entry out of bounds"},
		{"a list entry of an unknown type", func(c *Conn) error {
			_, _, err := listed(c.List(ctxFor(t), ".", ListOptions{Recursive: false, MaxEntries: 5}))
			return err
		}, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindData, nil, []byte(`{"path":"a","type":"door"}`+"\n"))
		}, "list entry out of bounds"},
		{"an exit in answer to a read", read, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindExit, agentproto.ExecResult{}, nil)
		}, `"exit" frame in answer to read`},
		{"a result in answer to an exec", exec, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindResult, agentproto.ReadResult{}, nil)
		}, `"result" frame in answer to exec`},
		{"data in answer to a resolve", resolve, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindData, nil, []byte("/bin/ls"))
		}, "data frame in answer to resolve"},
		// A request without onStream (a read) takes no stdout; one without
		// onData (a job read) takes no data: see request.
		{"stdout in answer to a read", read, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindStdout, nil, []byte("x"))
		}, "stdout frame in answer to read"},
		{"data in answer to a job read", func(c *Conn) error {
			_, err := c.Job(ctxFor(t), agentproto.JobRequest{Job: 1, Max: 10})
			return err
		}, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindData, nil, []byte("x"))
		}, "data frame in answer to job"},
		{"a result in answer to a ping", func(c *Conn) error {
			// The manager ends the sandbox on any error of a ping; the
			// model sees what the next call then gets.
			return unavailable(c.Ping(ctxFor(t)))
		}, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindResult, nil, nil)
		}, `"result" frame in answer to ping`},
		{"a result whose body is not the request's", read, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindResult, []string{"not", "an", "object"}, nil)
		}, "result frame 1: bad body"},
		{"an exit whose body is not an exec result", exec, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindExit, map[string]string{"exit_code": "zero"}, nil)
		}, "exit frame 1: bad body"},
		{"an error whose body is not an error", read, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindError, 42, nil)
		}, "error frame 1: bad body"},
		{"a resolve answered for another number of names", resolve, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindResult, agentproto.ResolveResult{Paths: []string{"/bin/ls", "/bin/sh"}}, nil)
		}, "resolve answered 2 paths for 1 names"},
		{"port data past the stream's window", port, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindPortReady, nil, nil)
			for range agentproto.PortWindow/agentproto.PortChunk + 1 {
				a.send(req.ID, agentproto.KindPortData, nil, chunk)
			}
		}, "port stream data past its window"},
		{"port data before the stream is connected", port, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindPortData, nil, []byte("x"))
		}, "before a port stream was connected"},
		{"a port ack for bytes never sent", port, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindPortReady, nil, nil)
			a.send(req.ID, agentproto.KindPortAck, agentproto.PortAck{Bytes: 1}, nil)
		}, "ack for bytes never sent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, a := hostileConn(t, func(a *agentEnd) {
				if !a.hello() {
					return
				}
				if req, ok := a.next(); ok {
					tc.answer(a, req)
				}
				a.drain()
			})
			start := time.Now()
			err := tc.call(c)
			wantBroken(t, c, a, err, tc.why)
			t.Logf("ended after %s: %v", time.Since(start).Round(time.Millisecond), c.Err())
		})
	}
}

// TestConnAgentGone: an agent whose stream ends, between frames or inside
// one, fails the call in flight as UNAVAILABLE and ends the connection,
// saying so (not as a protocol error: a killed agent does this too).
func TestConnAgentGone(t *testing.T) {
	for _, tc := range []struct {
		name string
		last []byte
		why  string
	}{
		{"between frames", nil, "the agent's stream ended"},
		{"inside a frame", append(sizes(100, 0), `{"id":1`...), "the agent's stream ended inside a frame"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := hostileConn(t, func(a *agentEnd) {
				if !a.hello() {
					return
				}
				if _, ok := a.next(); ok {
					a.raw(tc.last)
					a.out.Close()
				}
				a.drain()
			})
			_, err := c.ReadFile(ctxFor(t), "f", 0, 0, 10)
			wantCode(t, err, errcode.Unavailable)
			if cerr := c.Err(); cerr == nil || cerr.Error() != tc.why || errors.Is(cerr, errProtocol) {
				t.Fatalf("the connection ended with %v, want %q", cerr, tc.why)
			}
		})
	}
}

// ctxFor is the context of one call in these tests.
func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	t.Cleanup(cancel)
	return ctx
}

// TestConnRefusesABadHello: newConn accepts only a first frame that is a
// hello on id 0 in this server's version, says what was wrong otherwise, and
// closes the stream. An agent that says nothing holds it only as long as
// its context.
func TestConnRefusesABadHello(t *testing.T) {
	for _, tc := range []struct {
		name  string
		hello func(a *agentEnd)
		why   string
	}{
		{"another version", func(a *agentEnd) {
			a.send(0, agentproto.KindHello, agentproto.Hello{Version: agentproto.Version + 1}, nil)
		}, fmt.Sprintf("the agent speaks protocol %d, this server speaks %d: rebuild the runtime image", agentproto.Version+1, agentproto.Version)},
		{"no version", func(a *agentEnd) {
			a.send(0, agentproto.KindHello, struct{}{}, nil)
		}, fmt.Sprintf("the agent speaks protocol 0, this server speaks %d", agentproto.Version)},
		{"a hello on another id", func(a *agentEnd) {
			a.send(3, agentproto.KindHello, agentproto.Hello{Version: agentproto.Version}, nil)
		}, "the hello came on request id 3, not 0"},
		{"another frame first", func(a *agentEnd) {
			a.send(0, agentproto.KindPong, nil, nil)
			a.send(0, agentproto.KindHello, agentproto.Hello{Version: agentproto.Version}, nil)
		}, `the first frame is "pong", not hello`},
		{"a hello whose body does not decode", func(a *agentEnd) {
			a.send(0, agentproto.KindHello, map[string]string{"version": "1"}, nil)
		}, "hello frame 0: bad body"},
		{"garbage", func(a *agentEnd) {
			a.raw([]byte("exec /sandbox-agent: no such file or directory\n"))
		}, "waiting for the agent's hello: agentproto: frame exceeds size limits"},
		{"the stream ends", func(a *agentEnd) {
			a.out.Close()
		}, "waiting for the agent's hello: the agent's stream ended"},
		{"silence", func(a *agentEnd) {}, "waiting for the agent's hello: context deadline exceeded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			start := time.Now()
			_, a, err := pipeConn(t, ctx, func(a *agentEnd) {
				tc.hello(a)
				a.drain()
			})
			if err == nil || !strings.Contains(err.Error(), tc.why) {
				t.Fatalf("newConn: %v, want an error saying %q", err, tc.why)
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Fatalf("newConn took %s", took)
			}
			select {
			case <-a.ended:
			case <-time.After(5 * time.Second):
				t.Fatal("the stream to the agent is still open after a refused hello")
			}
		})
	}
}

// TestConnDesignedFailuresKeepTheConnection: what the protocol allows an
// agent to do ends at most the one call: late frames of a request that has
// ended are dropped, an error frame fails its call only (and a code the agent
// may not send never reaches the model as one), and a list past its byte cap
// ends truncated and cancelled. After each, the agent still answers a ping.
func TestConnDesignedFailuresKeepTheConnection(t *testing.T) {
	cancelled := make(chan uint64, 1)
	c, _ := hostileConn(t, func(a *agentEnd) {
		if !a.hello() {
			return
		}
		for {
			f, ok := a.next()
			if !ok {
				return
			}
			switch f.Kind {
			case agentproto.KindPing:
				a.send(f.ID, agentproto.KindPong, nil, nil)
			case agentproto.KindRead:
				a.send(f.ID, agentproto.KindData, nil, []byte("abc"))
				a.send(f.ID, agentproto.KindResult, agentproto.ReadResult{Size: 3}, nil)
				// Late: the request has ended.
				a.send(f.ID, agentproto.KindData, nil, []byte("late"))
				a.send(f.ID, agentproto.KindResult, agentproto.ReadResult{Size: 3}, nil)
			case agentproto.KindResolve:
				a.send(f.ID, agentproto.KindError, agentproto.Error{Code: string(errcode.PolicyDenied), Message: "trust me"}, nil)
			case agentproto.KindWrite:
				a.send(f.ID, agentproto.KindError, agentproto.Error{Code: string(errcode.NotFound), Message: "no such directory"}, nil)
			case agentproto.KindList:
				// One line longer than the list's byte cap.
				line := fmt.Sprintf(`{"path":%q,"type":"file"}`+"\n", strings.Repeat("a", int(policy.ListBytes(1))))
				a.send(f.ID, agentproto.KindData, nil, []byte(line))
			case agentproto.KindCancel:
				cancelled <- f.ID
			}
		}
	})
	ctx := ctxFor(t)
	alive := func(step string) {
		t.Helper()
		if err := c.Ping(ctx); err != nil {
			t.Fatalf("after %s: ping: %v", step, err)
		}
	}

	res, err := c.ReadFile(ctx, "f", 0, 0, 10)
	if err != nil || string(res.Data) != "abc" {
		t.Fatalf("read: %q %v", res.Data, err)
	}
	alive("late frames of an ended request")

	_, err = c.Resolve(ctx, []string{"ls"}, ".")
	if _, ok := errcode.As(err); ok || err == nil || !strings.Contains(err.Error(), "POLICY_DENIED: trust me") {
		t.Fatalf("an agent's POLICY_DENIED came back as %v", err)
	}
	alive("an error with a code the agent may not send")

	_, err = c.WriteFile(ctx, "d/f", strings.NewReader("x"), 1, false, 0o644)
	if e := wantCode(t, err, errcode.NotFound); e.Message != "no such directory" {
		t.Fatalf("the agent's error: %v", e)
	}
	alive("an error")

	entries, truncated, err := listed(c.List(ctx, ".", ListOptions{Recursive: false, MaxEntries: 1}))
	if err != nil || !truncated || len(entries) != 0 {
		t.Fatalf("a list past its byte cap: %v truncated=%v %v", entries, truncated, err)
	}
	select {
	case <-cancelled:
	case <-time.After(callTimeout):
		t.Fatal("the list past its byte cap was not cancelled")
	}
	alive("a list past its byte cap")
	if err := c.Err(); err != nil {
		t.Fatalf("the connection ended: %v", err)
	}
}

// TestConnSilentAgent: an agent that stops answering holds no call past its
// bound. A ping fails with its context, leaving the verdict to the caller
// (the manager ends the sandbox); a command the agent does not stop when told
// to ends the connection a grace period after the cancel.
func TestConnSilentAgent(t *testing.T) {
	c, a := hostileConn(t, func(a *agentEnd) {
		if a.hello() {
			a.drain()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := c.Ping(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ping of a silent agent: %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("the ping took %s", took)
	}

	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start = time.Now()
	_, err := c.Exec(ctx, ExecRequest{Argv: []string{"sleep", "1000"}, Cwd: ".", Timeout: time.Hour}, JobOpts{})
	took := time.Since(start)
	wantCode(t, err, errcode.Unavailable)
	if cerr := c.Err(); cerr == nil || !strings.Contains(cerr.Error(), "did not stop a command it was told to stop") {
		t.Fatalf("the connection after an unanswered cancel: %v", cerr)
	}
	if took < cancelGrace || took > cancelGrace+5*time.Second {
		t.Fatalf("the exec ended %s after it started, want the cancel's grace (%s) after the cancel", took, cancelGrace)
	}
	select {
	case <-a.ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the stream to the agent is still open")
	}
}

// fakeAgent answers every exec with exit 0, handing the request (and its
// header's size on the wire) to the test.
type fakeAgent struct {
	*agentEnd
	execs chan agentproto.ExecRequest
	sizes chan int
}

// newFakeConn returns a conn whose agent is a fakeAgent.
func newFakeConn(t *testing.T) (*Conn, *fakeAgent) {
	t.Helper()
	fa := &fakeAgent{execs: make(chan agentproto.ExecRequest, 4), sizes: make(chan int, 4)}
	c, a := hostileConn(t, func(a *agentEnd) {
		if !a.hello() {
			return
		}
		for {
			before := a.in.n
			f, ok := a.next()
			if !ok {
				return
			}
			if f.Kind != agentproto.KindExec {
				continue
			}
			var req agentproto.ExecRequest
			if f.Decode(&req) != nil {
				return
			}
			fa.sizes <- a.in.n - before
			fa.execs <- req
			a.send(f.ID, agentproto.KindExit, agentproto.ExecResult{}, nil)
		}
	})
	fa.agentEnd = a
	return c, fa
}

// worstExec is the largest exec request the policy lets through, every
// byte of it one that JSON escapes to 6: argv and env at their caps in
// control characters, a program path and a cwd of MaxPathBytes.
func worstExec(t *testing.T) ExecRequest {
	t.Helper()
	const ctl = "\x01"
	argv := []string{strings.Repeat(ctl, policy.MaxPathBytes)}
	room := policy.MaxArgvBytes - (policy.MaxPathBytes + 1)
	for i := 1; i < policy.MaxArgv; i++ {
		n := room/(policy.MaxArgv-i) - 1
		argv = append(argv, strings.Repeat(ctl, n))
		room -= n + 1
	}
	env := map[string]string{}
	room = policy.MaxEnvBytes
	for i := 0; room > 0; i++ {
		name := fmt.Sprintf("V%d", i)
		n := min(room, 1000) - len(name) - 2
		if n < 0 {
			break
		}
		env[name] = strings.Repeat(ctl, n)
		room -= len(name) + n + 2
	}
	if d := policy.CheckArgv(argv); !d.Allow {
		t.Fatalf("the worst argv is not allowed: %v", d)
	}
	pairs, d := policy.CheckEnv(env)
	if !d.Allow {
		t.Fatalf("the worst env is not allowed: %v", d)
	}
	cwd, d := policy.WorkspacePath(strings.Repeat("<", policy.MaxPathBytes))
	if !d.Allow {
		t.Fatalf("the worst cwd is not allowed: %v", d)
	}
	return ExecRequest{
		Argv: argv, Env: pairs, Cwd: cwd, Program: "/" + strings.Repeat(ctl, policy.MaxPathBytes-1),
		Timeout: policy.DefaultMaxExecTimeout, MaxOutput: policy.DefaultMaxOutputBytes,
	}
}

// TestConnRequestTooLargeFailsOnlyTheCall: an exec the protocol cannot
// carry is refused as TOO_LARGE before a byte reaches the agent, and the
// connection goes on; the largest exec the policy allows, every byte
// escaped, is carried whole.
func TestConnRequestTooLargeFailsOnlyTheCall(t *testing.T) {
	c, a := newFakeConn(t)
	ctx := context.Background()

	huge := ExecRequest{Argv: []string{"echo", strings.Repeat("<", agentproto.MaxRequestHeader/6+1)}, Cwd: ".", Timeout: time.Second}
	_, err := c.Exec(ctx, huge, JobOpts{})
	e := wantCode(t, err, errcode.TooLarge)
	if !strings.Contains(e.Message, "stdin") || !strings.Contains(e.Message, fmt.Sprint(agentproto.MaxRequestHeader)) {
		t.Fatalf("the refusal does not say what to do: %s", e.Message)
	}
	if err := c.Err(); err != nil {
		t.Fatalf("the connection ended: %v", err)
	}

	worst := worstExec(t)
	if _, err := c.Exec(ctx, worst, JobOpts{}); err != nil {
		t.Fatalf("the largest exec the policy allows: %v", err)
	}
	// The agent saw nothing of the refused request: the next frame it read
	// was the worst case, intact.
	got := <-a.execs
	size := <-a.sizes
	if !slices.Equal(got.Argv, worst.Argv) || !slices.Equal(got.Env, worst.Env) || got.Cwd != worst.Cwd || got.Path != worst.Program {
		t.Fatal("the worst-case request arrived changed")
	}
	t.Logf("the largest exec the policy allows is %d bytes on the wire (header limit %d; it was %d)", size, agentproto.MaxRequestHeader, agentproto.MaxHeader)
	if size <= agentproto.MaxHeader {
		t.Fatalf("the worst case (%d bytes) is not escaped as expected", size)
	}
}

// TestConnWriteErrorEndsTheConnection: a write the stream fails (which may
// leave a frame cut) ends the connection, unlike a frame refused before
// writing.
func TestConnWriteErrorEndsTheConnection(t *testing.T) {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	go func() {
		agentproto.NewWriter(outW).Write(0, agentproto.KindHello, agentproto.Hello{Version: agentproto.Version}, nil)
		agentproto.NewReader(inR).Read() // the lease
		inR.CloseWithError(errors.New("gone"))
	}()
	raw := closerFunc(func() error {
		inW.Close()
		outR.Close()
		return nil
	})
	defer raw.Close()
	c, err := New(ctxFor(t), outR, inW, raw, time.Minute, "", testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Exec(context.Background(), ExecRequest{Argv: []string{"true"}, Cwd: ".", Timeout: time.Second}, JobOpts{})
	wantCode(t, err, errcode.Unavailable)
	if err := c.Err(); err == nil || !strings.Contains(err.Error(), "writing to the agent") {
		t.Fatalf("the connection after a write error: %v", err)
	}
}
