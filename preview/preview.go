// Package preview serves a sandbox's TCP port to a person's browser at an
// unguessable, expiring, revocable URL: /preview/<token>/... is proxied,
// HTTP/1.1 and WebSocket upgrades included, to the one port the preview
// names, through a dial function the caller supplies (the sandbox agent's
// port stream, so the sandbox needs no network and gains no way in).
//
// It knows net/http and nothing of MCP or of sandboxes: a preview is a
// token, an owner, a sandbox id, a port, a dial function and a channel that
// closes when the sandbox ends.
package preview

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults and bounds (docs/previews.md).
const (
	// DefaultTTL is how long a preview lives unless the operator sets
	// another (--preview-ttl).
	DefaultTTL = time.Hour
	// MaxTTL bounds any preview's life.
	MaxTTL = 24 * time.Hour
	// MaxConns bounds the connections to the sandbox's port one preview
	// holds at once (a browser opens about 6 per host, and each open
	// WebSocket holds one); a request past it waits up to connWait, then
	// gets 503.
	MaxConns = 32
	// MaxBytes bounds the bytes one preview relays in its life, both ways
	// together; past it the preview ends as if revoked.
	MaxBytes = 4 << 30
	// MaxPerSandbox bounds the previews open at once on one sandbox.
	MaxPerSandbox = 8
	// tokenBytes is the token's entropy: 256 bits from crypto/rand.
	tokenBytes = 32
	// Prefix is where previews are served.
	Prefix = "/preview/"
	// connWait is how long a request waits for a free connection.
	connWait = 10 * time.Second
	// dialTimeout bounds the connect inside the sandbox.
	dialTimeout = 5 * time.Second
)

// DialFunc opens a connection to port inside the sandbox.
type DialFunc func(ctx context.Context, port int) (net.Conn, error)

// Target is what a preview exposes.
type Target struct {
	Owner   string // the caller who exposed it ("" on stdio)
	Sandbox string
	Port    int
	// Path is where the URL points under the port's root ("" or "/...").
	Path string
	Dial DialFunc
	// Done closes when the sandbox ends; the preview ends with it.
	Done <-chan struct{}
}

// Info describes a preview.
type Info struct {
	Token   string
	URL     string // base URL + /preview/<token>/ + path
	Sandbox string
	Port    int
	Path    string // under the port's root, "/..."
	Created time.Time
	Expires time.Time
}

// Options configure a Registry.
type Options struct {
	// BaseURL is the scheme://host[:port] URLs start with.
	BaseURL string
	// TTL is a preview's life; 0 means DefaultTTL, and it is capped at
	// MaxTTL.
	TTL time.Duration
	// Logger gets a line per preview opened and ended. Nil discards.
	Logger *slog.Logger
}

// Registry holds the open previews and serves them (it is an
// http.Handler for Prefix).
type Registry struct {
	opts Options
	log  *slog.Logger

	mu     sync.Mutex
	byHash map[[32]byte]*entry // by the token's SHA-256: lookups leak no token timing
	closed bool
}

// entry is one open preview.
type entry struct {
	Info
	r     *Registry
	owner string
	hash  [32]byte
	dial  DialFunc
	proxy *httputil.ReverseProxy
	tr    *http.Transport
	slots chan struct{} // one per connection held
	bytes atomic.Int64

	ctx    context.Context // ends with the preview
	cancel context.CancelFunc
	once   sync.Once

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// New returns an empty registry.
func New(o Options) *Registry {
	if o.TTL <= 0 {
		o.TTL = DefaultTTL
	}
	o.TTL = min(o.TTL, MaxTTL)
	o.BaseURL = strings.TrimRight(o.BaseURL, "/")
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Registry{opts: o, log: log, byHash: make(map[[32]byte]*entry)}
}

// TTL is a preview's life.
func (r *Registry) TTL() time.Duration { return r.opts.TTL }

// ErrTooMany is Expose's error past MaxPerSandbox.
var ErrTooMany = fmt.Errorf("preview: a sandbox has at most %d previews open at once; revoke one first", MaxPerSandbox)

// ErrClosed is Expose's error once the registry is closed.
var ErrClosed = errors.New("preview: the server is stopping")

// Expose opens a preview of t, or, when owner already has one of that
// sandbox and port, returns it with its path set to t.Path and its life
// renewed: a URL a person opened keeps working.
func (r *Registry) Expose(t Target) (Info, error) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return Info{}, ErrClosed
	}
	n := 0
	for _, e := range r.byHash {
		if e.Sandbox != t.Sandbox || e.owner != t.Owner {
			continue
		}
		if e.Port == t.Port {
			e.Path = cleanPath(t.Path)
			e.URL = r.opts.BaseURL + Prefix + e.Token + e.Path
			e.Expires = now.Add(r.opts.TTL)
			e.renew(r)
			return e.Info, nil
		}
		n++
	}
	if n >= MaxPerSandbox {
		return Info{}, ErrTooMany
	}
	b := make([]byte, tokenBytes)
	rand.Read(b) // never fails (crypto/rand)
	token := base64.RawURLEncoding.EncodeToString(b)
	e := &entry{
		Info: Info{Token: token, Sandbox: t.Sandbox, Port: t.Port, Created: now, Expires: now.Add(r.opts.TTL)},
		r:    r, owner: t.Owner, hash: sha256.Sum256([]byte(token)), dial: t.Dial,
		slots: make(chan struct{}, MaxConns), conns: make(map[net.Conn]struct{}),
	}
	e.Path = cleanPath(t.Path)
	e.URL = r.opts.BaseURL + Prefix + token + e.Path
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.tr = &http.Transport{
		DialContext:           e.dialContext,
		MaxIdleConnsPerHost:   MaxConns,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 5 * time.Minute,
		DisableCompression:    true,
	}
	e.proxy = &httputil.ReverseProxy{
		Rewrite:   e.rewrite,
		Transport: e.tr,
		ErrorLog:  slog.NewLogLogger(r.log.Handler(), slog.LevelDebug),
		ErrorHandler: func(w http.ResponseWriter, req *http.Request, err error) {
			http.Error(w, fmt.Sprintf("the sandbox's port %d did not answer: %v", e.Port, errText(err)), http.StatusBadGateway)
		},
	}
	r.byHash[e.hash] = e
	e.renew(r)
	go func() {
		select {
		case <-t.Done:
			r.end(e, "the sandbox ended")
		case <-e.ctx.Done():
		}
	}()
	r.log.Info("preview opened", "sandbox", t.Sandbox, "port", t.Port, "expires", e.Expires.UTC().Format(time.RFC3339))
	return e.Info, nil
}

// renew (re)arms the preview's expiry. r.mu is held.
func (e *entry) renew(r *Registry) {
	exp := e.Expires
	time.AfterFunc(time.Until(exp), func() {
		r.mu.Lock()
		due := !e.Expires.After(exp) // not renewed since
		r.mu.Unlock()
		if due {
			r.end(e, "it expired")
		}
	})
}

// Revoke ends owner's previews of sandbox (port 0: every port) and
// returns how many there were.
func (r *Registry) Revoke(owner, sandbox string, port int) int {
	var ended []*entry
	r.mu.Lock()
	for _, e := range r.byHash {
		if e.owner == owner && e.Sandbox == sandbox && (port == 0 || e.Port == port) {
			ended = append(ended, e)
		}
	}
	r.mu.Unlock()
	for _, e := range ended {
		r.end(e, "it was revoked")
	}
	return len(ended)
}

// List returns owner's previews of sandbox.
func (r *Registry) List(owner, sandbox string) []Info {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Info
	for _, e := range r.byHash {
		if e.owner == owner && e.Sandbox == sandbox {
			out = append(out, e.Info)
		}
	}
	return out
}

// Close ends every preview.
func (r *Registry) Close() {
	r.mu.Lock()
	r.closed = true
	var all []*entry
	for _, e := range r.byHash {
		all = append(all, e)
	}
	r.mu.Unlock()
	for _, e := range all {
		r.end(e, "the server is stopping")
	}
}

// end removes a preview and closes every connection it holds.
func (r *Registry) end(e *entry, why string) {
	e.once.Do(func() {
		r.mu.Lock()
		delete(r.byHash, e.hash)
		r.mu.Unlock()
		e.cancel()
		e.mu.Lock()
		conns := make([]net.Conn, 0, len(e.conns))
		for c := range e.conns {
			conns = append(conns, c)
		}
		e.mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
		e.tr.CloseIdleConnections()
		r.log.Info("preview ended", "sandbox", e.Sandbox, "port", e.Port, "why", why, "bytes", e.bytes.Load())
	})
}

// lookup finds the live preview of token.
func (r *Registry) lookup(token string) *entry {
	h := sha256.Sum256([]byte(token))
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.byHash[h]
	if e == nil || !time.Now().Before(e.Expires) {
		return nil
	}
	return e
}

// notFound is the one answer to a token that is wrong, expired, revoked or
// of an ended sandbox: the same status and body, so a prober learns nothing.
func notFound(w http.ResponseWriter) {
	w.Header().Set("Cache-Control", "no-store")
	http.Error(w, "404 page not found", http.StatusNotFound)
}

// ServeHTTP serves /preview/<token>/...
func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	rest, ok := strings.CutPrefix(req.URL.Path, Prefix)
	if !ok {
		notFound(w)
		return
	}
	token, sub, slash := strings.Cut(rest, "/")
	e := r.lookup(token)
	if e == nil {
		notFound(w)
		return
	}
	if !slash {
		// Relative links resolve under the token only with the slash.
		http.Redirect(w, req, Prefix+token+"/", http.StatusFound)
		return
	}
	w.Header().Set("Referrer-Policy", "no-referrer") // the token stays off other sites' logs
	if isUpgrade(req) {
		// An upgraded connection lives past the listener's request
		// timeouts; the preview's own end closes it.
		rc := http.NewResponseController(w)
		rc.SetReadDeadline(time.Time{})
		rc.SetWriteDeadline(time.Time{})
	}
	ctx, cancel := context.WithCancel(req.Context())
	defer cancel()
	stop := context.AfterFunc(e.ctx, cancel)
	defer stop()
	out := req.Clone(ctx)
	out.URL.Path = "/" + sub
	out.URL.RawPath = ""
	if raw := req.URL.RawPath; raw != "" {
		if _, s, ok := strings.Cut(strings.TrimPrefix(raw, Prefix), "/"); ok {
			out.URL.RawPath = "/" + s
		}
	}
	e.proxy.ServeHTTP(w, out)
}

func isUpgrade(r *http.Request) bool {
	return r.Header.Get("Upgrade") != "" && strings.Contains(strings.ToLower(r.Header.Get("Connection")), "upgrade")
}

// rewrite points a request at the preview's port, whatever its Host or
// URL said: only that port is ever dialled (dialContext ignores the
// address too).
func (e *entry) rewrite(pr *httputil.ProxyRequest) {
	target := &url.URL{Scheme: "http", Host: fmt.Sprintf("localhost:%d", e.Port)}
	pr.Out.URL.Scheme, pr.Out.URL.Host = target.Scheme, target.Host
	pr.Out.Host = target.Host // dev servers check Host against localhost
	pr.Out.Header.Del("Authorization")
	pr.Out.Header.Del("Cookie") // the server's origin's cookies are not the sandbox's
	pr.SetXForwarded()
}

// dialContext opens a connection to the preview's port, within the
// preview's connection bound, counted against its byte bound.
func (e *entry) dialContext(ctx context.Context, _, _ string) (net.Conn, error) {
	wait := time.NewTimer(connWait)
	defer wait.Stop()
	select {
	case e.slots <- struct{}{}:
	case <-wait.C:
		return nil, fmt.Errorf("the preview holds %d connections already", MaxConns)
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-e.ctx.Done():
		return nil, errors.New("the preview ended")
	}
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	nc, err := e.dial(dctx, e.Port)
	if err != nil {
		<-e.slots
		return nil, err
	}
	c := &countedConn{Conn: nc, e: e}
	e.mu.Lock()
	if e.ctx.Err() != nil {
		e.mu.Unlock()
		c.Close()
		return nil, errors.New("the preview ended")
	}
	e.conns[c] = struct{}{}
	e.mu.Unlock()
	return c, nil
}

// countedConn counts a connection's bytes against its preview's bound and
// gives its slot back when closed.
type countedConn struct {
	net.Conn
	e    *entry
	once sync.Once
}

func (c *countedConn) count(n int) error {
	if c.e.bytes.Add(int64(n)) > MaxBytes {
		go c.e.endOver()
		return fmt.Errorf("the preview relayed its %d bytes", int64(MaxBytes))
	}
	return nil
}

func (c *countedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if cerr := c.count(n); cerr != nil && err == nil {
		err = cerr
	}
	return n, err
}

func (c *countedConn) Write(p []byte) (int, error) {
	if err := c.count(len(p)); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}

// CloseWrite passes a half-close on when the stream has one.
func (c *countedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.e.mu.Lock()
		delete(c.e.conns, c)
		c.e.mu.Unlock()
		<-c.e.slots
	})
	return err
}

// endOver ends a preview past its byte bound.
func (e *entry) endOver() { e.r.end(e, "it relayed its byte bound") }

func cleanPath(p string) string {
	p = strings.TrimLeft(p, "/")
	return "/" + p
}

func errText(err error) string {
	s := err.Error()
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

var _ io.Closer = (*countedConn)(nil)
