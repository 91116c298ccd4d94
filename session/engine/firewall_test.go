package engine

import (
	"context"
	"crypto/rand"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"

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
	out, err := exec.Command("iptables", "-S", FirewallChain).Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(out), `"`+ruleComment(network)+`"`)
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
		if n := rulesOf(t, network); n != 4 {
			t.Fatalf("%d rules, want 4", n)
		}
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
		if n := rulesOf(t, network); n != 0 {
			t.Fatalf("%d rules left", n)
		}
	}
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
