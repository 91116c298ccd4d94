package session

import "github.com/sandbox-mcp/sandbox-mcp/netproxy"

// HostPatterns are host[:port] patterns in --allow-host syntax, which the
// egress proxy defines: the tools match hosts against them (the operator's
// --network-approval patterns, the hosts a model drops) without knowing
// the proxy.
type HostPatterns struct{ a *netproxy.Allowlist }

// ParseHostPatterns parses patterns as --allow-host does, with its errors.
func ParseHostPatterns(patterns []string) (*HostPatterns, error) {
	a, err := netproxy.ParseAllowlist(patterns)
	if err != nil {
		return nil, err
	}
	return &HostPatterns{a}, nil
}

// Match reports whether host:port matches a pattern, and which.
func (h *HostPatterns) Match(host string, port int) (pattern string, ok bool) {
	return h.a.Match(host, port)
}

// MaxDroppedHosts bounds the hosts one sandbox may drop from its
// allowlist (the proxy keeps at most this many).
const MaxDroppedHosts = netproxy.MaxDropped
