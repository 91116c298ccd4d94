package main

// The streamable HTTP transport: many clients at once, each MCP session with
// its own sandbox, safe to put on a network. Every request passes the
// checks of cmd/sandbox-mcp/internal/httpguard (Host, Origin, bearer token,
// session and call caps, request bodies admitted into the memory budget
// before they are read, calls of a dropped POST ended) before the go-sdk's
// handler sees it; this file listens, serves and shuts down.

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/cmd/sandbox-mcp/internal/audit"
	"github.com/sandbox-mcp/sandbox-mcp/cmd/sandbox-mcp/internal/httpguard"
	"github.com/sandbox-mcp/sandbox-mcp/preview"
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
)

// serveHTTP serves MCP over streamable HTTP on cfg.HTTP.Addr until a
// signal arrives; then it stops accepting, ends every call, removes every
// sandbox and returns within a bounded time.
func serveHTTP(ctx context.Context, cfg Config, log *slog.Logger, auditLog *audit.Log) error {
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
	m, release, err := newManager(ctx, cfg, log, auditLog, true, addr.AddrPort())
	if err != nil {
		return err
	}
	defer release()
	logPolicy(log, cfg)
	sessions := tools.NewSessions(m)
	sessions.OwnerOf = httpguard.OwnerOf
	// A 2026-07-28 request is served on a session that ends with it: no
	// sandbox may be tied to that.
	sessions.Sessionless = cfg.HTTP.Sessionless()
	// One memory budget for tool calls and the request bodies that
	// carry them.
	mem := tools.NewMemory(cfg.Policy)
	var previews *preview.Registry
	if cfg.HTTP.PreviewListen != "" {
		if previews, err = listenPreviews(ctx, cfg, log); err != nil {
			return err
		}
	} else {
		previews = preview.New(preview.Options{BaseURL: previewBase(cfg.HTTP.Addr, addr), TTL: cfg.HTTP.PreviewTTL, Logger: log})
		defer previews.Close()
	}
	server := newServer(cfg, m, sessions, mem, log, auditLog, previews)
	opts := guardOptions(cfg, addr, log)
	if cfg.HTTP.PreviewListen == "" {
		opts.Preview = previews
	}
	opts.ReserveBody = func(ctx context.Context, caller string, n int64, wait time.Duration) (httpguard.BodyHold, error) {
		h, err := mem.ReserveBody(ctx, caller, n, wait)
		if err != nil {
			return nil, err
		}
		return h, nil
	}
	g, err := httpguard.New(opts, server, sessions)
	if err != nil {
		cctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		m.Close(cctx)
		return err
	}
	srv := &http.Server{
		Handler:           g.Handler(),
		ReadHeaderTimeout: httpReadHeaderTimeout,
		ReadTimeout:       httpReadTimeout,
		IdleTimeout:       httpIdleTimeout,
		MaxHeaderBytes:    httpMaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("serving MCP over streamable HTTP", "url", "http://"+addr.String()+httpguard.Path,
		"callers", g.Callers(), "allow_origin", strings.Join(cfg.HTTP.AllowOrigins, ","),
		"http_allow_host", strings.Join(cfg.HTTP.AllowHosts, ","), "max_sessions", cfg.HTTP.MaxSandboxes,
		"max_sessions_per_caller", cfg.HTTP.SandboxesPerCaller(), "max_calls_per_caller", cfg.HTTP.CallsPerCaller(),
		"max_request_bytes", g.MaxBody(), "idle_timeout", cfg.IdleTimeout, "default_sandbox", cfg.HTTP.DefaultSandbox)

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

// guardOptions are the HTTP guard's options from the configuration, for a
// server listening on addr.
func guardOptions(cfg Config, addr *net.TCPAddr, log *slog.Logger) httpguard.Options {
	return httpguard.Options{
		Addr:              cfg.HTTP.Addr,
		Listen:            addr,
		Tokens:            cfg.HTTP.Tokens,
		AllowOrigins:      cfg.HTTP.AllowOrigins,
		AllowHosts:        cfg.HTTP.AllowHosts,
		MaxSessions:       cfg.HTTP.MaxSandboxes,
		SessionsPerCaller: cfg.HTTP.SandboxesPerCaller(),
		CallsPerCaller:    cfg.HTTP.CallsPerCaller(),
		MaxRequestBytes:   httpguard.MaxRequestBody(cfg.Policy.MaxFileBytes),
		IdleTimeout:       cfg.IdleTimeout,
		Logger:            log,
	}
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
