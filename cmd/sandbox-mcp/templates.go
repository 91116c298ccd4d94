package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/distribution/reference"

	"github.com/sandbox-mcp/sandbox-mcp/netproxy"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session"
)

// TemplatesKey is the config file's key of the operator's sandbox
// templates: an object of template name → the keys below.
const TemplatesKey = "templates"

// templateKeys are what a template may set: the config file's keys (the
// flags' names) of what shapes a sandbox. Every other key stays the
// server's: a template cannot set it.
var templateKeys = []string{
	"image", "memory", "cpus", "pids", "max-workspace-bytes",
	"network", "allow-host", "network-approval", "network-approval-caller-scope", "secret", "env", "workspace-from", "read-only",
	"exec", "allow-cmd",
}

// templateName is what a template may be called.
var templateName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)

// Template is one of the operator's named sandbox templates, resolved:
// every key it does not set is the default template's (the flags' value).
type Template struct {
	Name string
	// Image is the base image of its sandboxes.
	Image string
	// Policy is its whole policy (the server-wide knobs are the
	// default's).
	Policy policy.Policy
	// Env is what its sandboxes get, as NAME=VALUE (values are secret).
	Env []string
	// Secrets names the server's --secret its sandboxes hold.
	Secrets []string
	// WorkspaceFrom is the host directory its workspaces start with.
	WorkspaceFrom string
	// Keys are the keys it set, sorted.
	Keys []string
}

// parseTemplates resolves the config file's templates (raw, the value of
// its "templates" key; nil for none) against the default template cfg,
// whose layers are all applied. Errors name the file, the template and the
// key.
func parseTemplates(cfg Config, file string, raw json.RawMessage, getenv func(string) string) ([]Template, error) {
	if raw == nil {
		return nil, nil
	}
	var byName map[string]json.RawMessage
	if err := json.Unmarshal(raw, &byName); err != nil {
		return nil, fmt.Errorf("--config %s: %q must be an object of template name → settings: %w", file, TemplatesKey, err)
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []Template
	var errs []error
	for _, name := range names {
		t, err := parseTemplate(cfg, name, byName[name], getenv)
		if err != nil {
			errs = append(errs, fmt.Errorf("--config %s: template %q: %w", file, name, err))
			continue
		}
		out = append(out, t)
	}
	return out, errors.Join(errs...)
}

// parseTemplate resolves one template: the default's values, with the keys
// it sets parsed as the flags parse them.
func parseTemplate(cfg Config, name string, raw json.RawMessage, getenv func(string) string) (Template, error) {
	if name == session.DefaultTemplate || !templateName.MatchString(name) {
		return Template{}, fmt.Errorf("a template's name is 1-32 of a-z, 0-9, - and _ (starting with a letter or digit), and not %q, which names the flags' own", session.DefaultTemplate)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return Template{}, fmt.Errorf("not a JSON object: %w", err)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	// The template starts as the default; the flags' own parsing reads
	// its keys, each a new layer that replaces a list.
	tc := Config{Policy: cfg.Policy, Image: cfg.Image, WorkspaceFrom: cfg.WorkspaceFrom}
	tc.Policy.AllowCmds = slices.Clone(cfg.Policy.AllowCmds)
	tc.Policy.AllowHosts = slices.Clone(cfg.Policy.AllowHosts)
	tc.Policy.NetworkApproval = slices.Clone(cfg.Policy.NetworkApproval)
	f := newFlagSet(&tc, getenv)
	f.source = 1
	f.env.resolved = slices.Clone(cfg.Env)
	var secrets []string
	secretsSet := false
	var errs []error
	for _, k := range keys {
		if !slices.Contains(templateKeys, k) {
			errs = append(errs, fmt.Errorf("unknown key %q; a template sets only %s (a server-wide key such as %q stays the flags')", k, strings.Join(templateKeys, ", "), "max-file-bytes"))
			continue
		}
		vals := configValues(m[k])
		if k == "network-approval" {
			// Its own patterns replace the default's; [] or "" turns
			// approval off for the template.
			tc.Policy.NetworkApproval = nil
		}
		if k == "secret" {
			secretsSet = true
			for _, v := range vals {
				for _, n := range strings.Split(v, ",") {
					if n = strings.TrimSpace(n); n != "" {
						secrets = append(secrets, n)
					}
				}
			}
			continue
		}
		for _, v := range vals {
			if err := f.fs.Set(k, v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", k, err))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Template{}, err
	}
	t := Template{Name: name, Image: tc.Image, Policy: tc.Policy, Env: f.env.resolved, WorkspaceFrom: tc.WorkspaceFrom, Keys: keys}
	networked := t.Policy.Network == policy.NetworkAllowlist
	if !networked && !slices.Contains(keys, "allow-host") {
		// The default's hosts go with its network.
		t.Policy.AllowHosts, t.Policy.AllowPrivateNetworks = nil, false
	}
	if !networked && !slices.Contains(keys, "network-approval") {
		// So do the hosts a person may approve: without the egress
		// proxy there is nothing to approve at.
		t.Policy.NetworkApproval = nil
	}
	if len(t.Policy.NetworkApproval) == 0 && !slices.Contains(keys, "network-approval-caller-scope") {
		// The default's caller scope goes with its patterns.
		t.Policy.NetworkApprovalCallerScope = false
	}
	if !secretsSet && networked {
		// Inherited with the network; a template without network holds
		// none.
		for _, s := range cfg.Secrets {
			t.Secrets = append(t.Secrets, s.Name)
		}
	} else {
		t.Secrets = secrets
	}
	return t, t.validate(cfg, secretsSet)
}

// configValues turns a config file value into the strings a flag is set
// with, as applyFile does.
func configValues(v any) []string {
	switch v := v.(type) {
	case []any:
		var out []string
		for _, e := range v {
			out = append(out, fmt.Sprint(e))
		}
		return out
	case float64:
		return []string{strconv.FormatFloat(v, 'f', -1, 64)}
	}
	return []string{fmt.Sprint(v)}
}

// validate checks a resolved template against the server's configuration:
// nothing in it may widen what the operator's server allows (a secret must
// be one of the server's), and it must be startable.
func (t Template) validate(cfg Config, secretsSet bool) error {
	var errs []error
	if err := t.Policy.Validate(); err != nil {
		errs = append(errs, err)
	}
	if t.Image == "" {
		errs = append(errs, errors.New("image: empty"))
	} else if _, err := reference.ParseAnyReference(t.Image); err != nil {
		errs = append(errs, fmt.Errorf("image %q is not an image name such as sandbox-mcp:py or an image id (%v)", t.Image, err))
	}
	networked := t.Policy.Network == policy.NetworkAllowlist
	var allow *netproxy.Allowlist
	if networked {
		var err error
		if allow, err = netproxy.ParseAllowlist(t.Policy.AllowHosts); err != nil {
			errs = append(errs, fmt.Errorf("allow-host: %w", err))
		}
		if len(t.Policy.AllowHosts) == 0 {
			errs = append(errs, errors.New(`network "allowlist" with no "allow-host" lets nothing out; name the hosts, or set "network": "none"`))
		}
	}
	if _, err := netproxy.ParseAllowlist(t.Policy.NetworkApproval); err != nil {
		errs = append(errs, fmt.Errorf("network-approval: %w", err))
	}
	var held []netproxy.Secret
	for _, name := range t.Secrets {
		i := slices.IndexFunc(cfg.Secrets, func(s netproxy.Secret) bool { return s.Name == name })
		if i < 0 {
			have := "none"
			if len(cfg.SecretSpecs) > 0 {
				var ns []string
				for _, s := range cfg.Secrets {
					ns = append(ns, s.Name)
				}
				have = strings.Join(ns, ", ")
			}
			errs = append(errs, fmt.Errorf("secret %s is not one of this server's --secret names (it has %s); a template only picks among them", name, have))
			continue
		}
		held = append(held, cfg.Secrets[i])
	}
	if len(held) > 0 {
		switch {
		case !networked:
			errs = append(errs, fmt.Errorf(`secret %s: secrets are put into requests by the egress proxy, which only "network": "allowlist" has`, held[0].Name))
		case allow != nil:
			if err := netproxy.CheckSecrets(held, allow); err != nil {
				hint := `; add the host to the template's "allow-host"`
				if !secretsSet {
					hint += `, or name the secrets it holds with "secret" (it inherits every one of the server's)`
				}
				errs = append(errs, fmt.Errorf("secret: %w%s", err, hint))
			}
		}
	}
	if err := checkEnv(t.Env, cfg.HTTP.Tokens); err != nil {
		errs = append(errs, err)
	}
	for _, kv := range t.Env {
		n, val, _ := strings.Cut(kv, "=")
		for _, s := range cfg.Secrets {
			if n == s.Name || s.Value != "" && strings.Contains(val, s.Value) {
				errs = append(errs, fmt.Errorf("env %s: it is a --secret or holds a secret's value; drop it from the template's env", n))
			}
		}
	}
	if t.WorkspaceFrom != "" && t.WorkspaceFrom != cfg.WorkspaceFrom {
		if st, err := os.Stat(t.WorkspaceFrom); err != nil || !st.IsDir() {
			errs = append(errs, fmt.Errorf("workspace-from %s is not a directory", t.WorkspaceFrom))
		}
	}
	if t.Policy.ReadOnly && t.WorkspaceFrom != "" &&
		(t.WorkspaceFrom != cfg.WorkspaceFrom || !cfg.Policy.ReadOnly || t.Image != cfg.Image || cfg.Kube.Backend == BackendKubernetes) {
		errs = append(errs, errors.New(`a read-only workspace starts with content only as the default's does (the same "workspace-from" and image, the flags read-only too, on Docker): set "workspace-from": "" or make the template writable`))
	}
	if cfg.Kube.Backend == BackendKubernetes && slices.Contains(t.Keys, "pids") {
		// Refused rather than shown and not applied: the instructions and
		// sandbox://policy would promise a limit no pod has.
		errs = append(errs, errors.New(`"pids" does not apply on --backend kubernetes: Kubernetes has no per-pod process limit, every sandbox pod gets the kubelet's podPidsLimit (docs/kubernetes.md); drop the key`))
	}
	if cfg.Kube.Backend == BackendKubernetes && networked && cfg.Policy.Network != policy.NetworkAllowlist {
		errs = append(errs, errors.New(`on --backend kubernetes a template gets "network": "allowlist" only when the flags have --network=allowlist (the proxy's NetworkPolicy is made for it)`))
	}
	return errors.Join(errs...)
}

// imageBakesSeed reports whether the default's runtime image holds the
// workspace's content (a read-only workspace with --workspace-from, on
// Docker).
func (c Config) imageBakesSeed() bool {
	return c.Policy.ReadOnly && c.WorkspaceFrom != "" && c.Kube.Backend != BackendKubernetes
}

// sessionImage is the base image the session layer is given for a
// template: "" to run the default's own runtime image (with a read-only
// default workspace's content in it), the template's image otherwise.
func (t Template) sessionImage(cfg Config) string {
	switch {
	case t.Image != cfg.Image:
		return t.Image
	case t.Policy.ReadOnly && cfg.imageBakesSeed() && t.WorkspaceFrom == "":
		return t.Image // the same base, without the default's content
	}
	return ""
}

// templateImages returns the template images the backend must prepare
// besides --image (sessionImage's, deduplicated).
func (c Config) templateImages() []string {
	var out []string
	for _, t := range c.Templates {
		if img := t.sessionImage(c); img != "" && !slices.Contains(out, img) {
			out = append(out, img)
		}
	}
	return out
}

// anyNetworked reports whether the default or a template gets the
// allowlist network (the egress proxy, the firewall).
func (c Config) anyNetworked() bool {
	if c.Policy.Network == policy.NetworkAllowlist {
		return true
	}
	return slices.ContainsFunc(c.Templates, func(t Template) bool { return t.Policy.Network == policy.NetworkAllowlist })
}

// loadTemplates makes the session's templates: a writable workspace's
// content is read once per directory and size (the default's reused). On
// failure what was loaded is closed.
func loadTemplates(cfg Config, def *session.Seed) (map[string]session.Template, error) {
	if len(cfg.Templates) == 0 {
		return nil, nil
	}
	out := map[string]session.Template{}
	type seedKey struct {
		dir string
		max int64
	}
	seeds := map[seedKey]*session.Seed{}
	if def != nil && !cfg.Policy.ReadOnly {
		seeds[seedKey{cfg.WorkspaceFrom, cfg.Policy.MaxWorkspaceBytes}] = def
	}
	for _, t := range cfg.Templates {
		st := session.Template{Name: t.Name, Image: t.sessionImage(cfg), Policy: t.Policy, Env: t.Env, Secrets: t.Secrets}
		if t.WorkspaceFrom != "" && !t.Policy.ReadOnly {
			k := seedKey{t.WorkspaceFrom, t.Policy.MaxWorkspaceBytes}
			if seeds[k] == nil {
				sd, err := session.LoadSeed(t.WorkspaceFrom, t.Policy.MaxWorkspaceBytes, false, nil)
				if err != nil {
					for _, s := range seeds {
						if s != def {
							s.Close()
						}
					}
					return nil, fmt.Errorf("template %s: %w", t.Name, err)
				}
				seeds[k] = sd
			}
			st.Seed = seeds[k]
		}
		out[t.Name] = st
	}
	return out, nil
}
