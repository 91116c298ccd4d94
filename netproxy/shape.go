package netproxy

import (
	"errors"
	"fmt"
	"slices"
	"sync"
)

// Shape is what one sandbox may reach through the proxy, when it is not
// what the Config gives every sandbox: its own base allowlist and the
// secrets (by name, among Config.Secrets) it holds. An operator's template
// of sandboxes has one; a sandbox without a Shape gets Config.Allow and
// every secret.
type Shape struct {
	// Allow is the sandbox's allowlist; nil or empty refuses everything.
	Allow *Allowlist
	// Secrets names the secrets of Config.Secrets the sandbox holds: it
	// gets their placeholders (SecretEnv), and only they are put into its
	// requests. A tunnel to a host none of them is for is not
	// intercepted. Empty: none.
	Secrets []string
}

// shaped is a Shape in force, with the names as a set.
type shaped struct {
	allow   *Allowlist
	secrets map[string]bool
}

// shapes are the sandboxes' own shapes, by sandbox id.
type shapes struct {
	mu sync.Mutex
	m  map[string]*shaped
}

// SetShape gives the sandbox with this id (as Serve and Grant name it) its
// own allowlist and secrets, in place of Config.Allow and every secret,
// until clear is called. It refuses a secret the proxy does not hold and a
// secret whose hosts s.Allow does not list. Set it before the sandbox's
// first Serve or Grant; setting it again replaces it.
func (p *Proxy) SetShape(sandbox string, s Shape) (clear func(), err error) {
	sh := &shaped{allow: s.Allow, secrets: map[string]bool{}}
	var errs []error
	for _, name := range s.Secrets {
		i := slices.IndexFunc(p.secretList(), func(sec Secret) bool { return sec.Name == name })
		if i < 0 {
			errs = append(errs, fmt.Errorf("netproxy: secret %s is not one of this proxy's", name))
			continue
		}
		for _, h := range p.secrets.secrets[i].Hosts {
			if len(s.Allow.ports(h)) == 0 {
				errs = append(errs, fmt.Errorf("netproxy: secret %s is for %s, which the sandbox's allowlist does not list", name, h))
			}
		}
		sh.secrets[name] = true
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	p.shapes.mu.Lock()
	if p.shapes.m == nil {
		p.shapes.m = map[string]*shaped{}
	}
	p.shapes.m[sandbox] = sh
	p.shapes.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			p.shapes.mu.Lock()
			if p.shapes.m[sandbox] == sh {
				delete(p.shapes.m, sandbox)
			}
			p.shapes.mu.Unlock()
		})
	}, nil
}

// shapeOf returns the sandbox's own shape, or nil.
func (p *Proxy) shapeOf(sandbox string) *shaped {
	p.shapes.mu.Lock()
	defer p.shapes.mu.Unlock()
	return p.shapes.m[sandbox]
}

// allowFor returns the allowlist of the sandbox: its shape's, or
// Config.Allow.
func (p *Proxy) allowFor(sandbox string) *Allowlist {
	if sh := p.shapeOf(sandbox); sh != nil {
		return sh.allow
	}
	return p.cfg.Allow
}

// heldBy returns which secrets the sandbox holds, by name: nil when it
// holds every one (no shape).
func (p *Proxy) heldBy(sandbox string) map[string]bool {
	if sh := p.shapeOf(sandbox); sh != nil {
		return sh.secrets
	}
	return nil
}

// secretList returns the proxy's secrets (nil without).
func (p *Proxy) secretList() []Secret {
	if p.secrets == nil {
		return nil
	}
	return p.secrets.secrets
}
