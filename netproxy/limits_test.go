package netproxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Proxy cases 53-60 of docs/attack-cases.md (slow and abusive clients),
// with short timeouts so the whole file runs in about two seconds.

// publicHarness allows api.example.com -> 93.184.216.34 and sends every dial
// to a local server running handle.
func publicHarness(t *testing.T, cfg Config, handle func(net.Conn)) (*harness, *testServer) {
	t.Helper()
	h := newHarness(t, cfg)
	srv := startServer(t, "tcp", "127.0.0.1:0", handle)
	h.dialer.target = srv.addr()
	h.res.setAddrs("api.example.com", "93.184.216.34")
	return h, srv
}

func TestSlowHeaderClosedAtReadHeaderTimeout(t *testing.T) {
	h := newHarness(t, Config{HeaderTimeout: 150 * time.Millisecond})
	for _, partial := range []string{"", "CONNECT a", "CONNECT api.example.com:443 HTTP/1.1\r\nX-Slow: 1\r\n"} {
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, partial)
		start := time.Now()
		c.SetReadDeadline(time.Now().Add(3 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%q: no response: %v", partial, err)
		}
		if resp.StatusCode != http.StatusRequestTimeout {
			t.Errorf("%q: status %d, want 408", partial, resp.StatusCode)
		}
		if el := time.Since(start); el > time.Second {
			t.Errorf("%q: answered after %v, want about 150ms", partial, el)
		}
		expectClosed(t, c, time.Second)
	}
	if n := h.res.total(); n != 0 {
		t.Errorf("%d lookups", n)
	}
}

// Proxy case 38: a 1 MB header is cut off at MaxHeaderBytes with 431.
func TestHugeHeaderRefusedWith431(t *testing.T) {
	h := newHarness(t, Config{})
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go func() {
		io.WriteString(c, "CONNECT api.example.com:443 HTTP/1.1\r\nX-Big: "+strings.Repeat("a", 1<<20)+"\r\n\r\n")
	}()
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("status %d, want 431", resp.StatusCode)
	}
	c.Close()
	if n := h.res.total(); n != 0 {
		t.Errorf("%d lookups", n)
	}
}

// Proxy cases 54 and 58: an idle tunnel (the upstream accepts and never answers)
// is closed on both legs, with a close record.
func TestIdleTunnelClosedOnBothLegs(t *testing.T) {
	upstreamDone := make(chan time.Time, 1)
	h, _ := publicHarness(t, Config{IdleTimeout: 150 * time.Millisecond}, func(c net.Conn) {
		io.Copy(io.Discard, c) // never answers; returns when the proxy closes its leg
		upstreamDone <- time.Now()
	})
	resp, body, c := h.connect("api.example.com:443")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d %q", resp.StatusCode, body)
	}
	start := time.Now()
	io.WriteString(c, "hello")
	expectClosed(t, c, 2*time.Second)
	if el := time.Since(start); el < 100*time.Millisecond {
		t.Errorf("closed after %v, before the idle timeout", el)
	}
	select {
	case <-upstreamDone:
	case <-time.After(2 * time.Second):
		t.Fatal("upstream leg still open")
	}
	cl := h.waitCloses(1)[0]
	if cl.Reason != CloseIdle || cl.BytesUp != 5 || cl.BytesDown != 0 || cl.Duration < 150*time.Millisecond {
		t.Errorf("close = %+v, want idle with 5 bytes up", cl)
	}
	recs := h.logs.records(t, "proxy tunnel closed")
	if len(recs) != 1 || recs[0]["reason"] != "idle" || recs[0]["bytes_up"] != float64(5) || recs[0]["bytes_down"] != float64(0) {
		t.Errorf("close log = %v", recs)
	}
}

// Proxy case 54: activity in one direction keeps the whole tunnel alive.
func TestIdleTimeoutCountsBothDirections(t *testing.T) {
	// The upstream streams a byte every 40ms and never reads.
	h, _ := publicHarness(t, Config{IdleTimeout: 150 * time.Millisecond}, func(c net.Conn) {
		for range 12 {
			if _, err := c.Write([]byte{'.'}); err != nil {
				return
			}
			time.Sleep(40 * time.Millisecond)
		}
		c.Close()
	})
	resp, _, c := h.connect("api.example.com:443")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	n, _ := io.Copy(io.Discard, c) // the client never writes
	if n != 12 {
		t.Errorf("got %d bytes, want 12: the tunnel was closed while data flowed", n)
	}
	c.Close()
	if cl := h.waitCloses(1)[0]; cl.Reason != CloseEOF || cl.BytesDown != 12 {
		t.Errorf("close = %+v, want eof after 12 bytes down", cl)
	}
}

// Proxy case 55: a busy tunnel still ends at MaxLifetime.
func TestBusyTunnelEndsAtMaxLifetime(t *testing.T) {
	h, _ := publicHarness(t, Config{IdleTimeout: 150 * time.Millisecond, MaxLifetime: 400 * time.Millisecond}, echo)
	resp, _, c := h.connect("api.example.com:443")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	start := time.Now()
	buf := make([]byte, 1)
	for time.Since(start) < 3*time.Second {
		if _, err := c.Write([]byte{'x'}); err != nil {
			break
		}
		c.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := io.ReadFull(c, buf); err != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	el := time.Since(start)
	if el < 350*time.Millisecond || el > 1500*time.Millisecond {
		t.Errorf("tunnel ended after %v, want about 400ms", el)
	}
	if cl := h.waitCloses(1)[0]; cl.Reason != CloseLifetime || cl.BytesUp == 0 || cl.BytesUp != cl.BytesDown {
		t.Errorf("close = %+v, want lifetime", cl)
	}
}

// Proxy case 56: the (N+1)th tunnel gets 429 + Retry-After; a slot comes back when
// a tunnel closes, and after a failed dial or lookup.
func TestTunnelsBeyondTheLimitGet429(t *testing.T) {
	h, _ := publicHarness(t, Config{MaxTunnels: 2}, echo)
	h.res.setAddrs("refused.pkg.example.org", "93.184.216.99")
	h.dialer.refuse = map[string]bool{"93.184.216.99:443": true}

	_, _, c1 := h.connect("api.example.com:443")
	_, _, c2 := h.connect("api.example.com:443")
	expectEcho(t, c1, "1")
	expectEcho(t, c2, "2")
	resp, body, _ := h.connect("api.example.com:443")
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1" ||
		!strings.Contains(body, "already has 2 open tunnels") {
		t.Fatalf("third tunnel: %d Retry-After=%q %q, want 429", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	// A refusal by the allowlist needs no slot.
	if resp, _, _ := h.connect("evil.com:443"); resp.StatusCode != http.StatusForbidden {
		t.Errorf("allowlist refusal while full: %d, want 403", resp.StatusCode)
	}

	c1.Close()
	h.waitCloses(1)
	// Failed dial and failed lookup release their slot.
	for range 3 {
		if resp, _, _ := h.connect("refused.pkg.example.org:443"); resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("refused dial: %d, want 502", resp.StatusCode)
		}
		if resp, _, _ := h.connect("nx.pkg.example.org:443"); resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("failed lookup: %d, want 502", resp.StatusCode)
		}
	}
	resp, body, c3 := h.connect("api.example.com:443")
	if resp.StatusCode != 200 {
		t.Fatalf("after a close: %d %q, want 200", resp.StatusCode, body)
	}
	expectEcho(t, c3, "3")
}

// Proxy case 57: a burst over the rate gets 429; another sandbox is unaffected.
func TestConnectsRateLimitedPerSandbox(t *testing.T) {
	h := newHarness(t, Config{Rate: 1, Burst: 3})
	other := h.serve("sandbox-2")
	for i := range 3 {
		if resp, body, _ := h.connect("evil.com:443"); resp.StatusCode != http.StatusForbidden {
			t.Fatalf("request %d: %d %q, want 403", i, resp.StatusCode, body)
		}
	}
	resp, body, _ := h.connect("evil.com:443")
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, "faster than 1 per second") {
		t.Fatalf("4th request: %d %q, want 429", resp.StatusCode, body)
	}
	if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || ra != 1 {
		t.Errorf("Retry-After = %q, want 1", resp.Header.Get("Retry-After"))
	}
	// A refused request does not use up a future token.
	resp, _, _ = h.connect("evil.com:443")
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1" {
		t.Errorf("5th request: %d Retry-After=%q, want 429 and 1", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if resp, body, _ := roundTrip(t, other, connectReq("evil.com:443")); resp.StatusCode != http.StatusForbidden {
		t.Errorf("other sandbox: %d %q, want 403", resp.StatusCode, body)
	}
}

// Connections that never send a request are capped per sandbox too.
func TestConnectionLimit(t *testing.T) {
	h := newHarness(t, Config{MaxConns: 2})
	for range 2 {
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, "CONNECT ") // hold the slot
	}
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(time.Millisecond) {
		n := 0
		h.p.mu.Lock()
		if sb := h.p.sandboxes["sandbox-1"]; sb != nil { // nil until Serve has started
			sb.mu.Lock()
			n = sb.conns
			sb.mu.Unlock()
		}
		h.p.mu.Unlock()
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("proxy holds %d connections, want 2", n)
		}
	}
	resp, body, _ := h.connect("api.example.com:443")
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, "open connections") {
		t.Errorf("third connection: %d %q, want 429", resp.StatusCode, body)
	}
}

// Proxy case 59: a dial that never completes gets 504 at ConnectTimeout.
func TestDialThatNeverCompletesGets504(t *testing.T) {
	h := newHarness(t, Config{ConnectTimeout: 100 * time.Millisecond})
	h.res.setAddrs("api.example.com", "93.184.216.34")
	h.dialer.hang = map[string]bool{"93.184.216.34:443": true}
	start := time.Now()
	resp, body, _ := h.connect("api.example.com:443")
	if resp.StatusCode != http.StatusGatewayTimeout || !strings.Contains(body, "timed out after 100ms") {
		t.Errorf("status %d %q, want 504", resp.StatusCode, body)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("answered after %v", el)
	}
	if d := h.decisionList(); len(d) != 1 || d[0].Addr.String() != "93.184.216.34" {
		t.Errorf("decisions = %+v", d)
	}
}

// Proxy case 60: a client that half-closes right after its request still gets the
// response, and the half-close is passed on to the upstream.
func TestHalfClosedClientStillGetsTheResponse(t *testing.T) {
	h, _ := publicHarness(t, Config{}, func(c net.Conn) {
		got, _ := io.ReadAll(c) // until the client's FIN arrives through the tunnel
		io.WriteString(c, "bye after "+strconv.Quote(string(got)))
		c.Close()
	})
	for _, tc := range []struct {
		req, want string
	}{
		{connectReq("api.example.com:443") + "early", "HTTP/1.1 200 Connection established\r\n\r\nbye after \"early\""},
		{connectReq("evil.com:443"), "HTTP/1.1 403 Forbidden"},
	} {
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, tc.req)
		c.(*net.TCPConn).CloseWrite()
		c.SetReadDeadline(time.Now().Add(3 * time.Second))
		got, err := io.ReadAll(c)
		c.Close()
		if err != nil || !strings.HasPrefix(string(got), tc.want) {
			t.Errorf("response %q (%v), want prefix %q", got, err, tc.want)
		}
	}
	if cl := h.waitCloses(1)[0]; cl.Reason != CloseEOF || cl.BytesUp != 5 || cl.BytesDown != int64(len(`bye after "early"`)) {
		t.Errorf("close = %+v", cl)
	}
}

// A slow reader is not idle: a write that makes progress is retried until
// it completes, even when it takes longer than the idle timeout.
func TestTunnelSlowReaderIsNotIdle(t *testing.T) {
	client, clientPeer := net.Pipe() // net.Pipe is unbuffered, so writes wait for the reader
	upstream, upstreamPeer := net.Pipe()
	tun := newTunnel(client, upstream, 100*time.Millisecond, 10*time.Second)
	done := make(chan string, 1)
	go func() { done <- tun.run(context.Background(), nil, nil) }()
	go upstreamPeer.Write(make([]byte, 32<<10))
	defer upstreamPeer.Close()

	total, buf := 0, make([]byte, 2<<10)
	for total < 32<<10 { // 16 reads, 20ms apart: 320ms in all
		clientPeer.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, err := clientPeer.Read(buf)
		total += n
		if err != nil {
			t.Fatalf("after %d bytes: %v", total, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	clientPeer.Close()
	<-done
	if tun.down != 32<<10 {
		t.Errorf("down = %d", tun.down)
	}
}
