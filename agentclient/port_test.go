package agentclient

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// listen starts a TCP server on the host's loopback, which is where the
// agent, running in this process, dials; serve runs once per connection.
func listen(t *testing.T, serve func(net.Conn)) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(c)
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestPortStreamRelaysBothWays: a stream to a port through the real agent
// carries several windows of bytes each way unchanged (an echo server), a
// half-close reaches the program as EOF while its answer still comes back,
// and the stream then ends with EOF.
func TestPortStreamRelaysBothWays(t *testing.T) {
	c, _ := realAgentConn(t, time.Minute)
	port := listen(t, func(nc net.Conn) {
		n, _ := io.Copy(nc, nc) // echo until the client half-closes
		nc.Write([]byte("bye after " + itoa(n)))
	})
	pc, err := c.DialPort(ctxFor(t), port, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	data := make([]byte, 3*agentproto.PortWindow+12345)
	rand.Read(data)
	go func() {
		if _, err := pc.Write(data); err != nil {
			t.Error(err)
		}
		if err := pc.CloseWrite(); err != nil {
			t.Error(err)
		}
	}()
	got, err := io.ReadAll(pc)
	if err != nil {
		t.Fatal(err)
	}
	want := append(append([]byte{}, data...), "bye after "+itoa(int64(len(data)))...)
	if !bytes.Equal(got, want) {
		t.Fatalf("got %d bytes back, want %d (the echo and the goodbye)", len(got), len(want))
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestPortStreamNothingListens: a port where nothing listens is NOT_FOUND
// at once, saying so, and the connection goes on.
func TestPortStreamNothingListens(t *testing.T) {
	c, _ := realAgentConn(t, time.Minute)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	_, err = c.DialPort(ctxFor(t), port, 0)
	if e := wantCode(t, err, errcode.NotFound); !bytes.Contains([]byte(e.Message), []byte("nothing listens")) {
		t.Fatalf("message %q does not say nothing listens", e.Message)
	}
	if err := c.Ping(ctxFor(t)); err != nil {
		t.Fatalf("the connection ended with the refused stream: %v", err)
	}
}

// TestPortStreamSlowReaderIsBounded: a program that writes without end to
// a reader that does not read is stopped by the window: the server holds
// at most PortWindow bytes of it, the program's writes block (what it
// wrote is the window plus the kernel's socket buffers, far below what it
// tried), and reading later gets every byte in order.
func TestPortStreamSlowReaderIsBounded(t *testing.T) {
	c, _ := realAgentConn(t, time.Minute)
	const total = 64 << 20
	var wrote atomic.Int64
	port := listen(t, func(nc net.Conn) {
		buf := make([]byte, 32<<10)
		for i := range buf {
			buf[i] = byte(i)
		}
		for wrote.Load() < total {
			n, err := nc.Write(buf)
			wrote.Add(int64(n))
			if err != nil {
				return
			}
		}
	})
	pc, err := c.DialPort(ctxFor(t), port, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	time.Sleep(time.Second)
	held := func() int64 {
		pc.mu.Lock()
		defer pc.mu.Unlock()
		return pc.held
	}
	if h, w := held(), wrote.Load(); h > agentproto.PortWindow || w > 16<<20 {
		t.Fatalf("with no reader, the server holds %d bytes (window %d) and the program wrote %d of %d", h, agentproto.PortWindow, w, total)
	}
	t.Logf("with no reader: %d bytes held by the server, %d written by the program", held(), wrote.Load())
	buf := make([]byte, 100<<10)
	var n int64
	for n < total {
		m, err := pc.Read(buf)
		for i := range m {
			if buf[i] != byte((n+int64(i))%(32<<10)) {
				t.Fatalf("byte %d is wrong", n+int64(i))
			}
		}
		n += int64(m)
		if err != nil {
			t.Fatalf("after %d bytes: %v", n, err)
		}
	}
}

// TestPortStreamCloseAndDeadlines: a read deadline makes a waiting Read
// fail as a timeout; Close ends the program's connection (it reads EOF) and
// later reads and writes fail.
func TestPortStreamCloseAndDeadlines(t *testing.T) {
	c, _ := realAgentConn(t, time.Minute)
	ended := make(chan error, 1)
	port := listen(t, func(nc net.Conn) {
		_, err := io.Copy(io.Discard, nc)
		ended <- err
	})
	pc, err := c.DialPort(ctxFor(t), port, 0)
	if err != nil {
		t.Fatal(err)
	}
	pc.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	var ne net.Error
	if _, err := pc.Read(make([]byte, 10)); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read past the deadline: %v, want a timeout", err)
	}
	if _, err := pc.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	pc.Close()
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the program's connection did not end after Close")
	}
	if _, err := pc.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after close: %v", err)
	}
	if err := c.Ping(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
}
