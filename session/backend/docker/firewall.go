package docker

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// FirewallTable is the nftables table (family inet) that holds the rules
// keeping sandboxes off the host, in its chain FirewallChain, a base chain
// on the input hook, and off every other network, in FirewallForwardChain,
// a base chain on the forward hook.
//
// The table is this program's alone. The rules used to live in a chain of
// iptables' filter table, which other programs rewrite whole
// (iptables-restore without --noflush, as kube-router does on every policy
// sync; a firewalld reload): a rewrite that saved the table before a rule
// was added and restored it after drops the rule, one that saved it before
// a rule was deleted brings it back, and a sandbox's isolation depended on
// who won the race. Such rewrites touch only the tables they restore; no
// program but this one writes to FirewallTable. A reject in any base chain
// of the hook is final, whatever other tables (iptables' among them) then
// accept, so the table needs no place in anyone else's chains.
const (
	FirewallTable        = "sandbox-mcp"
	FirewallChain        = "input"
	FirewallForwardChain = "forward"
)

// firewall keeps a sandbox network's containers away from every port of the
// host but the egress proxy's, and the proxy's listener away from everyone
// but the sandbox. A Docker internal network still gives the host an
// address on the network's bridge, and anything listening on it (or on
// 0.0.0.0) would be reachable from the sandbox: the MCP HTTP port, a DNS
// forwarder, sshd. The rules match packets arriving on the sandbox's
// bridge: TCP from the sandbox's address to the proxy's address and port
// passes; other TCP is reset and everything else (IPv6 too) refused, so a
// wrong door fails at once instead of timing out. And TCP to the proxy's
// address and port that arrives on any other interface (a container on
// docker0 or on another network, a process of the host) is reset: the
// listener, and the allowlist behind it, are the sandbox's alone.
//
// Nothing that enters or leaves a sandbox's bridge is ever forwarded: the
// sandbox's one peer is its gateway, the host itself (input), and the
// network holds one container. So the forward chain refuses every packet
// arriving on the bridge (TCP reset, anything else unreachable) and drops
// every packet routed to it. Docker's own rules for an internal network
// (DOCKER-ISOLATION-STAGE-1) say the same, but they live in iptables'
// filter table, which other programs rewrite; without the forward rules a
// sandbox that lost them could reach, through its gateway's address, any
// port another container publishes (the engine's DNAT turns the packet
// into forwarded traffic that the input chain never sees). The forward
// rules count what they stop.
//
// A network's rules go in and out in one netlink batch, which the kernel
// applies as one transaction: there is no moment with some of them.
type firewall struct {
	table   *nftables.Table
	input   *nftables.Chain
	forward *nftables.Chain
	// mu serialises this server's changes to the chain.
	mu sync.Mutex
	// want holds the rules of every network this server isolated and has
	// not released, so that reconcile can put back what another program
	// removed (an `nft flush ruleset`, a table deleted by hand). A loop
	// runs reconcile every reconcileEvery while want is not empty (running
	// tells whether it runs).
	want    map[string][]*nftables.Rule
	running bool
	// log gets a warning for every network whose rules had to be put back;
	// nil discards.
	log *slog.Logger
}

// reconcileEvery is how often the firewall checks that the rules of this
// server's networks are all still there. No program but this one writes to
// its table, but one may remove every table (`nft flush ruleset`, as a
// reload of a host's nftables.conf does). It is the longest such a hole
// stays open; each check is one netlink dump of the chain.
const reconcileEvery = 2 * time.Second

// newFirewall checks that nftables can be changed (root or CAP_NET_ADMIN)
// and makes sure FirewallTable and its chain exist.
func newFirewall() (*firewall, error) { return newFirewallIn(FirewallTable) }

// newFirewallIn is newFirewall with a table of that name (tests use one
// of their own).
func newFirewallIn(table string) (*firewall, error) {
	f := &firewall{table: &nftables.Table{Family: nftables.TableFamilyINet, Name: table}}
	chain := func(name string, hook *nftables.ChainHook) *nftables.Chain {
		accept := nftables.ChainPolicyAccept
		return &nftables.Chain{
			Name:     name,
			Table:    f.table,
			Type:     nftables.ChainTypeFilter,
			Hooknum:  hook,
			Priority: nftables.ChainPriorityRef(*nftables.ChainPriorityFilter - 10),
			Policy:   &accept,
		}
	}
	f.input = chain(FirewallChain, nftables.ChainHookInput)
	f.forward = chain(FirewallForwardChain, nftables.ChainHookForward)
	c, err := nftables.New()
	if err != nil {
		return nil, err
	}
	f.addTable(c)
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("nftables: make table inet %s: %w", table, err)
	}
	return f, nil
}

// addTable queues the table and its chains; they are kept if they exist.
func (f *firewall) addTable(c *nftables.Conn) {
	c.AddTable(f.table)
	c.AddChain(f.input)
	c.AddChain(f.forward)
}

// comment tags every rule of one network, so rules can be found again.
func ruleComment(network string) string { return "sandbox-mcp:" + network }

// ruleCommentOf returns a rule's comment, or "".
func ruleCommentOf(r *nftables.Rule) string {
	s, _ := userdata.GetString(r.UserData, userdata.TypeComment)
	return s
}

// ifname is an interface name as the kernel compares it: NUL-padded to
// IFNAMSIZ.
func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

// rules returns a network's rules: four in the input chain, in order (the
// proxy's accept before the rejects), then three in the forward chain.
func (f *firewall) rules(network, bridge string, gw, client netip.Addr, port int) []*nftables.Rule {
	iif := func(op expr.CmpOp) []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Cmp{Op: op, Register: 1, Data: ifname(bridge)},
		}
	}
	oif := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(bridge)},
	}
	counter := []expr.Any{&expr.Counter{}}
	ipv4 := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}
	addr := func(offset uint32, a netip.Addr) []expr.Any {
		return []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a.AsSlice()},
		}
	}
	tcp := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
	}
	dport := []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(uint16(port))},
	}
	reset := &expr.Reject{Type: unix.NFT_REJECT_TCP_RST}
	refuse := &expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_PORT_UNREACH}
	rule := func(chain *nftables.Chain, e []expr.Any) *nftables.Rule {
		return &nftables.Rule{Table: f.table, Chain: chain, Exprs: e,
			UserData: userdata.AppendString(nil, userdata.TypeComment, ruleComment(network))}
	}
	in, fwd := f.input, f.forward
	return []*nftables.Rule{
		rule(in, slices.Concat(iif(expr.CmpOpEq), ipv4, addr(12, client), addr(16, gw), tcp, dport, []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}})),
		rule(in, slices.Concat(iif(expr.CmpOpEq), tcp, []expr.Any{reset})),
		rule(in, slices.Concat(iif(expr.CmpOpEq), []expr.Any{refuse})),
		rule(in, slices.Concat(iif(expr.CmpOpNeq), ipv4, addr(16, gw), tcp, dport, []expr.Any{reset})),
		rule(fwd, slices.Concat(iif(expr.CmpOpEq), tcp, counter, []expr.Any{reset})),
		rule(fwd, slices.Concat(iif(expr.CmpOpEq), counter, []expr.Any{refuse})),
		rule(fwd, slices.Concat(oif, counter, []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}})),
	}
}

// isolate installs a network's rules, and keeps them there (reconcile)
// until release.
func (f *firewall) isolate(network, bridge string, gw, client netip.Addr, port int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	rules := f.rules(network, bridge, gw, client, port)
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("firewall: %w", err)
	}
	f.addTable(c) // a table someone removed comes back with the rules
	for _, r := range rules {
		c.AddRule(r)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("firewall: %w", err)
	}
	if f.want == nil {
		f.want = map[string][]*nftables.Rule{}
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
	defer f.mu.Unlock()
	delete(f.want, network)
	return f.removeWhereLocked(func(r *nftables.Rule) bool { return ruleCommentOf(r) == ruleComment(network) })
}

// adopt takes over the rules of a network that a server before this one
// isolated and left (its container outlived it): they are kept from now
// on, and put back at once, in one transaction, if some are missing.
func (f *firewall) adopt(network, bridge string, gw, client netip.Addr, port int) error {
	f.mu.Lock()
	if f.want == nil {
		f.want = map[string][]*nftables.Rule{}
	}
	f.want[network] = f.rules(network, bridge, gw, client, port)
	if !f.running {
		f.running = true
		go f.keep()
	}
	f.mu.Unlock()
	_, err := f.reconcile()
	return err
}

// forget stops keeping a network's rules without removing them: they stay
// in the chains for the network's container, which outlives this server
// (Detach), until the next server takes them over or a sweep finds the
// network gone.
func (f *firewall) forget(network string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.want, network)
}

// releaseAll removes the rules of every network this server isolated and
// has not released, and ends the reconcile loop.
func (f *firewall) releaseAll() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.want) == 0 {
		return nil
	}
	comments := map[string]bool{}
	for network := range f.want {
		comments[ruleComment(network)] = true
	}
	clear(f.want)
	return f.removeWhereLocked(func(r *nftables.Rule) bool { return comments[ruleCommentOf(r)] })
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

// list returns the rules of both chains; a table or chain that is gone has
// none.
func (f *firewall) list() ([]*nftables.Rule, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, err
	}
	var all []*nftables.Rule
	for _, chain := range []*nftables.Chain{f.input, f.forward} {
		rules, err := c.GetRules(f.table, chain)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return nil, err
		}
		all = append(all, rules...)
	}
	return all, nil
}

// reconcile puts back the rules of this server's networks that are no
// longer all in the chains, and returns the networks it mended. Nothing
// but a removal changes the table (no other program writes to it), so a
// network with all its rules has them in order; one with fewer (a rule
// deleted, a chain or the whole table gone) has what is left deleted and
// the whole set added again, chains included, in one transaction.
func (f *firewall) reconcile() ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.want) == 0 {
		return nil, nil
	}
	listed, err := f.list()
	if err != nil {
		return nil, fmt.Errorf("firewall: list the rules: %w", err)
	}
	have := map[string][]*nftables.Rule{}
	for _, r := range listed {
		if c := ruleCommentOf(r); c != "" {
			have[c] = append(have[c], r)
		}
	}
	var mended []string
	var firstErr error
	for network, rules := range f.want {
		present := have[ruleComment(network)]
		if len(present) == len(rules) {
			continue
		}
		c, err := nftables.New()
		if err != nil {
			return mended, err
		}
		f.addTable(c)
		for _, r := range present {
			if err := c.DelRule(r); err != nil {
				return mended, err
			}
		}
		for _, r := range rules {
			c.AddRule(r)
		}
		if err := c.Flush(); err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("firewall: put back the rules of %s: %w", network, err)
			}
			continue
		}
		mended = append(mended, network)
		if f.log != nil {
			f.log.Warn("firewall: another program removed rules of a sandbox network; put them back", "network", network,
				"rules_found", len(present), "rules", len(rules))
		}
	}
	return mended, firstErr
}

// removeWhereLocked deletes the chains' rules that match, in one
// transaction, and lists the chains again to make sure. Another server (its
// sweep, or its removal of a network this one swept) may delete one of
// them first: the transaction then fails as a whole, and the next attempt
// deletes what is left.
func (f *firewall) removeWhereLocked(match func(r *nftables.Rule) bool) error {
	const attempts = 3
	var err error
	for range attempts {
		rules, lerr := f.list()
		if lerr != nil {
			return fmt.Errorf("firewall: list the rules: %w", lerr)
		}
		c, cerr := nftables.New()
		if cerr != nil {
			return cerr
		}
		n := 0
		for _, r := range rules {
			if match(r) {
				if err := c.DelRule(r); err != nil {
					return err
				}
				n++
			}
		}
		if n == 0 {
			return nil
		}
		if err = c.Flush(); err == nil {
			return nil
		}
	}
	return fmt.Errorf("firewall: rules still in table inet %s after %d attempts to delete them: %w", f.table.Name, attempts, err)
}

// sweep removes the rules of networks that no longer exist. The rules are
// listed before live lists the networks, and only rules so listed go: a
// network made after the rules were listed (another server's new sandbox)
// has none among them, whereas one listed the other way round would look
// rule-less and lose its isolation to this sweep.
func (f *firewall) sweep(live func() (map[string]bool, error)) error {
	rules, err := f.list()
	if err != nil {
		return err
	}
	names, err := live() // not under mu: live may wait for this server's new sandboxes
	if err != nil {
		return err
	}
	stale := map[uint64]string{} // handle → comment
	for _, r := range rules {
		if network, ok := strings.CutPrefix(ruleCommentOf(r), "sandbox-mcp:"); ok && !names[network] {
			stale[r.Handle] = ruleCommentOf(r)
		}
	}
	if len(stale) == 0 {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.removeWhereLocked(func(r *nftables.Rule) bool {
		c, ok := stale[r.Handle]
		return ok && c == ruleCommentOf(r)
	})
}
