package netproxy

import (
	"context"
	"fmt"
	"iter"
	"maps"
	"net"
	"net/netip"
	"slices"
	"syscall"
)

// deniedError is a dial refused by the address check in Dialer.Control.
type deniedError struct{ reason string }

func (e *deniedError) Error() string { return e.reason }

// checkAddr decides whether the proxy may connect to a:port. It returns ""
// if so, or the end of a refusal sentence ("127.0.0.1 (loopback), which ...").
// It is the single address policy, used both before dialling and again in
// the default dialer's Control function.
func (p *Proxy) checkAddr(a netip.Addr, port uint16) string {
	a = a.Unmap().WithZone("")
	if class := Classify(a); class != "" {
		if !p.cfg.AllowPrivate || !unlockedByAllowPrivate(class) {
			if unlockedByAllowPrivate(class) {
				return fmt.Sprintf("%s (%s), which this proxy refuses; an operator can allow loopback, private and CGNAT addresses with --allow-private-networks", a, class)
			}
			return fmt.Sprintf("%s (%s), which this proxy always refuses", a, class)
		}
	}
	p.mu.Lock()
	listeners := slices.Collect(maps.Keys(p.listeners))
	p.mu.Unlock()
	if matchDeny(a, port, slices.Values(listeners)) {
		return fmt.Sprintf("%s port %d, this proxy's own address; connections back into the proxy are refused", a, port)
	}
	if matchDeny(a, port, slices.Values(p.deny)) {
		return fmt.Sprintf("%s port %d, a server address that sandboxes may not reach", a, port)
	}
	return ""
}

// matchDeny reports whether a:port is one of list. A zero port in the list
// matches every port; an unspecified address matches every address of this
// host.
func matchDeny(a netip.Addr, port uint16, list iter.Seq[netip.AddrPort]) bool {
	for d := range list {
		if d.Port() != 0 && d.Port() != port {
			continue
		}
		if d.Addr() == a || d.Addr().IsUnspecified() && isLocalAddr(a) {
			return true
		}
	}
	return false
}

// isLocalAddr reports whether a belongs to this host. It lists interfaces
// on every call, which is only reached when an unspecified deny entry's port
// matches, so rarely.
func isLocalAddr(a netip.Addr) bool {
	if a.IsLoopback() || a.IsUnspecified() {
		return true
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return true // fail closed
	}
	for _, ia := range addrs {
		if n, ok := ia.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == a {
				return true
			}
		}
	}
	return false
}

// control is the default dialer's Control function: a last check of the
// exact address the socket is about to connect to.
func (p *Proxy) control(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return &deniedError{fmt.Sprintf("the dialer was given %q, not an IP address and port", address)}
	}
	if r := p.checkAddr(ap.Addr(), ap.Port()); r != "" {
		return &deniedError{"the connection was stopped at connect time: " + r}
	}
	return nil
}

// dial connects to the checked address a:port with ConnectTimeout.
func (p *Proxy) dial(ctx context.Context, a netip.Addr, port int) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ConnectTimeout)
	defer cancel()
	network := "tcp4"
	if a.Is6() {
		network = "tcp6"
	}
	return p.dialer.DialContext(ctx, network, netip.AddrPortFrom(a, uint16(port)).String())
}
