package netproxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// A slot frees its place once however often it is released, so a holder
// can defer the release and still free it early; a nil slot is a refusal.
func TestSlotReleaseIsIdempotent(t *testing.T) {
	sb := newSandboxState("sb", rate.Inf, 1)
	a := sb.take(&sb.tunnels, 1)
	if a == nil {
		t.Fatal("no slot under the limit")
	}
	if sb.take(&sb.tunnels, 1) != nil {
		t.Fatal("a slot past the limit")
	}
	a.release()
	a.release()
	if sb.tunnels != 0 {
		t.Fatalf("tunnels = %d after two releases of one slot, want 0", sb.tunnels)
	}
	b := sb.take(&sb.tunnels, 1)
	a.release() // a late release of a freed slot must not free b's place
	if b == nil || sb.tunnels != 1 {
		t.Fatalf("tunnels = %d with one slot held, want 1", sb.tunnels)
	}
	if sb.take(&sb.tunnels, 1) != nil {
		t.Fatal("a stale release let a second slot in past the limit")
	}
	b.release()
	var none *slot
	none.release()
	if sb.tunnels != 0 {
		t.Fatalf("tunnels = %d, want 0", sb.tunnels)
	}
}

// admitOwn holds the connection slot only for a connection it lets in: a
// refused one and one that sends nothing leave the count as it was.
func TestAdmitOwnHoldsTheSlotOnlyWhenLetIn(t *testing.T) {
	p, err := New(Config{MaxConns: 1, HeaderTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	sb := newSandboxState("sb", rate.Inf, 1)
	admit := func(send string) (admitted, *http.Response) {
		t.Helper()
		client, server := net.Pipe()
		got := make(chan *http.Response, 1)
		go func() {
			defer client.Close()
			if send == "" {
				got <- nil
				return
			}
			go io.WriteString(client, send) // a refusal may come before the request is read
			resp, _ := http.ReadResponse(bufio.NewReader(client), nil)
			got <- resp
		}()
		d := Decision{Sandbox: sb.id}
		a := p.admitOwn(server, &d, sb)
		server.Close() // the client reads no answer from a connection let in
		return a, <-got
	}

	a, _ := admit("CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\n\r\n")
	if a.conn == nil || a.sb != sb || a.req.target != "api.example.com:443" {
		t.Fatalf("a valid request was not let in: %+v", a)
	}
	if sb.conns != 1 {
		t.Fatalf("conns = %d while admitted, want 1", sb.conns)
	}
	full, resp := admit("CONNECT api.example.com:443 HTTP/1.1\r\n\r\n")
	if full.conn != nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a connection past MaxConns: admitted %v, answer %v; want a 429", full.conn != nil, resp)
	}
	a.conn.release()

	for _, send := range []string{"", "GARBAGE\r\n\r\n", "CONNECT api.example.com:443 HTTP/2\r\n\r\n"} {
		a, resp := admit(send)
		if a.conn != nil {
			t.Errorf("%q let in", send)
		}
		if send != "" && (resp == nil || resp.StatusCode != http.StatusBadRequest) {
			t.Errorf("%q: answer %v, want a 400", send, resp)
		}
		if sb.conns != 0 {
			t.Errorf("%q: conns = %d after the refusal, want 0", send, sb.conns)
		}
	}
}
