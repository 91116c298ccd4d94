package netproxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// maxResponseHeaderBytes bounds an upstream's response header on an
// intercepted tunnel.
const maxResponseHeaderBytes = 64 << 10

// SecretUse records that a secret was put into a request. One is logged (as
// "proxy secret used") and passed to Config.OnSecretUse the first time each
// secret is used on an intercepted tunnel. It never holds the value.
type SecretUse struct {
	Sandbox string
	Name    string // the secret's name, the variable the sandbox sees
	Host    string // the normalised host the request went to
	Port    int
}

// meteredConn counts the bytes read from a connection, notes when bytes
// last moved either way, and signals its first Close.
type meteredConn struct {
	net.Conn
	read   atomic.Int64
	last   *atomic.Int64 // shared by a tunnel's connections: unix nanos of the last byte moved
	once   sync.Once
	closed chan struct{}
}

func newMetered(c net.Conn, last *atomic.Int64) *meteredConn {
	return &meteredConn{Conn: c, last: last, closed: make(chan struct{})}
}

func (m *meteredConn) Read(b []byte) (int, error) {
	n, err := m.Conn.Read(b)
	if n > 0 {
		m.read.Add(int64(n))
		m.last.Store(time.Now().UnixNano())
	}
	return n, err
}

func (m *meteredConn) Write(b []byte) (int, error) {
	m.last.Store(time.Now().UnixNano()) // a slow reader keeps a write busy: that is not idleness
	n, err := m.Conn.Write(b)
	if n > 0 {
		m.last.Store(time.Now().UnixNano())
	}
	return n, err
}

func (m *meteredConn) Close() error {
	m.once.Do(func() { close(m.closed) })
	return m.Conn.Close()
}

// upstreamTLS opens TLS to the real host over up, verifying its
// certificate and name against Config.RootCAs (the system's roots by
// default) and offering only HTTP/1.1.
func (p *Proxy) upstreamTLS(ctx context.Context, up net.Conn, host string) (*tls.Conn, error) {
	tc := tls.Client(up, &tls.Config{
		ServerName: host,
		RootCAs:    p.cfg.RootCAs,
		NextProtos: []string{"http/1.1"},
		MinVersion: tls.VersionTLS12,
	})
	hctx, cancel := context.WithTimeout(ctx, p.cfg.ConnectTimeout)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		return nil, err
	}
	if np := tc.ConnectionState().NegotiatedProtocol; np != "" && np != "http/1.1" {
		return nil, fmt.Errorf("the host chose the protocol %q, not http/1.1", np)
	}
	return tc, nil
}

// tlsRefusal is the 502 for a failed TLS connection to an intercepted host.
// The reason never quotes a request: none has been read.
func tlsRefusal(hostport string, err error) *refusal {
	why := innermost(err)
	var cv *tls.CertificateVerificationError
	if errors.As(err, &cv) {
		why = cv.Err.Error()
	}
	return &refusal{http.StatusBadGateway, fmt.Sprintf(
		"the TLS connection to %s failed: %s; the proxy verifies the real host's certificate before it sends any credential, so nothing was sent",
		hostport, quote(why))}
}

// oneConnListener hands one connection to an http.Server, then blocks
// until that connection is closed.
type oneConnListener struct {
	c    chan net.Conn
	done <-chan struct{}
	addr net.Addr
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.c:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}
func (l *oneConnListener) Close() error   { return nil }
func (l *oneConnListener) Addr() net.Addr { return l.addr }

// intercepted is one intercepted tunnel: the client's TLS connection
// terminated here, HTTP/1.1 requests forwarded to the real host with the
// sandbox's placeholders replaced.
type intercepted struct {
	p        *Proxy
	sb       *sandboxState
	sandbox  string
	d        *Decision
	rw       *rewriter
	last     atomic.Int64
	client   *meteredConn
	mu       sync.Mutex
	first    *tls.Conn // the verified upstream connection made before the 200
	ups      []*meteredConn
	closed   bool // the tunnel is ending: no new upstream connection
	used     []bool
	reported []bool
}

// serveIntercepted runs an intercepted tunnel until the client's
// connection ends, it is idle for IdleTimeout, MaxLifetime passes or ctx
// ends. c is the client's connection (the 200 already sent), up the
// verified TLS connection to the host over rawUp. It returns the close
// reason and the bytes read from each side.
func (p *Proxy) serveIntercepted(ctx context.Context, c net.Conn, early []byte, up *tls.Conn, rawUp *meteredConn, d *Decision, sb *sandboxState) (reason string, bytesUp, bytesDown int64) {
	start := time.Now()
	t := &intercepted{p: p, sb: sb, sandbox: sb.id, d: d, first: up, ups: []*meteredConn{rawUp}}
	t.rw = p.secrets.rewriter(sb.id, d.Normalized)
	t.used = make([]bool, len(t.rw.names))
	t.reported = make([]bool, len(t.rw.names))
	t.last.Store(start.UnixNano())
	rawUp.last = &t.last
	var cc net.Conn = c
	if len(early) > 0 {
		cc = &prefixConn{Conn: c, prefix: early}
	}
	t.client = newMetered(cc, &t.last)
	defer func() {
		t.client.Close()
		t.mu.Lock()
		for _, u := range t.ups {
			u.Close()
			bytesDown += u.read.Load()
		}
		t.mu.Unlock()
		bytesUp = t.client.read.Load()
	}()

	leaf, err := p.ca.leaf(d.Normalized, start)
	if err != nil {
		p.log.Error("interception certificate", "sandbox", sb.id, "host", d.Normalized, "err", err)
		return CloseError, 0, 0
	}
	host := d.Normalized
	tc := tls.Server(t.client, &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(hi *tls.ClientHelloInfo) (*tls.Certificate, error) {
			if sni := strings.TrimSuffix(asciiLower(hi.ServerName), "."); sni != "" && sni != host {
				return nil, fmt.Errorf("the ClientHello names %s, not the CONNECT target %s", quote(truncate(sni, 100)), host)
			}
			return leaf, nil
		},
	})
	hctx, cancel := context.WithTimeout(ctx, p.cfg.HeaderTimeout)
	err = tc.HandshakeContext(hctx)
	cancel()
	if err != nil {
		p.log.Warn("the sandbox's TLS handshake with the proxy failed", "sandbox", sb.id, "host", host, "err", innermost(err))
		if ctx.Err() != nil {
			return CloseCtx, 0, 0
		}
		return CloseError, 0, 0
	}

	authority := host
	if d.Port != 443 {
		authority = host + ":" + strconv.Itoa(d.Port)
	}
	discard := log.New(io.Discard, "", 0)
	tr := &http.Transport{
		DialTLSContext:         t.dialUpstream,
		TLSNextProto:           map[string]func(string, *tls.Conn) http.RoundTripper{},
		DisableCompression:     true,
		MaxConnsPerHost:        1,
		MaxIdleConnsPerHost:    1,
		IdleConnTimeout:        p.cfg.IdleTimeout,
		ResponseHeaderTimeout:  p.cfg.IdleTimeout,
		MaxResponseHeaderBytes: maxResponseHeaderBytes,
	}
	defer tr.CloseIdleConnections()
	rp := &httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { t.rewrite(pr, authority) },
		Transport:     tr,
		FlushInterval: -1,
		ErrorLog:      discard,
		ModifyResponse: func(r *http.Response) error {
			for _, vs := range r.Header {
				for i, v := range vs {
					vs[i] = t.rw.restore(v)
				}
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			why := p.secrets.scrub(innermost(err))
			p.log.Warn("an intercepted request failed", "sandbox", sb.id, "host", host, "err", why)
			reason := fmt.Sprintf("the request to %s failed: %s", host, quote(why))
			w.Header().Set(ErrorHeader, headerSafe(reason))
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusBadGateway)
			io.WriteString(w, reason+"\n")
		},
	}
	// The handlers are counted so that the tunnel ends only after the last
	// one has returned: Serve waits for every goroutine of its tunnels.
	var hmu sync.Mutex
	var handlers sync.WaitGroup
	closing := false
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hmu.Lock()
		if closing {
			hmu.Unlock()
			return
		}
		handlers.Add(1)
		hmu.Unlock()
		defer handlers.Done()
		rp.ServeHTTP(w, r)
	})
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: p.cfg.HeaderTimeout,
		MaxHeaderBytes:    p.cfg.MaxHeaderBytes,
		ErrorLog:          discard,
		TLSNextProto:      map[string]func(*http.Server, *tls.Conn, http.Handler){},
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	l := &oneConnListener{c: make(chan net.Conn, 1), done: t.client.closed, addr: c.LocalAddr()}
	l.c <- tc
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(l)
	}()

	reason = t.watch(ctx, start)
	hmu.Lock()
	closing = true
	hmu.Unlock()
	tc.Close()
	t.closeUpstreams()
	<-served
	handlers.Wait()
	return reason, 0, 0
}

// closeUpstreams closes every connection to the host, which ends a round
// trip in progress.
func (t *intercepted) closeUpstreams() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	if t.first != nil {
		t.first.Close()
	}
	for _, u := range t.ups {
		u.Close()
	}
}

// watch waits for the client's connection to end and enforces the idle
// time and the lifetime. It returns the close reason.
func (t *intercepted) watch(ctx context.Context, start time.Time) string {
	cfg := t.p.cfg
	end := start.Add(cfg.MaxLifetime)
	timer := time.NewTimer(cfg.IdleTimeout)
	defer timer.Stop()
	for {
		select {
		case <-t.client.closed:
			return CloseEOF
		case <-ctx.Done():
			return CloseCtx
		case now := <-timer.C:
			if !now.Before(end) {
				return CloseLifetime
			}
			next := time.Unix(0, t.last.Load()).Add(cfg.IdleTimeout)
			if !now.Before(next) {
				return CloseIdle
			}
			if next.After(end) {
				next = end
			}
			timer.Reset(next.Sub(now))
		}
	}
}

// dialUpstream gives the Transport its connection to the host: first the
// one verified before the tunnel opened; then, should the host close it
// between requests, a new one to the same checked address, verified the
// same way.
func (t *intercepted) dialUpstream(ctx context.Context, _, _ string) (net.Conn, error) {
	t.mu.Lock()
	first := t.first
	t.first = nil
	t.mu.Unlock()
	if first != nil {
		return first, nil
	}
	// A new connection counts against the sandbox's request rate, as a
	// new tunnel would.
	if ok, wait := t.sb.allow(time.Now()); !ok {
		return nil, fmt.Errorf("this sandbox opens connections faster than %v per second, the limit; retry in %d s", float64(t.p.cfg.Rate), retryAfterSeconds(wait))
	}
	raw, err := t.p.dial(ctx, t.d.Addr, t.d.Port)
	if err != nil {
		return nil, err
	}
	m := newMetered(raw, &t.last)
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		raw.Close()
		return nil, net.ErrClosed
	}
	t.ups = append(t.ups, m)
	t.mu.Unlock()
	tc, err := t.p.upstreamTLS(ctx, m, t.d.Normalized)
	if err != nil {
		m.Close()
		return nil, err
	}
	return tc, nil
}

// rewrite makes the outgoing request: to the CONNECT target, whatever
// Host the client sent, with the sandbox's placeholders for this host
// replaced in the request target and every header.
func (t *intercepted) rewrite(pr *httputil.ProxyRequest, authority string) {
	out := pr.Out
	out.URL.Scheme, out.URL.Host, out.Host = "https", authority, authority
	t.mu.Lock()
	defer t.mu.Unlock()
	out.URL.User = nil // an absolute-form target's user info is not forwarded (net/http would send it as Basic unreplaced)
	uri := pr.In.RequestURI
	if !strings.HasPrefix(uri, "/") {
		// Absolute form ("https://host/path"): keep its path and query.
		if u, err := url.ParseRequestURI(uri); err == nil && u.Host != "" {
			uri = u.RequestURI()
		}
	}
	if strings.HasPrefix(uri, "/") {
		// Keep the request target as the client wrote it (escapes
		// included), only with the placeholders replaced.
		uri = t.rw.replace(uri, t.used)
		path, query, _ := strings.Cut(uri, "?")
		out.URL.Opaque, out.URL.RawQuery = path, query
		out.URL.Path, out.URL.RawPath = "", ""
		if strings.HasPrefix(path, "//") {
			out.URL.Opaque, out.URL.Path = "", path // url.URL would read "//x" in Opaque as an authority
			if u, err := url.ParseRequestURI(path); err == nil {
				out.URL.Path, out.URL.RawPath = u.Path, u.RawPath
			}
		}
	}
	for k, vs := range out.Header {
		for i, v := range vs {
			vs[i] = t.rw.replaceHeader(k, v, t.used)
		}
	}
	for i, u := range t.used {
		if u && !t.reported[i] {
			t.reported[i] = true
			t.p.secretUsed(SecretUse{Sandbox: t.sandbox, Name: t.rw.names[i], Host: t.d.Normalized, Port: t.d.Port})
		}
	}
}

func (p *Proxy) secretUsed(u SecretUse) {
	p.log.LogAttrs(context.Background(), slog.LevelInfo, "proxy secret used",
		slog.String("sandbox", u.Sandbox),
		slog.String("secret", u.Name),
		slog.String("host", u.Host),
		slog.Int("port", u.Port),
	)
	if p.cfg.OnSecretUse != nil {
		p.cfg.OnSecretUse(u)
	}
}

// prefixConn reads prefix before the connection's own bytes.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(b []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(b, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(b)
}
