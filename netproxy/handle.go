package netproxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

const (
	readBufSize = 4 << 10
	// After a refusal the proxy half-closes and reads what the client still
	// sends, for at most this long and this much, so that closing with unread
	// data does not reset the connection before the client reads the answer.
	lingerTimeout  = 500 * time.Millisecond
	maxLingerBytes = 256 << 10
)

// limitReader counts the bytes read through it and fails after n.
type limitReader struct {
	r    io.Reader
	n    int64
	read int64
}

var errHeaderTooLarge = errors.New("request header too large")

func (l *limitReader) Read(b []byte) (int, error) {
	if l.n <= 0 {
		return 0, errHeaderTooLarge
	}
	if int64(len(b)) > l.n {
		b = b[:l.n]
	}
	n, err := l.r.Read(b)
	l.n -= int64(n)
	l.read += int64(n)
	return n, err
}

// handle serves one client connection: one request, one decision, and a
// tunnel if the request is allowed. The connection is always closed on return.
func (p *Proxy) handle(ctx context.Context, c net.Conn, s *served) {
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer func() {
		stop()
		c.Close()
	}()
	d := Decision{Sandbox: s.sb.id}
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		d.Client = ta.AddrPort().Addr().Unmap().WithZone("")
	}

	if !s.admits(d.Client) {
		if s.strangers.Add(1) <= int64(p.cfg.MaxConns) {
			p.refuse(c, &d, s.sb, &refusal{http.StatusForbidden, fmt.Sprintf(
				"this proxy serves one sandbox, and %s is not its address", addrString(d.Client))})
		}
		s.strangers.Add(-1)
		return
	}

	var a admitted
	if s.shared {
		a = p.admitShared(c, &d, s)
	} else {
		a = p.admitOwn(c, &d, s.sb)
	}
	defer a.conn.release()
	if a.conn == nil {
		return
	}
	sb := a.sb
	start := time.Now()
	// Bytes the client sent after the header (e.g. an eager TLS ClientHello)
	// belong to the tunnel.
	early, _ := a.br.Peek(a.br.Buffered())

	up, ref, extra := p.connect(ctx, a.req, &d, sb)
	d.Duration = time.Since(start)
	if ref != nil {
		p.refuse(c, &d, sb, ref, extra...)
		return
	}
	d.Allow, d.Status, d.Count = true, http.StatusOK, 1
	d.Reason = "allowed by " + d.Rule
	if up.tls != nil {
		d.Reason += "; intercepted to add a secret"
	}

	stop() // from here on the tunnel closes c, recording why
	cl, ref, isTLS := p.tunnel(ctx, c, up, early, &d, sb)
	if ref != nil {
		d.Allow, d.Status, d.Reason, d.Count = false, ref.status, ref.reason, 0
		p.recordRefusal(sb, &d)
		if isTLS {
			// A fatal access_denied alert: the client has already had its 200.
			c.SetWriteDeadline(time.Now().Add(lingerTimeout))
			c.Write([]byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 49})
		}
		return
	}
	p.logClose(&cl) // after tunnel freed the slot, so a caller that saw it can open another
}

// slot is one of a sandbox's counted places, a connection or a tunnel,
// held from take until release. release is idempotent, and a nil slot's
// does nothing, so a holder defers it and may still release early.
type slot struct {
	sb       *sandboxState
	n        *int
	released atomic.Bool
}

// take holds one unit of *n, or returns nil if *n is at limit.
func (s *sandboxState) take(n *int, limit int) *slot {
	if !s.acquire(n, limit) {
		return nil
	}
	return &slot{sb: s, n: n}
}

func (s *slot) release() {
	if s == nil || s.released.Swap(true) {
		return
	}
	s.sb.release(s.n)
}

// admitted is a connection let in: the sandbox it is charged to, one of
// whose connection slots it holds (nil if it was not let in), and the
// request it sent.
type admitted struct {
	sb   *sandboxState
	conn *slot
	req  *request
	br   *bufio.Reader
}

func (p *Proxy) tooManyConns() *refusal {
	return &refusal{http.StatusTooManyRequests, fmt.Sprintf(
		"this sandbox already has %d open connections to the proxy, the limit; close some and retry", p.cfg.MaxConns)}
}

// admitOwn admits a connection to a listener that serves one sandbox: its
// slot first, then its request and the request's credential. It answers
// what it refuses, holding the slot while it does.
func (p *Proxy) admitOwn(c net.Conn, d *Decision, sb *sandboxState) (a admitted) {
	conn := sb.take(&sb.conns, p.cfg.MaxConns)
	if conn == nil {
		p.refuse(c, d, sb, p.tooManyConns(), "Retry-After", "1")
		return admitted{}
	}
	defer func() {
		if a.conn == nil {
			conn.release()
		}
	}()
	req, br, ref := p.readRequest(c, p.cfg.HeaderTimeout)
	switch {
	case req == nil && ref == nil:
		return admitted{} // the client closed without sending anything, or Serve is ending
	case ref != nil:
		if req != nil {
			d.Host = truncate(req.target, maxLoggedHost)
		}
		p.refuse(c, d, sb, ref)
		return admitted{}
	case !p.credentialOK(sb, req.header):
		d.Host = truncate(req.target, maxLoggedHost)
		p.refuse(c, d, sb, errNoCredential, "Proxy-Authenticate", `Basic realm="sandbox-mcp"`)
		return admitted{}
	}
	return admitted{sb: sb, conn: conn, req: req, br: br}
}

// admitShared admits a connection to the shared listener, where who is
// asking is known only from the request's credential: see authenticate.
// Then the connection takes a slot of the sandbox the credential names.
func (p *Proxy) admitShared(c net.Conn, d *Decision, s *served) admitted {
	req, br, sb := p.authenticate(c, d, s)
	if sb == nil {
		return admitted{}
	}
	d.Sandbox = sb.id
	conn := sb.take(&sb.conns, p.cfg.MaxConns)
	if conn == nil {
		p.refuse(c, d, sb, p.tooManyConns(), "Retry-After", "1")
		return admitted{}
	}
	return admitted{sb: sb, conn: conn, req: req, br: br}
}

// authenticate reads a shared listener's request and returns the sandbox
// its credential names, or nil after answering what it refuses. Until it
// returns, the connection is charged to its source address, under a bound
// of its own, with a short time to send its header; every answer given in
// this phase is given within that time too.
func (p *Proxy) authenticate(c net.Conn, d *Decision, s *served) (*request, *bufio.Reader, *sandboxState) {
	if !s.pending.take(d.Client, p.cfg.MaxPendingPerAddr, p.cfg.MaxPending) {
		return nil, nil, nil
	}
	defer s.pending.done(d.Client)
	authTimeout := min(p.cfg.AuthTimeout, p.cfg.HeaderTimeout)
	req, br, ref := p.readRequest(c, authTimeout)
	if req == nil && ref == nil {
		return nil, nil, nil
	}
	if ref != nil {
		if req != nil {
			d.Host = truncate(req.target, maxLoggedHost)
		}
		p.refuseWithin(c, d, s.sb, ref, authTimeout)
		return nil, nil, nil
	}
	owner := p.byCredential(req.header)
	if owner == nil {
		d.Host = truncate(req.target, maxLoggedHost)
		p.refuseWithin(c, d, s.sb, errNoCredential, authTimeout, "Proxy-Authenticate", `Basic realm="sandbox-mcp"`)
		return nil, nil, nil
	}
	return req, br, owner
}

// upstream is an allowed request's connection to its host, with one of the
// sandbox's tunnel slots held for it. close closes the connection and frees
// the slot; it may be called more than once.
type upstream struct {
	conn net.Conn
	raw  *meteredConn // intercepted: the metered connection under tls
	tls  *tls.Conn    // intercepted: the session with the host, its certificate verified
	slot *slot
}

func (u *upstream) close() {
	u.conn.Close()
	u.slot.release()
}

// connect decides a request and, if it is allowed, opens its upstream:
// for a host the proxy intercepts, a TLS session whose certificate was
// verified before the sandbox hears a 200 (a failure is a 502, never a
// tunnel without the check). On a refusal it holds nothing.
func (p *Proxy) connect(ctx context.Context, req *request, d *Decision, sb *sandboxState) (*upstream, *refusal, []string) {
	up, ref, extra := p.decide(ctx, req, d, sb)
	if ref != nil || !p.secrets.intercepts(d.Normalized, p.heldBy(sb.id)) {
		return up, ref, extra
	}
	up.raw = newMetered(up.conn, new(atomic.Int64))
	var err error
	if up.tls, err = p.upstreamTLS(ctx, up.raw, d.Normalized); err != nil {
		up.close()
		if ctx.Err() != nil {
			return nil, shuttingDown, nil
		}
		return nil, tlsRefusal(quote(d.Normalized+":"+strconv.Itoa(d.Port)), err), nil
	}
	return up, nil, nil
}

// tunnel serves an allowed request from its 200 on. It closes the upstream
// and frees its tunnel slot before it returns, so the caller records the
// close once the slot is free. A refusal is one given after the 200 (the
// ClientHello names another host), isTLS whether the client spoke TLS.
func (p *Proxy) tunnel(ctx context.Context, c net.Conn, up *upstream, early []byte, d *Decision, sb *sandboxState) (cl Close, ref *refusal, isTLS bool) {
	defer up.close()
	cl = Close{Sandbox: sb.id, Host: d.Normalized, Port: d.Port, Addr: d.Addr}
	start := time.Now()
	defer func() { cl.Duration = time.Since(start) }()
	c.SetWriteDeadline(time.Now().Add(p.cfg.HeaderTimeout))
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		p.logDecision(d)
		cl.Reason = CloseError
		if ctx.Err() != nil {
			cl.Reason = CloseCtx
		}
		return cl, nil, false
	}
	c.SetWriteDeadline(time.Time{})
	if up.tls != nil {
		p.logDecision(d)
		cl.Reason, cl.BytesUp, cl.BytesDown = p.serveIntercepted(ctx, c, early, up.tls, up.raw, d, sb)
		return cl, nil, false
	}

	// A tunnel that is not intercepted must be TLS to the host it was
	// allowed for, if it is TLS at all: the ClientHello's server name is
	// checked against the CONNECT target, and what was read is replayed.
	toUp, toClient, isTLS, ref, ended := p.checkHello(ctx, c, up.conn, early, d.Normalized, start)
	if ref != nil {
		return cl, ref, isTLS
	}
	p.logDecision(d)
	if ended != "" {
		// Nothing came from either side before the tunnel's idle time or
		// lifetime ran out, or Serve is ending.
		cl.Reason = ended
		return cl, nil, false
	}
	t := newTunnel(c, up.conn, p.cfg.IdleTimeout, p.cfg.MaxLifetime)
	t.start = start
	cl.Reason = t.run(ctx, toUp, toClient)
	cl.BytesUp, cl.BytesDown = t.up, t.down
	return cl, nil, false
}

// request is a parsed request line and header.
type request struct {
	method, target, proto string
	header                textproto.MIMEHeader
}

// readRequest reads one request header within timeout and
// MaxHeaderBytes. It returns (nil, nil, nil) if there is nothing to answer.
//
// It parses the request line itself, rather than with http.ReadRequest,
// so that the target reaches parseTarget exactly as sent: net/http turns
// "a:443@b:443" into host "b:443", and fails on other shapes with errors
// that do not say what to send instead.
func (p *Proxy) readRequest(c net.Conn, timeout time.Duration) (*request, *bufio.Reader, *refusal) {
	c.SetReadDeadline(time.Now().Add(timeout))
	lr := &limitReader{r: c, n: int64(p.cfg.MaxHeaderBytes) + readBufSize}
	br := bufio.NewReaderSize(lr, readBufSize)
	tp := textproto.NewReader(br)
	tooLarge := &refusal{http.StatusRequestHeaderFieldsTooLarge, fmt.Sprintf(
		"the request header is larger than %d bytes; send a shorter request", p.cfg.MaxHeaderBytes)}
	readErr := func(err error) *refusal {
		var ne net.Error
		switch {
		case lr.n <= 0 || errors.Is(err, errHeaderTooLarge):
			return tooLarge
		case errors.As(err, &ne) && ne.Timeout():
			return &refusal{http.StatusRequestTimeout, fmt.Sprintf(
				"the request header did not arrive within %v; send the whole request at once", timeout)}
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			return &refusal{http.StatusBadRequest, "the request header ended early; send a complete request"}
		default:
			return &refusal{http.StatusBadRequest, "malformed request header: " + quote(err.Error())}
		}
	}

	line, err := readLine(br)
	if err != nil {
		if lr.read == 0 && errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
			return nil, nil, nil
		}
		return nil, nil, readErr(err)
	}
	req := &request{}
	method, rest, ok := strings.Cut(line, " ")
	i := strings.LastIndexByte(rest, ' ')
	if !ok || i < 0 || method == "" {
		return nil, nil, &refusal{http.StatusBadRequest, fmt.Sprintf(
			`malformed request line %s; send "CONNECT host:port HTTP/1.1"`, quote(line))}
	}
	req.method, req.target, req.proto = method, rest[:i], rest[i+1:]
	if req.proto != "HTTP/1.1" && req.proto != "HTTP/1.0" {
		return req, nil, &refusal{http.StatusBadRequest, fmt.Sprintf(
			`unsupported protocol %s; this proxy speaks HTTP/1.1: send "CONNECT host:port HTTP/1.1"`, quote(req.proto))}
	}
	if req.header, err = tp.ReadMIMEHeader(); err != nil {
		if errors.Is(err, net.ErrClosed) {
			return nil, nil, nil
		}
		return req, nil, readErr(err)
	}
	if lr.read-int64(br.Buffered()) > int64(p.cfg.MaxHeaderBytes) {
		return req, nil, tooLarge
	}
	c.SetReadDeadline(time.Time{})
	return req, br, nil
}

// readLine reads the request line. Unlike textproto.Reader.ReadLine, it
// fails when the connection ends or times out before the line's '\n'
// rather than returning the fragment as if it were a whole line. Its length
// is bounded by the limitReader under br.
func readLine(br *bufio.Reader) (string, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		line = append(line, frag...)
		if err == nil {
			break
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return "", err
		}
	}
	line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r"))
	return string(line), nil
}

// decide checks a request and, if it is allowed, returns the upstream
// connection with one of the sandbox's tunnel slots held for it (and on a
// refusal holds none). It fills d
// as it goes. extra holds response headers for a refusal.
func (p *Proxy) decide(ctx context.Context, req *request, d *Decision, sb *sandboxState) (up *upstream, ref *refusal, extra []string) {
	d.Host = truncate(req.target, maxLoggedHost)
	if ok, wait := sb.allow(time.Now()); !ok {
		return nil, &refusal{http.StatusTooManyRequests, fmt.Sprintf(
			"this sandbox sends proxy requests faster than %v per second, the limit; slow down and retry", float64(p.cfg.Rate)),
		}, []string{"Retry-After", strconv.Itoa(retryAfterSeconds(wait))}
	}
	if req.method != http.MethodConnect {
		return nil, &refusal{http.StatusMethodNotAllowed, fmt.Sprintf(
			"this proxy only tunnels HTTPS with CONNECT (got %s); use an https:// URL, plain HTTP is refused", quote(req.method)),
		}, []string{"Allow", http.MethodConnect}
	}
	// A CONNECT request has no content (RFC 9110 9.3.6). "Content-Length: 0"
	// is tolerated, as some clients send it; anything else would leave body
	// bytes that are neither header nor tunnel.
	cl, te := req.header.Values("Content-Length"), req.header.Values("Transfer-Encoding")
	if len(te) > 0 || len(cl) > 1 || len(cl) == 1 && strings.TrimSpace(cl[0]) != "0" {
		return nil, &refusal{http.StatusBadRequest,
			"a CONNECT request must not have a body; remove the Content-Length or Transfer-Encoding header"}, nil
	}

	t, ref := parseTarget(req.target)
	d.Host, d.Port = t.host, t.port
	if ref != nil {
		return nil, ref, nil
	}
	d.Normalized = t.norm
	hostport := quote(t.norm + ":" + strconv.Itoa(t.port))
	rule, ref, unlisted := p.match(sb.id, t.norm, t.port)
	if ref != nil {
		d.Unlisted = unlisted
		return nil, ref, nil
	}
	d.Rule = rule

	tun := sb.take(&sb.tunnels, p.cfg.MaxTunnels)
	if tun == nil {
		return nil, &refusal{http.StatusTooManyRequests, fmt.Sprintf(
			"this sandbox already has %d open tunnels, the limit; close some connections and retry", p.cfg.MaxTunnels),
		}, []string{"Retry-After", "1"}
	}
	defer func() {
		if ref != nil {
			tun.release()
		}
	}()

	addr, ref := p.resolve(ctx, t.norm, t.port, d)
	if ref != nil {
		return nil, ref, nil
	}
	d.Addr = addr
	conn, err := p.dial(ctx, addr, t.port)
	if err != nil {
		return nil, p.dialRefusal(ctx, err, hostport, addr), nil
	}
	return &upstream{conn: conn, slot: tun}, nil, nil
}

// resolve looks the name up once and checks every answer. Policy for mixed
// answers: strict. If any address is refused, the request is refused, so a
// name that points partly inside never reaches anything. Otherwise the first
// address is the one dialled, and only that one: no fallback.
func (p *Proxy) resolve(ctx context.Context, name string, port int, d *Decision) (netip.Addr, *refusal) {
	lctx, cancel := context.WithTimeout(ctx, p.cfg.DNSTimeout)
	defer cancel()
	addrs, err := p.resolver.LookupNetIP(lctx, "ip", lookupName(name))
	d.Resolved = make([]netip.Addr, len(addrs))
	for i, a := range addrs {
		d.Resolved[i] = a.WithZone("")
	}
	if err != nil {
		var why string
		var dnsErr *net.DNSError
		switch {
		case ctx.Err() != nil:
			return netip.Addr{}, shuttingDown
		case lctx.Err() == context.DeadlineExceeded:
			why = fmt.Sprintf("the lookup timed out after %v; try again later", p.cfg.DNSTimeout)
		case errors.As(err, &dnsErr):
			why = dnsErr.Err
		default:
			why = "the lookup failed"
		}
		return netip.Addr{}, &refusal{http.StatusBadGateway, fmt.Sprintf("could not resolve %s: %s", quote(name), why)}
	}
	if len(addrs) == 0 {
		return netip.Addr{}, &refusal{http.StatusBadGateway, fmt.Sprintf("could not resolve %s: it has no addresses", quote(name))}
	}
	for _, a := range d.Resolved {
		// Resolvers return IPv4 addresses in IPv4-mapped form at times
		// (Go's reads /etc/hosts that way); what is checked and dialled is
		// the plain IPv4 address, which is what a mapped one reaches.
		a = a.Unmap()
		if why := p.checkAddr(a, uint16(port)); why != "" {
			d.Addr = a
			return netip.Addr{}, &refusal{http.StatusForbidden, fmt.Sprintf("%s resolved to %s", quote(name), why)}
		}
	}
	return d.Resolved[0].Unmap(), nil
}

// lookupName is the name given to the resolver. A name with a dot is looked
// up fully qualified ("api.example.com."), so resolv.conf search domains can
// never turn an allowed name into another one. A single-label name (say
// "localhost") is looked up as given: the operator listed it expecting
// /etc/hosts or the search list to complete it.
func lookupName(name string) string {
	if strings.Contains(name, ".") {
		return name + "."
	}
	return name
}

func (p *Proxy) dialRefusal(ctx context.Context, err error, hostport string, addr netip.Addr) *refusal {
	var denied *deniedError
	var ne net.Error
	switch {
	case errors.As(err, &denied):
		return &refusal{http.StatusForbidden, fmt.Sprintf("%s: %s", hostport, denied.reason)}
	case ctx.Err() != nil:
		return shuttingDown
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		return &refusal{http.StatusGatewayTimeout, fmt.Sprintf(
			"connecting to %s (%s) timed out after %v; the host may be down or unreachable", hostport, addr, p.cfg.ConnectTimeout)}
	default:
		return &refusal{http.StatusBadGateway, fmt.Sprintf("connecting to %s (%s) failed: %s", hostport, addr, quote(innermost(err)))}
	}
}

var shuttingDown = &refusal{http.StatusServiceUnavailable, "the proxy is shutting down; retry later"}

// innermost extracts the innermost error text ("connection refused")
// without the local addresses that *net.OpError includes.
func innermost(err error) string {
	for {
		u := errors.Unwrap(err)
		if u == nil {
			return err.Error()
		}
		err = u
	}
}

// refuse records the decision (aggregated with the sandbox's other
// refusals) and sends the refusal, then closes gracefully.
func (p *Proxy) refuse(c net.Conn, d *Decision, sb *sandboxState, ref *refusal, extra ...string) {
	p.refuseWithin(c, d, sb, ref, p.cfg.HeaderTimeout, extra...)
}

// refuseWithin is refuse, with the answer's write bounded by timeout.
func (p *Proxy) refuseWithin(c net.Conn, d *Decision, sb *sandboxState, ref *refusal, timeout time.Duration, extra ...string) {
	d.Status, d.Reason = ref.status, ref.reason
	p.recordRefusal(sb, d)
	c.SetWriteDeadline(time.Now().Add(timeout))
	if writeRefusal(c, ref.status, ref.reason, extra...) != nil {
		return
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	c.SetReadDeadline(time.Now().Add(min(lingerTimeout, timeout)))
	io.CopyN(io.Discard, c, maxLingerBytes)
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ", ")
}
