package agentclient

import (
	"context"
	"encoding/binary"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agent"
	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
)

// attachEngine plays what the Docker engine does with a container whose
// stdin stays open past its attaches (StdinOnce false): every attach's
// input goes into the one stdin pipe of the agent, in turn, and the
// agent's output goes to the attach of the moment, or nowhere when none is
// attached. An attach that ends (its server died) closes nothing of the
// agent's. As the server does with Docker, the first attach comes before
// the agent starts, so the agent's hello reaches it.
type attachEngine struct {
	stdin    *io.PipeWriter // the agent's stdin
	mu       sync.Mutex
	cur      *io.PipeWriter // the current attach's output end
	attached chan struct{}  // closed by the first attach
	once     sync.Once
	served   chan error
}

func startAttachEngine(t *testing.T) *attachEngine {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	e := &attachEngine{stdin: inW, attached: make(chan struct{}), served: make(chan error, 1)}
	go func() {
		<-e.attached // the engine starts the container after the first attach
		err := agent.Serve(context.Background(), inR, outW, agent.Options{
			Workspace: t.TempDir(), User: agent.User{UID: 1000, GID: 1000}, Logger: testLogger(t),
		})
		outW.Close()
		e.served <- err
	}()
	go func() { // the engine's copy of the agent's output to whoever is attached
		buf := make([]byte, 32<<10)
		for {
			n, err := outR.Read(buf)
			e.mu.Lock()
			if cur := e.cur; cur != nil && n > 0 {
				if _, werr := cur.Write(buf[:n]); werr != nil {
					e.cur = nil
				}
			}
			if err != nil && e.cur != nil {
				e.cur.CloseWithError(err)
			}
			e.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		inW.Close()
		e.once.Do(func() { close(e.attached) })
		select {
		case <-e.served:
		case <-time.After(10 * time.Second):
			t.Error("the agent did not end")
		}
	})
	return e
}

// attach is one server's attach: its reader of the agent's output, its
// writer into the agent's stdin, and its close, which ends the attach only.
func (e *attachEngine) attach() (io.Reader, io.Writer, io.Closer) {
	r, w := io.Pipe()
	e.mu.Lock()
	e.cur = w
	e.mu.Unlock()
	e.once.Do(func() { close(e.attached) })
	var once sync.Once
	closed := make(chan struct{})
	in := writerFunc(func(p []byte) (int, error) {
		select {
		case <-closed:
			return 0, io.ErrClosedPipe
		default:
		}
		return e.stdin.Write(p)
	})
	return r, in, closerFunc(func() error {
		once.Do(func() {
			close(closed)
			r.Close()
			e.mu.Lock()
			if e.cur == w {
				e.cur = nil
			}
			e.mu.Unlock()
		})
		return nil
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestResumeTakesOverARunningAgent: a server gives the agent a lease with
// a token and writes a file; it dies in the middle of writing a frame
// (half a write request's data is in the agent's stdin); a new server
// attaches and resumes: the agent dropped the cut frame, the file is
// there, the lease held, and requests work on the new connection. A
// server without the token cannot take the agent over.
func TestResumeTakesOverARunningAgent(t *testing.T) {
	e := startAttachEngine(t)
	ctx := ctxFor(t)
	token := NewToken()
	r, w, raw := e.attach()
	old, err := New(ctx, r, w, raw, time.Minute, token, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.WriteFile(ctx, "kept.txt", strings.NewReader("kept\n"), 5, false, 0o644); err != nil {
		t.Fatal(err)
	}
	// The old server's last frame, cut: sizes that promise 200 header
	// bytes and 1000 payload bytes, and only 30 of them.
	var cut [8]byte
	binary.BigEndian.PutUint32(cut[0:], 200)
	binary.BigEndian.PutUint32(cut[4:], 1000)
	if _, err := w.Write(append(cut[:], []byte(`{"id":9,"k":"write","b":{"path"`)...)); err != nil {
		t.Fatal(err)
	}
	raw.Close() // the old server is gone; the agent's stdin stays open
	old.Fail(ErrRemoved)

	r3, w3, raw3 := e.attach()
	start := time.Now()
	c, res, err := Resume(ctx, r3, w3, raw3, token, time.Minute, agentproto.ResumeQuiet, testLogger(t))
	if err != nil {
		t.Fatalf("resume: %v", err)
	}
	t.Logf("resumed in %s (%s of it quiet)", time.Since(start).Round(time.Millisecond), agentproto.ResumeQuiet)
	if res.Hello.Version != agentproto.Version || res.LeaseMillis != time.Minute.Milliseconds() {
		t.Fatalf("resumed: %+v", res)
	}
	got, err := c.ReadFile(ctx, "kept.txt", 0, 0, 100)
	if err != nil || string(got.Data) != "kept\n" {
		t.Fatalf("the file after the resume: %q %v", got.Data, err)
	}
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteFile(ctx, "new.txt", strings.NewReader("new"), 3, false, 0o644); err != nil {
		t.Fatalf("a write on the new connection: %v", err)
	}
	raw3.Close()
	c.Fail(ErrRemoved)

	// A server without the token gets no answer; the one with it does.
	r4, w4, raw4 := e.attach()
	wrong, cancel := context.WithTimeout(ctx, time.Second)
	_, _, err = Resume(wrong, r4, w4, raw4, NewToken(), time.Minute, 0, testLogger(t))
	cancel()
	if err == nil {
		t.Fatal("a server with another token took the agent over")
	}
	r5, w5, raw5 := e.attach()
	c, _, err = Resume(ctx, r5, w5, raw5, token, time.Minute, 0, testLogger(t))
	if err != nil {
		t.Fatalf("resume after a wrong token: %v", err)
	}
	if got, err := c.ReadFile(ctx, "new.txt", 0, 0, 100); err != nil || string(got.Data) != "new" {
		t.Fatalf("after the second resume: %q %v", got.Data, err)
	}
}
