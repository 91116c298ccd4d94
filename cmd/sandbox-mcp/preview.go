package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/cmd/sandbox-mcp/internal/httpguard"
	"github.com/sandbox-mcp/sandbox-mcp/preview"
)

// previewsOff is what sandbox_expose says on a stdio server without
// --preview-listen.
const previewsOff = "previews are off: this server runs on stdio without --preview-listen; its operator can set --preview-listen 127.0.0.1:PORT to serve them"

// previewBase is the scheme://host:port preview URLs start with, for a
// listener on addr as configured (host) and bound (port).
func previewBase(configured string, bound *net.TCPAddr) string {
	host, _, _ := net.SplitHostPort(configured)
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, fmt.Sprint(bound.Port))
}

// listenPreviews serves reg on --preview-listen behind the Host and Origin
// checks until ctx ends, and returns the registry with its base URL set.
func listenPreviews(ctx context.Context, cfg Config, log *slog.Logger) (*preview.Registry, error) {
	addr := cfg.HTTP.PreviewListen
	if strings.HasPrefix(addr, ":") {
		addr = "127.0.0.1" + addr // loopback unless a host is named
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--preview-listen %s: %w", cfg.HTTP.PreviewListen, err)
	}
	bound := ln.Addr().(*net.TCPAddr)
	if !bound.IP.IsLoopback() {
		log.Warn("previews are served on an address other machines may reach: anyone who has a preview's URL opens it until it expires", "addr", bound.String())
	}
	reg := preview.New(preview.Options{BaseURL: previewBase(addr, bound), TTL: cfg.HTTP.PreviewTTL, Logger: log})
	h, err := httpguard.PreviewHandler(httpguard.Options{
		Addr: addr, Listen: bound, AllowHosts: cfg.HTTP.AllowHosts, AllowOrigins: cfg.HTTP.AllowOrigins, Logger: log,
	}, reg)
	if err != nil {
		ln.Close()
		return nil, err
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: httpReadHeaderTimeout,
		IdleTimeout:       httpIdleTimeout,
		MaxHeaderBytes:    httpMaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	go srv.Serve(ln)
	go func() {
		<-ctx.Done()
		reg.Close()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if srv.Shutdown(sctx) != nil {
			srv.Close()
		}
	}()
	log.Info("serving previews", "url", previewBase(addr, bound)+preview.Prefix, "ttl", reg.TTL())
	return reg, nil
}
