package main

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/cmd/sandbox-mcp/internal/httpguard"
	"github.com/sandbox-mcp/sandbox-mcp/preview"
	"github.com/sandbox-mcp/sandbox-mcp/tools"
)

// Defaults and limits of the HTTP transport's configuration.
const (
	// DefaultMaxSandboxes is --max-sandboxes' default.
	DefaultMaxSandboxes = 32
	// MinTokenLength is the shortest bearer token accepted: a token is
	// the only thing between the network and a shell.
	MinTokenLength = 16
	// callsPerSession is --max-calls-per-caller's default per session a
	// caller may hold: a model mostly waits for one call at a time, and
	// sometimes runs a few side by side.
	callsPerSession = 2
)

// HTTPConfig is the streamable HTTP transport's part of the configuration.
type HTTPConfig struct {
	// Addr is the address to serve on (--http); "" serves stdio.
	Addr string
	// Tokens are the bearer tokens callers present, each a distinct caller.
	// They are secret: never logged, never in an error message.
	Tokens []string
	// AllowOrigins are the Origin values accepted besides the server's own,
	// as scheme://host[:port].
	AllowOrigins []string
	// AllowHosts are the Host names served besides loopback names and the
	// listen address (ports are not compared).
	AllowHosts []string
	// MaxSandboxes caps the sandboxes alive at once (--max-sandboxes): a
	// session's own and those made by sandbox_create alike, counted by
	// package session when one is made. Over --http it caps the MCP
	// sessions too.
	MaxSandboxes int
	// MaxSandboxesPerCaller caps the sandboxes one caller (one token)
	// holds at once, and over --http its sessions. 0 means the default,
	// see SandboxesPerCaller.
	MaxSandboxesPerCaller int
	// MaxCallsPerCaller caps the tool calls and resource reads one caller
	// has in flight at once. 0 means the default, see CallsPerCaller.
	MaxCallsPerCaller int
	// DefaultSandbox is what a call without `sandbox` uses on MCP
	// 2026-07-28, which has no sessions (--default-sandbox): none
	// (DefaultSandboxNone: the call is refused and told to make one) or
	// one per caller (DefaultSandboxPerCaller).
	DefaultSandbox string
	// PreviewListen is where preview URLs are served when set
	// (--preview-listen; a host left out is 127.0.0.1); otherwise the
	// --http listener serves them, and a stdio server serves none.
	PreviewListen string
	// PreviewTTL is a preview's life (--preview-ttl); 0 means
	// preview.DefaultTTL.
	PreviewTTL time.Duration
}

// --default-sandbox's values.
const (
	DefaultSandboxNone      = "none"
	DefaultSandboxPerCaller = "per-caller"
)

// Sessionless is the tools' rule for a call without `sandbox` on MCP
// 2026-07-28 over HTTP.
func (h HTTPConfig) Sessionless() tools.Sessionless {
	if h.DefaultSandbox == DefaultSandboxPerCaller {
		return tools.SessionlessPerCaller
	}
	return tools.SessionlessNone
}

// SandboxesPerCaller returns the effective --max-sandboxes-per-caller: as
// set, or by default a quarter of --max-sandboxes (at least 1) when --token
// names several callers, so that no one of them can take every place; with
// one caller or none, all of --max-sandboxes.
func (h HTTPConfig) SandboxesPerCaller() int {
	switch {
	case h.MaxSandboxesPerCaller > 0:
		return h.MaxSandboxesPerCaller
	case h.callers() < 2:
		return h.MaxSandboxes
	default:
		return max(1, h.MaxSandboxes/4)
	}
}

// callers counts the distinct tokens: the callers the server tells apart.
func (h HTTPConfig) callers() int {
	seen := make(map[string]bool, len(h.Tokens))
	for _, t := range h.Tokens {
		seen[t] = true
	}
	return len(seen)
}

// CallsPerCaller returns the effective --max-calls-per-caller: as set, or
// by default twice the sessions a caller may hold.
func (h HTTPConfig) CallsPerCaller() int {
	if h.MaxCallsPerCaller > 0 {
		return h.MaxCallsPerCaller
	}
	return callsPerSession * h.SandboxesPerCaller()
}

// addTransportFlags adds the flags of the HTTP transport and the audit log.
func (f *flagSet) addTransportFlags(cfg *Config) {
	h := &cfg.HTTP
	fs := f.fs
	fs.StringVar(&h.Addr, "http", h.Addr, "serve streamable HTTP at http://`addr`/mcp (e.g. 127.0.0.1:8080) instead of stdio")
	fs.Var(&secretList{listValue{v: &h.Tokens, f: f}}, "token", "bearer `token`s for --http (comma list, repeatable; each a separate caller; at least 16 characters); required unless --http is a loopback address")
	fs.Var(&listValue{v: &h.AllowOrigins, f: f}, "allow-origin", "comma `list` (repeatable) of web origins (scheme://host[:port]) allowed to call --http besides its own; a request with any other Origin gets 403")
	fs.Var(&listValue{v: &h.AllowHosts, f: f}, "http-allow-host", "comma `list` (repeatable) of host names --http answers to besides localhost and its listen address, e.g. the name of the reverse proxy in front of it; any other Host gets 403")
	fs.IntVar(&h.MaxSandboxes, "max-sandboxes", h.MaxSandboxes, "sandboxes alive at once, sessions' own and sandbox_create's alike (one more gets BUSY); over --http also the MCP sessions served at once (one more gets 503)")
	fs.IntVar(&h.MaxSandboxes, "max-sessions", h.MaxSandboxes, "the old name of --max-sandboxes")
	fs.IntVar(&h.MaxSandboxesPerCaller, "max-sandboxes-per-caller", h.MaxSandboxesPerCaller, "sandboxes one caller (one --token) holds at once (one more gets BUSY), and over --http its MCP sessions (one more gets 429) (0: a quarter of --max-sandboxes, at least 1, when --token names several callers; all of --max-sandboxes otherwise)")
	fs.IntVar(&h.MaxSandboxesPerCaller, "max-sessions-per-caller", h.MaxSandboxesPerCaller, "the old name of --max-sandboxes-per-caller")
	fs.IntVar(&h.MaxCallsPerCaller, "max-calls-per-caller", h.MaxCallsPerCaller, "tool calls and resource reads one caller (one --token) has in flight at once over --http; more get BUSY (0: twice --max-sandboxes-per-caller)")
	fs.Var(&choice{v: &h.DefaultSandbox, allowed: []string{DefaultSandboxNone, DefaultSandboxPerCaller}}, "default-sandbox",
		"`mode` for a call without `sandbox` from an MCP 2026-07-28 client over --http, which has no session and so no session's sandbox: "+
			"none (refused: it is told to make one with sandbox_create and name it) or per-caller (each caller, one --token, gets one default sandbox, kept until the server exits; its container goes when idle, snapshotted, and comes back at the next call)")
	fs.StringVar(&h.PreviewListen, "preview-listen", h.PreviewListen, "serve sandbox_expose's preview URLs on this `addr` (host:port; a host left out is 127.0.0.1) instead of the --http listener; on stdio previews are off unless it is set")
	fs.DurationVar(&h.PreviewTTL, "preview-ttl", h.PreviewTTL, "how long a preview URL works (0: 1h; at most 24h)")
	fs.StringVar(&cfg.AuditLog, "audit-log", cfg.AuditLog, "append a JSON line per tool call to this `file` (created with mode 0600)")
}

// secretList is a listValue whose values never print (in help or errors).
type secretList struct{ listValue }

func (s secretList) String() string { return "" }

// Validate checks the HTTP configuration, naming the flag to fix. No
// message quotes a token.
func (h HTTPConfig) Validate() error {
	var errs []error
	if h.MaxSandboxes < 1 {
		errs = append(errs, fmt.Errorf("--max-sandboxes must be at least 1 (got %d)", h.MaxSandboxes))
	}
	if h.MaxSandboxesPerCaller < 0 {
		errs = append(errs, fmt.Errorf("--max-sandboxes-per-caller must not be negative (got %d; 0 picks the default)", h.MaxSandboxesPerCaller))
	} else if h.MaxSandboxesPerCaller > h.MaxSandboxes && h.MaxSandboxes >= 1 {
		errs = append(errs, fmt.Errorf("--max-sandboxes-per-caller %d is above --max-sandboxes %d, which caps every caller together; lower it, or raise --max-sandboxes",
			h.MaxSandboxesPerCaller, h.MaxSandboxes))
	}
	if h.MaxCallsPerCaller < 0 {
		errs = append(errs, fmt.Errorf("--max-calls-per-caller must not be negative (got %d; 0 picks the default)", h.MaxCallsPerCaller))
	}
	if h.Addr != "" {
		if _, _, err := net.SplitHostPort(h.Addr); err != nil {
			errs = append(errs, fmt.Errorf("--http %q: want host:port, e.g. 127.0.0.1:8080 (%v)", h.Addr, err))
		}
	}
	for i, t := range h.Tokens {
		if len(t) < MinTokenLength {
			errs = append(errs, fmt.Errorf("--token: token %d of %d has %d characters; use at least %d, e.g. the output of `openssl rand -hex 32`", i+1, len(h.Tokens), len(t), MinTokenLength))
		} else if strings.IndexFunc(t, func(r rune) bool { return r < 0x21 || r > 0x7e }) >= 0 {
			errs = append(errs, fmt.Errorf("--token: token %d of %d has a space, a control or a non-ASCII character; use printable ASCII, e.g. the output of `openssl rand -hex 32`", i+1, len(h.Tokens)))
		}
	}
	if h.PreviewListen != "" {
		if _, _, err := net.SplitHostPort(h.PreviewListen); err != nil {
			errs = append(errs, fmt.Errorf("--preview-listen %q: want host:port, e.g. 127.0.0.1:8090 (%v)", h.PreviewListen, err))
		}
	}
	if h.PreviewTTL < 0 || h.PreviewTTL > preview.MaxTTL {
		errs = append(errs, fmt.Errorf("--preview-ttl %s: give 0 (1h) to %s", h.PreviewTTL, preview.MaxTTL))
	}
	for _, o := range h.AllowOrigins {
		if _, err := httpguard.NormalizeOrigin(o); err != nil {
			errs = append(errs, fmt.Errorf("--allow-origin %q: %w", o, err))
		}
	}
	for _, name := range h.AllowHosts {
		if _, err := httpguard.NormalizeHostName(name); err != nil {
			errs = append(errs, fmt.Errorf("--http-allow-host %q: %w", name, err))
		}
	}
	return errors.Join(errs...)
}
