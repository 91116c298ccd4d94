package netproxy

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/textproto"
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
	t.rw = p.secrets.rewriter(sb.id, d.Normalized, p.heldBy(sb.id))
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
		Transport:     &scrubTransport{rt: tr, s: t.rw.scrub, host: host},
		FlushInterval: -1,
		ErrorLog:      discard,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			why := p.secrets.scrub(t.rw.scrub.scrubString(innermost(err)))
			p.log.Warn("an intercepted request failed", "sandbox", sb.id, "host", host, "err", why)
			reason := fmt.Sprintf("the request to %s failed: %s", host, quote(why))
			var ur *unscrubbable
			if errors.As(err, &ur) {
				reason = ur.reason
			}
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
		if up := r.Header.Get("Upgrade"); up != "" && strings.Contains(strings.ToLower(strings.Join(r.Header.Values("Connection"), ",")), "upgrade") {
			// After a 101 the host's bytes would reach the sandbox as
			// they come, with nothing to scrub them.
			reason := fmt.Sprintf("the proxy does not switch protocols (Upgrade: %s) on a connection to %s, a host it puts a secret into: it could not turn the secret back into its placeholder in what the host sends; use plain HTTPS requests", quote(truncate(up, 40)), host)
			w.Header().Set(ErrorHeader, headerSafe(reason))
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("Connection", "close")
			w.WriteHeader(http.StatusForbidden)
			io.WriteString(w, reason+"\n")
			return
		}
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
// replaced where each secret goes (Authorization and the secret's other
// header fields; the request target only for a secret with InURL). It asks
// for the response in a form the proxy can scrub: whole (no Range) and not
// compressed (Accept-Encoding: identity).
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
		uri = t.rw.replaceURL(uri, t.used)
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
	// A compressed body could not be scrubbed as it streams, and byte
	// ranges would let a sandbox fetch a reflected value in pieces, each
	// too short to be recognised.
	out.Header.Set("Accept-Encoding", "identity")
	out.Header.Del("Range")
	out.Header.Del("If-Range")
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

// scrubTransport is an intercepted tunnel's transport to its host: what
// the host answers has the tunnel's secret values turned back into their
// placeholders before the sandbox sees it. That is the header of each
// informational (1xx) response, the final response's header, its body as
// it streams (decompressed first if the host compressed it although asked
// not to) and its trailer. A body in an encoding the proxy cannot decode
// is refused (502), never passed on unscrubbed.
type scrubTransport struct {
	rt   http.RoundTripper
	s    *scrubber
	host string
}

func (st *scrubTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	// This trace is newer than the reverse proxy's, so its hook runs first
	// and the proxy copies the scrubbed header to the sandbox.
	ctx := httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		Got1xxResponse: func(_ int, h textproto.MIMEHeader) error {
			st.s.scrubHeader(http.Header(h))
			return nil
		},
	})
	resp, err := st.rt.RoundTrip(req.WithContext(ctx))
	if err != nil {
		return nil, err
	}
	st.s.scrubHeader(resp.Header)
	st.s.scrubHeader(resp.Trailer) // the names announced so far
	if resp.StatusCode == http.StatusSwitchingProtocols {
		resp.Body.Close()
		return nil, &unscrubbable{fmt.Sprintf("%s switched protocols, which the proxy does not pass on from a host it puts a secret into: it could not turn the secret back into its placeholder in what the host sends", st.host)}
	}
	if resp.Body == nil || resp.Body == http.NoBody || req.Method == http.MethodHead {
		return resp, nil
	}
	var decode func(io.Reader) (io.Reader, error)
	switch ce := strings.ToLower(strings.TrimSpace(strings.Join(resp.Header.Values("Content-Encoding"), ","))); ce {
	case "", "identity":
	case "gzip", "x-gzip":
		decode = func(r io.Reader) (io.Reader, error) { return gzip.NewReader(r) }
	case "deflate":
		decode = func(r io.Reader) (io.Reader, error) { return zlib.NewReader(r) }
	default:
		resp.Body.Close()
		return nil, &unscrubbable{fmt.Sprintf("%s sent its response in the content coding %s although asked for none; the proxy cannot turn the secret back into its placeholder in it, so it passes none of it on", st.host, quote(truncate(ce, 40)))}
	}
	if decode != nil {
		resp.Header.Del("Content-Encoding")
	}
	body := &scrubBody{ReadCloser: resp.Body, resp: resp, s: st.s, decode: decode}
	if 0 <= resp.ContentLength && resp.ContentLength <= maxBufferedBody {
		// A small body is read whole and scrubbed, so that it keeps a
		// Content-Length (its new one): a client that wants one gets it.
		b, err := io.ReadAll(io.LimitReader(body, maxBufferedBody+1))
		if err != nil {
			body.Close()
			return nil, err
		}
		if len(b) <= maxBufferedBody {
			resp.Body = readCloser{bytes.NewReader(b), body}
			resp.ContentLength = int64(len(b))
			resp.Header.Set("Content-Length", strconv.Itoa(len(b)))
			return resp, nil
		}
		resp.Body = readCloser{io.MultiReader(bytes.NewReader(b), body), body} // it grew as it was decoded
	} else {
		resp.Body = body
	}
	// Scrubbing changes the length: the sandbox gets the body chunked.
	resp.Header.Del("Content-Length")
	resp.ContentLength = -1
	return resp, nil
}

// maxBufferedBody is the largest response body that an intercepted tunnel
// reads whole before passing it on (to give it its scrubbed length); a
// larger one streams, chunked.
const maxBufferedBody = 64 << 10

type readCloser struct {
	io.Reader
	io.Closer
}

// unscrubbable is a response the proxy refuses to pass on because it
// cannot scrub it; reason says why, to the sandbox.
type unscrubbable struct{ reason string }

func (u *unscrubbable) Error() string { return u.reason }

// scrubBody is a response body read through a scrubReader, decompressed
// first if decode is set. At the end of the body it scrubs the trailer.
type scrubBody struct {
	io.ReadCloser
	resp   *http.Response
	s      *scrubber
	decode func(io.Reader) (io.Reader, error)
	r      io.Reader
}

func (b *scrubBody) Read(p []byte) (int, error) {
	if b.r == nil {
		src := io.Reader(b.ReadCloser)
		if b.decode != nil {
			d, err := b.decode(src)
			if err != nil {
				return 0, fmt.Errorf("the compressed body could not be decoded: %w", err)
			}
			src = d
		}
		b.r = newScrubReader(b.s, src, b.scrubTrailer)
	}
	return b.r.Read(p)
}

// Close closes the body, after which the trailer is whole, and scrubs the
// trailer (the reverse proxy copies it after Close).
func (b *scrubBody) Close() error {
	err := b.ReadCloser.Close()
	b.scrubTrailer()
	return err
}

func (b *scrubBody) scrubTrailer() {
	b.s.scrubHeader(b.resp.Trailer)
}
