package session

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/netproxy"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
)

// DefaultTemplate is the name of the template the server's own options
// (Options.Policy, Env, Seed, Secrets and the backend's image) make: what a
// sandbox gets when no template is named.
const DefaultTemplate = "default"

// Template is a shape of sandbox the operator defined (a named template in
// the config file): what its sandboxes start with and what they may do.
// Every field comes from the operator's configuration, never from a tool
// argument; a caller only picks a template by name.
type Template struct {
	// Name is the template's name (the key in Options.Templates).
	Name string
	// Image is the base image of the template's sandboxes; "" means the
	// backend's own (with a read-only default workspace's content, where
	// the backend baked it into the image). The backend must have
	// prepared it (docker.Config.Images).
	Image string
	// Policy is the template's whole policy: limits, read-only, exec
	// mode and allowlist, network and allowed hosts. The tools check a
	// call on the template's sandbox against it.
	Policy policy.Policy
	// Env is the NAME=VALUE list the template's sandboxes get, in place
	// of Options.Env.
	Env []string
	// Secrets names the secrets of Options.Secrets the template's
	// sandboxes hold (each a placeholder in their environment, replaced at
	// the proxy); they need Policy.Network allowlist with the secrets'
	// hosts on Policy.AllowHosts.
	Secrets []string
	// Seed is what a writable workspace of the template starts with a
	// copy of (nil: empty); it must be loaded for a writable workspace
	// (LoadSeed with readOnly false). The Manager owns it from NewManager
	// on, and closes it.
	Seed *Seed

	// Derived by NewManager.
	isDefault bool
	allow     *netproxy.Allowlist // nil without the allowlist network
	// approvable are Policy.NetworkApproval parsed (nil: none).
	approvable *netproxy.Allowlist
	pmEnv      []string // package managers' settings (packageManagerEnv)
}

// networked reports whether the template's sandboxes get the egress proxy.
func (t *Template) networked() bool { return t.Policy.Network == policy.NetworkAllowlist }

// defaultTemplate is the template Options make.
func defaultTemplate(opts Options, allow *netproxy.Allowlist) *Template {
	t := &Template{Name: DefaultTemplate, Policy: opts.Policy, Env: opts.Env, Seed: opts.Seed, isDefault: true, allow: allow}
	for _, s := range opts.Secrets {
		t.Secrets = append(t.Secrets, s.Name)
	}
	t.pmEnv = packageManagerEnv(allow)
	t.approvable = parseApprovable(t.Policy)
	return t
}

// parseApprovable parses the hosts a person may approve (nil: none, or no
// egress proxy); the options were checked before.
func parseApprovable(p policy.Policy) *netproxy.Allowlist {
	if p.Network != policy.NetworkAllowlist || len(p.NetworkApproval) == 0 {
		return nil
	}
	a, err := netproxy.ParseAllowlist(p.NetworkApproval)
	if err != nil {
		return nil
	}
	return a
}

// checkTemplates checks the named templates against the options and
// returns them ready for use (allowlists parsed), by name.
func checkTemplates(opts Options) (map[string]*Template, error) {
	out := make(map[string]*Template, len(opts.Templates))
	var errs []error
	for name, t := range opts.Templates {
		t := t
		if name == "" || name == DefaultTemplate || strings.TrimSpace(name) != name {
			errs = append(errs, fmt.Errorf("session: template name %q is reserved or empty", name))
			continue
		}
		t.Name = name
		if err := t.Policy.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("session: template %s: %w", name, err))
			continue
		}
		if t.Seed != nil && t.Seed.readOnly {
			errs = append(errs, fmt.Errorf("session: template %s: its Seed was loaded for a read-only workspace; a template's seed is copied in at each start (LoadSeed with readOnly false)", name))
		}
		if t.Policy.ReadOnly && t.Seed != nil {
			errs = append(errs, fmt.Errorf("session: template %s: a read-only workspace cannot be filled after its start: drop its Seed", name))
		}
		if t.networked() {
			a, err := netproxy.ParseAllowlist(t.Policy.AllowHosts)
			if err != nil {
				errs = append(errs, fmt.Errorf("session: template %s: %w", name, err))
				continue
			}
			t.allow = a
			if t.approvable, err = netproxy.ParseAllowlist(t.Policy.NetworkApproval); err != nil {
				errs = append(errs, fmt.Errorf("session: template %s: network approval: %w", name, err))
				continue
			}
			if len(t.Policy.NetworkApproval) == 0 {
				t.approvable = nil
			}
		} else if len(t.Secrets) > 0 {
			errs = append(errs, fmt.Errorf("session: template %s: secrets are put into requests by the egress proxy, which only the allowlist network has", name))
		}
		for _, s := range t.Secrets {
			if !slices.ContainsFunc(opts.Secrets, func(sec netproxy.Secret) bool { return sec.Name == s }) {
				errs = append(errs, fmt.Errorf("session: template %s: secret %s is not one of the server's", name, s))
			}
		}
		t.pmEnv = packageManagerEnv(t.allow)
		out[name] = &t
	}
	return out, errors.Join(errs...)
}

// template returns the template called name: "" and "default" are the
// default template. An unknown name is INVALID_ARGUMENT, naming the
// templates there are.
func (m *Manager) template(name string) (*Template, error) {
	if name == "" || name == DefaultTemplate {
		return m.def, nil
	}
	if t := m.templates[name]; t != nil {
		return t, nil
	}
	return nil, errcode.Errorf(errcode.InvalidArgument, "there is no sandbox template %q; this server's templates are %s", name, strings.Join(m.TemplateNames(), ", "))
}

// TemplateNames returns the names of the templates a sandbox may be made
// from, "default" first, the others sorted.
func (m *Manager) TemplateNames() []string {
	names := make([]string, 0, len(m.templates))
	for n := range m.templates {
		names = append(names, n)
	}
	sort.Strings(names)
	return append([]string{DefaultTemplate}, names...)
}

// TemplateToolbox returns the toolbox manifest of a template's image, as
// Toolbox does the default's: "" when it has none, or the backend cannot
// read it in 2 s or inspect images of its choice.
func (m *Manager) TemplateToolbox(ctx context.Context, name string) string {
	t, err := m.template(name)
	if err != nil {
		return ""
	}
	if t.Image == "" {
		return m.Toolbox(ctx)
	}
	if im, ok := m.backend.(interface {
		ImageToolbox(context.Context, string) string
	}); ok {
		return im.ImageToolbox(ctx, t.Image)
	}
	return ""
}

// proxyFor returns the egress proxy of a template's sandboxes, or nil for
// no network at all.
func (m *Manager) proxyFor(t *Template) *netproxy.Proxy {
	if !t.networked() {
		return nil
	}
	return m.proxy
}

// Template returns the name of the template the sandbox was made from.
func (s *Sandbox) Template() string { return s.tpl.Name }

// Policy returns the policy of the sandbox's template: what the tools
// check its calls against.
func (s *Sandbox) Policy() policy.Policy { return s.tpl.Policy }

// warnMissingImages tells the operator, once prepared, which templates
// cannot start a sandbox because the backend lacks their image (a backend
// with MissingImages: Docker); the other templates run meanwhile, and each
// start of theirs looks for the image again.
func (m *Manager) warnMissingImages() {
	mi, ok := m.backend.(interface{ MissingImages() []string })
	if !ok {
		return
	}
	for _, img := range mi.MissingImages() {
		var names []string
		for _, n := range m.TemplateNames() {
			if t := m.templates[n]; t != nil && t.Image == img {
				names = append(names, n)
			}
		}
		m.log.Warn("sandbox templates cannot start until their image is on the engine: build or load it, or change their \"image\" in the config file (`sandbox-mcp doctor` checks); the other templates work meanwhile",
			"templates", strings.Join(names, ","), "image", img)
	}
}

// templateImageError is what a caller sees when template tpl's image is
// missing where the backend runs sandboxes (err wraps a
// *backend.ImageMissingError): which template, which image, and what the
// operator does. It returns nil for any other error, and for the default
// template, whose image is the server's own (--image).
func templateImageError(tpl *Template, err error) error {
	var im *backend.ImageMissingError
	if tpl.isDefault || !errors.As(err, &im) {
		return nil
	}
	return errcode.Errorf(errcode.Unavailable, "the template %s cannot start a sandbox: its %w. The server's operator must build or load that image (or change the template's \"image\" in the server's config file; `sandbox-mcp doctor` checks every template's image); the server's other templates work, and this one does once the image is there", tpl.Name, im)
}

// checkTemplateImage fails the creation of a sandbox of template tpl at
// once when the backend knows its image is missing (a backend with
// ImageReady: Docker, which looks again and prepares the image if it came
// since). Before the preparation is done it says nothing: the first call
// waits for that and meets the missing image then.
func (m *Manager) checkTemplateImage(ctx context.Context, tpl *Template) error {
	ir, ok := m.backend.(interface {
		ImageReady(context.Context, string) error
	})
	if tpl.Image == "" || !ok || !m.prep.status().Ready {
		return nil
	}
	err := ir.ImageReady(ctx, tpl.Image)
	if terr := templateImageError(tpl, err); terr != nil {
		return terr
	}
	return err
}
