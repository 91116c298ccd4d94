package engine

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync"

	"github.com/coreos/go-iptables/iptables"
)

// FirewallChain is the iptables chain (filter table) that holds the rules
// keeping sandboxes off the host. INPUT jumps to it first.
const FirewallChain = "SANDBOX-MCP"

// firewall keeps a sandbox network's containers away from every port of the
// host but the egress proxy's, and the proxy's listener away from everyone
// but the sandbox. A Docker internal network still gives the host an
// address on the network's bridge, and anything listening on it (or on
// 0.0.0.0) would be reachable from the sandbox: the MCP HTTP port, a DNS
// forwarder, sshd. The rules match packets arriving on the sandbox's
// bridge: TCP from the sandbox's address to the proxy's address and port is
// accepted; other TCP is reset and everything else refused, so a wrong door
// fails at once instead of timing out. And TCP to the proxy's address and
// port that arrives on any other interface (a container on docker0 or on
// another network, a process of the host) is reset: the listener, and the
// allowlist behind it, are the sandbox's alone.
type firewall struct {
	ipt *iptables.IPTables
	// mu serialises this server's changes to the chain. iptables locks
	// each command, but a delete checks and then deletes in two: two
	// removers of one network in this process (a sandbox's removal and
	// the shutdown) would race between them.
	mu sync.Mutex
}

// newFirewall checks that iptables can be changed (root or CAP_NET_ADMIN)
// and makes sure INPUT jumps to FirewallChain.
func newFirewall() (*firewall, error) {
	ipt, err := iptables.New(iptables.Timeout(10))
	if err != nil {
		return nil, err
	}
	ok, err := ipt.ChainExists("filter", FirewallChain)
	if err != nil {
		return nil, err
	}
	if !ok {
		if err := ipt.NewChain("filter", FirewallChain); err != nil {
			return nil, err
		}
	}
	jump := []string{"-m", "comment", "--comment", "sandbox-mcp", "-j", FirewallChain}
	if err := ipt.InsertUnique("filter", "INPUT", 1, jump...); err != nil {
		return nil, err
	}
	return &firewall{ipt: ipt}, nil
}

// comment tags every rule of one network, so rules can be found again.
func ruleComment(network string) string { return "sandbox-mcp:" + network }

func (f *firewall) rules(network, bridge string, gw, client netip.Addr, port int) [][]string {
	c := []string{"-m", "comment", "--comment", ruleComment(network)}
	proxy := []string{"-p", "tcp", "-d", gw.String(), "--dport", strconv.Itoa(port)}
	return [][]string{
		append(append([]string{"-i", bridge, "-s", client.String()}, proxy...), append(c, "-j", "ACCEPT")...),
		append([]string{"-i", bridge, "-p", "tcp"}, append(c, "-j", "REJECT", "--reject-with", "tcp-reset")...),
		append([]string{"-i", bridge}, append(c, "-j", "REJECT", "--reject-with", "icmp-port-unreachable")...),
		append(append([]string{"!", "-i", bridge}, proxy...), append(c, "-j", "REJECT", "--reject-with", "tcp-reset")...),
	}
}

// isolate installs a network's rules.
func (f *firewall) isolate(network, bridge string, gw, client netip.Addr, port int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.rules(network, bridge, gw, client, port) {
		if err := f.ipt.AppendUnique("filter", FirewallChain, r...); err != nil {
			f.removeWhereLocked(func(comment string) bool { return comment == ruleComment(network) })
			return fmt.Errorf("firewall: %w", err)
		}
	}
	return nil
}

// release removes every rule of a network.
func (f *firewall) release(network string) error {
	return f.removeWhere(func(comment string) bool { return comment == ruleComment(network) })
}

// removeWhere deletes the chain's rules whose comment matches, and lists
// the chain again to make sure: another process (a second server's sweep)
// may change it at the same time, and what it lists is what counts.
func (f *firewall) removeWhere(match func(comment string) bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.removeWhereLocked(match)
}

func (f *firewall) removeWhereLocked(match func(comment string) bool) error {
	const attempts = 3
	var err error
	for range attempts {
		rules, lerr := f.ipt.List("filter", FirewallChain)
		if lerr != nil {
			return lerr
		}
		left := 0
		for _, r := range rules {
			if c := ruleCommentOf(r); c != "" && match(c) {
				left++
			}
		}
		if left == 0 {
			return nil
		}
		err = f.remove(rules, match)
	}
	if err == nil {
		err = fmt.Errorf("firewall: rules still in %s after %d attempts to delete them", FirewallChain, attempts)
	}
	return err
}

// remove deletes those of rules (as iptables -S lists them) whose comment
// matches. Another server's sweep may delete the same rule at the same
// time (between iptables' check and its delete): a rule that is gone is
// what was wanted, so that is no error.
func (f *firewall) remove(rules []string, match func(comment string) bool) error {
	var firstErr error
	for _, r := range rules {
		comment := ruleCommentOf(r)
		if comment == "" || !match(comment) {
			continue
		}
		spec := strings.Fields(strings.TrimPrefix(r, "-A "+FirewallChain+" "))
		for i, w := range spec { // iptables -S quotes comments with spaces; ours have none
			spec[i] = strings.Trim(w, `"`)
		}
		err := f.ipt.DeleteIfExists("filter", FirewallChain, spec...)
		if err != nil {
			if ok, cerr := f.ipt.Exists("filter", FirewallChain, spec...); cerr == nil && !ok {
				continue // deleted by someone else meanwhile
			}
			if firstErr == nil {
				firstErr = err
			}
		}
	}
	return firstErr
}

// ruleCommentOf returns the --comment value of a rule as iptables -S prints
// it, or "".
func ruleCommentOf(rule string) string {
	f := strings.Fields(rule)
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "--comment" {
			return strings.Trim(f[i+1], `"`)
		}
	}
	return ""
}

// sweep removes the rules of networks that no longer exist. The rules are
// listed before live lists the networks: a network made after the rules
// were listed (another server's new sandbox) then has no rule in the list,
// whereas one listed the other way round would look rule-less and lose
// its isolation to this sweep.
func (f *firewall) sweep(live func() (map[string]bool, error)) error {
	rules, err := f.ipt.List("filter", FirewallChain)
	if err != nil {
		return err
	}
	names, err := live() // not under mu: live may wait for this server's new sandboxes
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.remove(rules, func(comment string) bool {
		network, ok := strings.CutPrefix(comment, "sandbox-mcp:")
		return ok && !names[network]
	})
}
