// Package httpguard checks every request to the streamable HTTP transport
// before the go-sdk's handler sees it, so the server is safe to put on a
// network.
//
// A request to /mcp passes, in order: the Host allowlist (403), the Origin
// allowlist (403), the bearer token (401), a session id this process holds
// (404, the body unread), for a POST the admission of its body into the
// server's in-flight memory budget before it is read (413, 429, 503; see
// body.go), then, for a request that may open a session, the session caps
// (503 for --max-sandboxes, 429 for --max-sandboxes-per-caller, which cap sessions too), and for a
// DELETE, the removal of the session's sandbox, before the go-sdk's handler
// sees it. Inside the SDK, a caller's
// tool calls and resource reads in flight are capped
// (--max-calls-per-caller), and the calls a POST carried end when its
// client drops it (see abandon.go). /healthz answers probes without any of
// that and says nothing but "ok".
//
// It knows the MCP SDK and net/http, not the tools or the sandboxes: a
// DELETE ends its session through the Sessions it is given.
package httpguard

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

const (
	// Path is where MCP is served.
	Path = "/mcp"
	// retryAfter is what a client refused for a session cap is told to
	// wait.
	retryAfter = 30 * time.Second
	// bearerChallenge is the WWW-Authenticate value of every 401.
	bearerChallenge = `Bearer realm="sandbox-mcp"`
)

// Options configure a Guard. Messages name the server's flags, so an
// operator knows what to change.
type Options struct {
	// Addr is the listen address as configured (--http), whose host name,
	// if any, is a name the server answers to.
	Addr string
	// Listen is the address listened on. An unspecified address (every
	// interface) makes every local address a name of the server.
	Listen *net.TCPAddr
	// Tokens are the accepted bearer tokens, each a distinct caller. None
	// means no authentication (for a loopback listener only; the caller
	// checks that). They are secret: never logged.
	Tokens []string
	// AllowOrigins are the Origin values accepted besides the server's own,
	// as scheme://host[:port].
	AllowOrigins []string
	// AllowHosts are the Host names served besides loopback names and the
	// listen address.
	AllowHosts []string
	// MaxSessions caps the MCP sessions alive at once (503 beyond it).
	MaxSessions int
	// SessionsPerCaller caps the sessions one caller holds (429 beyond it).
	SessionsPerCaller int
	// CallsPerCaller caps the tool calls and resource reads one caller has
	// in flight (BUSY beyond it).
	CallsPerCaller int
	// MaxRequestBytes caps a request body (see MaxRequestBody).
	MaxRequestBytes int64
	// IdleTimeout ends a session idle that long; 0 means never. It is
	// passed to the SDK and named in refusals.
	IdleTimeout time.Duration
	// ReserveBody, if set, admits a POST body of n bytes of caller into
	// the server's in-flight memory budget, the one tool calls use, before
	// any byte of it is read (see body.go). Nil admits every body.
	ReserveBody func(ctx context.Context, caller string, n int64, wait time.Duration) (BodyHold, error)
	// Preview, if set, serves previews at PreviewPrefix behind the Host
	// and Origin checks (no bearer token: the URL is the credential).
	Preview http.Handler
	// Logger gets a line per refused request. Nil discards them.
	Logger *slog.Logger
}

// PreviewPrefix is where previews are served (package preview's Prefix).
const PreviewPrefix = "/preview/"

// BodyHold is the part of the memory budget a request body holds.
type BodyHold interface {
	// Resize makes the hold n bytes, taking more only if it fits now.
	Resize(n int64) error
	// Release gives the hold back.
	Release()
}

// Sessions ends an HTTP session's sandbox on DELETE (tools.Sessions is
// one). End reports whether the session had one and belonged to owner.
type Sessions interface {
	End(sessionID, owner string) bool
}

// OwnerOf names the caller of a request: the id the bearer token maps to,
// or "" when the server runs without tokens (on loopback, for the local
// user).
func OwnerOf(extra *mcp.RequestExtra) string {
	if extra == nil || extra.TokenInfo == nil {
		return ""
	}
	return extra.TokenInfo.UserID
}

// CallerID derives a caller's id from its token: stable across restarts
// (snapshots keep their owner), never the token itself.
func CallerID(token string) string {
	sum := sha256.Sum256([]byte("sandbox-mcp caller\x00" + token))
	return "caller-" + hex.EncodeToString(sum[:8])
}

// credential is one accepted token, kept only as a digest.
type credential struct {
	sum    [sha256.Size]byte
	caller string
}

// Guard checks every request to /mcp before the SDK's handler sees it.
type Guard struct {
	hosts   map[string]bool // normalized Host names served
	origins map[string]bool // normalized extra origins allowed
	tokens  []credential    // none: no authentication (loopback only)
	maxBody int64
	idle    time.Duration // --idle-timeout, for messages
	reserve func(ctx context.Context, caller string, n int64, wait time.Duration) (BodyHold, error)

	sessions Sessions
	server   *mcp.Server // its sessions are the ones this process holds
	quota    *sessionQuota
	posts    *posts       // the POSTs being served, whose calls end with them
	mcp      http.Handler // the SDK's streamable handler, with sessions (MCP 2025-11-25 and older)
	// stateless is the SDK's stateless handler (MCP 2026-07-28 and later),
	// over the same server: each request on a session of its own that
	// ends with it.
	stateless http.Handler
	preview   http.Handler // previews, or nil
	authed    http.Handler // token check, then serveMCP
	log       *slog.Logger
}

// New builds the request checks for server, and adds the per-caller call
// cap and the session accounting to server as middleware. sessions may be
// nil when no DELETE is to end a sandbox.
func New(o Options, server *mcp.Server, sessions Sessions) (*Guard, error) {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g := &Guard{
		maxBody:  o.MaxRequestBytes,
		idle:     o.IdleTimeout,
		reserve:  o.ReserveBody,
		sessions: sessions,
		server:   server,
		quota:    newSessionQuota(server, o.MaxSessions, o.SessionsPerCaller),
		posts:    newPosts(),
		log:      log,
	}
	server.AddReceivingMiddleware(g.quota.noteSession, newCallQuota(o.CallsPerCaller, log).limit, g.posts.watch)
	hosts, origins, err := namesOf(o)
	if err != nil {
		return nil, err
	}
	g.hosts, g.origins = hosts, origins
	g.preview = o.Preview
	seen := map[string]bool{}
	for _, t := range o.Tokens {
		if !seen[t] {
			seen[t] = true
			g.tokens = append(g.tokens, credential{sum: sha256.Sum256([]byte(t)), caller: CallerID(t)})
		}
	}
	g.mcp = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{
		Logger:              log,
		SessionTimeout:      o.IdleTimeout,
		MaxRequestBodyBytes: g.maxBody,
		// The guard's Host allowlist covers every listener; the SDK's
		// own check covers loopback listeners only, and would refuse a
		// reverse proxy on the same machine.
		DisableLocalhostProtection: true,
	})
	g.stateless = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{
		Stateless:                  true,
		Logger:                     log,
		MaxRequestBodyBytes:        g.maxBody,
		DisableLocalhostProtection: true, // as above
	})
	g.authed = auth.RequireBearerToken(g.verify, &auth.RequireBearerTokenOptions{
		// Static tokens do not expire: an operator revokes one by
		// restarting the server without it.
		AllowMissingExpiration: true,
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Del("WWW-Authenticate") // set for the token check's 401 only
		g.serveMCP(w, r)
	}))
	return g, nil
}

// namesOf returns the Host names and the extra origins a listener of o
// answers to.
func namesOf(o Options) (hosts, origins map[string]bool, err error) {
	hosts = map[string]bool{"localhost": true, "127.0.0.1": true, "::1": true}
	origins = map[string]bool{}
	addr := o.Listen
	names := append([]string{addr.IP.String()}, o.AllowHosts...)
	if host, _, err := net.SplitHostPort(o.Addr); err == nil && host != "" {
		names = append(names, host)
	}
	if addr.IP.IsUnspecified() {
		// Listening everywhere: every local address is a name of this
		// server. (An address literal is no rebinding vector anyway.)
		ifaddrs, err := net.InterfaceAddrs()
		if err != nil {
			return nil, nil, fmt.Errorf("--http %s: list local addresses: %w", o.Addr, err)
		}
		for _, a := range ifaddrs {
			if ipn, ok := a.(*net.IPNet); ok {
				names = append(names, ipn.IP.String())
			}
		}
	}
	for _, n := range names {
		h, err := NormalizeHostName(n)
		if err != nil {
			return nil, nil, fmt.Errorf("--http-allow-host %q: %w", n, err)
		}
		hosts[h] = true
	}
	for _, origin := range o.AllowOrigins {
		n, err := NormalizeOrigin(origin)
		if err != nil {
			return nil, nil, fmt.Errorf("--allow-origin %q: %w", origin, err)
		}
		origins[n] = true
	}
	return hosts, origins, nil
}

// PreviewHandler returns h behind the Host and Origin checks of a listener
// of o (--preview-listen): the checks /mcp gets, without the bearer token,
// since a person's browser has none (a preview's URL is its own
// credential).
func PreviewHandler(o Options, h http.Handler) (http.Handler, error) {
	hosts, origins, err := namesOf(o)
	if err != nil {
		return nil, err
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g := &Guard{hosts: hosts, origins: origins, log: log}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { g.servePreview(w, r, h) }), nil
}

// servePreview serves a preview request after the Host and Origin checks.
func (g *Guard) servePreview(w http.ResponseWriter, r *http.Request, h http.Handler) {
	if !g.hostAllowed(r.Host) {
		g.refuse(w, r, http.StatusForbidden, fmt.Sprintf("Host %q is not a name this server answers to (DNS rebinding protection); its operator can add it with --http-allow-host", r.Host))
		return
	}
	if origins := r.Header.Values("Origin"); len(origins) > 0 && !g.originAllowed(origins, r.Host) {
		g.refuse(w, r, http.StatusForbidden, fmt.Sprintf("Origin %q may not reach this server; its operator can allow it with --allow-origin", strings.Join(origins, ", ")))
		return
	}
	h.ServeHTTP(w, r)
}

// Callers returns the number of distinct callers (tokens) accepted.
func (g *Guard) Callers() int { return len(g.tokens) }

// MaxBody returns the cap on a request body.
func (g *Guard) MaxBody() int64 { return g.maxBody }

// Handler returns the server's handler: /mcp behind the guard, and /healthz.
func (g *Guard) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		io.WriteString(w, "ok\n")
	})
	mux.Handle(Path, g)
	if g.preview != nil {
		mux.HandleFunc(PreviewPrefix, func(w http.ResponseWriter, r *http.Request) { g.servePreview(w, r, g.preview) })
	}
	return mux
}

// ServeHTTP checks Host, Origin and the bearer token, in that order.
func (g *Guard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !g.hostAllowed(r.Host) {
		g.refuse(w, r, http.StatusForbidden, fmt.Sprintf("Host %q is not a name this server answers to (DNS rebinding protection); its operator can add it with --http-allow-host", r.Host))
		return
	}
	if origins := r.Header.Values("Origin"); len(origins) > 0 && !g.originAllowed(origins, r.Host) {
		g.refuse(w, r, http.StatusForbidden, fmt.Sprintf("Origin %q may not call this server; its operator can allow it with --allow-origin", strings.Join(origins, ", ")))
		return
	}
	if len(g.tokens) == 0 {
		g.serveMCP(w, r)
		return
	}
	w.Header().Set("WWW-Authenticate", bearerChallenge)
	if n := len(r.Header.Values("Authorization")); n != 1 {
		g.refuse(w, r, http.StatusUnauthorized, "this server needs exactly one header \"Authorization: Bearer <token>\" (tokens in the URL are not accepted)")
		return
	}
	g.authed.ServeHTTP(w, r)
}

// verify is the token check: the presented token's digest is compared in
// constant time with every accepted one.
func (g *Guard) verify(_ context.Context, token string, r *http.Request) (*auth.TokenInfo, error) {
	sum := sha256.Sum256([]byte(token))
	caller := ""
	for _, c := range g.tokens {
		if subtle.ConstantTimeCompare(sum[:], c.sum[:]) == 1 {
			caller = c.caller
		}
	}
	if caller == "" {
		g.log.Info("http request refused", "status", http.StatusUnauthorized, "reason", "unknown bearer token", "remote", r.RemoteAddr)
		return nil, fmt.Errorf("%w: this server does not accept that bearer token", auth.ErrInvalidToken)
	}
	return &auth.TokenInfo{UserID: caller}, nil
}

// sessionlessSince is the first MCP version without protocol sessions
// (SEP-2567), served by the stateless handler.
const sessionlessSince = "2026-07-28"

// Sessionless reports whether a request is for the stateless handler: its
// MCP-Protocol-Version header names 2026-07-28 or later. Clients of those
// versions send the header on every request (the go-sdk's sets it from
// each message's _meta, server/discover included), and the SDK refuses a
// request whose _meta names a version its header does not; a request
// without the header is an older client's, or an initialize.
func Sessionless(r *http.Request) bool {
	return r.Header.Get("MCP-Protocol-Version") >= sessionlessSince
}

// serveMCP hands an authenticated request to the SDK: one of MCP
// 2026-07-28 to the stateless handler once its body is admitted, any
// other to the handler with sessions, after admitting a request that may
// open a session under the session caps, and ending a deleted session's
// calls.
func (g *Guard) serveMCP(w http.ResponseWriter, r *http.Request) {
	caller := ""
	if ti := auth.TokenInfoFromContext(r.Context()); ti != nil {
		caller = ti.UserID
	}
	if Sessionless(r) {
		// No session to look up, open or end: GET and DELETE get 405
		// from the SDK (the revision has no standalone stream and no
		// session to delete).
		if r.Method == http.MethodPost {
			admitted, release, ok := g.admitBody(w, r, caller)
			if !ok {
				return
			}
			defer release()
			r = admitted
		}
		r, served := g.posts.tag(r)
		defer served()
		g.stateless.ServeHTTP(w, r)
		return
	}
	id := r.Header.Get("Mcp-Session-Id")
	if (r.Method == http.MethodPost || r.Method == http.MethodGet) && id != "" && !g.holds(id) {
		// A session this process does not hold: made by a server
		// (replica) that is gone or restarted, or by another replica
		// the request was routed away from, or made up. 404 makes
		// clients start a new session (the MCP rule for an ended
		// session); the body says what happened and what survives. The
		// request's body is not read: it is refused before it costs
		// anything (so the error cannot name the request's id).
		g.refuse(w, r, http.StatusNotFound, "UNAVAILABLE: this server does not hold that MCP session: "+
			"the server or replica that made it has restarted or is gone, and the session's sandbox with it "+
			"(or a load balancer sent the request to another replica: route each session to one replica). "+
			"Start a new session (initialize again); snapshots you made are kept, and sandbox_restore brings one back")
		return
	}
	if r.Method == http.MethodPost {
		admitted, release, ok := g.admitBody(w, r, caller)
		if !ok {
			return
		}
		defer release()
		r = admitted
	}
	switch {
	case r.Method == http.MethodDelete && id != "":
		// The SDK's DELETE waits for the session's calls to return:
		// remove the sandbox first, which ends them. Another caller's
		// session is left to the SDK, which answers 403.
		if g.sessions != nil && g.sessions.End(id, caller) {
			g.log.Info("session deleted: its sandbox was removed", "session", id)
		}
	case r.Method == http.MethodPost && id == "":
		// The one request from which the SDK makes a session (it looks
		// the header up the same way), whatever its body holds.
		admitted, done, refused := g.quota.admit(r, caller)
		if refused != nil {
			w.Header().Set("Retry-After", strconv.Itoa(int(retryAfter.Seconds())))
			idle := "sessions idle for " + g.idle.String() + " end by themselves"
			if g.idle <= 0 {
				idle = "idle sessions never end (--idle-timeout 0)"
			}
			g.refuse(w, r, refused.status, fmt.Sprintf("BUSY: %s; retry in %s, or end a session you no longer use (HTTP DELETE); %s",
				refused.msg, retryAfter, idle))
			return
		}
		defer done()
		r = admitted
	}
	r, served := g.posts.tag(r)
	defer served()
	g.mcp.ServeHTTP(w, r)
}

// hostAllowed reports whether a Host header names this server.
func (g *Guard) hostAllowed(host string) bool {
	h, err := NormalizeHostName(host)
	return err == nil && g.hosts[h]
}

// originAllowed reports whether the Origin header values admit a request:
// exactly one, and either on the allowlist or the server's own origin
// (scheme://Host, the Host having passed its check). "null" never passes.
func (g *Guard) originAllowed(values []string, host string) bool {
	if len(values) != 1 {
		return false
	}
	o, err := NormalizeOrigin(values[0])
	if err != nil {
		return false
	}
	if g.origins[o] {
		return true
	}
	_, rest, _ := strings.Cut(o, "://")
	return rest == strings.ToLower(host)
}

// listed reports whether origin is on --allow-origin.
func (g *Guard) listed(origin string) bool {
	o, err := NormalizeOrigin(origin)
	return err == nil && g.origins[o]
}

// refuse answers a request the guard stops, with a JSON-RPC error body
// (no id: the request was not read) that says what to do, and logs it
// without any header value but the remote address.
func (g *Guard) refuse(w http.ResponseWriter, r *http.Request, status int, msg string) {
	g.log.Info("http request refused", "status", status, "method", r.Method, "remote", r.RemoteAddr, "reason", msg)
	type rpcError struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	id := json.RawMessage("null")
	body, err := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   rpcError        `json:"error"`
	}{"2.0", id, rpcError{-32000, "sandbox-mcp: " + msg}})
	if err != nil {
		http.Error(w, msg, status)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
}

// holds reports whether the MCP session id is one this process serves.
func (g *Guard) holds(id string) bool {
	if id == "" {
		return false // the stateless handler's sessions have none
	}
	for ss := range g.server.Sessions() {
		if ss.ID() == id {
			return true
		}
	}
	return false
}

// MaxRequestBody returns the cap on an HTTP request body: large enough for
// a sandbox_write_file of maxFileBytes sent as base64 (4 bytes per 3), with
// room for escaped slashes and the JSON-RPC envelope, and no larger.
func MaxRequestBody(maxFileBytes int64) int64 {
	b64 := (maxFileBytes + 2) / 3 * 4
	return b64 + b64/32 + 1<<20
}

// NormalizeOrigin returns an allowed origin in the form browsers send:
// lower-case scheme://host[:port], the default port dropped.
func NormalizeOrigin(o string) (string, error) {
	if o == "null" || o == "*" {
		return "", errors.New(`it would let any web page (or a sandboxed frame) drive this server; list each origin as scheme://host[:port]`)
	}
	u, err := url.Parse(o)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return "", errors.New("want scheme://host[:port], e.g. https://tools.example.com")
	}
	host := strings.ToLower(u.Host)
	if p := u.Port(); (u.Scheme == "http" && p == "80") || (u.Scheme == "https" && p == "443") {
		host = strings.ToLower(u.Hostname())
		if strings.Contains(host, ":") {
			host = "[" + host + "]"
		}
	}
	return strings.ToLower(u.Scheme) + "://" + host, nil
}

// NormalizeHostName returns the host of a Host header value or of an
// --http-allow-host entry: lower case, no port, no brackets, no final dot.
// Ports are not compared: a rebinding attack differs in the name.
func NormalizeHostName(h string) (string, error) {
	if h == "" || strings.ContainsAny(h, "/@?# \t") {
		return "", errors.New("want a host name or address, e.g. mcp.example.com")
	}
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	}
	h = strings.TrimSuffix(strings.ToLower(strings.Trim(h, "[]")), ".")
	if h == "" {
		return "", errors.New("want a host name or address, e.g. mcp.example.com")
	}
	return h, nil
}
