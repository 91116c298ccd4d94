package session

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/docker"
)

// mapResolver resolves test names to fixed addresses.
type mapResolver map[string][]netip.Addr

func (r mapResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := r[strings.TrimSuffix(host, ".")]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// canary listens on addr and counts connections; an echo canary also
// echoes what it reads.
type canary struct {
	ln    net.Listener
	count atomic.Int64
}

func listen(t *testing.T, addr string, echo bool) *canary {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c := &canary{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			c.count.Add(1)
			go func() {
				defer conn.Close()
				if echo {
					conn.SetDeadline(time.Now().Add(10 * time.Second))
					io.Copy(conn, conn)
				}
			}()
		}
	}()
	return c
}

func (c *canary) port() int { return c.ln.Addr().(*net.TCPAddr).Port }

// hostIP returns an address of this host outside loopback and Docker's
// networks, which a sandbox must not reach either.
func hostIP(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("sh", "-c", "ip -4 -o route get 1.1.1.1 | sed -n 's/.* src \\([0-9.]*\\).*/\\1/p'").Output()
	ip := strings.TrimSpace(string(out))
	if err != nil || ip == "" {
		t.Fatalf("no host address found: %v", err)
	}
	return ip
}

// proxyScript sends one CONNECT through the sandbox's proxy, with the
// sandbox's credential from its proxy URL, and prints the answer.
func proxyScript(target, payload string) string {
	return fmt.Sprintf(`p=${HTTPS_PROXY#http://}; auth=$(printf %%s "${p%%@*}" | base64); p=${p#*@}; { printf 'CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %%s\r\n\r\n' "$auth"; sleep 0.5; printf '%s'; sleep 0.5; } | nc -w 2 ${p%%:*} ${p##*:}`, target, target, payload)
}

func egressManager(t *testing.T, allowPrivate bool, hosts ...string) *Manager {
	return testManager(t, func(o *Options) {
		o.Policy.Network = policy.NetworkAllowlist
		o.Policy.AllowHosts = hosts
		o.Policy.AllowPrivateNetworks = allowPrivate
		o.Resolver = mapResolver{
			"api.test":      {netip.MustParseAddr("127.0.0.1")},
			"blocked.test":  {netip.MustParseAddr("127.0.0.1")},
			"metadata.test": {netip.MustParseAddr("169.254.169.254")},
		}
	})
}

func TestEgressThroughTheProxyOnly(t *testing.T) {
	upstream := listen(t, "127.0.0.1:0", true)
	m := egressManager(t, true, fmt.Sprintf("api.test:%d", upstream.port()), fmt.Sprintf("metadata.test:%d", upstream.port()))
	sb := newSandbox(t, m)

	// The allowed name, through the proxy, reaches the upstream.
	res := sh(t, sb, proxyScript(fmt.Sprintf("api.test:%d", upstream.port()), "ping-through-tunnel"))
	out := string(res.Stdout)
	if !strings.Contains(out, "HTTP/1.1 200") || !strings.Contains(out, "ping-through-tunnel") {
		t.Fatalf("allowed CONNECT: %q %q", out, res.Stderr)
	}
	// Another name: 403 with the reason, and no dial.
	before := upstream.count.Load()
	out = string(sh(t, sb, proxyScript(fmt.Sprintf("blocked.test:%d", upstream.port()), "x")).Stdout)
	if !strings.Contains(out, "403") || !strings.Contains(out, "--allow-host") {
		t.Fatalf("unlisted name: %q", out)
	}
	// An allowed name that resolves to a metadata address stays refused
	// even with private networks allowed.
	out = string(sh(t, sb, proxyScript(fmt.Sprintf("metadata.test:%d", upstream.port()), "x")).Stdout)
	if !strings.Contains(out, "403") {
		t.Fatalf("metadata address: %q", out)
	}
	if upstream.count.Load() != before {
		t.Fatal("a refused request reached the upstream")
	}

	// No other door: not the host's other ports on the gateway, not the
	// host's own address, not the outside, not DNS.
	wild := listen(t, "0.0.0.0:0", false)
	gwScript := fmt.Sprintf(`p=${HTTPS_PROXY##*@}; nc -w 2 ${p%%:*} %d </dev/null; echo rc=$?`, wild.port())
	start := time.Now()
	for name, script := range map[string]string{
		"gateway, another port": gwScript,
		"host address":          fmt.Sprintf("nc -w 2 %s %d </dev/null; echo rc=$?", hostIP(t), wild.port()),
		"outside address":       "nc -w 2 1.1.1.1 443 </dev/null; echo rc=$?",
		"dns":                   "nslookup example.com >/dev/null 2>&1; echo rc=$?",
		"dns at the gateway":    `p=${HTTPS_PROXY##*@}; nslookup example.com ${p%%:*} >/dev/null 2>&1; echo rc=$?`,
		"the engine's resolver": "nslookup example.com 127.0.0.11 >/dev/null 2>&1; echo rc=$?",
	} {
		out := strings.TrimSpace(string(sh(t, sb, script).Stdout))
		if out == "rc=0" {
			t.Errorf("%s: reachable from the sandbox", name)
		}
	}
	if wild.count.Load() != 0 {
		t.Fatalf("a host listener on 0.0.0.0 accepted %d connections from the sandbox", wild.count.Load())
	}
	t.Logf("refused doors took %s", time.Since(start).Round(time.Millisecond))

	// The container joined its own internal network, with the gateway as
	// its only resolver.
	insp, err := testenv.Engine(t).ContainerInspect(context.Background(), sb.ContainerID(), client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h := insp.Container.HostConfig
	netName := string(h.NetworkMode)
	if !strings.HasPrefix(netName, "sandbox-mcp-"+sb.ID()) || len(h.DNS) != 1 {
		t.Fatalf("network mode %q, dns %v", netName, h.DNS)
	}
	nw, err := testenv.Engine(t).NetworkInspect(context.Background(), netName, client.NetworkInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !nw.Network.Internal || nw.Network.Labels[docker.LabelSandbox] != sb.ID() || nw.Network.Labels[docker.LabelInstance] != m.Instance() {
		t.Fatalf("network: internal %v labels %v", nw.Network.Internal, nw.Network.Labels)
	}
	if len(nw.Network.IPAM.Config) != 1 || !docker.DefaultNetworkPool.Contains(nw.Network.IPAM.Config[0].Subnet.Addr()) || h.DNS[0] != nw.Network.IPAM.Config[0].Gateway {
		t.Fatalf("network IPAM %v, dns %v", nw.Network.IPAM.Config, h.DNS)
	}

	// Removing the sandbox removes the network and its firewall rules.
	m.Release(t.Name())
	if _, err := testenv.Engine(t).NetworkInspect(context.Background(), netName, client.NetworkInspectOptions{}); !isGone(err) {
		t.Fatalf("network %s left after the sandbox: %v", netName, err)
	}
	rules, _ := exec.Command("nft", "list", "table", "inet", docker.FirewallTable).Output()
	if strings.Contains(string(rules), netName) {
		t.Fatalf("firewall rules left:\n%s", rules)
	}
}

func TestEgressPrivateAddressRefused(t *testing.T) {
	upstream := listen(t, "127.0.0.1:0", true)
	m := egressManager(t, false, fmt.Sprintf("api.test:%d", upstream.port()))
	sb := newSandbox(t, m)
	out := string(sh(t, sb, proxyScript(fmt.Sprintf("api.test:%d", upstream.port()), "x")).Stdout)
	if !strings.Contains(out, "403") || !strings.Contains(out, "--allow-private-networks") {
		t.Fatalf("an allowed name resolving to loopback: %q", out)
	}
	if upstream.count.Load() != 0 {
		t.Fatal("the loopback upstream was dialled")
	}
}

func TestEgressSandboxesCannotReachEachOther(t *testing.T) {
	m := egressManager(t, false, "api.test:443")
	a, _ := m.Sandbox("a", "")
	b, _ := m.Sandbox("b", "")
	// a listens; b tries to connect to a's address.
	if _, err := a.Exec(context.Background(), ExecRequest{Argv: []string{"sh", "-c", "nc -l -p 8080 >/dev/null 2>&1 &"}, Cwd: ".", Timeout: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	ip := strings.TrimSpace(string(sh(t, a, "ip -4 -o addr show eth0 | sed 's/.*inet \\([0-9.]*\\).*/\\1/'").Stdout))
	if ip == "" {
		t.Fatal("no address for sandbox a")
	}
	if out := strings.TrimSpace(string(sh(t, a, "nc -w 1 127.0.0.1 8080 </dev/null; echo rc=$?").Stdout)); out != "rc=0" {
		t.Fatalf("a's own listener is not up: %s", out)
	}
	if out := strings.TrimSpace(string(sh(t, b, fmt.Sprintf("nc -w 2 %s 8080 </dev/null; echo rc=$?", ip)).Stdout)); out == "rc=0" {
		t.Fatal("sandbox b reached sandbox a")
	}
}

// runPlain runs script in a plain container of the test image (not a
// sandbox: the engine's defaults) on the given network, and returns its
// output. The container is labelled with the manager's instance and removed.
func runPlain(t *testing.T, m *Manager, networkMode, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	created, err := testenv.Engine(t).ContainerCreate(ctx, client.ContainerCreateOptions{
		Config: &container.Config{
			Image:  testenv.TestImage(t),
			Cmd:    []string{"sh", "-c", script},
			Tty:    true, // the log is the raw output
			Labels: map[string]string{docker.LabelInstance: m.Instance(), "io.sandbox-mcp.test": t.Name()},
		},
		HostConfig: &container.HostConfig{NetworkMode: container.NetworkMode(networkMode)},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		testenv.Engine(t).ContainerRemove(context.Background(), created.ID, client.ContainerRemoveOptions{Force: true})
	})
	if _, err := testenv.Engine(t).ContainerStart(ctx, created.ID, client.ContainerStartOptions{}); err != nil {
		t.Fatal(err)
	}
	wait := testenv.Engine(t).ContainerWait(ctx, created.ID, client.ContainerWaitOptions{})
	select {
	case <-wait.Result:
	case err := <-wait.Error:
		t.Fatalf("wait for the plain container: %v", err)
	}
	logs, err := testenv.Engine(t).ContainerLogs(ctx, created.ID, client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true})
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	out, _ := io.ReadAll(logs)
	return string(out)
}

// TestEgressProxyIsTheSandboxsAlone: a container on Docker's default bridge
// can route to a sandbox's gateway, but neither it nor another sandbox can
// use the sandbox's proxy (and its allowlist); the sandbox itself can.
func TestEgressProxyIsTheSandboxsAlone(t *testing.T) {
	upstream := listen(t, "127.0.0.1:0", true)
	target := fmt.Sprintf("api.test:%d", upstream.port())
	m := egressManager(t, true, target)
	sb := newSandbox(t, m)
	proxyURL := strings.TrimSpace(string(sh(t, sb, "echo $HTTPS_PROXY").Stdout))
	pu, err := url.Parse(proxyURL)
	if err != nil || pu.User == nil {
		t.Fatalf("the sandbox's proxy URL %q has no credential (%v)", proxyURL, err)
	}
	host, port, err := net.SplitHostPort(pu.Host)
	if err != nil {
		t.Fatalf("the sandbox's proxy %q: %v", proxyURL, err)
	}
	// Outsiders hold the sandbox's own credential: the address check alone
	// must keep them out.
	pw, _ := pu.User.Password()
	auth := base64.StdEncoding.EncodeToString([]byte(pu.User.Username() + ":" + pw))
	connect := fmt.Sprintf(`{ printf 'CONNECT %[1]s HTTP/1.1\r\nHost: %[1]s\r\nProxy-Authorization: Basic %[4]s\r\n\r\n'; sleep 0.5; printf 'from-outside'; sleep 0.5; } | nc -w 3 %[2]s %[3]s; echo rc=$?`, target, host, port, auth)

	// The firewall resets the listener's port to every interface but the
	// sandbox's bridge; the proxy itself serves the sandbox's address only.
	rules, _ := exec.Command("nft", "list", "table", "inet", docker.FirewallTable).Output()
	if !regexp.MustCompile(`iifname != "sbx-\S+" ip daddr ` + regexp.QuoteMeta(host) + ` tcp dport ` + port + ` reject with tcp reset`).Match(rules) {
		t.Errorf("no rule keeps other interfaces off the proxy's port %s:\n%s", port, rules)
	}

	// Another container on the default bridge: its packets reach the
	// host's INPUT from docker0, not from the sandbox's bridge.
	out := runPlain(t, m, "bridge", connect)
	// The status line, not "200" anywhere: the proxy's address may hold
	// it (nc names the address it could not reach, 198.18.200.233).
	if strings.Contains(out, "HTTP/1.1 200") || strings.Contains(out, "from-outside") {
		t.Errorf("a container on the default bridge tunnelled through the sandbox's proxy:\n%s", out)
	}
	// Another sandbox, on its own network.
	other, err := m.Sandbox("other", "")
	if err != nil {
		t.Fatal(err)
	}
	if out := string(sh(t, other, connect).Stdout); strings.Contains(out, "HTTP/1.1 200") {
		t.Errorf("another sandbox tunnelled through this sandbox's proxy:\n%s", out)
	}
	if n := upstream.count.Load(); n != 0 {
		t.Fatalf("the upstream was reached %d times from outside the sandbox", n)
	}

	// The sandbox itself still gets through, with its credential only.
	res := sh(t, sb, proxyScript(target, "from-the-sandbox"))
	if !strings.Contains(string(res.Stdout), "HTTP/1.1 200") || !strings.Contains(string(res.Stdout), "from-the-sandbox") {
		t.Fatalf("the sandbox's own CONNECT: %q %q", res.Stdout, res.Stderr)
	}
	bare := fmt.Sprintf(`printf 'CONNECT %[1]s HTTP/1.1\r\nHost: %[1]s\r\n\r\n' | nc -w 3 %[2]s %[3]s | head -1`, target, host, port)
	if out := string(sh(t, sb, bare).Stdout); !strings.Contains(out, "407") {
		t.Errorf("the sandbox's CONNECT without its credential: %q, want 407", out)
	}
}

// publish runs a plain container of the test image (not a sandbox) on
// Docker's default bridge that answers "published-hello" on a port it
// publishes on every address of the host, and returns that host port. The
// container is labelled with the manager's instance and removed.
func publish(t *testing.T, m *Manager) string {
	t.Helper()
	cli := testenv.Engine(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	port := network.MustParsePort("8080/tcp")
	created, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config: &container.Config{
			Image:        testenv.TestImage(t),
			Cmd:          []string{"sh", "-c", "while true; do echo published-hello | nc -l -p 8080; done"},
			ExposedPorts: network.PortSet{port: {}},
			Labels:       map[string]string{docker.LabelInstance: m.Instance(), "io.sandbox-mcp.test": t.Name()},
		},
		HostConfig: &container.HostConfig{
			NetworkMode:  "bridge",
			PortBindings: network.PortMap{port: {{}}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cli.ContainerRemove(context.Background(), created.ID, client.ContainerRemoveOptions{Force: true})
	})
	if _, err := cli.ContainerStart(ctx, created.ID, client.ContainerStartOptions{}); err != nil {
		t.Fatal(err)
	}
	insp, err := cli.ContainerInspect(ctx, created.ID, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range insp.Container.NetworkSettings.Ports[port] {
		if b.HostPort != "" {
			return b.HostPort
		}
	}
	t.Fatalf("no host port published: %v", insp.Container.NetworkSettings.Ports)
	return ""
}

// withoutDockerIsolation removes, until the test ends, the rules Docker
// keeps in iptables' DOCKER-ISOLATION-STAGE-1 chain for a bridge (for an
// internal network: drop what enters the bridge from elsewhere, and what
// leaves it for elsewhere), as a program that rewrites iptables' filter
// table may. The rules are put back at cleanup, before the network goes
// (which removes them itself). It returns the rules it removed.
func withoutDockerIsolation(t *testing.T, bridge string) []string {
	t.Helper()
	const chain = "DOCKER-ISOLATION-STAGE-1"
	out, err := exec.Command("iptables", "-S", chain).Output()
	if err != nil {
		t.Logf("no iptables chain %s (%v): Docker's isolation rules are elsewhere or absent", chain, err)
		return nil
	}
	var removed []string
	for _, line := range strings.Split(string(out), "\n") {
		spec, ok := strings.CutPrefix(line, "-A "+chain+" ")
		if !ok || !slices.Contains(strings.Fields(spec), bridge) {
			continue
		}
		args := strings.Fields(spec)
		if out, err := exec.Command("iptables", append([]string{"-D", chain}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("iptables -D %s %s: %v %s", chain, spec, err, out)
		}
		removed = append(removed, spec)
		t.Cleanup(func() {
			if exec.Command("iptables", append([]string{"-C", chain}, args...)...).Run() == nil {
				return // already back
			}
			if out, err := exec.Command("iptables", append([]string{"-I", chain, "1"}, args...)...).CombinedOutput(); err != nil {
				t.Errorf("put back Docker's rule %s %s: %v %s", chain, spec, err, out)
			}
		})
	}
	return removed
}

var forwardCounter = regexp.MustCompile(`counter packets (\d+) bytes \d+`)

// forwardPackets returns the packets the forward chain's rules of a
// network have stopped.
func forwardPackets(t *testing.T, network string) int {
	t.Helper()
	out, err := exec.Command("nft", "list", "chain", "inet", docker.FirewallTable, docker.FirewallForwardChain).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list chain: %v %s", err, out)
	}
	n, rules := 0, 0
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.Contains(line, `comment "sandbox-mcp:`+network+`"`) {
			continue
		}
		rules++
		if m := forwardCounter.FindStringSubmatch(line); m != nil {
			c, _ := strconv.Atoi(m[1])
			n += c
		}
	}
	if rules != 3 {
		t.Fatalf("the network has %d forward rules, want 3:\n%s", rules, out)
	}
	return n
}

// TestEgressForwardChainStopsPublishedPorts: a port that a container on
// another bridge publishes stays out of a sandbox's reach even with
// Docker's isolation rules for the sandbox's network gone. The sandbox
// reaches the host only through its gateway, whose address is the host's
// own, so the engine's DNAT of the published port applies there, and the
// packet is forwarded to the other bridge: the input chain never sees it.
// The forward chain of the server's table refuses it, and its counters
// show it did.
func TestEgressForwardChainStopsPublishedPorts(t *testing.T) {
	cli := testenv.Engine(t)
	m := egressManager(t, false, "api.test:443")
	sb := newSandbox(t, m)
	gw := strings.TrimSpace(string(sh(t, sb, `p=${HTTPS_PROXY##*@}; echo ${p%%:*}`).Stdout))
	insp, err := cli.ContainerInspect(context.Background(), sb.ContainerID(), client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	netName := string(insp.Container.HostConfig.NetworkMode)
	nw, err := cli.NetworkInspect(context.Background(), netName, client.NetworkInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bridge := nw.Network.Options["com.docker.network.bridge.name"]
	if bridge == "" || gw == "" {
		t.Fatalf("bridge %q, gateway %q", bridge, gw)
	}

	port := publish(t, m)
	// The published port answers (from the host, through the engine).
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", net.JoinHostPort(hostIP(t), port), 2*time.Second)
		if err == nil {
			conn.SetDeadline(time.Now().Add(2 * time.Second))
			b, _ := io.ReadAll(conn)
			conn.Close()
			if strings.Contains(string(b), "published-hello") {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the published port %s never answered from the host: %v", port, err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	removed := withoutDockerIsolation(t, bridge)
	t.Logf("removed Docker's rules for %s: %q", bridge, removed)
	before := forwardPackets(t, netName)
	out := string(sh(t, sb, fmt.Sprintf("nc -w 3 %s %s </dev/null; echo rc=$?", gw, port)).Stdout)
	if strings.Contains(out, "published-hello") || strings.TrimSpace(out) == "rc=0" {
		t.Fatalf("the sandbox reached the port another container publishes, through its gateway %s:%s: %q", gw, port, out)
	}
	if after := forwardPackets(t, netName); after <= before {
		t.Fatalf("the forward chain stopped no packet (%d before, %d after): what stopped the sandbox was not this server's table", before, after)
	}
}
