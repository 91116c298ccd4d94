package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// writeConfig writes a config file and returns its path.
func writeConfig(t *testing.T, dir, body string) string {
	t.Helper()
	file := filepath.Join(dir, "c.json")
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// TestTemplatesInherit: a template inherits every key it does not set from
// the default template (the flags, after every layer), and the keys it
// sets are parsed as the flags parse them (units, lists that replace).
func TestTemplatesInherit(t *testing.T) {
	dir := t.TempDir()
	env := map[string]string{"HOME": dir, "GH": testSecretValue, "PY": "pypi-token-value-42"}
	file := writeConfig(t, dir, `{
		"network": "allowlist", "allow-host": ["github.com", "pypi.org"], "memory": "2GiB", "env": ["A=1"],
		"secret": ["GH@github.com", "PY@pypi.org"],
		"templates": {
			"py": {"image": "sandbox-mcp:py", "memory": "512MiB", "pids": 64, "allow-host": ["pypi.org"], "secret": ["PY"], "env": ["B=2"]},
			"locked": {"network": "none", "read-only": true, "exec": "allowlist", "allow-cmd": ["ls", "cat"]}
		}}`)
	cfg, err := ParseConfig([]string{"--config", file, "--cpus", "2"}, envFrom(env))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Templates) != 2 || cfg.Templates[0].Name != "locked" || cfg.Templates[1].Name != "py" {
		t.Fatalf("templates %+v", cfg.Templates)
	}
	locked, py := cfg.Templates[0], cfg.Templates[1]
	if py.Image != "sandbox-mcp:py" || py.Policy.Memory != 512<<20 || py.Policy.Pids != 64 || py.Policy.CPUs != 2 ||
		!slices.Equal(py.Policy.AllowHosts, []string{"pypi.org"}) || !slices.Equal(py.Secrets, []string{"PY"}) || !slices.Equal(py.Env, []string{"B=2"}) {
		t.Errorf("py: %+v", py)
	}
	if locked.Image != cfg.Image || locked.Policy.Memory != 2<<30 || locked.Policy.CPUs != 2 || locked.Policy.Network != policy.NetworkNone ||
		!locked.Policy.ReadOnly || locked.Policy.Exec != policy.ExecAllowlist || !slices.Equal(locked.Policy.AllowCmds, []string{"ls", "cat"}) ||
		len(locked.Secrets) != 0 || !slices.Equal(locked.Env, []string{"A=1"}) {
		t.Errorf("locked: %+v (a template without network holds no secret; the rest inherited)", locked)
	}
	if cfg.Policy.Memory != 2<<30 || cfg.Policy.ReadOnly || !slices.Equal(cfg.Policy.AllowHosts, []string{"github.com", "pypi.org"}) || !slices.Equal(cfg.Env, []string{"A=1"}) {
		t.Errorf("the default changed: %+v %v", cfg.Policy, cfg.Env)
	}
	if imgs := cfg.templateImages(); !slices.Equal(imgs, []string{"sandbox-mcp:py"}) {
		t.Errorf("template images %q", imgs)
	}
}

// TestTemplatesRefused: what a template cannot be, each refused at load
// with the file, the template and the key named.
func TestTemplatesRefused(t *testing.T) {
	dir := t.TempDir()
	seed := t.TempDir()
	env := map[string]string{"HOME": dir, "GH": testSecretValue}
	for _, tc := range []struct {
		name, server, templates, want string
	}{
		{"unknown key", ``, `{"t": {"max-file-bytes": "1MiB"}}`, `template "t": unknown key "max-file-bytes"`},
		{"unknown key typo", ``, `{"t": {"memroy": "1GiB"}}`, `unknown key "memroy"`},
		{"unknown secret", `"network": "allowlist", "allow-host": ["github.com"], "secret": ["GH@github.com"],`, `{"t": {"secret": ["NPM"]}}`, `template "t": secret NPM is not one of this server's --secret names (it has GH)`},
		{"secret without any on the server", ``, `{"t": {"secret": ["GH"]}}`, `secret GH is not one of this server's --secret names (it has none)`},
		{"inherited secret off the allowlist", `"network": "allowlist", "allow-host": ["github.com", "pypi.org"], "secret": ["GH@github.com"],`, `{"t": {"allow-host": ["pypi.org"]}}`, `name the secrets it holds with "secret"`},
		{"secret without network", `"network": "allowlist", "allow-host": ["github.com"], "secret": ["GH@github.com"],`, `{"t": {"network": "none", "secret": ["GH"]}}`, `only "network": "allowlist" has`},
		{"bad image name", ``, `{"t": {"image": "Not A/Name::"}}`, `template "t": image "Not A/Name::" is not an image name`},
		{"bad memory", ``, `{"t": {"memory": "lots"}}`, `template "t": memory: "lots" is not a byte count`},
		{"bad network", ``, `{"t": {"network": "open"}}`, `template "t": network: "open" is not one of none, allowlist`},
		{"allowlist without hosts", ``, `{"t": {"network": "allowlist"}}`, `with no "allow-host" lets nothing out`},
		{"allowlist exec without commands", ``, `{"t": {"exec": "allowlist"}}`, `template "t"`},
		{"reserved name", ``, `{"default": {"memory": "1GiB"}}`, `template "default": a template's name`},
		{"bad name", ``, `{"Py Tools": {}}`, `template "Py Tools": a template's name`},
		{"server env", ``, `{"t": {"env": ["SANDBOX_MCP_TOKEN=x"]}}`, `configure this server`},
		{"read-only with its own seed", ``, `{"t": {"read-only": true, "workspace-from": "` + seed + `"}}`, `a read-only workspace starts with content only as the default's does`},
		{"missing seed", ``, `{"t": {"workspace-from": "` + filepath.Join(seed, "nope") + `"}}`, `workspace-from`},
		{"not an object", ``, `["t"]`, `"templates" must be an object`},
		{"pids on kubernetes", `"backend": "kubernetes", "namespace": "ns", "agent-image": "agent:1",`, `{"t": {"pids": 64}}`, `"pids" does not apply on --backend kubernetes`},
		{"allowlist on kubernetes without the flags'", `"backend": "kubernetes", "namespace": "ns", "agent-image": "agent:1",`, `{"t": {"network": "allowlist", "allow-host": ["pypi.org"]}}`, `only when the flags have --network=allowlist`},
	} {
		file := writeConfig(t, dir, `{`+tc.server+` "templates": `+tc.templates+`}`)
		_, err := ParseConfig([]string{"--config", file}, envFrom(env))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
		if err != nil && !strings.Contains(err.Error(), file) {
			t.Errorf("%s: %v does not name the file", tc.name, err)
		}
	}
}

// TestTemplatesNetwork: the backend's firewall and proxy exist when any
// template needs the allowlist, even with --network=none; the default's
// own network decides nothing for a template that sets its own.
func TestTemplatesNetwork(t *testing.T) {
	dir := t.TempDir()
	file := writeConfig(t, dir, `{"templates": {"web": {"network": "allowlist", "allow-host": ["pypi.org"]}}}`)
	cfg, err := ParseConfig([]string{"--config", file}, envFrom(map[string]string{"HOME": dir}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Policy.Network != policy.NetworkNone || !cfg.anyNetworked() {
		t.Errorf("network %s, anyNetworked %v", cfg.Policy.Network, cfg.anyNetworked())
	}
	cfg, _ = ParseConfig(nil, envFrom(map[string]string{"HOME": dir}))
	if cfg.anyNetworked() || len(cfg.Templates) != 0 {
		t.Error("no template, no network, yet networked")
	}
}

// TestTemplatesDocExample: the example in docs/templates.md loads as the
// page says.
func TestTemplatesDocExample(t *testing.T) {
	doc, err := os.ReadFile("../../docs/templates.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(string(doc), "```json\n")
	example, _, _ := strings.Cut(rest, "```")
	dir := t.TempDir()
	file := writeConfig(t, dir, example)
	cfg, err := ParseConfig([]string{"--config", file}, envFrom(map[string]string{"HOME": dir, "GH_TOKEN": testSecretValue}))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Templates) != 2 {
		t.Fatalf("templates %+v", cfg.Templates)
	}
	locked, py := cfg.Templates[0], cfg.Templates[1]
	if py.Policy.Memory != 1<<30 || len(py.Secrets) != 0 || py.Policy.Network != policy.NetworkAllowlist {
		t.Errorf("py %+v", py)
	}
	if locked.Policy.Memory != 2<<30 || locked.Policy.Network != policy.NetworkNone || len(locked.Policy.AllowHosts) != 0 || !locked.Policy.ReadOnly {
		t.Errorf("locked %+v", locked)
	}
}

// TestTemplatesNetworkApproval: a template sets its own "network-approval"
// (the hosts a person may approve for its sandboxes), turns it off with
// [], inherits the default's with its network, and drops it without one;
// bad values are refused at load, naming the template and the key.
func TestTemplatesNetworkApproval(t *testing.T) {
	dir := t.TempDir()
	env := envFrom(map[string]string{"HOME": dir})
	file := writeConfig(t, dir, `{
		"network": "allowlist", "allow-host": ["github.com"], "network-approval": ["*.pypi.org"],
		"templates": {
			"ask": {"network-approval": ["files.example:443", "*.npmjs.org"]},
			"inherit": {"memory": "512MiB"},
			"quiet": {"network-approval": []},
			"offline": {"network": "none"}
		}}`)
	cfg, err := ParseConfig([]string{"--config", file}, env)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, tp := range cfg.Templates {
		got[tp.Name] = tp.Policy.NetworkApproval
	}
	if !slices.Equal(got["ask"], []string{"files.example:443", "*.npmjs.org"}) || !slices.Equal(got["inherit"], []string{"*.pypi.org"}) ||
		len(got["quiet"]) != 0 || len(got["offline"]) != 0 || !slices.Equal(cfg.Policy.NetworkApproval, []string{"*.pypi.org"}) {
		t.Errorf("network-approval per template: %v, default %v", got, cfg.Policy.NetworkApproval)
	}
	// A template may turn approval on where the flags have none.
	file = writeConfig(t, dir, `{"network": "allowlist", "allow-host": ["github.com"], "templates": {"ask": {"network-approval": "pypi.org"}}}`)
	if cfg, err = ParseConfig([]string{"--config", file}, env); err != nil || !slices.Equal(cfg.Templates[0].Policy.NetworkApproval, []string{"pypi.org"}) || len(cfg.Policy.NetworkApproval) != 0 {
		t.Errorf("approval on a template only: %v %+v", err, cfg.Templates)
	}
	for _, tc := range []struct{ name, server, templates, want string }{
		{"bad pattern", `"network": "allowlist", "allow-host": ["github.com"],`, `{"t": {"network-approval": ["*.*.example"]}}`, `template "t": network-approval: `},
		{"ip literal", `"network": "allowlist", "allow-host": ["github.com"],`, `{"t": {"network-approval": ["10.0.0.1:80"]}}`, `template "t": network-approval: `},
		{"without network", ``, `{"t": {"network-approval": ["pypi.org"]}}`, `template "t": --network-approval needs --network=allowlist`},
		{"network none", `"network": "allowlist", "allow-host": ["github.com"],`, `{"t": {"network": "none", "network-approval": ["pypi.org"]}}`, `template "t": --network-approval needs --network=allowlist`},
	} {
		file := writeConfig(t, dir, `{`+tc.server+` "templates": `+tc.templates+`}`)
		_, err := ParseConfig([]string{"--config", file}, env)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
