package session

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/sandbox-mcp/sandbox-mcp/agentproto"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/docker"
)

// TestGracefulStopLeavesHandlesToTheNextServer: a server that stops
// normally (Close, as at SIGTERM) leaves its handle running for the server
// started next on its state slot: that one finds the handle's file, and its
// background job still running with all its output, while the session's
// own sandbox ended with the first server. Once the handle is ended nothing
// of either server is left on the engine. With --end-handles-at-stop the
// handle ends at the stop too.
func TestGracefulStopLeavesHandlesToTheNextServer(t *testing.T) {
	state := t.TempDir()
	cli := testenv.Engine(t)
	ctx := context.Background()
	open := func(end bool) (*Manager, *Slot) {
		slot, err := OpenSlot(state, AnySlot)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { slot.Close() })
		m := testManager(t, func(o *Options) { o.StateDir, o.Slot, o.EndHandlesAtStop = state, slot, end })
		return m, slot
	}
	stop := func(m *Manager, slot *Slot) {
		cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		if err := m.Close(cctx); err != nil {
			t.Fatal(err)
		}
		slot.Close()
	}

	a, slotA := open(false)
	h, err := a.Create(ctx, "alice", CreateOptions{Label: "build"})
	if err != nil {
		t.Fatal(err)
	}
	loop := background(t, h, `i=0; while :; do echo tick $i; i=$((i+1)); sleep 0.1; done`)
	before, _ := waitFor(t, h, loop, func(out string, _ agentproto.JobStatus) bool { return strings.Contains(out, "tick 3\n") })
	sh(t, h, "echo kept > kept.txt")
	sess, err := a.Sandbox("session-1", "alice")
	if err != nil {
		t.Fatal(err)
	}
	sh(t, sess, "echo gone > gone.txt")
	stop(a, slotA)

	if got := testenv.Containers(t, cli, docker.LabelSandbox, sess.ID()); len(got) != 0 {
		t.Fatalf("the session's sandbox outlived the stop: %v", got)
	}
	if got := testenv.Containers(t, cli, docker.LabelSandbox, h.ID()); len(got) != 1 {
		t.Fatalf("the handle's container after the stop: %v", got)
	}

	b, slotB := open(false)
	if slotB.Number() != slotA.Number() {
		t.Fatalf("the next server took slot %d, not %d", slotB.Number(), slotA.Number())
	}
	if _, err := b.Find(sess.ID(), "alice"); err == nil {
		t.Fatal("the session's sandbox came back")
	}
	hb, err := b.Find(h.ID(), "alice")
	if err != nil {
		t.Fatal(err)
	}
	if in := hb.Info(); in.Label != "build" {
		t.Fatalf("the handle's label after the stop: %+v", in)
	}
	if got := string(sh(t, hb, "cat kept.txt").Stdout); got != "kept\n" {
		t.Fatalf("the handle's file after the stop: %q", got)
	}
	res := job(t, hb, JobRequest{Job: loop, StdoutOffset: 0, StderrOffset: 0, Wait: time.Second, Max: 1 << 20})
	out := string(res.Out[0])
	if res.Status.State != agentproto.JobRunning || !strings.HasPrefix(out, before) || lastTickIn(out) <= lastTickIn(before) {
		t.Fatalf("the handle's job after the stop: %+v, output %q (before: %q)", res.Status, out, before)
	}
	// --end-handles-at-stop: the next stop ends it.
	stop(b, slotB)
	c, slotC := open(true)
	hc, err := c.Find(h.ID(), "alice")
	if err != nil {
		t.Fatal(err)
	}
	if st := job(t, hc, JobRequest{Job: loop, StdoutOffset: -1, StderrOffset: -1}); st.Status.State != agentproto.JobRunning {
		t.Fatalf("the job after the second stop: %+v", st.Status)
	}
	stop(c, slotC)
	if got := testenv.Containers(t, cli, docker.LabelSandbox, h.ID()); len(got) != 0 {
		t.Fatalf("the handle outlived a stop with EndHandlesAtStop: %v", got)
	}
	d, slotD := open(false)
	defer stop(d, slotD)
	if l := d.List(ctx, "alice"); len(l) != 0 {
		t.Fatalf("sandboxes after a stop that ended them: %+v", l)
	}
}

// lastTickIn is the highest counter in "tick N" lines.
func lastTickIn(out string) int {
	last := -1
	for _, line := range strings.Split(out, "\n") {
		if n, err := strconv.Atoi(strings.TrimPrefix(line, "tick ")); err == nil && strings.HasPrefix(line, "tick ") {
			last = n
		}
	}
	return last
}

// TestGracefulStopKeepsANetworkedHandle: a handle with its own network
// behind the egress proxy (--network=allowlist) is taken back whole by the
// next server: its file and job are there, the next server's proxy serves
// it where the last one's did (same address, same credential), what it
// dropped from its allowlist stays dropped, and ending it removes its
// network and firewall rules.
func TestGracefulStopKeepsANetworkedHandle(t *testing.T) {
	upstream := listen(t, "127.0.0.1:0", true)
	api, other := fmt.Sprintf("api.test:%d", upstream.port()), fmt.Sprintf("other.test:%d", upstream.port())
	state := t.TempDir()
	ctx := context.Background()
	open := func() (*Manager, *Slot) {
		slot, err := OpenSlot(state, AnySlot)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { slot.Close() })
		m := testManager(t, func(o *Options) {
			o.StateDir, o.Slot = state, slot
			o.Policy.Network = policy.NetworkAllowlist
			o.Policy.AllowHosts = []string{api, other}
			o.Policy.AllowPrivateNetworks = true
			o.Resolver = mapResolver{"api.test": {netip.MustParseAddr("127.0.0.1")}, "other.test": {netip.MustParseAddr("127.0.0.1")}}
		})
		return m, slot
	}
	stop := func(m *Manager, slot *Slot) {
		cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		if err := m.Close(cctx); err != nil {
			t.Fatal(err)
		}
		slot.Close()
	}
	through := func(sb *Sandbox, target, payload string) string {
		return string(sh(t, sb, proxyScript(target, payload)).Stdout)
	}

	a, slotA := open()
	h, err := a.Create(ctx, "alice", CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if out := through(h, api, "before-the-stop"); !strings.Contains(out, "HTTP/1.1 200") || !strings.Contains(out, "before-the-stop") {
		t.Fatalf("through the proxy before the stop: %q", out)
	}
	if err := h.NarrowNetwork([]string{other}, false); err != nil {
		t.Fatal(err)
	}
	loop := background(t, h, `i=0; while :; do echo tick $i; i=$((i+1)); sleep 0.1; done`)
	waitFor(t, h, loop, func(out string, _ agentproto.JobStatus) bool { return strings.Contains(out, "tick 2\n") })
	sh(t, h, "echo kept > kept.txt")
	netName := h.ContainerID()
	stop(a, slotA)

	b, slotB := open()
	defer stop(b, slotB)
	hb, err := b.Find(h.ID(), "alice")
	if err != nil {
		t.Fatal(err)
	}
	if got := string(sh(t, hb, "cat kept.txt").Stdout); got != "kept\n" {
		t.Fatalf("the handle's file after the stop: %q", got)
	}
	if st := job(t, hb, JobRequest{Job: loop, StdoutOffset: -1, StderrOffset: -1}); st.Status.State != agentproto.JobRunning {
		t.Fatalf("the handle's job after the stop: %+v", st.Status)
	}
	if out := through(hb, api, "after-the-stop"); !strings.Contains(out, "HTTP/1.1 200") || !strings.Contains(out, "after-the-stop") {
		t.Fatalf("through the proxy after the stop: %q", out)
	}
	if out := through(hb, other, "x"); !strings.Contains(out, "403") {
		t.Fatalf("a dropped host after the stop: %q", out)
	}
	if l, _ := hb.NetworkLayers(); !slices.Contains(l.Dropped, other) {
		t.Fatalf("the layers after the stop: %+v", l)
	}
	if _, err := b.End(ctx, h.ID(), "alice", false); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Engine(t).NetworkInspect(ctx, netName, client.NetworkInspectOptions{}); !isGone(err) {
		t.Fatalf("network %s left after the handle ended: %v", netName, err)
	}
	rules, _ := exec.Command("nft", "list", "table", "inet", docker.FirewallTable).Output()
	if strings.Contains(string(rules), netName) {
		t.Fatalf("firewall rules left:\n%s", rules)
	}
}
