package engine

import (
	"context"
	"crypto/rand"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
)

// testFirewall returns the real firewall, or skips where iptables cannot
// be changed. The rules a test makes name a network of its own.
func testFirewall(t *testing.T) (*firewall, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("changes iptables")
	}
	fw, err := newFirewall()
	if err != nil {
		t.Skipf("iptables: %v", err)
	}
	network := "sandbox-mcp-fwtest-" + strings.ToLower(rand.Text()[:10])
	t.Cleanup(func() { fw.release(network) })
	liveNetwork(t, network)
	return fw, network
}

// liveNetwork makes an engine network of that name, labelled as a live
// server's, so that the firewall sweep of any server starting meanwhile
// (tests run in parallel) keeps its rules: the sweep removes the rules of
// networks the engine no longer has.
func liveNetwork(t *testing.T, name string) {
	t.Helper()
	cli := testenv.Engine(t)
	labels := ownerLabels()
	labels[LabelManaged] = "1"
	labels[LabelInstance] = "fwtest"
	ctx := context.Background()
	if _, err := cli.NetworkCreate(ctx, name, client.NetworkCreateOptions{Labels: labels}); err != nil {
		t.Fatalf("create network %s: %v", name, err)
	}
	t.Cleanup(func() { cli.NetworkRemove(context.Background(), name, client.NetworkRemoveOptions{}) })
}

func rulesOf(t *testing.T, network string) int {
	t.Helper()
	return len(listRules(t, network))
}

// listRules returns a network's rules as iptables -S prints them, in the
// chain's order.
func listRules(t *testing.T, network string) []string {
	t.Helper()
	out, err := exec.Command("iptables", "-S", FirewallChain).Output()
	if err != nil {
		t.Fatal(err)
	}
	var rules []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, `"`+ruleComment(network)+`"`) {
			rules = append(rules, line)
		}
	}
	return rules
}

// waitRules waits until the network has want rules. Another program on
// this machine may rewrite the filter table meanwhile (the test node's
// kube-router does, on every policy change) and drop a rule just added or
// bring back one just deleted: the firewall puts missing rules back
// (reconcile), and fix, if not nil, is called between looks.
func waitRules(t *testing.T, network string, want int, fix func()) {
	t.Helper()
	deadline := time.Now().Add(4 * reconcileEvery)
	for {
		n := rulesOf(t, network)
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rules of %s, want %d", n, network, want)
		}
		if fix != nil {
			fix()
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestFirewallReleaseTwiceAtOnce: two removers of one network's rules at
// once (a server's shutdown and another server's sweep) both succeed, and
// the rules are gone.
func TestFirewallReleaseTwiceAtOnce(t *testing.T) {
	fw, network := testFirewall(t)
	gw := netip.MustParseAddr("192.0.2.1")
	for round := range 20 {
		if err := fw.isolate(network, "sbx-fwtest", gw, gw.Next(), 40000+round); err != nil {
			t.Fatal(err)
		}
		waitRules(t, network, 4, nil)
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			wg.Go(func() { errs[i] = fw.release(network) })
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		waitRules(t, network, 0, func() { fw.release(network) })
	}
}

// TestFirewallPutsBackRemovedRules: rules of a sandbox network that another
// program deleted (a table rewriter, a firewalld reload) come back within
// reconcileEvery, in their order (the proxy's ACCEPT before the REJECTs),
// without a moment in which none is there; released networks' rules do not.
func TestFirewallPutsBackRemovedRules(t *testing.T) {
	fw, network := testFirewall(t)
	gw := netip.MustParseAddr("192.0.2.1")
	if err := fw.isolate(network, "sbx-fwtest3", gw, gw.Next(), 40200); err != nil {
		t.Fatal(err)
	}
	waitRules(t, network, 4, nil)
	want := listRules(t, network)
	drop := func(rule string) {
		t.Helper()
		args := append([]string{"-D"}, strings.Fields(strings.TrimPrefix(rule, "-A "))...)
		for i, a := range args {
			args[i] = strings.Trim(a, `"`)
		}
		if out, err := exec.Command("iptables", args...).CombinedOutput(); err != nil {
			// Gone already is what was wanted: a table rewriter on this
			// machine may have dropped it first.
			args[0] = "-C"
			if exec.Command("iptables", args...).Run() == nil {
				t.Fatalf("iptables -D: %v %s", err, out)
			}
		}
	}
	// The ACCEPT and one REJECT go; reconcile puts both back, in order.
	// A table rewriter on this machine (the test node's kube-router) may
	// interleave with reconcile's commands and undo part of its work; the
	// next reconcile finishes it, so the test calls it until the rules are
	// back, as the firewall's loop would.
	drop(want[0])
	drop(want[2])
	mendedIt := false
	for deadline := time.Now().Add(4 * reconcileEvery); ; {
		mended, err := fw.reconcile()
		if err != nil {
			t.Logf("reconcile: %v", err)
		}
		mendedIt = mendedIt || slices.Equal(mended, []string{network})
		got := listRules(t, network)
		if slices.Equal(got, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after reconcile:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !mendedIt {
		t.Fatal("reconcile did not report the network it mended")
	}
	// Without a call: the firewall's own loop does it.
	drop(want[1])
	deadline := time.Now().Add(3 * reconcileEvery)
	for !slices.Equal(listRules(t, network), want) {
		if time.Now().After(deadline) {
			t.Fatalf("rules not put back within %v: %q", 3*reconcileEvery, listRules(t, network))
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Released, they stay gone.
	if err := fw.release(network); err != nil {
		t.Fatal(err)
	}
	if mended, err := fw.reconcile(); err != nil || len(mended) != 0 {
		t.Fatalf("reconcile after release: %v %v", mended, err)
	}
	waitRules(t, network, 0, func() { fw.release(network) })
}

// TestFirewallSweepSparesNewNetworks: a network made while a sweep runs
// (after the sweep saw the engine's networks) keeps its rules.
func TestFirewallSweepSparesNewNetworks(t *testing.T) {
	fw, network := testFirewall(t)
	gw := netip.MustParseAddr("192.0.2.1")
	stale := network + "-gone"
	t.Cleanup(func() { fw.release(stale) })
	if err := fw.isolate(stale, "sbx-fwtest2", gw, gw.Next(), 40100); err != nil {
		t.Fatal(err)
	}
	err := fw.sweep(func() (map[string]bool, error) {
		// Every network with rules is live (other servers' included),
		// but the stale one; and one more is made after this list, as if
		// the engine's list had been taken a moment before its network
		// was made. The sweep must not remove its rules.
		live := map[string]bool{}
		rules, err := fw.ipt.List("filter", FirewallChain)
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
	if n := rulesOf(t, network); n != 4 {
		out, _ := exec.Command("iptables", "-S", FirewallChain).Output()
		t.Errorf("the new network has %d rules, want 4:\n%s", n, out)
	}
	if n := rulesOf(t, stale); n != 0 {
		t.Errorf("the removed network still has %d rules", n)
	}
}
