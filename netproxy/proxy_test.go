package netproxy

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"
)

// canaries listen on 127.0.0.1 and ::1 on the same port where possible;
// a refused request must leave their accept counts at zero.
func canaries(t *testing.T) (v4, v6 *testServer) {
	t.Helper()
	v4 = startServer(t, "tcp4", "127.0.0.1:0", silent)
	ln6, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Logf("no IPv6 loopback: %v", err)
		return v4, nil
	}
	ln6.Close()
	v6 = startServer(t, "tcp6", ln6.Addr().String(), silent)
	return v4, v6
}

// With the proxy's real dialer, nothing that resolves to or names a local
// address reaches a listener there.
func TestCanariesWithRealDialer(t *testing.T) {
	v4, v6 := canaries(t)
	targets := map[string]string{ // answer -> port
		"127.0.0.1":        itoa(v4.port()),
		"0.0.0.0":          itoa(v4.port()),
		"::ffff:127.0.0.1": itoa(v4.port()),
		"::ffff:0.0.0.0":   itoa(v4.port()),
		"127.0.0.2":        itoa(v4.port()),
	}
	if v6 != nil {
		targets["::1"] = itoa(v6.port())
		targets["::"] = itoa(v6.port())
	}
	for answer, port := range targets {
		t.Run(answer, func(t *testing.T) {
			h := newHarness(t, Config{Allow: mustAllowlist(t, "api.example.com:"+port)}, realDialer)
			h.res.setAddrs("api.example.com", answer)
			if resp, body, _ := h.connect("api.example.com:" + port); resp.StatusCode != http.StatusForbidden {
				t.Errorf("by name: %d %q, want 403", resp.StatusCode, body)
			}
			if resp, body, _ := h.connect(literal(answer) + ":" + port); resp.StatusCode != http.StatusForbidden {
				t.Errorf("as literal: %d %q, want 403", resp.StatusCode, body)
			}
		})
	}
	time.Sleep(20 * time.Millisecond)
	if n := v4.accepts.Load(); n != 0 {
		t.Errorf("127.0.0.1 canary accepted %d connections", n)
	}
	if v6 != nil && v6.accepts.Load() != 0 {
		t.Errorf("::1 canary accepted %d connections", v6.accepts.Load())
	}
}

// The default dialer checks the address again at connect time.
func TestDialerControlRechecks(t *testing.T) {
	v4, _ := canaries(t)
	p, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{"127.0.0.1:443", "[::ffff:127.0.0.1]:443", "169.254.169.254:80", "0.0.0.0:443", "[fe80::1%25lo]:443", "not-an-addr"} {
		var denied *deniedError
		if err := p.control("tcp", addr, nil); !errors.As(err, &denied) {
			t.Errorf("control(%s) = %v, want a denial", addr, err)
		}
	}
	if err := p.control("tcp4", "93.184.216.34:443", nil); err != nil {
		t.Errorf("control(public) = %v", err)
	}
	// Dial a checked-looking but denied address directly: Control stops it.
	_, err = p.dial(context.Background(), netip.MustParseAddr("127.0.0.1"), v4.port())
	var denied *deniedError
	if !errors.As(err, &denied) || !strings.Contains(err.Error(), "loopback") {
		t.Errorf("dial(127.0.0.1) = %v, want a Control denial", err)
	}
	if ref := p.dialRefusal(context.Background(), err, `"x:1"`, netip.MustParseAddr("127.0.0.1")); ref.status != http.StatusForbidden {
		t.Errorf("a Control denial maps to %d, want 403", ref.status)
	}
	time.Sleep(20 * time.Millisecond)
	if n := v4.accepts.Load(); n != 0 {
		t.Errorf("canary accepted %d connections", n)
	}
}

// Proxy case 16: the proxy's own listeners, DenyAddrs (exact, any port, and
// unspecified = every local address) stay refused even with AllowPrivate.
func TestOwnListenersAndDenyAddrsRefused(t *testing.T) {
	mcp := startServer(t, "tcp4", "127.0.0.1:0", silent) // stands in for the MCP HTTP listener
	other := startServer(t, "tcp4", "127.0.0.1:0", silent)
	echoSrv := startServer(t, "tcp4", "127.0.0.1:0", echo)
	self, second := listen(t), listen(t) // two sandboxes' proxy listeners
	port := func(a net.Addr) string { return itoa(a.(*net.TCPAddr).Port) }
	h := newHarness(t, Config{
		AllowPrivate: true,
		Allow: mustAllowlist(t, "*.test.example:443", "*.test.example:8080", "*.test.example:"+itoa(mcp.port()),
			"*.test.example:"+itoa(other.port()), "*.test.example:"+itoa(echoSrv.port()),
			"*.test.example:"+port(self.Addr()), "*.test.example:"+port(second.Addr())),
		DenyAddrs: []netip.AddrPort{
			netip.MustParseAddrPort(mcp.addr()),
			netip.MustParseAddrPort("172.17.0.1:0"), // the Docker bridge gateway, every port
			netip.MustParseAddrPort("[::]:" + itoa(other.port())),
		},
	}, realDialer, func(h *harness, _ *Config) { h.ln = self })
	h.serveOn(second, "sandbox-2")
	h.res.setAddrs("lo.test.example", "127.0.0.1")
	h.res.setAddrs("mapped.test.example", "::ffff:127.0.0.1")
	h.res.setAddrs("gw.test.example", "172.17.0.1")

	cases := []struct {
		target, reason string
	}{
		{"lo.test.example:" + port(self.Addr()), "this proxy's own address"},
		{"mapped.test.example:" + port(self.Addr()), "this proxy's own address"},
		{"lo.test.example:" + port(second.Addr()), "this proxy's own address"},
		{"lo.test.example:" + itoa(mcp.port()), "a server address that sandboxes may not reach"},
		{"gw.test.example:443", "a server address"},
		{"gw.test.example:8080", "a server address"},
		{"lo.test.example:" + itoa(other.port()), "a server address"}, // [::]:port covers 127.0.0.1
	}
	for _, tc := range cases {
		resp, body, _ := h.connect(tc.target)
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, tc.reason) {
			t.Errorf("%s: %d %q, want 403 %q", tc.target, resp.StatusCode, body, tc.reason)
		}
	}
	if n := mcp.accepts.Load() + other.accepts.Load(); n != 0 {
		t.Errorf("denied servers accepted %d connections", n)
	}
	// With AllowPrivate, an ordinary loopback server is reachable.
	resp, body, c := h.connect("lo.test.example:" + itoa(echoSrv.port()))
	if resp.StatusCode != 200 {
		t.Fatalf("loopback with AllowPrivate: %d %q", resp.StatusCode, body)
	}
	expectEcho(t, c, "ok")
}

// Proxy case 49: a CONNECT inside an established tunnel is just bytes for the
// upstream; the proxy makes one decision and one lookup.
func TestConnectInsideTunnelIsJustBytes(t *testing.T) {
	h, _ := publicHarness(t, Config{}, echo)
	resp, _, c := h.connect("api.example.com:443")
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	inner := connectReq("evil.com:443")
	expectEcho(t, c, inner)
	if n := len(h.decisionList()); n != 1 {
		t.Errorf("%d decisions, want 1", n)
	}
	if h.res.lookups("evil.com") != 0 || h.dialer.count() != 1 {
		t.Errorf("inner CONNECT reached the proxy: lookups %d, dials %v", h.res.lookups("evil.com"), h.dialer.list())
	}
}

// End to end: HTTPS through the proxy to a TLS server on loopback, with the
// real dialer and AllowPrivate.
func TestEndToEndTLS(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(w, r.Body)
	}))
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	h := newHarness(t, Config{AllowPrivate: true, Allow: mustAllowlist(t, "example.com:"+itoa(port))}, realDialer)
	h.res.setAddrs("example.com", "127.0.0.1")

	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	proxyURL, _ := url.Parse("http://" + h.addr)
	tr := &http.Transport{
		Proxy:           http.ProxyURL(proxyURL),
		TLSClientConfig: &tls.Config{RootCAs: pool}, // httptest's certificate names example.com
	}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	payload := bytes.Repeat([]byte("sandbox "), 64<<10) // 512 KiB
	for range 2 {
		resp, err := client.Post("https://example.com:"+itoa(port)+"/", "application/octet-stream", bytes.NewReader(payload))
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || !bytes.Equal(got, payload) {
			t.Fatalf("echoed %d bytes (%v), want %d", len(got), err, len(payload))
		}
	}
	tr.CloseIdleConnections()
	ds := h.decisionList()
	var up, down int64
	for _, cl := range h.waitCloses(len(ds)) {
		up += cl.BytesUp
		down += cl.BytesDown
		if cl.Reason != CloseEOF && cl.Reason != CloseError { // a TLS close_notify may meet a closed socket
			t.Errorf("close reason %q", cl.Reason)
		}
	}
	if up < int64(2*len(payload)) || down < int64(2*len(payload)) {
		t.Errorf("%d bytes up, %d down, want at least %d each way", up, down, 2*len(payload))
	}
	for _, d := range ds {
		if !d.Allow || d.Addr != netip.MustParseAddr("127.0.0.1") || d.Status != 200 {
			t.Errorf("decision = %+v, want an allowed tunnel to 127.0.0.1", d)
		}
	}
}

// End to end over plain TCP: exact byte counts both ways, early data, and a
// clean half-close.
func TestEndToEndEcho(t *testing.T) {
	echoSrv := startServer(t, "tcp4", "127.0.0.1:0", echo)
	port := itoa(echoSrv.port())
	h := newHarness(t, Config{AllowPrivate: true, Allow: mustAllowlist(t, "echo.test.example:"+port)}, realDialer)
	h.res.setAddrs("echo.test.example", "127.0.0.1")

	payload := make([]byte, 1<<20)
	rand.Read(payload)
	resp, body, c := roundTrip(t, h.addr, connectReq("echo.test.example:"+port)+"early")
	if resp.StatusCode != 200 {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(payload)
		c.Conn.(*net.TCPConn).CloseWrite()
		errc <- err
	}()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	want := append([]byte("early"), payload...)
	if !bytes.Equal(got, want) {
		t.Fatalf("echoed %d bytes, want %d identical", len(got), len(want))
	}
	cl := h.waitCloses(1)[0]
	if cl.Reason != CloseEOF || cl.BytesUp != int64(len(want)) || cl.BytesDown != int64(len(want)) ||
		cl.Host != "echo.test.example" || cl.Addr != netip.MustParseAddr("127.0.0.1") || cl.Sandbox != "sandbox-1" {
		t.Errorf("close = %+v, want eof with %d bytes each way", cl, len(want))
	}
}

// Serve's context ending closes active tunnels (reason "ctx") and Serve
// returns nil; closing the listener ends Serve the same way.
func TestShutdown(t *testing.T) {
	h, _ := publicHarness(t, Config{}, echo)
	resp, _, c := h.connect("api.example.com:443")
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	expectEcho(t, c, "x")
	h.cancel()
	expectClosed(t, c, 2*time.Second)
	if cl := h.waitCloses(1)[0]; cl.Reason != CloseCtx {
		t.Errorf("close reason %q, want ctx", cl.Reason)
	}
	if _, err := net.Dial("tcp", h.addr); err == nil {
		t.Error("listener still open after cancel")
	}
}

func TestServeReturnsWhenListenerClosed(t *testing.T) {
	echoSrv := startServer(t, "tcp4", "127.0.0.1:0", echo)
	d := &recordingDialer{target: echoSrv.addr()}
	r := newFakeResolver()
	r.setAddrs("api.example.com", "93.184.216.34")
	p, err := New(Config{Allow: mustAllowlist(t, "api.example.com"), Resolver: r, Dialer: d})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Serve(context.Background(), ln, "sb") }()
	resp, _, c := roundTrip(t, ln.Addr().String(), connectReq("api.example.com:443"))
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	ln.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve = %v, want nil", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Serve did not return")
	}
	expectClosed(t, c, time.Second) // Serve does not leave tunnels behind
	p.mu.Lock()
	left := len(p.sandboxes) + len(p.listeners)
	p.mu.Unlock()
	if left != 0 {
		t.Errorf("%d sandbox or listener entries left after Serve", left)
	}
	checkNoLeaks(t)
}

func TestLogRecords(t *testing.T) {
	h, _ := publicHarness(t, Config{}, echo)
	secret := "Basic c2VjcmV0LXRva2Vu"
	resp, _, c := roundTrip(t, h.addr, "CONNECT api.example.com:443 HTTP/1.1\r\nProxy-Authorization: "+secret+"\r\nCookie: sessionsecret\r\n\r\n")
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	expectEcho(t, c, "hi")
	c.Close()
	h.waitCloses(1)
	roundTrip(t, h.addr, "CONNECT evil.com:443 HTTP/1.1\r\nProxy-Authorization: "+secret+"\r\n\r\n")

	logs := h.logs.String()
	for _, s := range []string{secret, "c2VjcmV0", "sessionsecret"} {
		if strings.Contains(logs, s) {
			t.Errorf("logs contain %q:\n%s", s, logs)
		}
	}
	decisions := h.logs.records(t, "proxy decision")
	if len(decisions) != 2 {
		t.Fatalf("%d decision records, want 2", len(decisions))
	}
	for _, rec := range decisions {
		for _, k := range []string{"sandbox", "host", "normalized", "port", "resolved", "addr", "allow", "reason", "rule", "status", "duration"} {
			if _, ok := rec[k]; !ok {
				t.Errorf("decision record lacks %q: %v", k, rec)
			}
		}
	}
	if decisions[0]["level"] != "INFO" || decisions[1]["level"] != "WARN" || decisions[1]["allow"] != false {
		t.Errorf("levels: %v / %v", decisions[0]["level"], decisions[1]["level"])
	}
	closes := h.logs.records(t, "proxy tunnel closed")
	if len(closes) != 1 {
		t.Fatalf("%d close records, want 1", len(closes))
	}
	for _, k := range []string{"sandbox", "host", "port", "addr", "bytes_up", "bytes_down", "duration", "reason"} {
		if _, ok := closes[0][k]; !ok {
			t.Errorf("close record lacks %q: %v", k, closes[0])
		}
	}
}

func TestReasonsAreHeaderSafe(t *testing.T) {
	h := newHarness(t, Config{})
	resp, body, _ := roundTrip(t, h.addr, "CONNECT évil\x7f\x01.com:443 HTTP/1.1\r\n\r\n")
	if resp.StatusCode != 400 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	for _, r := range body[:len(body)-1] {
		if r < 0x20 || r > 0x7e {
			t.Fatalf("reason has byte %q: %q", r, body)
		}
	}
}

func TestNewValidatesConfig(t *testing.T) {
	for _, cfg := range []Config{
		{HeaderTimeout: -1}, {DNSTimeout: -1}, {ConnectTimeout: -1}, {IdleTimeout: -1}, {MaxLifetime: -1},
		{MaxTunnels: -1}, {MaxConns: -1}, {Burst: -1}, {Rate: -1}, {MaxHeaderBytes: -1},
	} {
		if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "negative") {
			t.Errorf("New(%+v) = %v, want an error", cfg, err)
		}
	}
	p, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	c := p.cfg
	if c.HeaderTimeout != DefaultHeaderTimeout || c.DNSTimeout != DefaultDNSTimeout || c.ConnectTimeout != DefaultConnectTimeout ||
		c.IdleTimeout != DefaultIdleTimeout || c.MaxLifetime != DefaultMaxLifetime || c.MaxTunnels != DefaultMaxTunnels ||
		c.MaxConns != DefaultMaxConns || c.Rate != DefaultRate || c.Burst != DefaultBurst || c.MaxHeaderBytes != DefaultMaxHeaderBytes {
		t.Errorf("defaults not applied: %+v", c)
	}
	if _, ok := p.resolver.(*net.Resolver); !ok || !p.resolver.(*net.Resolver).PreferGo {
		t.Errorf("default resolver = %#v, want the pure-Go net.Resolver", p.resolver)
	}
	if nd, ok := p.dialer.(*net.Dialer); !ok || nd.Control == nil {
		t.Errorf("default dialer = %#v, want a net.Dialer with Control", p.dialer)
	}
}

// A zero Config refuses everything.
func TestZeroConfigDeniesAll(t *testing.T) {
	h := newHarness(t, Config{}, func(h *harness, c *Config) { c.Allow = nil })
	h.res.setAddrs("api.example.com", "93.184.216.34")
	resp, body, _ := h.connect("api.example.com:443")
	h.expectDeny(resp, body, http.StatusForbidden, "not on this server's --allow-host list")
}
