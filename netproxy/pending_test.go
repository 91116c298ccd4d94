package netproxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// dialFrom opens a TCP connection to addr from the loopback address src
// (127.0.0.2 is a second client host on the same machine).
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, src, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// connectFrom sends req on a new connection from src and returns the
// status of the answer, or 0 if the connection was closed unanswered.
func connectFrom(t *testing.T, src, addr, req string) int {
	t.Helper()
	c := dialFrom(t, src, addr)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		return 0
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0
	}
	return resp.StatusCode
}

// TestSharedListenerIdleConnectionsOfOneSourceSpareOthers (issue 18 item
// 8): one source address (a pod) that holds many connections open without
// sending its credential takes a bounded share of the shared listener;
// another source's requests are served all the while.
func TestSharedListenerIdleConnectionsOfOneSourceSpareOthers(t *testing.T) {
	h := newHarness(t, Config{})
	h.res.setAddrs("api.example.com", "93.184.216.34")
	h.dialer.target = startServer(t, "tcp", "127.0.0.1:0", echo).addr()
	ln := listen(t)
	h.wg.Go(func() { h.p.ServeShared(h.ctx, ln) })
	addr := ln.Addr().String()
	tok := NewToken()
	defer h.p.Grant("sb-b", tok)()

	// The attacker at 127.0.0.2: more idle connections than any limit the
	// proxy has, none of them sending a byte.
	const idle = 200
	var wg sync.WaitGroup
	for range idle {
		wg.Go(func() { dialFrom(t, "127.0.0.2", addr) })
	}
	wg.Wait()
	time.Sleep(200 * time.Millisecond) // every one accepted and waiting

	for i := range 5 {
		if st := connectFrom(t, "127.0.0.1", addr, authConnect("api.example.com:443", tok)); st != http.StatusOK {
			t.Fatalf("request %d of the other sandbox while 127.0.0.2 holds %d idle connections: status %d (0: closed unanswered), want 200", i, idle, st)
		}
	}
}

// TestSharedListenerUnauthenticatedPhaseIsShort: a connection that does
// not send its credential within AuthTimeout is answered 408 and closed,
// and frees its slot: the same source is served again at once.
func TestSharedListenerUnauthenticatedPhaseIsShort(t *testing.T) {
	h := newHarness(t, Config{AuthTimeout: 300 * time.Millisecond, MaxPendingPerAddr: 4})
	h.res.setAddrs("api.example.com", "93.184.216.34")
	h.dialer.target = startServer(t, "tcp", "127.0.0.1:0", echo).addr()
	ln := listen(t)
	h.wg.Go(func() { h.p.ServeShared(h.ctx, ln) })
	addr := ln.Addr().String()
	tok := NewToken()
	defer h.p.Grant("sb-a", tok)()

	var conns []net.Conn
	for range 4 {
		conns = append(conns, dialFrom(t, "127.0.0.2", addr))
	}
	time.Sleep(100 * time.Millisecond)
	// The source's share is full: a fifth connection is closed unanswered.
	if st := connectFrom(t, "127.0.0.2", addr, authConnect("api.example.com:443", tok)); st != 0 {
		t.Errorf("a connection past the source's %d pending ones got %d, want it closed unanswered", 4, st)
	}
	start := time.Now()
	for i, c := range conns {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != http.StatusRequestTimeout {
			t.Fatalf("idle connection %d: %v %v, want 408", i, resp, err)
		}
		expectClosed(t, c, 2*time.Second)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("idle connections closed after %v, want about 300ms", el)
	}
	// Their slots are free again once each answer's linger is over (at
	// most half a second after the answer).
	deadline := time.Now().Add(2 * time.Second)
	for {
		st := connectFrom(t, "127.0.0.2", addr, authConnect("api.example.com:443", tok))
		if st == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the idle ones ended: status %d, want 200", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
