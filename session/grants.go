package session

import (
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// A person may allow a host for every sandbox of one caller, for
// policy.CallerApprovalTTL (--network-approval-caller-scope): the grant is
// the caller's, kept here, and the egress proxy consults it (Granted) for
// a host on none of a sandbox's lists. It admits the host in a sandbox of
// that caller only while it lasts, only where the sandbox's own template
// lets a person approve that host with the caller scope on, never where
// the sandbox dropped it or went offline (the proxy's narrowing comes
// first), and never to a private or metadata address (the proxy's address
// checks come after).

// Bounds of the grants, so that their memory is bounded whatever is
// answered: per caller, and callers kept (past it, the one granted to
// longest ago is forgotten).
const (
	maxCallerGrants = 32
	maxGrantCallers = 4096
)

// callerGrants are the live grants, by caller, then host and port.
type callerGrants struct {
	mu    sync.Mutex
	now   func() time.Time // time.Now; a test's clock
	m     map[string]map[hostPort]time.Time
	order []string // callers, oldest first
}

type hostPort struct {
	host string
	port int
}

func (g *callerGrants) clock() time.Time {
	if g.now != nil {
		return g.now()
	}
	return time.Now()
}

// add grants host:port to owner's sandboxes until an hour from now (a
// grant again renews it) and returns that time.
func (g *callerGrants) add(owner, host string, port int) (time.Time, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.clock()
	until := now.Add(policy.CallerApprovalTTL)
	if g.m == nil {
		g.m = map[string]map[hostPort]time.Time{}
	}
	hosts := g.m[owner]
	for k, t := range hosts {
		if !now.Before(t) {
			delete(hosts, k)
		}
	}
	key := hostPort{host, port}
	if hosts == nil {
		if len(g.order) >= maxGrantCallers {
			delete(g.m, g.order[0])
			g.order = g.order[1:]
		}
		hosts = map[hostPort]time.Time{}
		g.m[owner] = hosts
		g.order = append(g.order, owner)
	}
	if _, ok := hosts[key]; !ok && len(hosts) >= maxCallerGrants {
		return time.Time{}, fmt.Errorf("this caller already has %d hosts allowed for all its sandboxes, the most it may have", maxCallerGrants)
	}
	hosts[key] = until
	return until, nil
}

// until returns when owner's grant of host:port ends, if it is live.
func (g *callerGrants) until(owner, host string, port int) (time.Time, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	t, ok := g.m[owner][hostPort{host, port}]
	if !ok || !g.clock().Before(t) {
		return time.Time{}, false
	}
	return t, true
}

// live returns owner's live grants and when each ends.
func (g *callerGrants) live(owner string) map[hostPort]time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.clock()
	out := map[hostPort]time.Time{}
	for k, t := range g.m[owner] {
		if now.Before(t) {
			out[k] = t
		}
	}
	return out
}

// callerScoped reports whether the template lets a person allow host:port
// for all its caller's sandboxes: the caller scope is on and one of its
// approval patterns admits the host.
func (t *Template) callerScoped(host string, port int) bool {
	if !t.networked() || !t.Policy.NetworkApprovalCallerScope || t.approvable == nil {
		return false
	}
	_, ok := t.approvable.Match(host, port)
	return ok
}

// granted is the proxy's Granted: a live grant of the sandbox's owner
// admits host:port where the sandbox's template is callerScoped for it.
func (m *Manager) granted(sandbox, host string, port int) (string, bool) {
	m.mu.Lock()
	s := m.byID[sandbox]
	m.mu.Unlock()
	if s == nil || !s.tpl.callerScoped(host, port) {
		return "", false
	}
	until, ok := m.grants.until(s.owner, host, port)
	if !ok {
		return "", false
	}
	return fmt.Sprintf("%s:%d (approved by a person for this caller's sandboxes until %s)", host, port, until.UTC().Format(time.RFC3339)), true
}

// ApproveHostForCaller lets every sandbox of this sandbox's caller whose
// template lets a person approve host:port with the caller scope reach it
// for policy.CallerApprovalTTL, from their next request on, and returns
// when that ends. Only a person's answer may lead here (the tools ask
// one). It fails where this sandbox's template does not permit it.
func (s *Sandbox) ApproveHostForCaller(host string, port int) (time.Time, error) {
	if s.m.proxy == nil {
		return time.Time{}, errNoProxy()
	}
	if !s.tpl.callerScoped(host, port) {
		return time.Time{}, errcode.Errorf(errcode.PolicyDenied, "this sandbox's template does not let a person allow %s:%d for all the caller's sandboxes", host, port)
	}
	until, err := s.m.grants.add(s.owner, host, port)
	if err != nil {
		return time.Time{}, errcode.Errorf(errcode.InvalidArgument, "%v", err)
	}
	return until, nil
}

// CallerApprovals returns the hosts a person allowed for all the
// sandbox's caller's sandboxes that apply to it, "host:port until
// RFC3339".
func (s *Sandbox) CallerApprovals() []string {
	out := []string{}
	for k, t := range s.m.grants.live(s.owner) {
		if s.tpl.callerScoped(k.host, k.port) {
			out = append(out, k.host+":"+strconv.Itoa(k.port)+" until "+t.UTC().Format(time.RFC3339))
		}
	}
	sort.Strings(out)
	return out
}
