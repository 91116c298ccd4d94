package docker

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/netproxy"
)

// DefaultNetworkPool is where sandbox networks take their subnets: the
// benchmarking range (RFC 2544), which real networks rarely use, cut into
// /29s, enough for thousands of sandboxes (Docker's default pools hold about
// thirty networks).
var DefaultNetworkPool = netip.MustParsePrefix("198.18.0.0/15")

// sandboxNet is a sandbox's own internal network and the proxy listener on
// its gateway.
type sandboxNet struct {
	id, name, bridge string
	gateway          netip.Addr
	client           netip.Addr // the container's address, the only one the proxy serves
	port             int
	stop             context.CancelFunc
	served           chan struct{}
	firewalled       bool
	// createCut is set when the create call was cut before the engine
	// answered (see DefaultCreateGrace): the network may exist all the
	// same, under an id not known.
	createCut bool
	// token is the sandbox's proxy credential, in its proxy URL; the
	// proxy checks it beside the client's address. revoke gives it back.
	token  string
	revoke func()
}

// proxyURL is the address sandboxed programs reach the proxy at, with the
// sandbox's credential (http://sbx:TOKEN@gateway:port).
func (n *sandboxNet) proxyURL() string {
	return netproxy.ProxyURL(netip.AddrPortFrom(n.gateway, uint16(n.port)).String(), n.token)
}

// env is what a sandbox's programs need to find the proxy.
func (n *sandboxNet) env() []string {
	u := n.proxyURL()
	noProxy := "localhost,127.0.0.1,::1"
	return []string{
		"HTTP_PROXY=" + u, "HTTPS_PROXY=" + u, "http_proxy=" + u, "https_proxy=" + u,
		"NO_PROXY=" + noProxy, "no_proxy=" + noProxy,
	}
}

// bridgeName derives the host interface name of a network (at most 15
// bytes).
func bridgeName(network string) string {
	sum := sha256.Sum256([]byte(network))
	return "sbx-" + hex.EncodeToString(sum[:])[:11]
}

// pickSubnet returns a random /29 of pool.
func pickSubnet(pool netip.Prefix) netip.Prefix {
	bits := 29 - pool.Bits()
	if bits <= 0 || !pool.Addr().Is4() {
		return pool.Masked()
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	n := binary.BigEndian.Uint32(b[:]) % (1 << bits)
	base := binary.BigEndian.Uint32(pool.Masked().Addr().AsSlice())
	var out [4]byte
	binary.BigEndian.PutUint32(out[:], base+n<<3)
	return netip.PrefixFrom(netip.AddrFrom4(out), 29)
}

// openNet creates a sandbox's internal network, starts the proxy on its
// gateway address only, and firewalls every other port of the host away
// from it. The container gets the address after the gateway, and the proxy
// listener is its own: the proxy serves no other address, and the firewall
// refuses the listener to packets from any other interface (another
// bridge, docker0, the host itself). It returns the network whatever
// happened, for the caller to close: on failure, and when ctx ends, that
// removes whatever was made of it.
func (d *Docker) openNet(ctx context.Context, sandbox, name string, proxy *netproxy.Proxy) (n *sandboxNet, err error) {
	n = &sandboxNet{name: name, bridge: bridgeName(name)}
	no := false
	var created client.NetworkCreateResult
	for attempt := 0; ; attempt++ {
		subnet := pickSubnet(d.cfg.NetworkPool)
		gw := subnet.Addr().Next()
		cctx, stop := d.creating(ctx)
		created, err = d.cli.NetworkCreate(cctx, name, client.NetworkCreateOptions{
			Driver:     "bridge",
			Internal:   true,
			EnableIPv6: &no,
			Labels:     d.labels(sandbox),
			IPAM:       &network.IPAM{Config: []network.IPAMConfig{{Subnet: subnet, Gateway: gw}}},
			Options: map[string]string{
				"com.docker.network.bridge.name":                 n.bridge,
				"com.docker.network.bridge.enable_icc":           "false",
				"com.docker.network.bridge.enable_ip_masquerade": "false",
			},
		})
		n.createCut = err != nil && cctx.Err() != nil
		stop()
		if err == nil {
			n.gateway, n.client = gw, gw.Next()
			break
		}
		// The subnet may overlap another network's (engines report that
		// in several ways): try another, unless the engine is gone.
		if attempt < 8 && !client.IsErrConnectionFailed(err) && !n.createCut && ctx.Err() == nil {
			continue
		}
		return n, engineError("create the sandbox's network", err)
	}
	n.id = created.ID
	if ctx.Err() != nil {
		return n, abandoned(ctx, "create the sandbox's network")
	}

	ln, err := net.Listen("tcp", netip.AddrPortFrom(n.gateway, 0).String())
	if err != nil {
		if errors.Is(err, syscall.EADDRNOTAVAIL) {
			return n, errcode.Errorf(errcode.Unavailable, "the egress proxy cannot listen on the sandbox network's gateway %s: this server does not share the host's network namespace. When sandbox-mcp runs in a container, run that container with --network host (see docs/network.md); or use --network=none", n.gateway)
		}
		return n, fmt.Errorf("listen on the sandbox network's gateway %s: %w", n.gateway, err)
	}
	n.port = ln.Addr().(*net.TCPAddr).Port
	if d.fw != nil {
		if err := d.fw.isolate(n.name, n.bridge, n.gateway, n.client, n.port); err != nil {
			ln.Close()
			return n, fmt.Errorf("firewall the sandbox network: %w", err)
		}
		n.firewalled = true
	}
	n.token = netproxy.NewToken()
	d.serveProxy(n, ln, sandbox, proxy)
	return n, nil
}

// serveProxy grants n's credential for sandbox at the proxy and serves the
// proxy on ln, for n's container address alone, until n is torn down.
func (d *Docker) serveProxy(n *sandboxNet, ln net.Listener, sandbox string, proxy *netproxy.Proxy) {
	n.revoke = proxy.Grant(sandbox, n.token)
	pctx, stop := context.WithCancel(context.Background())
	n.stop, n.served = stop, make(chan struct{})
	go func() {
		defer close(n.served)
		if err := proxy.Serve(pctx, ln, sandbox, n.client); err != nil {
			d.log.Warn("proxy stopped", "sandbox", sandbox, "err", err)
		}
	}()
}

// adoptNet takes over the network of a sandbox container a server before
// this one started (Reattach): the proxy listens again on the network's
// gateway at the port, and takes the credential, that the container's
// proxy variables name (the last server's listener went with it), for the
// container's address alone; the firewall rules, which outlived that
// server, are this server's to keep from now on. It fails, leaving nothing,
// when what the container was given does not match its network (a
// container someone changed) or the port is taken.
func (d *Docker) adoptNet(sandbox, name string, env []string, ns *container.NetworkSettings, proxy *netproxy.Proxy) (*sandboxNet, error) {
	fw, err := d.egressFirewall()
	if err != nil {
		return nil, fmt.Errorf("set up the egress firewall: %w", err)
	}
	if fw == nil {
		return nil, errors.New("this server runs without the egress firewall (--network is not allowlist)")
	}
	var ep *network.EndpointSettings
	if ns != nil {
		ep = ns.Networks[name]
	}
	if ep == nil || !ep.IPAddress.IsValid() || !ep.Gateway.IsValid() {
		return nil, fmt.Errorf("the container is not on its network %s", name)
	}
	var raw string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "HTTPS_PROXY="); ok {
			raw = v
		}
	}
	u, err := url.Parse(raw)
	if err != nil || u.User == nil || u.User.Username() != netproxy.CredentialUser {
		return nil, errors.New("the container has no proxy URL with a credential")
	}
	token, _ := u.User.Password()
	at, err := netip.ParseAddrPort(u.Host)
	if err != nil || at.Addr() != ep.Gateway || token == "" {
		return nil, fmt.Errorf("the container's proxy URL does not name its network's gateway %s", ep.Gateway)
	}
	n := &sandboxNet{id: ep.NetworkID, name: name, bridge: bridgeName(name), gateway: ep.Gateway, client: ep.IPAddress, port: int(at.Port()), token: token}
	ln, err := net.Listen("tcp", at.String())
	if err != nil {
		return nil, fmt.Errorf("listen again at the proxy's address %s: %w", at, err)
	}
	if err := fw.adopt(n.name, n.bridge, n.gateway, n.client, n.port); err != nil {
		ln.Close()
		return nil, fmt.Errorf("take over the network's firewall rules: %w", err)
	}
	n.firewalled = true
	d.serveProxy(n, ln, sandbox, proxy)
	return n, nil
}

// closeNet stops a network's proxy and removes its rules and the network
// (found by name if its create was cut). The network's container must be
// gone already.
func (d *Docker) closeNet(n *sandboxNet) {
	if n.stop != nil {
		n.stop()
		<-n.served
	}
	if n.revoke != nil {
		n.revoke()
	}
	if n.firewalled {
		if err := d.fw.release(n.name); err != nil {
			d.log.Warn("remove firewall rules", "network", n.name, "err", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ids := []string{n.id}
	if n.id == "" {
		if !n.createCut {
			return
		}
		var err error
		if ids, err = d.ownNetworks(ctx, n.name); err != nil {
			d.log.Warn("find network", "network", n.name, "err", err)
			return
		}
	}
	for _, id := range ids {
		if err := removeNetwork(ctx, d.cli, id); err != nil {
			d.log.Warn("remove network", "network", n.name, "err", err)
		}
	}
}

// ownNetworks returns the ids of this server's networks named name ("" for
// every one). The engine matches names by substring; the names are
// compared here whole.
func (d *Docker) ownNetworks(ctx context.Context, name string) ([]string, error) {
	list, err := d.cli.NetworkList(ctx, client.NetworkListOptions{Filters: make(client.Filters).Add("label", LabelInstance+"="+d.cfg.Instance)})
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, nw := range list.Items {
		if name == "" || nw.Name == name {
			ids = append(ids, nw.ID)
		}
	}
	return ids, nil
}

// removeNetwork removes a network, waiting (until ctx ends) for endpoints
// that linger a moment after their container is gone.
func removeNetwork(ctx context.Context, cli Engine, id string) error {
	for {
		_, err := cli.NetworkRemove(ctx, id, client.NetworkRemoveOptions{})
		if err == nil || cerrdefs.IsNotFound(err) {
			return nil
		}
		if ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}
