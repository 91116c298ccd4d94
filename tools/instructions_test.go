package tools

import (
	"strings"
	"testing"

	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// configs are the server configurations whose texts the tests check.
func configs() map[string]PolicyView {
	def := policy.Default()
	allow := policy.Default()
	allow.Exec, allow.AllowCmds = policy.ExecAllowlist, []string{"ls", "cat", "python3", "node", "npm", "git", "make", "gcc", "bash", "sh"}
	allow.Network, allow.AllowHosts = policy.NetworkAllowlist, []string{"pypi.org:443", "files.pythonhosted.org:443", "registry.npmjs.org:443", "*.github.com:443"}
	deny := policy.Default()
	deny.Exec, deny.ReadOnly = policy.ExecDeny, true
	noHosts := policy.Default()
	noHosts.Network = policy.NetworkAllowlist
	noShell := policy.Default()
	noShell.Exec, noShell.AllowCmds = policy.ExecAllowlist, []string{"python3", "/usr/bin/git", "ls"}
	return map[string]PolicyView{
		"allowlist without a shell": ViewOf(noShell, "sandbox-mcp:default", nil),
		"default":                   ViewOf(def, "sandbox-mcp:default", nil),
		"allowlist":                 withSecrets(ViewOf(allow, "registry.example/team/toolchain:1.2", []string{"CI=1", "LANG=C.UTF-8"}), SecretView{Name: "GITHUB_TOKEN", Hosts: []string{"api.github.com", "github.com"}}),
		"deny":                      ViewOf(deny, "sandbox-mcp:default", nil),
		"no hosts":                  ViewOf(noHosts, "sandbox-mcp:default", nil),
	}
}

func withSecrets(v PolicyView, s ...SecretView) PolicyView {
	v.Secrets = s
	return v
}

// TestInstructionsFollowTheConfig: the instructions say what each
// configuration gives, and nothing it does not.
func TestInstructionsFollowTheConfig(t *testing.T) {
	c := configs()
	for name, tc := range map[string]struct {
		has, hasNot []string
	}{
		"default": {
			has: []string{"python3 with pip", "no network", "/workspace last for the session", "working directory, exported variables and shell state do not carry over",
				"background: true", "sandbox_job", "any command may run", "8 MiB", "1 GiB of memory", "default 1m, at most 10m", "sandbox://policy"},
			hasNot: []string{"read-only: nothing", "only these programs", "Set for every command"},
		},
		"allowlist": {
			has: []string{"registry.example/team/toolchain:1.2", "ls /usr/local/bin", "reaches only pypi.org:443, files.pythonhosted.org:443, registry.npmjs.org:443, *.github.com:443", "only these programs run: ls, cat, python3", "Set for every command: CI, LANG",
				"$GITHUB_TOKEN is the credential for api.github.com, github.com"},
			hasNot: []string{"python3 with pip", "no network", "C.UTF-8", "shell lines are refused"},
		},
		"allowlist without a shell": {
			has:    []string{"only these programs run: python3, /usr/bin/git, ls. argv only; shell lines are refused here."},
			hasNot: []string{"shell line (command)"},
		},
		"deny": {
			has:    []string{"no commands run here", "workspace is read-only"},
			hasNot: []string{"background: true", "timeout_ms", "shell state"},
		},
		"no hosts": {has: []string{"allows no host"}},
	} {
		got := Instructions(c[name], "sandbox-mcp:default")
		for _, s := range tc.has {
			if !strings.Contains(got, s) {
				t.Errorf("%s: instructions lack %q:\n%s", name, s, got)
			}
		}
		for _, s := range tc.hasNot {
			if strings.Contains(got, s) {
				t.Errorf("%s: instructions say %q:\n%s", name, s, got)
			}
		}
		if strings.Contains(got, " \n") || strings.HasSuffix(got, " ") {
			t.Errorf("%s: trailing space:\n%q", name, got)
		}
	}
}

// TestExecSaysArgvOnlyWithoutAShell: under an allowlist without a shell,
// sandbox_exec's description and its command argument say that shell lines
// are refused; with one, they do not.
func TestExecSaysArgvOnlyWithoutAShell(t *testing.T) {
	for name, want := range map[string]bool{"allowlist without a shell": true, "allowlist": false, "default": false} {
		for _, tool := range listTools(t, configs()[name].Policy) {
			if tool.Name != NameExec {
				continue
			}
			desc := tool.Description
			cmd := tool.InputSchema.(map[string]any)["properties"].(map[string]any)["command"].(map[string]any)["description"].(string)
			if strings.Contains(desc, "argv only; shell lines (command) are refused here") != want || strings.Contains(cmd, "Refused here") != want {
				t.Errorf("%s: description %q, command %q; want shell lines refused: %v", name, desc, cmd, want)
			}
		}
	}
}

// maxTextBudget bounds what a client puts in every conversation: every
// tool description and the instructions together.
const maxTextBudget = 6000

// TestTextsFitTheBudget: the tool descriptions plus the instructions stay
// short, for every configuration; and every description but exec's starts
// with when to use the tool rather than sandbox_exec.
func TestTextsFitTheBudget(t *testing.T) {
	for name, v := range configs() {
		total := len(Instructions(v, "sandbox-mcp:default"))
		for _, tool := range listTools(t, v.Policy) {
			total += len(tool.Description)
			if tool.Name == NameExec {
				continue
			}
			first, _, _ := strings.Cut(tool.Description, ". ")
			if !strings.HasPrefix(first, "Use it ") || !(strings.Contains(first, "sandbox_exec") || strings.Contains(first, " when ")) {
				t.Errorf("%s: the first sentence of %s does not say when to use it rather than sandbox_exec: %q", name, tool.Name, first)
			}
		}
		t.Logf("%s: %d characters of descriptions and instructions", name, total)
		if total > maxTextBudget {
			t.Errorf("%s: descriptions and instructions take %d characters, over the contract's %d", name, total, maxTextBudget)
		}
	}
}
