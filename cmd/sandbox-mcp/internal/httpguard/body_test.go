package httpguard

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// meter is a budget of limit bytes for the guard's bodies: it refuses what
// does not fit (as the caller's share when wide is false, the server's
// total when true), and records the most it held.
type meter struct {
	limit int64
	wide  bool

	mu         sync.Mutex
	held, peak int64
}

type refusal struct{ wide bool }

func (r refusal) Error() string    { return "no room" }
func (r refusal) ServerWide() bool { return r.wide }

type meterHold struct {
	m *meter
	n int64
}

func (m *meter) reserve(_ context.Context, _ string, n int64, _ time.Duration) (BodyHold, error) {
	h := &meterHold{m: m}
	if err := h.Resize(n); err != nil {
		return nil, err
	}
	return h, nil
}

func (h *meterHold) Resize(n int64) error {
	h.m.mu.Lock()
	defer h.m.mu.Unlock()
	if h.m.held-h.n+n > h.m.limit {
		return refusal{h.m.wide}
	}
	h.m.held += n - h.n
	h.n = n
	h.m.peak = max(h.m.peak, h.m.held)
	return nil
}

func (h *meterHold) Release() { h.Resize(0) }

// countingBody counts the bytes read from a body.
type countingBody struct {
	r    io.Reader
	mu   sync.Mutex
	read int64
}

func (c *countingBody) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.mu.Lock()
	c.read += int64(n)
	c.mu.Unlock()
	return n, err
}

func (c *countingBody) Close() error { return nil }

func newBodyGuard(t *testing.T, m *meter) *Guard {
	t.Helper()
	srv := mcp.NewServer(&mcp.Implementation{Name: "t", Version: "0"}, nil)
	g, err := New(Options{Addr: "127.0.0.1:0", Listen: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)},
		MaxSessions: 4, SessionsPerCaller: 4, CallsPerCaller: 4, MaxRequestBytes: 1 << 20, ReserveBody: m.reserve}, srv, nil)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// post serves an initialize whose body is padded to size bytes, sent
// chunked (no Content-Length) or with its length.
func post(g *Guard, size int, chunked bool) (*httptest.ResponseRecorder, *countingBody) {
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"0"}},"pad":"`
	body += strings.Repeat("a", size-len(body)-2) + `"}`
	cb := &countingBody{r: strings.NewReader(body)}
	r := httptest.NewRequest(http.MethodPost, "http://127.0.0.1/mcp", nil)
	r.Body = cb
	r.ContentLength = int64(len(body))
	if chunked {
		r.ContentLength = -1
	}
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Accept", "application/json, text/event-stream")
	w := httptest.NewRecorder()
	g.Handler().ServeHTTP(w, r)
	return w, cb
}

// A body is admitted before it is read: with its Content-Length all at
// once (3 bytes per byte), without one a chunk at a time (4 per byte); a
// body that does not fit is refused with 429 or 503 and Retry-After,
// having read at most what was admitted; the bytes come back once served.
func TestBodiesAdmittedBeforeTheyAreRead(t *testing.T) {
	const size = 300 << 10
	for _, chunked := range []bool{false, true} {
		m := &meter{limit: 8 << 20}
		w, _ := post(newBodyGuard(t, m), size, chunked)
		factor := int64(bodyFactor)
		if chunked {
			factor = chunkedFactor
		}
		if w.Code != http.StatusOK || m.held != 0 || m.peak < factor*size || m.peak > factor*(size+bodyChunk) {
			t.Errorf("chunked %v: status %d, peak %d for a body of %d (want %d×, in %d-byte steps), %d still held: %s",
				chunked, w.Code, m.peak, size, factor, bodyChunk, m.held, w.Body)
		}

		for _, wide := range []bool{false, true} {
			m := &meter{limit: 2 * size, wide: wide}
			w, cb := post(newBodyGuard(t, m), size, chunked)
			want := http.StatusTooManyRequests
			if wide {
				want = http.StatusServiceUnavailable
			}
			if w.Code != want || w.Header().Get("Retry-After") == "" || !strings.Contains(w.Body.String(), "BUSY: ") || m.held != 0 {
				t.Errorf("chunked %v, server-wide %v: %d (Retry-After %q), want %d with Retry-After; %d held: %s",
					chunked, wide, w.Code, w.Header().Get("Retry-After"), want, m.held, w.Body)
			}
			if (!chunked && cb.read != 0) || cb.read*factor > m.limit {
				t.Errorf("chunked %v: %d bytes read before the refusal, more than the %d admitted", chunked, cb.read, m.limit/factor)
			}
		}
	}
	// Above the request cap: 413 from the Content-Length, unread.
	m := &meter{limit: 64 << 20}
	if w, cb := post(newBodyGuard(t, m), 2<<20, false); w.Code != http.StatusRequestEntityTooLarge || cb.read != 0 || m.peak != 0 {
		t.Errorf("a body above the cap: %d after reading %d bytes (peak held %d), want 413 unread", w.Code, cb.read, m.peak)
	}
	if w, _ := post(newBodyGuard(t, m), 2<<20, true); w.Code != http.StatusRequestEntityTooLarge || m.held != 0 {
		t.Errorf("a chunked body above the cap: %d, %d held, want 413", w.Code, m.held)
	}
}
