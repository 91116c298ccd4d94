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
	withToolbox := ViewOf(def, "sandbox-mcp:default", nil)
	withToolbox.Toolbox = ParseToolbox(testToolbox)
	http := withToolbox
	http.ImplicitSandbox = SessionlessNone.String()
	httpPerCaller := withToolbox
	httpPerCaller.ImplicitSandbox = SessionlessPerCaller.String()
	return map[string]PolicyView{
		"http":                      http,
		"http with a default":       httpPerCaller,
		"allowlist without a shell": ViewOf(noShell, "sandbox-mcp:default", nil),
		"default":                   withToolbox,
		"allowlist":                 withSecrets(ViewOf(allow, "registry.example/team/toolchain:1.2", []string{"CI=1", "LANG=C.UTF-8"}), SecretView{Name: "GITHUB_TOKEN", Hosts: []string{"api.github.com", "github.com"}}),
		"deny":                      ViewOf(deny, "sandbox-mcp:default", nil),
		"no hosts":                  ViewOf(noHosts, "sandbox-mcp:default", nil),
	}
}

// testToolbox is a manifest as image/build.sh writes it (the default
// image's, with every entry the build records).
const testToolbox = `{"has":[{"name":"bash","version":"5.2.15"},{"name":"git","version":"2.39.5"},{"name":"curl","version":"7.88.1"},{"name":"jq","version":"1.6"},` +
	`{"name":"rg","version":"13.0.0"},{"name":"patch","version":"2.7.6"},{"name":"make","version":"4.3"},{"name":"python3","version":"3.11.2"},{"name":"pip","version":"23.0.1"},` +
	`{"name":"pytest","version":"7.2.1"},{"name":"numpy","version":"1.24.2"},{"name":"matplotlib","version":"3.6.3"},{"name":"PIL","version":"9.4.0"},{"name":"node","version":"18.19.0"},` +
	`{"name":"npm","version":"9.2.0"},{"name":"gcc","version":"12.2.0"},{"name":"g++","version":"12.2.0"},{"name":"zip"},{"name":"unzip"},{"name":"xxd"},{"name":"file"},{"name":"gawk"},` +
	`{"name":"less"},{"name":"ps"},{"name":"perl"}],"lacks":["wget","sqlite3","cmake","tree","vim","nano","ssh","cargo","rustc","go","java","ruby","php","yarn","pnpm","uv","docker","sudo"]}`

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
		"http": {
			has:    []string{"A call without `sandbox` uses your MCP session's sandbox", "(MCP 2026-07-28) create one with sandbox_create and pass its handle in `sandbox`."},
			hasNot: []string{"default sandbox", "this connection"},
		},
		"http with a default": {
			has:    []string{"A call without `sandbox` uses your MCP session's sandbox", "(MCP 2026-07-28) it uses your one default sandbox."},
			hasNot: []string{"this connection"},
		},
		"default": {
			has: []string{"Calls without `sandbox` share one sandbox: a Linux container, made at your first call and removed when this connection ends.", "It has bash 5.2, git 2.39,", "python3 3.11, pip 23.0, pytest 7.2, numpy 1.24, matplotlib 3.6, PIL 9.4, node 18.19", "It lacks wget,", "cargo", "no network", "/workspace last for the session", "working directory, exported variables and shell state do not carry over",
				"background: true", "sandbox_job", "any command may run", "8 MiB", "1 GiB of memory", "default 1m, at most 10m", "sandbox://policy"},
			hasNot: []string{"read-only: nothing", "only these programs", "Set for every command"},
		},
		"allowlist": {
			has: []string{"registry.example/team/toolchain:1.2", "ls /usr/local/bin", "reaches only pypi.org:443, files.pythonhosted.org:443, registry.npmjs.org:443, *.github.com:443", "only these programs run: ls, cat, python3", "Set for every command: CI, LANG",
				"$GITHUB_TOKEN is the credential for api.github.com, github.com"},
			hasNot: []string{"python3 3.11", "It has", "no network", "C.UTF-8", "shell lines are refused"},
		},
		"allowlist without a shell": {
			has:    []string{"only these programs run: python3, /usr/bin/git, ls. argv only; shell lines are refused here."},
			hasNot: []string{"shell line (command)"},
		},
		"deny": {
			has:    []string{"no commands run here", "workspace is read-only"},
			hasNot: []string{"background: true", "timeout_ms", "shell state"},
		},
		"no hosts": {has: []string{"allows no host", "this server's toolbox; list its tools"}, hasNot: []string{"It has"}},
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

// TestParseToolbox: a manifest that is missing or not one gives no toolbox
// (the instructions then say to list the image's tools), and a long one is
// cut to a bounded list.
func TestParseToolbox(t *testing.T) {
	for _, s := range []string{"", "not json", `{"has":[]}`, `{"lacks":["go"]}`} {
		if tb := ParseToolbox(s); tb != nil {
			t.Errorf("ParseToolbox(%q) = %+v, want nil", s, tb)
		}
	}
	long := `{"has":[` + strings.Repeat(`{"name":"x","version":"1.2.3"},`, 100) + `{"name":"y"}],"lacks":["go"]}`
	tb := ParseToolbox(long)
	if tb == nil || len(tb.Has) != maxToolboxEntries || tb.Lacks[0] != "go" {
		t.Fatalf("a long manifest: %+v", tb)
	}
	if got := tb.sentence(); !strings.HasPrefix(got, "It has x 1.2, x 1.2,") || !strings.HasSuffix(got, "It lacks go. ") {
		t.Errorf("sentence %q", got)
	}
}
