package netproxy

import (
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// byteCounter is an upstream that records every byte it receives.
type byteCounter struct {
	mu  sync.Mutex
	got []byte
}

func (b *byteCounter) handle(c net.Conn) {
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		b.mu.Lock()
		b.got = append(b.got, buf[:n]...)
		b.mu.Unlock()
		if err != nil {
			return
		}
	}
}

func (b *byteCounter) bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]byte(nil), b.got...)
}

// Proxy case 61: the SNI check never fails open. A ClientHello naming
// another host, sent as its first 11 bytes, a pause longer than the
// header timeout, then the rest, never reaches the upstream: a tunnel that
// begins like TLS is checked in full or closed. The same for a client that
// waits past the timeout before its first byte, and for a hello that the
// client cuts short. The header timeout is short here, so the test does
// not wait 10 s.
func TestSNICheckNeverFailsOpen(t *testing.T) {
	hello := clientHelloBytes(t, "evil.example.net")
	for _, tc := range []struct {
		name       string
		speaks     bool // the upstream says a byte 100ms after it is reached
		send       func(c net.Conn)
		wantStatus int
		wantReason string
	}{
		{"split and pause", false, func(c net.Conn) {
			c.Write(hello[:11])
			time.Sleep(600 * time.Millisecond)
			c.Write(hello[11:])
		}, http.StatusRequestTimeout, "did not arrive whole within 200ms of its first byte"},
		{"silent, then another name", false, func(c net.Conn) {
			time.Sleep(600 * time.Millisecond)
			c.Write(hello)
		}, http.StatusForbidden, `names "evil.example.net", not "api.example.com"`},
		{"cut short", false, func(c net.Conn) {
			c.Write(hello[:len(hello)/2])
			c.(interface{ CloseWrite() error }).CloseWrite()
		}, http.StatusBadRequest, "ended before it was whole"},
		{"the upstream speaks during the hello", true, func(c net.Conn) {
			c.Write(hello[:11])
			time.Sleep(400 * time.Millisecond)
			c.Write(hello[11:])
		}, http.StatusForbidden, "spoke while the client's TLS ClientHello was still arriving"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := &byteCounter{}
			timeout := 200 * time.Millisecond
			if tc.speaks {
				timeout = time.Second // the hello is late for the upstream, not for the timeout
			}
			h, _ := publicHarness(t, Config{HeaderTimeout: timeout}, func(c net.Conn) {
				if tc.speaks {
					time.Sleep(100 * time.Millisecond)
					c.Write([]byte{'x'})
				}
				up.handle(c)
			})
			resp, _, c := h.connect("api.example.com:443")
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			tc.send(c.Conn)
			c.SetReadDeadline(time.Now().Add(3 * time.Second))
			_, err := io.Copy(io.Discard, c)
			time.Sleep(50 * time.Millisecond) // a byte let through would have arrived by now
			if got := up.bytes(); len(got) > 0 {
				t.Errorf("the upstream received %d bytes of the hello: the check failed open", len(got))
			}
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Errorf("the tunnel is still open 3 s after the hello")
			}
			var refused bool
			for _, d := range h.decisionList() {
				if d.Allow {
					t.Errorf("an allowed decision was recorded: %+v", d)
				}
				refused = refused || d.Status == tc.wantStatus && strings.Contains(d.Reason, tc.wantReason)
			}
			if !refused {
				t.Errorf("decisions %+v: want a %d saying %q", h.decisionList(), tc.wantStatus, tc.wantReason)
			}
		})
	}
}

// Proxy case 62: what passes the SNI check unchecked, and when. An
// upstream that speaks first (no TLS server does) and a client whose first
// byte is not TLS pass at once, however long the first byte takes; a
// client that sends nothing keeps the tunnel until its idle time, then it
// is closed as idle.
func TestSNICheckPassesWhatIsNotTLS(t *testing.T) {
	t.Run("late, not TLS", func(t *testing.T) {
		h, _ := publicHarness(t, Config{HeaderTimeout: 100 * time.Millisecond}, echo)
		resp, _, c := h.connect("api.example.com:443")
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		time.Sleep(300 * time.Millisecond)
		expectEcho(t, c, "SSH-2.0-client\r\n")
	})
	t.Run("the upstream speaks first", func(t *testing.T) {
		h, _ := publicHarness(t, Config{HeaderTimeout: 100 * time.Millisecond}, func(c net.Conn) {
			io.WriteString(c, "220 ready\r\n")
			echo(c)
		})
		resp, _, c := h.connect("api.example.com:443")
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		greeting := make([]byte, len("220 ready\r\n"))
		c.SetReadDeadline(time.Now().Add(3 * time.Second))
		if _, err := io.ReadFull(c, greeting); err != nil || string(greeting) != "220 ready\r\n" {
			t.Fatalf("greeting %q %v", greeting, err)
		}
		time.Sleep(300 * time.Millisecond)
		expectEcho(t, c, "EHLO x\r\n")
	})
	t.Run("silent until idle", func(t *testing.T) {
		up := &byteCounter{}
		h, _ := publicHarness(t, Config{HeaderTimeout: 100 * time.Millisecond, IdleTimeout: 400 * time.Millisecond}, up.handle)
		resp, _, c := h.connect("api.example.com:443")
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		start := time.Now()
		expectClosed(t, c, 3*time.Second)
		if el := time.Since(start); el < 300*time.Millisecond {
			t.Errorf("closed after %v: a silent client keeps its tunnel for the idle time, not the header timeout", el)
		}
		if cl := h.waitCloses(1)[0]; cl.Reason != CloseIdle || cl.BytesUp != 0 {
			t.Errorf("close %+v, want idle", cl)
		}
		if ds := h.decisionList(); len(ds) != 1 || !ds[0].Allow {
			t.Errorf("decisions %+v, want the one allowed", ds)
		}
	})
}
