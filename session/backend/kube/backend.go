package kube

import (
	"context"
	"fmt"
	"net"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/netproxy"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
)

// BackendConfig configures a Backend.
type BackendConfig struct {
	// Cluster runs the pods. Required.
	Cluster *Cluster
	// Image is the sandbox image, any image the cluster can run. Required.
	Image string
	// ProxyListen is where the server's egress proxy listens for every
	// sandbox pod (e.g. "0.0.0.0:3128"); used with the allowlist only.
	ProxyListen string
	// ProxyAdvertise is host:port at which pods reach ProxyListen (the
	// node-facing address, or the server pod's); it goes into the
	// sandboxes' HTTP_PROXY with their credential.
	ProxyAdvertise string
}

// Backend runs sandboxes as pods (session's backend.Backend). The egress
// proxy listens once for all of them and tells them apart by the
// credential in each sandbox's proxy URL.
type Backend struct {
	cfg BackendConfig

	ctx    context.Context
	cancel context.CancelFunc
	mu     sync.Mutex
	served map[*netproxy.Proxy]bool
	wg     sync.WaitGroup
}

var (
	_ backend.Backend    = (*Backend)(nil)
	_ backend.Reattacher = (*Backend)(nil)
)

// NewBackend returns a Backend.
func NewBackend(cfg BackendConfig) (*Backend, error) {
	if cfg.Cluster == nil || cfg.Image == "" {
		return nil, fmt.Errorf("kube: a cluster and an image are required")
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Backend{cfg: cfg, ctx: ctx, cancel: cancel, served: map[*netproxy.Proxy]bool{}}, nil
}

// Prepare checks the namespace, writes the lease and the NetworkPolicies.
func (b *Backend) Prepare(ctx context.Context, step func(backend.Step)) error {
	step(backend.Step{What: "checking the namespace " + b.cfg.Cluster.Namespace() + " and writing this server's lease and network policies"})
	return b.cfg.Cluster.Prepare(ctx)
}

// Sweep deletes the pods of servers whose lease expired, and ended pods.
func (b *Backend) Sweep(ctx context.Context) error {
	_, err := b.cfg.Cluster.Sweep(ctx)
	return err
}

// Close stops the proxy listener and deletes this server's lease and
// proxy policy; call it after the session manager removed every sandbox.
func (b *Backend) Close(ctx context.Context) error {
	b.cancel()
	b.wg.Wait()
	return b.cfg.Cluster.Close(ctx)
}

// serveProxy starts the shared proxy listener for p once.
func (b *Backend) serveProxy(p *netproxy.Proxy) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.served[p] {
		return nil
	}
	if b.cfg.ProxyListen == "" || b.cfg.ProxyAdvertise == "" {
		return errcode.Errorf(errcode.Unavailable, "the allowlist needs the proxy's address on the cluster network: start the server with --proxy-listen and --proxy-advertise")
	}
	ln, err := net.Listen("tcp", b.cfg.ProxyListen)
	if err != nil {
		return errcode.Errorf(errcode.Unavailable, "cannot listen for the egress proxy on %s: %w", b.cfg.ProxyListen, err)
	}
	b.served[p] = true
	b.wg.Go(func() { _ = p.ServeShared(b.ctx, ln) })
	return nil
}

// Start starts one sandbox pod with the agent attached.
func (b *Backend) Start(ctx context.Context, spec backend.InstanceSpec) (backend.Instance, error) {
	name := fmt.Sprintf("sandbox-mcp-%s-%d", spec.Sandbox, spec.Generation)
	env := append([]string(nil), spec.Env...)
	network := NetworkNone
	revoke := func() {}
	if spec.Proxy != nil {
		if err := b.serveProxy(spec.Proxy); err != nil {
			return nil, err
		}
		tok := netproxy.NewToken()
		revoke = spec.Proxy.Grant(spec.Sandbox, tok)
		u := netproxy.ProxyURL(b.cfg.ProxyAdvertise, tok)
		noProxy := "localhost,127.0.0.1,::1"
		env = append(env, "HTTP_PROXY="+u, "HTTPS_PROXY="+u, "http_proxy="+u, "https_proxy="+u,
			"NO_PROXY="+noProxy, "no_proxy="+noProxy)
		network = NetworkProxy
	}
	// The environment holds the proxy credential, the operator's --env
	// values and the secrets' placeholders: the pod spec, which anyone who
	// may get pods reads and etcd keeps, gets none of it. The agent's setup
	// request carries it (backend.AgentEnv).
	image := b.cfg.Image
	if spec.Image != "" {
		image = spec.Image // an operator template's
	}
	inst, err := b.cfg.Cluster.Start(ctx, spec.Sandbox, Params{
		Name: name, Image: image, UID: spec.UID, GID: spec.GID,
		WorkspaceBytes: spec.Limits.WorkspaceBytes, TmpBytes: spec.Limits.TmpBytes, ReadOnly: spec.ReadOnly,
		Memory: spec.Limits.Memory, NanoCPUs: spec.Limits.NanoCPUs, Network: network,
	})
	if err != nil {
		revoke()
		return nil, err
	}
	inst.env, inst.revoke = env, revoke
	return inst, nil
}

// Reattach takes over the agent of a running sandbox pod, whichever
// server started it (Cluster.Reattach): backend.Reattacher.
//
// proxy is not used: a pod's egress goes through the cluster's shared
// proxy, which the pod's credential already names.
func (b *Backend) Reattach(ctx context.Context, name string, _ *netproxy.Proxy) (backend.Instance, error) {
	inst, err := b.cfg.Cluster.Reattach(ctx, name)
	if err != nil {
		return nil, err
	}
	return inst, nil
}

// FindSandbox returns a sandbox's running pod, whichever server started
// it (Cluster.Find).
func (b *Backend) FindSandbox(ctx context.Context, sandbox string) (string, int, bool, error) {
	return b.cfg.Cluster.Find(ctx, sandbox)
}

// RemoveSandbox deletes every pod of a sandbox, whichever server holds it
// (the sandbox ended through another server).
func (b *Backend) RemoveSandbox(ctx context.Context, sandbox string) error {
	c := b.cfg.Cluster
	zero := int64(0)
	err := c.cs.CoreV1().Pods(c.cfg.Namespace).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero},
		metav1.ListOptions{LabelSelector: LabelManaged + "=1," + LabelRole + "=sandbox," + LabelSandbox + "=" + sandbox})
	return apiError("delete the pods of sandbox "+sandbox, err)
}
