package main

// The streamable HTTP transport: many clients at once, each MCP session with
// its own sandbox, safe to put on a network.
//
// A request to /mcp passes, in order: the Host allowlist (403), the Origin
// allowlist (403), the bearer token (401), then, for a request that may open
// a session, the session caps (503 for --max-sessions, 429 for
// --max-sessions-per-caller), and for a DELETE, the removal of the session's
// sandbox, before the go-sdk's handler sees it. Inside the SDK, a caller's
// tool calls and resource reads in flight are capped
// (--max-calls-per-caller), and the calls a POST carried end when its
// client drops it (see http_abandon.go). /healthz answers probes without any of that and
// says nothing but "ok".

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/tools"
)

// Limits of the HTTP server. A request's whole header must arrive within
// httpReadHeaderTimeout (slow-header clients are cut off), and its body
// within httpReadTimeout: net/http clears that deadline once the body is
// read, so long calls and event streams are not cut. Responses have no
// deadline, since a command may run for --max-exec-timeout.
const (
	httpReadHeaderTimeout = 10 * time.Second
	httpReadTimeout       = 60 * time.Second
	httpIdleTimeout       = 120 * time.Second
	httpMaxHeaderBytes    = 64 << 10
	// httpDrainTimeout bounds the wait for connections to go idle at
	// shutdown, once every call has been ended.
	httpDrainTimeout = 10 * time.Second
	// retryAfter is what a client refused for a session cap is told to
	// wait.
	retryAfter = 30 * time.Second
	// bearerChallenge is the WWW-Authenticate value of every 401.
	bearerChallenge = `Bearer realm="sandbox-mcp"`
	// mcpPath is where MCP is served.
	mcpPath = "/mcp"
)

// maxRequestBody returns the cap on an HTTP request body: large enough for
// a sandbox_write_file of maxFileBytes sent as base64 (4 bytes per 3), with
// room for escaped slashes and the JSON-RPC envelope, and no larger.
func maxRequestBody(maxFileBytes int64) int64 {
	b64 := (maxFileBytes + 2) / 3 * 4
	return b64 + b64/32 + 1<<20
}

// serveHTTP serves MCP over streamable HTTP on cfg.HTTP.Addr until a
// signal arrives; then it stops accepting, ends every call, removes every
// sandbox and returns within a bounded time.
func serveHTTP(ctx context.Context, cfg Config, log *slog.Logger, audit *tools.AuditLog) error {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	ln, err := net.Listen("tcp", cfg.HTTP.Addr)
	if err != nil {
		return fmt.Errorf("--http %s: %w", cfg.HTTP.Addr, err)
	}
	defer ln.Close()
	addr := ln.Addr().(*net.TCPAddr)
	if !addr.IP.IsLoopback() && len(cfg.HTTP.Tokens) == 0 {
		return fmt.Errorf("--http %s listens on %s, which other machines and containers can reach, and no --token is set: "+
			"anyone who reaches the port could run code here. Set --token (or %s) to a secret of at least %d characters "+
			"(e.g. `openssl rand -hex 32`), or listen on 127.0.0.1", cfg.HTTP.Addr, addr, EnvVar("token"), MinTokenLength)
	}
	if addr.IP.IsUnspecified() {
		log.Warn("listening on every interface, the Docker bridges included: sandboxes on a network can reach this port (they still need a token). Prefer one address, e.g. --http 192.0.2.10:8080",
			"addr", addr.String())
	}

	// No tunnel may lead back to this listener.
	m, release, err := newManager(ctx, cfg, log, audit, addr.AddrPort())
	if err != nil {
		return err
	}
	defer release()
	logPolicy(log, cfg)
	sessions := tools.NewSessions(m)
	sessions.OwnerOf = ownerOf
	server := newServer(cfg, m, sessions, log, audit)
	g, err := newGuard(cfg, addr, server, sessions, log)
	if err != nil {
		cctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		m.Close(cctx)
		return err
	}
	srv := &http.Server{
		Handler:           g.routes(),
		ReadHeaderTimeout: httpReadHeaderTimeout,
		ReadTimeout:       httpReadTimeout,
		IdleTimeout:       httpIdleTimeout,
		MaxHeaderBytes:    httpMaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("serving MCP over streamable HTTP", "url", "http://"+addr.String()+mcpPath,
		"callers", len(g.tokens), "allow_origin", strings.Join(cfg.HTTP.AllowOrigins, ","),
		"http_allow_host", strings.Join(cfg.HTTP.AllowHosts, ","), "max_sessions", cfg.HTTP.MaxSessions,
		"max_sessions_per_caller", cfg.HTTP.SessionsPerCaller(), "max_calls_per_caller", cfg.HTTP.CallsPerCaller(),
		"max_request_bytes", g.maxBody, "idle_timeout", cfg.IdleTimeout)

	select {
	case <-ctx.Done():
	case err := <-served:
		// Serve failed on its own: still remove every sandbox.
		cctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		if cerr := m.Close(cctx); cerr != nil {
			log.Warn("removing sandboxes at exit", "err", cerr)
		}
		return fmt.Errorf("--http %s: %w", cfg.HTTP.Addr, err)
	}
	stop()
	log.Info("shutting down: refusing new connections, ending calls, removing sandboxes")
	start := time.Now()

	// Stop accepting at once; connections drain while the calls are ended.
	dctx, dcancel := context.WithTimeout(context.Background(), httpDrainTimeout)
	defer dcancel()
	drained := make(chan error, 1)
	go func() { drained <- srv.Shutdown(dctx) }()

	// The SDK closes a session only when its calls return, so end the
	// calls first: removing the sandboxes cancels them.
	cctx, ccancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer ccancel()
	if err := m.Close(cctx); err != nil {
		log.Warn("removing sandboxes at exit", "err", err)
	}
	closeSessions(cctx, server)
	if err := <-drained; err != nil {
		srv.Close() // what did not drain in time is cut
	}
	log.Info("sandbox-mcp stopped", "shutdown_ms", time.Since(start).Milliseconds())
	return nil
}

// closeSessions closes every MCP session (ending their event streams),
// giving up at ctx's end.
func closeSessions(ctx context.Context, server *mcp.Server) {
	var wg sync.WaitGroup
	for ss := range server.Sessions() {
		wg.Go(func() { _ = ss.Close() })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// ownerOf names the caller of a request: the id the bearer token maps to,
// or "" when the server runs without tokens (on loopback, for the local
// user).
func ownerOf(extra *mcp.RequestExtra) string {
	if extra == nil || extra.TokenInfo == nil {
		return ""
	}
	return extra.TokenInfo.UserID
}

// callerID derives a caller's id from its token: stable across restarts
// (snapshots keep their owner), never the token itself.
func callerID(token string) string {
	sum := sha256.Sum256([]byte("sandbox-mcp caller\x00" + token))
	return "caller-" + hex.EncodeToString(sum[:8])
}

// credential is one accepted token, kept only as a digest.
type credential struct {
	sum    [sha256.Size]byte
	caller string
}

// guard checks every request to /mcp before the SDK's handler sees it.
type guard struct {
	hosts   map[string]bool // normalized Host names served
	origins map[string]bool // normalized extra origins allowed
	tokens  []credential    // none: no authentication (loopback only)
	maxBody int64
	idle    time.Duration // --idle-timeout, for messages

	sessions *tools.Sessions
	server   *mcp.Server // its sessions are the ones this process holds
	quota    *sessionQuota
	posts    *posts       // the POSTs being served, whose calls end with them
	mcp      http.Handler // the SDK's streamable handler
	authed   http.Handler // token check, then serveMCP
	log      *slog.Logger
}

// newGuard builds the request checks for a server listening on addr.
func newGuard(cfg Config, addr *net.TCPAddr, server *mcp.Server, sessions *tools.Sessions, log *slog.Logger) (*guard, error) {
	g := &guard{
		hosts:    map[string]bool{"localhost": true, "127.0.0.1": true, "::1": true},
		origins:  map[string]bool{},
		maxBody:  maxRequestBody(cfg.Policy.MaxFileBytes),
		idle:     cfg.IdleTimeout,
		sessions: sessions,
		server:   server,
		quota:    newSessionQuota(server, cfg.HTTP.MaxSessions, cfg.HTTP.SessionsPerCaller()),
		posts:    newPosts(),
		log:      log,
	}
	server.AddReceivingMiddleware(g.quota.noteSession, newCallQuota(cfg.HTTP.CallsPerCaller(), log).limit, g.posts.watch)
	names := append([]string{addr.IP.String()}, cfg.HTTP.AllowHosts...)
	if host, _, err := net.SplitHostPort(cfg.HTTP.Addr); err == nil && host != "" {
		names = append(names, host)
	}
	if addr.IP.IsUnspecified() {
		// Listening everywhere: every local address is a name of this
		// server. (An address literal is no rebinding vector anyway.)
		ifaddrs, err := net.InterfaceAddrs()
		if err != nil {
			return nil, fmt.Errorf("--http %s: list local addresses: %w", cfg.HTTP.Addr, err)
		}
		for _, a := range ifaddrs {
			if ipn, ok := a.(*net.IPNet); ok {
				names = append(names, ipn.IP.String())
			}
		}
	}
	for _, n := range names {
		h, err := normalizeHostName(n)
		if err != nil {
			return nil, fmt.Errorf("--http-allow-host %q: %w", n, err)
		}
		g.hosts[h] = true
	}
	for _, o := range cfg.HTTP.AllowOrigins {
		n, err := normalizeOrigin(o)
		if err != nil {
			return nil, fmt.Errorf("--allow-origin %q: %w", o, err)
		}
		g.origins[n] = true
	}
	seen := map[string]bool{}
	for _, t := range cfg.HTTP.Tokens {
		if !seen[t] {
			seen[t] = true
			g.tokens = append(g.tokens, credential{sum: sha256.Sum256([]byte(t)), caller: callerID(t)})
		}
	}
	g.mcp = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{
		Logger:              log,
		SessionTimeout:      cfg.IdleTimeout,
		MaxRequestBodyBytes: g.maxBody,
		// The guard's Host allowlist covers every listener; the SDK's
		// own check covers loopback listeners only, and would refuse a
		// reverse proxy on the same machine.
		DisableLocalhostProtection: true,
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

// routes returns the server's handler: /mcp behind the guard, and /healthz.
func (g *guard) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		io.WriteString(w, "ok\n")
	})
	mux.Handle(mcpPath, g)
	return mux
}

// ServeHTTP checks Host, Origin and the bearer token, in that order.
func (g *guard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
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
func (g *guard) verify(_ context.Context, token string, r *http.Request) (*auth.TokenInfo, error) {
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

// serveMCP hands an authenticated request to the SDK, after admitting a
// request that may open a session under the session caps, and ending a
// deleted session's calls.
func (g *guard) serveMCP(w http.ResponseWriter, r *http.Request) {
	caller := ""
	if ti := auth.TokenInfoFromContext(r.Context()); ti != nil {
		caller = ti.UserID
	}
	id := r.Header.Get("Mcp-Session-Id")
	switch {
	case r.Method == http.MethodDelete && id != "":
		// The SDK's DELETE waits for the session's calls to return:
		// remove the sandbox first, which ends them. Another caller's
		// session is left to the SDK, which answers 403.
		if g.sessions.End(id, caller) {
			g.log.Info("session deleted: its sandbox was removed", "session", id)
		}
	case (r.Method == http.MethodPost || r.Method == http.MethodGet) && id != "" && !g.holds(id):
		// A session this process does not hold: made by a server
		// (replica) that is gone or restarted, or by another replica
		// the request was routed away from. 404 makes clients start a
		// new session (the MCP rule for an ended session); the body
		// says what happened and what survives.
		g.refuseCall(w, r, http.StatusNotFound, "UNAVAILABLE: this server does not hold that MCP session: "+
			"the server or replica that made it has restarted or is gone, and the session's sandbox with it "+
			"(or a load balancer sent the request to another replica: route each session to one replica). "+
			"Start a new session (initialize again); snapshots you made are kept, and sandbox_restore brings one back",
			requestID(r, g.maxBody))
		return
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

// requestID returns the id of the single JSON-RPC request in r's body (read
// up to limit bytes), or nil when there is none: a notification, a batch,
// a GET, a body that does not parse. Only a valid JSON number or string
// comes back, ready to be echoed.
func requestID(r *http.Request, limit int64) json.RawMessage {
	if r.Method != http.MethodPost || r.Body == nil {
		return nil
	}
	var req struct {
		ID json.RawMessage `json:"id"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, limit)).Decode(&req); err != nil || len(req.ID) == 0 {
		return nil
	}
	var v any
	if json.Unmarshal(req.ID, &v) != nil {
		return nil
	}
	switch v.(type) {
	case float64, string:
		return req.ID
	}
	return nil
}

// holds reports whether the MCP session id is one this process serves.
func (g *guard) holds(id string) bool {
	for ss := range g.server.Sessions() {
		if ss.ID() == id {
			return true
		}
	}
	return false
}

// hostAllowed reports whether a Host header names this server.
func (g *guard) hostAllowed(host string) bool {
	h, err := normalizeHostName(host)
	return err == nil && g.hosts[h]
}

// originAllowed reports whether the Origin header values admit a request:
// exactly one, and either on the allowlist or the server's own origin
// (scheme://Host, the Host having passed its check). "null" never passes.
func (g *guard) originAllowed(values []string, host string) bool {
	if len(values) != 1 {
		return false
	}
	o, err := normalizeOrigin(values[0])
	if err != nil {
		return false
	}
	if g.origins[o] {
		return true
	}
	_, rest, _ := strings.Cut(o, "://")
	return rest == strings.ToLower(host)
}

// refuse answers a request the guard stops, with a JSON-RPC error body
// (no id: the request was not read) that says what to do, and logs it
// without any header value but the remote address.
func (g *guard) refuse(w http.ResponseWriter, r *http.Request, status int, msg string) {
	g.refuseCall(w, r, status, msg, nil)
}

// refuseCall is refuse answering the JSON-RPC request with this id (nil:
// null), so that a client matches the error to its call and shows it.
func (g *guard) refuseCall(w http.ResponseWriter, r *http.Request, status int, msg string, id json.RawMessage) {
	g.log.Info("http request refused", "status", status, "method", r.Method, "remote", r.RemoteAddr, "reason", msg)
	type rpcError struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if id == nil {
		id = json.RawMessage("null")
	}
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
