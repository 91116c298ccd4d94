package session

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

	"github.com/moby/moby/api/pkg/stdcopy"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// fakeAgent is the agent's end of a conn over pipes: it says hello, takes
// the lease, and answers every exec with exit 0, handing the request (and
// its header's size) to the test.
type fakeAgent struct {
	execs  chan agentproto.ExecRequest
	sizes  chan int
	stdin  *io.PipeReader // what the server writes
	stdout *io.PipeWriter // what the server reads, multiplexed
}

// newFakeConn returns a conn whose agent is a fakeAgent.
func newFakeConn(t *testing.T) (*conn, *fakeAgent) {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	a := &fakeAgent{execs: make(chan agentproto.ExecRequest, 4), sizes: make(chan int, 4), stdin: inR, stdout: outW}
	raw := closerFunc(func() error {
		inW.Close()
		outR.Close()
		return nil
	})
	go a.serve()
	c, err := newConn(context.Background(), outR, inW, raw, time.Minute, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	return c, a
}

// muxWriter frames what it is given as the engine's attach stream does
// (stdout: an 8-byte header, then the bytes).
type muxWriter struct{ w io.Writer }

func (m muxWriter) Write(p []byte) (int, error) {
	hdr := [8]byte{byte(stdcopy.Stdout)}
	binary.BigEndian.PutUint32(hdr[4:], uint32(len(p)))
	if _, err := m.w.Write(append(hdr[:], p...)); err != nil {
		return 0, err
	}
	return len(p), nil
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

// serve answers until its stdin fails; its stdout stays open (the conn's
// close ends it).
func (a *fakeAgent) serve() {
	w := agentproto.NewWriter(muxWriter{a.stdout})
	if w.Write(0, agentproto.KindHello, agentproto.Hello{Version: agentproto.Version}, nil) != nil {
		return
	}
	in := &countingReader{r: a.stdin}
	r := agentproto.NewReader(in)
	r.MaxHeader = agentproto.MaxRequestHeader
	for {
		before := in.n
		f, err := r.Read()
		if err != nil {
			return
		}
		if f.Kind != agentproto.KindExec {
			continue
		}
		var req agentproto.ExecRequest
		if f.Decode(&req) != nil {
			return
		}
		a.sizes <- in.n - before
		a.execs <- req
		if w.Write(f.ID, agentproto.KindExit, agentproto.ExecResult{}, nil) != nil {
			return
		}
	}
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
	_, err := c.exec(ctx, huge)
	e := wantCode(t, err, errcode.TooLarge)
	if !strings.Contains(e.Message, "stdin") || !strings.Contains(e.Message, fmt.Sprint(agentproto.MaxRequestHeader)) {
		t.Fatalf("the refusal does not say what to do: %s", e.Message)
	}
	if err := c.err(); err != nil {
		t.Fatalf("the connection ended: %v", err)
	}

	worst := worstExec(t)
	if _, err := c.exec(ctx, worst); err != nil {
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
	c, a := newFakeConn(t)
	a.stdin.CloseWithError(errors.New("gone"))
	_, err := c.exec(context.Background(), ExecRequest{Argv: []string{"true"}, Cwd: ".", Timeout: time.Second})
	wantCode(t, err, errcode.Unavailable)
	if err := c.err(); err == nil || !strings.Contains(err.Error(), "writing to the agent") {
		t.Fatalf("the connection after a write error: %v", err)
	}
}
