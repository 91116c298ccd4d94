package netproxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Test doubles and a harness that runs a Proxy on a loopback listener.

// fakeResolver answers from a table. A name can have a sequence of answers
// (rebinding: the last one repeats), an error, or hang until ctx is done.
type fakeResolver struct {
	mu      sync.Mutex
	answers map[string][][]netip.Addr
	errs    map[string]error
	hang    map[string]bool
	calls   map[string]int
	nets    []string
}

func newFakeResolver() *fakeResolver {
	return &fakeResolver{
		answers: map[string][][]netip.Addr{},
		errs:    map[string]error{},
		hang:    map[string]bool{},
		calls:   map[string]int{},
	}
}

// set gives name one answer (or, with several lists, a sequence).
func (r *fakeResolver) set(name string, answers ...[]netip.Addr) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.answers[name] = answers
}

func (r *fakeResolver) setAddrs(name string, addrs ...string) {
	var list []netip.Addr
	for _, a := range addrs {
		list = append(list, netip.MustParseAddr(a))
	}
	r.set(name, list)
}

func (r *fakeResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	name := strings.TrimSuffix(host, ".")
	r.mu.Lock()
	r.calls[name]++
	n := r.calls[name]
	r.nets = append(r.nets, network+" "+host)
	seq, hang, err := r.answers[name], r.hang[name], r.errs[name]
	r.mu.Unlock()
	if hang {
		<-ctx.Done()
		return nil, &net.DNSError{Err: "i/o timeout", Name: host, IsTimeout: true}
	}
	if err != nil {
		return nil, err
	}
	if len(seq) == 0 {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return append([]netip.Addr(nil), seq[min(n, len(seq))-1]...), nil
}

func (r *fakeResolver) lookups(name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[name]
}

func (r *fakeResolver) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.calls {
		n += c
	}
	return n
}

// recordingDialer records every dial. It connects every dial to target (a
// local test server), unless the address is in refuse (ECONNREFUSED) or
// hang (blocks until ctx is done).
type recordingDialer struct {
	mu     sync.Mutex
	target string
	refuse map[string]bool
	hang   map[string]bool
	dials  []string
}

func (d *recordingDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	d.mu.Lock()
	d.dials = append(d.dials, network+" "+address)
	refuse, hang, target := d.refuse[address], d.hang[address], d.target
	d.mu.Unlock()
	switch {
	case hang:
		<-ctx.Done()
		return nil, &net.OpError{Op: "dial", Net: network, Err: ctx.Err()}
	case refuse || target == "":
		return nil, &net.OpError{Op: "dial", Net: network, Err: &osSyscallError{syscall.ECONNREFUSED}}
	}
	var nd net.Dialer
	return nd.DialContext(ctx, "tcp", target)
}

type osSyscallError struct{ err error }

func (e *osSyscallError) Error() string { return "connect: " + e.err.Error() }
func (e *osSyscallError) Unwrap() error { return e.err }

func (d *recordingDialer) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.dials)
}

func (d *recordingDialer) list() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.dials...)
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// records returns the JSON log records with the given message.
func (s *syncBuffer) records(t *testing.T, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(s.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line is not JSON: %v: %s", err, line)
		}
		if m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// testServer is a loopback TCP server whose connections are all closed, and
// whose goroutines have all ended, when the test ends.
type testServer struct {
	ln      net.Listener
	accepts atomic.Int64
	mu      sync.Mutex
	conns   []net.Conn
	wg      sync.WaitGroup
}

func startServer(t testing.TB, network, addr string, handle func(net.Conn)) *testServer {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	s := &testServer{ln: ln}
	s.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.accepts.Add(1)
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			if handle == nil {
				continue
			}
			s.wg.Go(func() { handle(c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *testServer) addr() string { return s.ln.Addr().String() }

func (s *testServer) port() int { return s.ln.Addr().(*net.TCPAddr).Port }

// echo copies everything back and half-closes at EOF.
func echo(c net.Conn) {
	io.Copy(c, c)
	c.(*net.TCPConn).CloseWrite()
}

// silent reads and discards everything, never answering.
func silent(c net.Conn) { io.Copy(io.Discard, c) }

// checkNoLeaks fails the test if, after a grace period, any goroutine is
// still running this package's non-test code.
func checkNoLeaks(t testing.TB) {
	t.Helper()
	prod := regexp.MustCompile(`/netproxy/(\w+)\.go:\d+`)
	var leaked []string
	for deadline := time.Now().Add(3 * time.Second); ; {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		leaked = leaked[:0]
		for g := range strings.SplitSeq(string(buf), "\n\n") {
			for _, m := range prod.FindAllStringSubmatch(g, -1) {
				if !strings.HasSuffix(m[1], "_test") {
					leaked = append(leaked, g)
					break
				}
			}
		}
		if len(leaked) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(leaked) > 0 {
		t.Errorf("%d goroutines still in netproxy code:\n%s", len(leaked), strings.Join(leaked, "\n\n"))
	}
}

// harness runs one Proxy with a fake resolver and a recording dialer
// (unless the Config sets its own), and records decisions, closes and logs.
type harness struct {
	t      *testing.T
	p      *Proxy
	res    *fakeResolver
	dialer *recordingDialer
	logs   *syncBuffer
	addr   string       // the first listener ("sandbox-1")
	ln     net.Listener // if an option sets it, the first listener to serve
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	decisions []Decision
	closes    []Close
}

// leakChecked records the tests that already have a leak check queued.
var leakChecked sync.Map // *testing.T -> bool

// stdAllowlist is the allowlist of the proxy cases in docs/attack-cases.md.
var stdAllowlist = []string{"api.example.com", "*.pkg.example.org:443"}

type harnessOpt func(*harness, *Config)

// realDialer leaves Config.Dialer nil: the proxy's own dialer, with Control.
func realDialer(h *harness, c *Config) { c.Dialer = nil }

func newHarness(t *testing.T, cfg Config, opts ...harnessOpt) *harness {
	t.Helper()
	h := &harness{t: t, res: newFakeResolver(), dialer: &recordingDialer{}, logs: &syncBuffer{}}
	if cfg.Allow == nil {
		cfg.Allow = mustAllowlist(t, stdAllowlist...)
	}
	if cfg.Resolver == nil {
		cfg.Resolver = h.res
	}
	if cfg.Dialer == nil {
		cfg.Dialer = h.dialer
	}
	cfg.Logger = slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg.OnDecision = func(d Decision) {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.decisions = append(h.decisions, d)
	}
	cfg.OnClose = func(c Close) {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.closes = append(h.closes, c)
	}
	for _, o := range opts {
		o(h, &cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.p = p
	h.ctx, h.cancel = context.WithCancel(context.Background())
	if _, done := leakChecked.LoadOrStore(t, true); !done {
		// Registered before any harness cleanup of this test, so it runs
		// after all of them (cleanups run last-in first-out).
		t.Cleanup(func() { checkNoLeaks(t); leakChecked.Delete(t) })
	}
	t.Cleanup(func() {
		h.cancel()
		done := make(chan struct{})
		go func() { h.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("Serve did not return within 5s of cancel")
		}
	})
	if h.ln == nil {
		h.ln = listen(t)
	}
	h.addr = h.serveOn(h.ln, "sandbox-1")
	return h
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// serve starts another Serve on a new loopback listener.
func (h *harness) serve(sandbox string) string {
	return h.serveOn(listen(h.t), sandbox)
}

func (h *harness) serveOn(ln net.Listener, sandbox string) string {
	h.wg.Go(func() {
		if err := h.p.Serve(h.ctx, ln, sandbox); err != nil {
			h.t.Errorf("Serve(%s) = %v", sandbox, err)
		}
	})
	return ln.Addr().String()
}

func mustAllowlist(t testing.TB, entries ...string) *Allowlist {
	t.Helper()
	a, err := ParseAllowlist(entries)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// bufConn is a client connection whose first bytes were read into r.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// roundTrip sends a raw request on a new connection to addr and reads the
// response header. For a 200 it returns the open connection (the tunnel);
// otherwise it reads the body and returns a closed connection.
func roundTrip(t *testing.T, addr, raw string) (*http.Response, string, *bufConn) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatalf("write request: %v", err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read response to %q: %v", truncate(raw, 80), err)
	}
	bc := &bufConn{Conn: c, r: br}
	if resp.StatusCode == http.StatusOK {
		return resp, "", bc
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	c.Close()
	return resp, string(body), bc
}

func connectReq(target string) string {
	return "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n\r\n"
}

func (h *harness) connect(target string) (*http.Response, string, *bufConn) {
	h.t.Helper()
	return roundTrip(h.t, h.addr, connectReq(target))
}

func (h *harness) decisionList() []Decision {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Decision(nil), h.decisions...)
}

// waitCloses waits until n Close records exist and returns them.
func (h *harness) waitCloses(n int) []Close {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		h.mu.Lock()
		got := append([]Close(nil), h.closes...)
		h.mu.Unlock()
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("got %d close records, want %d", len(got), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// expectEcho writes msg through a tunnel and expects it back.
func expectEcho(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatalf("tunnel write: %v", err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("tunnel read: %v", err)
	}
	if string(got) != msg {
		t.Fatalf("tunnel echoed %q, want %q", got, msg)
	}
}

// expectClosed waits for the peer to end the connection (EOF or reset).
func expectClosed(t *testing.T, c net.Conn, within time.Duration) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(within))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("connection still open after %v", within)
	}
}
