package netproxy

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
)

// A sandbox's allowlist is its base list (Config.Allow) with two layers on
// top that change while the sandbox lives:
//
//   - approved hosts (Approve): single host:port pairs a person allowed for
//     this sandbox; the next CONNECT to one is admitted;
//   - narrowing (Narrow): entries dropped for the rest of the sandbox's
//     life, or the whole sandbox taken offline. Narrowing always wins: a
//     dropped or offline host is refused whether the base list or an
//     approval has it, and nothing approves it again.
//
// Neither layer touches the address checks: an approved name that
// resolves to a private, loopback, link-local or metadata address is
// refused exactly as a listed one is. The layers outlive a sandbox's
// listeners (a restarted instance keeps them) and go with Forget.

// MaxApproved caps the hosts approved per sandbox, and MaxDropped the
// entries dropped, so that the layers' memory is bounded whatever is asked.
const (
	MaxApproved = 64
	MaxDropped  = 64
)

// ErrNarrowed is Approve's error for a host the sandbox dropped, or a
// sandbox that went offline: narrowing wins.
var ErrNarrowed = errors.New("netproxy: the sandbox dropped this host or went offline for the rest of its life; nothing can approve it again")

// layer is one sandbox's approved and narrowed hosts.
type layer struct {
	mu       sync.Mutex
	approved []string // "host:port", normalised, in the order approved
	dropped  *Allowlist
	drops    []string // entries of dropped, in the order given
	offline  bool
}

// Layers is a sandbox's live allowlist, for display: the base list, what
// was approved for it and what it dropped, each in normalised
// "host:port" / "*.domain:port" form.
type Layers struct {
	Base     []string
	Approved []string
	Dropped  []string
	Offline  bool
}

func (p *Proxy) layerOf(sandbox string, create bool) *layer {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.layers[sandbox]
	if l == nil && create {
		if p.layers == nil {
			p.layers = map[string]*layer{}
		}
		l = &layer{}
		p.layers[sandbox] = l
	}
	return l
}

// Approve adds host:port to the hosts the sandbox may reach, at once: its
// next CONNECT to it is admitted (subject to the address checks, as every
// request is). host must be one name (no wildcard, no IP literal). It fails
// with ErrNarrowed if the sandbox dropped the host or went offline, and
// when the sandbox already has MaxApproved approvals. Approving a host
// twice is a no-op.
func (p *Proxy) Approve(sandbox, host string, port int) error {
	entry := host + ":" + strconv.Itoa(port)
	h, wildcard, pt, problem := parseEntry(entry)
	switch {
	case problem != "":
		return fmt.Errorf("netproxy: approve %s: %s", quote(truncate(entry, 100)), problem)
	case wildcard:
		return fmt.Errorf("netproxy: approve %s: only one host can be approved, not a wildcard", quote(entry))
	}
	entry = h + ":" + strconv.Itoa(pt)
	l := p.layerOf(sandbox, true)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.narrowed(h, pt) {
		return ErrNarrowed
	}
	if slices.Contains(l.approved, entry) {
		return nil
	}
	if len(l.approved) >= MaxApproved {
		return fmt.Errorf("netproxy: the sandbox already has %d approved hosts, the most it may have", MaxApproved)
	}
	l.approved = append(l.approved, entry)
	return nil
}

// Narrow drops entries (allowlist entries, see [Allowlist]: "host[:port]"
// or "*.domain[:port]") from what the sandbox may reach, and with offline
// every host, for the rest of the sandbox's life (until Forget). It can
// only narrow: it never allows anything. It fails on an invalid entry
// (dropping nothing) or past MaxDropped entries.
func (p *Proxy) Narrow(sandbox string, drop []string, offline bool) error {
	parsed, err := ParseAllowlist(drop)
	if err != nil {
		return err
	}
	l := p.layerOf(sandbox, true)
	l.mu.Lock()
	defer l.mu.Unlock()
	all := slices.Clone(l.drops)
	for _, e := range parsed.entries {
		if !slices.Contains(all, e) {
			all = append(all, e)
		}
	}
	if len(all) > MaxDropped {
		return fmt.Errorf("netproxy: a sandbox may drop at most %d entries; go offline instead", MaxDropped)
	}
	if l.dropped, err = ParseAllowlist(all); err != nil {
		return err
	}
	l.drops = all
	l.offline = l.offline || offline
	// Approvals the drop covers go: narrowing wins, and the display shows
	// what can still be reached.
	l.approved = slices.DeleteFunc(l.approved, func(e string) bool {
		h, _, pt, _ := parseEntry(e)
		return l.narrowed(h, pt)
	})
	return nil
}

// narrowed reports whether the normalised h:port was dropped. l.mu is held.
func (l *layer) narrowed(h string, port int) bool {
	if l.offline {
		return true
	}
	_, ok := l.dropped.Match(h, port)
	return ok
}

// Allowed returns the sandbox's live allowlist: the base list, its
// approved hosts and what it dropped.
func (p *Proxy) Allowed(sandbox string) Layers {
	out := Layers{Base: p.allowFor(sandbox).Entries(), Approved: []string{}, Dropped: []string{}}
	if l := p.layerOf(sandbox, false); l != nil {
		l.mu.Lock()
		out.Approved = append(out.Approved, l.approved...)
		out.Dropped = append(out.Dropped, l.drops...)
		out.Offline = l.offline
		l.mu.Unlock()
	}
	return out
}

// Granted decides, for a sandbox, a host:port that is on none of its
// lists and not approved for it: a grant the proxy does not keep itself
// (a person's approval for every sandbox of one caller, for a while). It
// returns the rule that admits it, for the log. It is consulted only after
// narrowing (which wins) and the sandbox's own lists, with no lock of the
// proxy held, and the address checks apply to what it admits as to every
// request.
type Granted func(sandbox, host string, port int) (rule string, ok bool)

// SetGranted sets the proxy's Granted (nil: none). Set it before the
// first Serve or Grant.
func (p *Proxy) SetGranted(g Granted) {
	p.mu.Lock()
	p.granted = g
	p.mu.Unlock()
}

// Forget drops a sandbox's layers, when it has ended for good.
func (p *Proxy) Forget(sandbox string) {
	p.mu.Lock()
	delete(p.layers, sandbox)
	p.mu.Unlock()
}

// match decides h:port for the sandbox on its base list and its layers. It
// returns the matching rule, or the refusal: narrowing first, then the
// lists; unlisted marks the refusal of a host on none of the lists (the
// one an approval could lift).
func (p *Proxy) match(sandbox, h string, port int) (rule string, ref *refusal, unlisted bool) {
	hostport := quote(h + ":" + strconv.Itoa(port))
	l := p.layerOf(sandbox, false)
	approved := false
	if l != nil {
		l.mu.Lock()
		offline := l.offline
		e, dropped := l.dropped.Match(h, port)
		approved = slices.Contains(l.approved, h+":"+strconv.Itoa(port))
		l.mu.Unlock()
		if offline {
			return "", &refusal{http.StatusForbidden, fmt.Sprintf("%s: this sandbox went offline for the rest of its life; nothing can be reached from it", hostport)}, false
		}
		if dropped {
			return "", &refusal{http.StatusForbidden, fmt.Sprintf("%s: this sandbox dropped %s from its allowed hosts for the rest of its life", hostport, e)}, false
		}
	}
	base := p.allowFor(sandbox) // the sandbox's template's, or the server's
	if rule, ok := base.Match(h, port); ok {
		return rule, nil, false
	}
	if approved {
		return h + ":" + strconv.Itoa(port) + " (approved for this sandbox)", nil, false
	}
	p.mu.Lock()
	granted := p.granted
	p.mu.Unlock()
	if granted != nil {
		if rule, ok := granted(sandbox, h, port); ok {
			return rule, nil, false
		}
	}
	reason := fmt.Sprintf("%s is not on this server's --allow-host list; use an allowed host, or ask the operator to add it", hostport)
	if ports := base.ports(h); len(ports) > 0 {
		reason = fmt.Sprintf("%s is not on this server's --allow-host list: %s is allowed on port %s only",
			hostport, h, joinInts(ports))
	}
	return "", &refusal{http.StatusForbidden, reason}, true
}
