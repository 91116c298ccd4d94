package session

import (
	"slices"
	"testing"

	"github.com/sandbox-mcp/sandbox-mcp/netproxy"
)

// TestPackageManagerEnv: pip and npm get the settings that make them fail
// at once wherever their registry cannot be reached (no network, or a
// proxy that does not allow it), and keep their defaults where it can; the
// operator's --env replaces a setting of the same name.
func TestPackageManagerEnv(t *testing.T) {
	pip := []string{"PIP_RETRIES=0", "PIP_DISABLE_PIP_VERSION_CHECK=1"}
	npm := []string{"npm_config_fetch_retries=0", "npm_config_update_notifier=false"}
	allow := func(entries ...string) *netproxy.Allowlist {
		a, err := netproxy.ParseAllowlist(entries)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	for name, tc := range map[string]struct {
		allow *netproxy.Allowlist
		want  []string
	}{
		"no network":            {nil, slices.Concat(pip, npm)},
		"no registry allowed":   {allow("api.example.com"), slices.Concat(pip, npm)},
		"pypi allowed":          {allow("pypi.org", "files.pythonhosted.org"), npm},
		"npm allowed by a glob": {allow("*.npmjs.org:443"), pip},
		"both allowed":          {allow("pypi.org:443", "registry.npmjs.org"), nil},
		"registry on port 80":   {allow("pypi.org:80"), slices.Concat(pip, npm)},
	} {
		if got := packageManagerEnv(tc.allow); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %q, want %q", name, got, tc.want)
		}
	}
	m := &Manager{def: &Template{pmEnv: slices.Concat(pip, npm), Env: []string{"PIP_RETRIES=3", "CI=1"}}}
	want := []string{"HOME=/tmp", "PIP_DISABLE_PIP_VERSION_CHECK=1", "npm_config_fetch_retries=0", "npm_config_update_notifier=false", "PIP_RETRIES=3", "CI=1"}
	if got := m.sandboxEnv(m.def); !slices.Equal(got, want) {
		t.Errorf("sandbox env %q, want %q", got, want)
	}
}
