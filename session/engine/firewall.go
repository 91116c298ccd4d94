package engine

import (
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

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
	// want holds the rules of every network this server isolated and has
	// not released, so that reconcile can put back what another program
	// removed. A loop runs reconcile every reconcileEvery while want is
	// not empty (running tells whether it runs).
	want    map[string][][]string
	running bool
	// log gets a warning for every network whose rules had to be put back;
	// nil discards.
	log *slog.Logger
}

// reconcileEvery is how often the firewall checks that the rules of this
// server's networks are all still there: a program that rewrites the whole
// filter table (iptables-restore without --noflush, as kube-router does on
// every policy sync; a firewalld reload) drops rules added while it worked,
// which would leave a sandbox able to reach every port of this host. It is
// the longest such a hole stays open; each check is one `iptables -S` of
// the chain.
const reconcileEvery = 2 * time.Second

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

// isolate installs a network's rules, and keeps them there (reconcile)
// until release.
func (f *firewall) isolate(network, bridge string, gw, client netip.Addr, port int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	rules := f.rules(network, bridge, gw, client, port)
	for _, r := range rules {
		if err := f.ipt.AppendUnique("filter", FirewallChain, r...); err != nil {
			f.removeWhereLocked(func(comment string) bool { return comment == ruleComment(network) })
			return fmt.Errorf("firewall: %w", err)
		}
	}
	if f.want == nil {
		f.want = map[string][][]string{}
	}
	f.want[network] = rules
	if !f.running {
		f.running = true
		go f.keep()
	}
	return nil
}

// release removes every rule of a network.
func (f *firewall) release(network string) error {
	f.mu.Lock()
	delete(f.want, network)
	f.mu.Unlock()
	return f.removeWhere(func(comment string) bool { return comment == ruleComment(network) })
}

// keep runs reconcile every reconcileEvery until no network is left.
func (f *firewall) keep() {
	t := time.NewTicker(reconcileEvery)
	defer t.Stop()
	for range t.C {
		f.mu.Lock()
		if len(f.want) == 0 {
			f.running = false
			f.mu.Unlock()
			return
		}
		f.mu.Unlock()
		if _, err := f.reconcile(); err != nil && f.log != nil {
			f.log.Warn("firewall: check the rules", "err", err)
		}
	}
}

// reconcile puts back the rules of this server's networks that are no
// longer in the chain, and returns the networks it mended.
func (f *firewall) reconcile() ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.want) == 0 {
		return nil, nil
	}
	listed, err := f.ipt.List("filter", FirewallChain)
	if err != nil {
		return nil, err
	}
	have := map[string]int{}
	for _, r := range listed {
		if c := ruleCommentOf(r); c != "" {
			have[c]++
		}
	}
	var mended []string
	var firstErr error
	for network, rules := range f.want {
		if have[ruleComment(network)] >= len(rules) {
			continue // more is a copy a table rewriter put back: harmless
		}
		// The whole set goes in again at the end of the chain, in order (a
		// missing ACCEPT appended after the REJECTs would come too late),
		// before the rules still there are deleted: iptables -D deletes the
		// first match, the older copy. There is no moment without rules.
		var present [][]string
		for _, r := range rules {
			if ok, err := f.ipt.Exists("filter", FirewallChain, r...); err == nil && ok {
				present = append(present, r)
			}
		}
		for _, r := range rules {
			if err := f.ipt.Append("filter", FirewallChain, r...); err != nil && firstErr == nil {
				firstErr = fmt.Errorf("firewall: put back the rules of %s: %w", network, err)
			}
		}
		for _, r := range present {
			if err := f.ipt.Delete("filter", FirewallChain, r...); err != nil && firstErr == nil {
				firstErr = fmt.Errorf("firewall: put back the rules of %s: %w", network, err)
			}
		}
		mended = append(mended, network)
		if f.log != nil {
			f.log.Warn("firewall: another program removed rules of a sandbox network; put them back", "network", network,
				"rules_found", have[ruleComment(network)], "rules", len(rules))
		}
	}
	return mended, firstErr
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
