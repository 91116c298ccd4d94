package tools

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session"
)

// NetworkDenied is one host a command could not reach, as a result reports
// it: what the egress proxy refused while the command ran, or a name the
// command's output shows it failed to resolve or reach.
type NetworkDenied struct {
	Host   string `json:"host,omitempty" jsonschema:"The host that was refused or could not be reached, when known."`
	Port   int    `json:"port,omitempty" jsonschema:"Its port, when known."`
	Reason string `json:"reason" jsonschema:"Why: the proxy's refusal, or what this sandbox's network allows."`
	// Approved: a person allowed the host for this sandbox during the call.
	Approved bool `json:"approved,omitempty" jsonschema:"True when a person allowed this host for this sandbox during the call: run the command again."`
}

// maxNetworkDenied bounds the entries a result lists (the proxy keeps at
// most netproxy.MaxRecentRefusals per sandbox; the output adds a few).
const maxNetworkDenied = 8

// networkFailure matches what programs print when a name does not resolve
// or a host cannot be reached: the C library's and Go's resolver errors,
// curl, git, ssh, Node.js and npm, Python's urllib3 (pip, requests), and
// the refusal of a proxy tunnel. Groups name the host where the message
// carries it.
var networkFailure = []*regexp.Regexp{
	regexp.MustCompile(`(?i)could not resolve host(?:name)?:? '?([A-Za-z0-9.-]+)`),
	regexp.MustCompile(`getaddrinfo (?:ENOTFOUND|EAI_AGAIN) ([A-Za-z0-9.-]+)`),
	regexp.MustCompile(`Failed to resolve '([A-Za-z0-9.-]+)'`),
	regexp.MustCompile(`HTTPS?ConnectionPool\(host='([A-Za-z0-9.-]+)', port=(\d+)\).*(?:NameResolution|NewConnectionError|ProxyError|Max retries)`),
	regexp.MustCompile(`dial tcp: lookup ([A-Za-z0-9.-]+)`),
	regexp.MustCompile(`request to https?://([A-Za-z0-9.-]+)[^ ]* failed.*(?:ENOTCACHED|only-if-cached|EAI_AGAIN|ENOTFOUND|ECONNREFUSED|ENETUNREACH)`),
	regexp.MustCompile(`(?i)temporary failure in name resolution|name or service not known|no address associated with hostname|network is unreachable|ENETUNREACH|EAI_AGAIN|ENOTCACHED`),
	regexp.MustCompile(`(?i)tunnel connection failed: 403|received HTTP code 403 from proxy`),
}

// offlineFailure matches what a package manager prints when it found
// nothing to install and says nothing of the network: pip with no retries
// ("No matching distribution found"). With no network at all, that is why.
var offlineFailure = regexp.MustCompile(`No matching distribution found for ([A-Za-z0-9._-]+)|\(from versions: none\)`)

// outputNetworkFailures returns the hosts (with ports, where known) that
// text shows failing to resolve or connect, and whether it shows any such
// failure at all (some messages name no host).
func outputNetworkFailures(text string) (hosts []NetworkDenied, found bool) {
	seen := map[string]bool{}
	for _, re := range networkFailure {
		for _, m := range re.FindAllStringSubmatch(text, maxNetworkDenied) {
			found = true
			if len(m) < 2 || m[1] == "" {
				continue
			}
			host := strings.ToLower(strings.TrimSuffix(m[1], "."))
			if seen[host] || len(hosts) >= maxNetworkDenied {
				continue
			}
			seen[host] = true
			d := NetworkDenied{Host: host}
			if len(m) > 2 {
				d.Port, _ = strconv.Atoi(m[2])
			}
			hosts = append(hosts, d)
		}
	}
	return hosts, found
}

// Sentences of the network hints.
const (
	noNetwork     = "this sandbox has no network; nothing can be downloaded; use what the image has"
	noResolver    = "this sandbox resolves no names itself: its only way out is the proxy in HTTPS_PROXY (which resolves the names it tunnels to), and a program that ignores HTTPS_PROXY reaches nothing"
	operatorAllow = "only the server's operator can allow another host"
)

// networkNotes says why a command's network access failed: the proxy's
// refusals while it ran (always reported), or, for a command that failed,
// the resolution and connection failures its output shows. It returns the
// structured entries and the hint sentence ("" when there is nothing to
// say).
func networkNotes(p policy.Policy, refused []session.NetworkRefusal, answers map[string]approval, failed bool, output ...string) ([]NetworkDenied, string) {
	var out []NetworkDenied
	var sentences []string
	operator := false
	for _, r := range refused {
		if len(out) == maxNetworkDenied {
			break
		}
		nd := NetworkDenied{Host: r.Host, Port: r.Port, Reason: r.Reason}
		sentence := "the egress proxy refused " + hostPort(r.Host, r.Port) + ": " + r.Reason
		if a, ok := answers[hostPort(r.Host, r.Port)]; ok && a.answer != "" {
			then := approvalSentence(p, r.Host, r.Port, a)
			nd.Reason += "; " + then
			sentence += "; " + then
			if a.answer == AnswerApproved || a.answer == AnswerApprovedCaller {
				nd.Approved = true
			}
		} else if strings.Contains(r.Reason, "--allow-host") {
			operator = true
		}
		out = append(out, nd)
		sentences = append(sentences, sentence)
	}
	if len(out) > 0 {
		hint := strings.Join(sentences, "; ")
		if operator {
			hint += fmt.Sprintf(" (allowed: %s); %s", allowedHosts(p), operatorAllow)
		}
		return out, upperFirst(hint)
	}
	if !failed {
		return nil, ""
	}
	text := strings.Join(output, "\n")
	hosts, found := outputNetworkFailures(text)
	if !found && p.Network == policy.NetworkNone && offlineFailure.MatchString(text) {
		found = true
	}
	if !found {
		return nil, ""
	}
	reason := noNetwork
	if p.Network != policy.NetworkNone {
		reason = noResolver + fmt.Sprintf(" (allowed: %s)", allowedHosts(p))
	}
	if len(hosts) == 0 {
		hosts = []NetworkDenied{{}}
	}
	for i := range hosts {
		hosts[i].Reason = reason
	}
	what := "the output shows a name that did not resolve or a host that could not be reached"
	if named := hosts[0].Host; named != "" {
		what = "the output shows that " + hostPort(named, hosts[0].Port) + " could not be reached"
	}
	return hosts, upperFirst(what + ": " + reason)
}

// allowedHosts is the --allow-host list as a model reads it.
func allowedHosts(p policy.Policy) string {
	if len(p.AllowHosts) == 0 {
		return "none"
	}
	return strings.Join(p.AllowHosts, ", ")
}

func hostPort(host string, port int) string {
	if port == 0 {
		return host
	}
	return host + ":" + strconv.Itoa(port)
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
