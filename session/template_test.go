package session

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/netproxy"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/docker"
)

// templateSandbox makes a sandbox of the named template.
func templateSandbox(t *testing.T, m *Manager, key, template string) *Sandbox {
	t.Helper()
	sb, err := m.SandboxWithTemplate(key, "", template)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

// cgroupValue reads a cgroup file (v2, or v1 under its controller) inside
// the sandbox.
func cgroupValue(t *testing.T, sb *Sandbox, v2, v1 string) string {
	t.Helper()
	res := sh(t, sb, fmt.Sprintf("cat /sys/fs/cgroup/%s 2>/dev/null || cat /sys/fs/cgroup/%s", v2, v1))
	return strings.TrimSpace(string(res.Stdout))
}

// TestTemplateShapesTheSandbox: a sandbox of a template with a smaller
// memory and pids limit, a read-only workspace and its own image (here the
// same test image, prepared as a template image) has them, seen from
// inside; a default sandbox of the same manager keeps the options'.
func TestTemplateShapesTheSandbox(t *testing.T) {
	small := policy.Default()
	small.Memory, small.Pids, small.MaxWorkspaceBytes, small.ReadOnly = 128<<20, 64, 32<<20, true
	img := testenv.TestImage(t)
	m := testDockerManager(t, func(o *Options) {
		o.Env = []string{"WHO=default"}
		o.Templates = map[string]Template{"small": {Image: img, Policy: small, Env: []string{"WHO=small"}}}
	}, func(c *docker.Config) { c.Images = []string{img} })

	sb := templateSandbox(t, m, "small", "small")
	if sb.Template() != "small" || !sb.Policy().ReadOnly {
		t.Fatalf("template %q, policy %+v", sb.Template(), sb.Policy())
	}
	if got := cgroupValue(t, sb, "memory.max", "memory/memory.limit_in_bytes"); got != "134217728" {
		t.Errorf("memory limit inside %q, want 134217728", got)
	}
	if got := cgroupValue(t, sb, "pids.max", "pids/pids.max"); got != "64" {
		t.Errorf("pids limit inside %q, want 64", got)
	}
	if res := sh(t, sb, "echo x > /workspace/f && echo wrote; echo WHO=$WHO"); strings.Contains(string(res.Stdout), "wrote") || !strings.Contains(string(res.Stdout), "WHO=small") {
		t.Errorf("read-only template: %q %q", res.Stdout, res.Stderr)
	}
	if _, err := sb.WriteFile(context.Background(), "f", []byte("x"), false, 0o644); err == nil {
		t.Error("a write into the read-only template's workspace went through")
	}
	if _, _, err := sb.Restore(context.Background(), "snap-x"); !isCode(err, errcode.ReadOnly) {
		t.Errorf("restore into the read-only template's sandbox: %v, want READ_ONLY", err)
	}

	def := templateSandbox(t, m, "default", "")
	if def.Template() != DefaultTemplate {
		t.Errorf("template %q", def.Template())
	}
	if got := cgroupValue(t, def, "memory.max", "memory/memory.limit_in_bytes"); got != "268435456" {
		t.Errorf("default memory limit inside %q, want 268435456", got)
	}
	if got := cgroupValue(t, def, "pids.max", "pids/pids.max"); got != "256" {
		t.Errorf("default pids limit inside %q, want 256", got)
	}
	if res := sh(t, def, "echo x > /workspace/f && echo wrote; echo WHO=$WHO"); !strings.Contains(string(res.Stdout), "wrote") || !strings.Contains(string(res.Stdout), "WHO=default") {
		t.Errorf("default sandbox: %q %q", res.Stdout, res.Stderr)
	}

	if _, err := m.SandboxWithTemplate("other", "", "nope"); !isCode(err, errcode.InvalidArgument) || !strings.Contains(err.Error(), "default, small") {
		t.Errorf("an unknown template: %v", err)
	}
}

func isCode(err error, code errcode.Code) bool {
	e, ok := errcode.As(err)
	return ok && e.Code == code
}

// networkMode returns the network a sandbox's container joined.
func networkMode(t *testing.T, sb *Sandbox) string {
	t.Helper()
	insp, err := testenv.Engine(t).ContainerInspect(context.Background(), sb.ContainerID(), client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return string(insp.Container.HostConfig.NetworkMode)
}

// TestTemplateNetwork: with the allowlist as the default, a template with
// network none gets no network at all (no proxy, no route); and the
// reverse, with no network as the default, a template with an allowlist
// gets its own network and the proxy, with its own hosts.
func TestTemplateNetwork(t *testing.T) {
	upstream := listen(t, "127.0.0.1:0", true)
	api, other := fmt.Sprintf("api.test:%d", upstream.port()), fmt.Sprintf("other.test:%d", upstream.port())
	resolver := mapResolver{"api.test": {netip.MustParseAddr("127.0.0.1")}, "other.test": {netip.MustParseAddr("127.0.0.1")}}

	t.Run("default allowlist, template none", func(t *testing.T) {
		offline := policy.Default()
		m := testManager(t, func(o *Options) {
			o.Policy.Network, o.Policy.AllowHosts, o.Policy.AllowPrivateNetworks = policy.NetworkAllowlist, []string{api}, true
			o.Resolver = resolver
			o.Templates = map[string]Template{"offline": {Policy: offline}}
		})
		sb := templateSandbox(t, m, "offline", "offline")
		out := string(sh(t, sb, `echo "proxy=[$HTTPS_PROXY]"; grep -c : /proc/net/dev; nc -w 2 1.1.1.1 443 </dev/null; echo rc=$?`).Stdout)
		if !strings.Contains(out, "proxy=[]") || !strings.Contains(out, "rc=1") {
			t.Errorf("offline template: %q", out)
		}
		if mode := networkMode(t, sb); mode != "none" {
			t.Errorf("offline template's network %q, want none", mode)
		}
		def := templateSandbox(t, m, "default", "")
		if out := string(sh(t, def, proxyScript(api, "ping")).Stdout); !strings.Contains(out, "200") {
			t.Errorf("the default sandbox lost its allowlist: %q", out)
		}
	})

	t.Run("default none, template allowlist", func(t *testing.T) {
		web := policy.Default()
		web.Network, web.AllowHosts, web.AllowPrivateNetworks = policy.NetworkAllowlist, []string{other}, true
		m := testDockerManager(t, func(o *Options) {
			o.Resolver = resolver
			o.Templates = map[string]Template{"web": {Policy: web}}
		}, func(c *docker.Config) { c.Egress = true }) // as main sets it when a template needs the allowlist
		sb := templateSandbox(t, m, "web", "web")
		before := upstream.count.Load()
		// Its own host passes the allowlist (and is then refused for
		// resolving to loopback: private addresses are a server-wide
		// choice, off with the default's network none); the server's
		// other names are not on it.
		if out := string(sh(t, sb, proxyScript(other, "x")).Stdout); !strings.Contains(out, "403") || !strings.Contains(out, "--allow-private-networks") {
			t.Errorf("the template's own host: %q", out)
		}
		if out := string(sh(t, sb, proxyScript(api, "x")).Stdout); !strings.Contains(out, "403") || !strings.Contains(out, "--allow-host") {
			t.Errorf("a host off the template's allowlist: %q", out)
		}
		if mode := networkMode(t, sb); !strings.HasPrefix(mode, "sandbox-mcp-"+sb.ID()) {
			t.Errorf("web template's network %q, want its own", mode)
		}
		def := templateSandbox(t, m, "default", "")
		out := string(sh(t, def, `echo "proxy=[$HTTPS_PROXY]"`).Stdout)
		if !strings.Contains(out, "proxy=[]") {
			t.Errorf("the default sandbox got a proxy: %q", out)
		}
		if mode := networkMode(t, def); mode != "none" {
			t.Errorf("default network %q, want none", mode)
		}
		if upstream.count.Load() != before {
			t.Error("a refused request reached the upstream")
		}
	})
}

// TestTemplateSecrets: a template holds only the secrets it names: a
// template with none gets no placeholder and no CA bundle variables, while
// a default sandbox of the same server gets both.
func TestTemplateSecrets(t *testing.T) {
	bare := policy.Default()
	bare.Network, bare.AllowHosts = policy.NetworkAllowlist, []string{"api.test"}
	m := testManager(t, func(o *Options) {
		o.Policy.Network, o.Policy.AllowHosts = policy.NetworkAllowlist, []string{"api.test"}
		o.Secrets = []netproxy.Secret{{Name: "TOKEN", Value: "real-secret-value-0123", Hosts: []string{"api.test"}}}
		o.Templates = map[string]Template{"bare": {Policy: bare}}
	})
	script := `echo "token=[$TOKEN] ca=[$SSL_CERT_FILE]"`
	def := string(sh(t, templateSandbox(t, m, "default", ""), script).Stdout)
	if !strings.Contains(def, "token=[sbx-secret-TOKEN-") || strings.Contains(def, "ca=[]") {
		t.Errorf("default sandbox: %q", def)
	}
	if out := string(sh(t, templateSandbox(t, m, "bare", "bare"), script).Stdout); !strings.Contains(out, "token=[] ca=[]") {
		t.Errorf("a template holding no secret: %q", out)
	}
}
