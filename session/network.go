package session

import (
	"errors"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/netproxy"
)

// NetworkLayers is a sandbox's live allowlist: the base list, the hosts a
// person approved for it and what it dropped (see netproxy.Layers), and
// the hosts a person allowed for all its caller's sandboxes that apply to
// it ("host:port until RFC3339"; grants.go).
type NetworkLayers struct {
	netproxy.Layers
	CallerApproved []string
}

// errNoProxy is the error of a network change on a server without the
// egress proxy (--network none or open).
func errNoProxy() error {
	return errcode.Errorf(errcode.InvalidArgument, "this server's sandboxes have no egress proxy (--network is not allowlist), so there are no allowed hosts to change")
}

// ApproveHost lets the sandbox reach host:port from its next request on,
// for the rest of its life. Only a person's answer may lead here (the
// tools ask one): nothing the model sends approves a host. It fails if the
// sandbox dropped the host or went offline (narrowing wins).
func (s *Sandbox) ApproveHost(host string, port int) error {
	if s.m.proxy == nil {
		return errNoProxy()
	}
	if err := s.m.proxy.Approve(s.id, host, port); err != nil {
		if errors.Is(err, netproxy.ErrNarrowed) {
			return errcode.Errorf(errcode.PolicyDenied, "this sandbox dropped %s or went offline for the rest of its life; it cannot be approved again", host)
		}
		return errcode.Errorf(errcode.InvalidArgument, "%v", err)
	}
	s.recordLayers()
	return nil
}

// NarrowNetwork drops hosts (allowlist entries) from what the sandbox may
// reach, or with offline every host, for the rest of its life. It never
// widens.
func (s *Sandbox) NarrowNetwork(drop []string, offline bool) error {
	if s.m.proxy == nil {
		return errNoProxy()
	}
	if err := s.m.proxy.Narrow(s.id, drop, offline); err != nil {
		return errcode.Errorf(errcode.InvalidArgument, "%v", err)
	}
	s.recordLayers()
	return nil
}

// NetworkLayers returns the sandbox's live allowlist; ok is false on a
// server without the egress proxy.
func (s *Sandbox) NetworkLayers() (l NetworkLayers, ok bool) {
	if s.m.proxy == nil {
		return l, false
	}
	return NetworkLayers{Layers: s.m.proxy.Allowed(s.id), CallerApproved: s.CallerApprovals()}, true
}
