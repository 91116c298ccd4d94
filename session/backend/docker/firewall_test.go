package docker

import (
	"crypto/rand"
	"net/netip"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// testFirewall returns a real firewall in an nftables table of the test's
// own (removed at the end), or skips where nftables cannot be changed.
// Its rules name a network of the test's own.
func testFirewall(t *testing.T) (*firewall, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("changes nftables")
	}
	suffix := strings.ToLower(rand.Text()[:10])
	table := "sandbox-mcp-test-" + suffix
	fw, err := newFirewallIn(table)
	if err != nil {
		t.Skipf("nftables: %v", err)
	}
	t.Cleanup(func() {
		fw.mu.Lock()
		fw.want = nil // ends the loop at its next tick
		fw.mu.Unlock()
		if out, err := exec.Command("nft", "delete", "table", "inet", table).CombinedOutput(); err != nil && !strings.Contains(string(out), "No such file") {
			t.Errorf("nft delete table: %v %s", err, out)
		}
	})
	return fw, "sandbox-mcp-fwtest-" + suffix
}

var (
	handleRe   = regexp.MustCompile(`\s*# handle (\d+)$`)
	countersRe = regexp.MustCompile(`counter packets \d+ bytes \d+`)
)

// listRules returns a network's rules as nft prints them (without their
// handles and with their counters' values left out), the input chain's in
// order, then the forward chain's, and their handles as "chain handle".
func listRules(t *testing.T, fw *firewall, network string) (rules, handles []string) {
	t.Helper()
	for _, chain := range []string{FirewallChain, FirewallForwardChain} {
		out, err := exec.Command("nft", "-a", "list", "chain", "inet", fw.table.Name, chain).CombinedOutput()
		if err != nil {
			if strings.Contains(string(out), "No such file") {
				continue
			}
			t.Fatalf("nft list chain: %v %s", err, out)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if !strings.Contains(line, `comment "`+ruleComment(network)+`"`) {
				continue
			}
			m := handleRe.FindStringSubmatch(line)
			if m == nil {
				t.Fatalf("no handle in %q", line)
			}
			rule := strings.TrimSpace(strings.TrimSuffix(line, m[0]))
			rules = append(rules, countersRe.ReplaceAllString(rule, "counter"))
			handles = append(handles, chain+" "+m[1])
		}
	}
	return rules, handles
}

func rulesOf(t *testing.T, fw *firewall, network string) int {
	t.Helper()
	rules, _ := listRules(t, fw, network)
	return len(rules)
}

// TestFirewallRules: a network's rules are the four input rules and the
// three forward rules of the type's comment, in order, as nft itself reads
// them back; none of them is in a table that iptables-save shows (the
// tables that table rewriters such as kube-router save and restore whole);
// release removes them.
func TestFirewallRules(t *testing.T) {
	fw, network := testFirewall(t)
	gw := netip.MustParseAddr("192.0.2.1")
	if err := fw.isolate(network, "sbx-fwtest", gw, gw.Next(), 40000); err != nil {
		t.Fatal(err)
	}
	got, _ := listRules(t, fw, network)
	c := ` comment "` + ruleComment(network) + `"`
	want := []string{
		`iifname "sbx-fwtest" ip saddr 192.0.2.2 ip daddr 192.0.2.1 tcp dport 40000 accept` + c,
		`iifname "sbx-fwtest" meta l4proto tcp reject with tcp reset` + c,
		`iifname "sbx-fwtest" reject` + c, // icmpx port-unreachable, which nft prints as plain reject
		`iifname != "sbx-fwtest" ip daddr 192.0.2.1 tcp dport 40000 reject with tcp reset` + c,
		`iifname "sbx-fwtest" meta l4proto tcp counter reject with tcp reset` + c,
		`iifname "sbx-fwtest" counter reject` + c,
		`oifname "sbx-fwtest" counter drop` + c,
	}
	if !slices.Equal(got, want) {
		t.Fatalf("rules:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if out, err := exec.Command("iptables-save").Output(); err == nil && strings.Contains(string(out), network) {
		t.Fatalf("iptables-save shows the network's rules:\n%s", out)
	}
	if err := fw.release(network); err != nil {
		t.Fatal(err)
	}
	if n := rulesOf(t, fw, network); n != 0 {
		t.Fatalf("%d rules left after release", n)
	}
}

// TestFirewallReleaseTwiceAtOnce: several removers of one network's rules
// at once (a server's shutdown and another server's sweep) all succeed,
// and the rules are gone.
func TestFirewallReleaseTwiceAtOnce(t *testing.T) {
	fw, network := testFirewall(t)
	gw := netip.MustParseAddr("192.0.2.1")
	other, err := newFirewallIn(fw.table.Name) // as another server would
	if err != nil {
		t.Fatal(err)
	}
	for round := range 20 {
		if err := fw.isolate(network, "sbx-fwtest", gw, gw.Next(), 40000+round); err != nil {
			t.Fatal(err)
		}
		if n := rulesOf(t, fw, network); n != 7 {
			t.Fatalf("round %d: %d rules, want 7", round, n)
		}
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			f := fw
			if i%2 == 1 {
				f = other
			}
			wg.Go(func() { errs[i] = f.release(network) })
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if n := rulesOf(t, fw, network); n != 0 {
			t.Fatalf("round %d: %d rules left", round, n)
		}
	}
}

// TestFirewallPutsBackRemovedRules: rules of a sandbox network that another
// program deleted (one by one, with the forward chain, or with the whole
// table, as `nft flush ruleset` does) come back within reconcileEvery, in
// their order (the proxy's accept before the rejects); released networks'
// rules do not.
func TestFirewallPutsBackRemovedRules(t *testing.T) {
	fw, network := testFirewall(t)
	gw := netip.MustParseAddr("192.0.2.1")
	if err := fw.isolate(network, "sbx-fwtest3", gw, gw.Next(), 40200); err != nil {
		t.Fatal(err)
	}
	want, handles := listRules(t, fw, network)
	if len(want) != 7 {
		t.Fatalf("%d rules, want 7", len(want))
	}
	nft := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("nft", args...).CombinedOutput(); err != nil {
			t.Fatalf("nft %v: %v %s", args, err, out)
		}
	}
	deleteRule := func(handle string) {
		t.Helper()
		chain, h, _ := strings.Cut(handle, " ")
		nft("delete", "rule", "inet", fw.table.Name, chain, "handle", h)
	}
	// The accept, one reject and a forward rule go; reconcile puts them
	// back, in order.
	deleteRule(handles[0])
	deleteRule(handles[2])
	deleteRule(handles[5])
	mended, err := fw.reconcile()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(mended, []string{network}) {
		t.Fatalf("reconcile mended %v, want [%s]", mended, network)
	}
	if got, _ := listRules(t, fw, network); !slices.Equal(got, want) {
		t.Fatalf("after reconcile:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if mended, err := fw.reconcile(); err != nil || len(mended) != 0 {
		t.Fatalf("reconcile with every rule there: %v %v", mended, err)
	}
	// Without a call, the firewall's own loop does it: for one rule, and
	// for the whole table.
	waitBack := func(what string) {
		t.Helper()
		deadline := time.Now().Add(3 * reconcileEvery)
		for {
			got, _ := listRules(t, fw, network)
			if slices.Equal(got, want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: rules not put back within %v: %q", what, 3*reconcileEvery, got)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	_, handles = listRules(t, fw, network)
	deleteRule(handles[1])
	waitBack("one rule deleted")
	nft("delete", "chain", "inet", fw.table.Name, FirewallForwardChain)
	waitBack("forward chain deleted")
	nft("delete", "table", "inet", fw.table.Name)
	waitBack("table deleted")
	// Released, they stay gone.
	if err := fw.release(network); err != nil {
		t.Fatal(err)
	}
	if mended, err := fw.reconcile(); err != nil || len(mended) != 0 {
		t.Fatalf("reconcile after release: %v %v", mended, err)
	}
	if n := rulesOf(t, fw, network); n != 0 {
		t.Fatalf("%d rules after release", n)
	}
}

// TestFirewallSweepSparesNewNetworks: a network made while a sweep runs
// (after the sweep saw the engine's networks) keeps its rules.
func TestFirewallSweepSparesNewNetworks(t *testing.T) {
	fw, network := testFirewall(t)
	gw := netip.MustParseAddr("192.0.2.1")
	stale := network + "-gone"
	if err := fw.isolate(stale, "sbx-fwtest2", gw, gw.Next(), 40100); err != nil {
		t.Fatal(err)
	}
	err := fw.sweep(func() (map[string]bool, error) {
		// Every network with rules is live but the stale one; and one
		// more is made after this list, as if the engine's list had been
		// taken a moment before its network was made. The sweep must not
		// remove its rules.
		live := map[string]bool{}
		rules, err := fw.list()
		if err != nil {
			return nil, err
		}
		for _, r := range rules {
			if n, ok := strings.CutPrefix(ruleCommentOf(r), "sandbox-mcp:"); ok && n != stale {
				live[n] = true
			}
		}
		if err := fw.isolate(network, "sbx-fwtest", gw, gw.Next(), 40101); err != nil {
			return nil, err
		}
		return live, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := rulesOf(t, fw, network); n != 7 {
		out, _ := exec.Command("nft", "list", "table", "inet", fw.table.Name).Output()
		t.Errorf("the new network has %d rules, want 7:\n%s", n, out)
	}
	if n := rulesOf(t, fw, stale); n != 0 {
		t.Errorf("the removed network still has %d rules", n)
	}
}
