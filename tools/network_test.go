package tools

import (
	"strings"
	"testing"

	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session"
)

// Outputs of the default image's tools when a name does not resolve, as
// they ran in a sandbox with no network.
const (
	curlOut     = "curl: (6) Could not resolve host: pypi.org\n"
	gitOut      = "Cloning into 'y'...\nfatal: unable to access 'https://github.com/x/y/': Could not resolve host: github.com\n"
	npmOut      = "npm ERR! code EAI_AGAIN\nnpm ERR! syscall getaddrinfo\nnpm ERR! errno EAI_AGAIN\nnpm ERR! request to https://registry.npmjs.org/left-pad failed, reason: getaddrinfo EAI_AGAIN registry.npmjs.org\n"
	nodeOut     = "getaddrinfo EAI_AGAIN registry.npmjs.org\n"
	pyOut       = "urllib.error.URLError: <urlopen error [Errno -3] Temporary failure in name resolution>\n"
	pipOut      = "Defaulting to user installation because normal site-packages is not writeable\nERROR: Could not find a version that satisfies the requirement requests (from versions: none)\nERROR: No matching distribution found for requests\n"
	pipRetryOut = "WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7f10bb70d350>: " +
		"Failed to establish a new connection: [Errno -3] Temporary failure in name resolution')': /simple/requests/\n"
)

// TestNetworkNotes: a failed command whose output shows a name that did not
// resolve is explained by the network mode, naming the host where the
// output does; the proxy's refusals while it ran are always reported, with
// the allowlist and who can change it; other failures say nothing of the
// network.
func TestNetworkNotes(t *testing.T) {
	none := policy.Default()
	allow := policy.Default()
	allow.Network, allow.AllowHosts = policy.NetworkAllowlist, []string{"api.example.com", "registry.npmjs.org:443"}

	for name, tc := range map[string]struct {
		p       policy.Policy
		refused []session.NetworkRefusal
		failed  bool
		out     string
		host    string // the first entry's host; "-" for no entry
		hint    []string
	}{
		"curl, none":  {none, nil, true, curlOut, "pypi.org", []string{"pypi.org could not be reached", noNetwork}},
		"git, none":   {none, nil, true, gitOut, "github.com", []string{noNetwork}},
		"npm, none":   {none, nil, true, npmOut, "registry.npmjs.org", []string{noNetwork}},
		"node, none":  {none, nil, true, nodeOut, "registry.npmjs.org", []string{noNetwork}},
		"python":      {none, nil, true, pyOut, "", []string{"a name that did not resolve", noNetwork}},
		"pip, none":   {none, nil, true, pipOut, "", []string{noNetwork}},
		"pip retries": {none, nil, true, pipRetryOut, "", []string{noNetwork}},
		// With a network, pip's "no matching distribution" is the package's
		// own failure unless the proxy refused something.
		"pip, allowlist":  {allow, nil, true, pipOut, "-", nil},
		"curl, allowlist": {allow, nil, true, curlOut, "pypi.org", []string{"resolves no names itself", "HTTPS_PROXY", "allowed: api.example.com, registry.npmjs.org:443"}},
		"succeeded":       {none, nil, false, curlOut, "-", nil},
		"other failure":   {none, nil, true, "ModuleNotFoundError: No module named 'foo'\n", "-", nil},
		"proxy refusal": {allow, []session.NetworkRefusal{{Host: "pypi.org", Port: 443, Reason: `"pypi.org:443" is not on this server's --allow-host list; use an allowed host, or ask the operator to add it`}}, false, "", "pypi.org",
			[]string{`The egress proxy refused pypi.org:443: "pypi.org:443" is not on this server's --allow-host list`, "(allowed: api.example.com, registry.npmjs.org:443)", operatorAllow}},
		"proxy refusal, other reason": {allow, []session.NetworkRefusal{{Host: "api.example.com", Port: 443, Reason: `"api.example.com" resolved to 10.0.0.1, a private address`}}, true, curlOut, "api.example.com",
			[]string{"The egress proxy refused api.example.com:443: \"api.example.com\" resolved"}},
	} {
		got, hint := networkNotes(tc.p, tc.refused, nil, tc.failed, tc.out)
		if tc.host == "-" {
			if got != nil || hint != "" {
				t.Errorf("%s: %+v %q, want nothing", name, got, hint)
			}
			continue
		}
		if len(got) == 0 || got[0].Host != tc.host || got[0].Reason == "" {
			t.Errorf("%s: entries %+v, want host %q first", name, got, tc.host)
		}
		for _, s := range tc.hint {
			if !strings.Contains(hint, s) {
				t.Errorf("%s: hint %q lacks %q", name, hint, s)
			}
		}
		if name == "proxy refusal, other reason" && strings.Contains(hint, operatorAllow) {
			t.Errorf("%s: hint %q speaks of the allowlist", name, hint)
		}
	}
}
