package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"path"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/sandbox-mcp/sandbox-mcp/session/backend/kube"
)

// Backends the server runs sandboxes on.
const (
	BackendDocker     = "docker"
	BackendKubernetes = "kubernetes"
)

// KubeConfig configures the Kubernetes backend (--backend kubernetes).
type KubeConfig struct {
	// Backend is docker (the default) or kubernetes.
	Backend string
	// Kubeconfig is the client configuration file; "" means in-cluster.
	Kubeconfig string
	// Namespace holds every sandbox pod, lease and network policy.
	Namespace string
	// RuntimeClass is every sandbox pod's runtimeClassName ("" default).
	RuntimeClass string
	// SeccompLocalhost is the sandbox containers' seccomp profile, a path
	// under the kubelet's seccomp directory on every node ("" for the
	// runtime's default).
	SeccompLocalhost string
	// AgentImage is the image the agent is copied from into each pod.
	AgentImage string
	// PullPolicy is the pods' image pull policy ("" is IfNotPresent).
	PullPolicy string
	// ProxyListen and ProxyAdvertise place the egress proxy for pods
	// (--network=allowlist): where it listens, and host:port pods reach.
	ProxyListen    string
	ProxyAdvertise string
	// ReplicaKeyFile holds the key replicas share (a mounted Secret):
	// with it, any replica serves any handle (docs/kubernetes.md).
	ReplicaKeyFile string
}

func (f *flagSet) addKubeFlags(cfg *Config) {
	k := &cfg.Kube
	fs := f.fs
	fs.Var(&choice{v: &k.Backend, allowed: []string{BackendDocker, BackendKubernetes}}, "backend", "`backend` sandboxes run on: docker (a container each on the local engine) or kubernetes (a pod each; see --namespace)")
	fs.StringVar(&k.Kubeconfig, "kubeconfig", k.Kubeconfig, "kubeconfig `file` for --backend kubernetes (default: in-cluster, then $KUBECONFIG)")
	fs.StringVar(&k.Namespace, "namespace", k.Namespace, "`namespace` of the sandbox pods, leases and network policies (--backend kubernetes)")
	fs.StringVar(&k.RuntimeClass, "runtime-class", k.RuntimeClass, "runtimeClassName of sandbox pods, e.g. gvisor or kata (--backend kubernetes; default: the cluster's)")
	fs.StringVar(&k.SeccompLocalhost, "seccomp-localhost-profile", k.SeccompLocalhost, "seccomp profile `path` of sandbox containers, relative to the kubelet's seccomp directory on every node, e.g. sandbox-mcp/no-io_uring.json (--backend kubernetes; default: the runtime's own, RuntimeDefault)")
	fs.StringVar(&k.AgentImage, "agent-image", k.AgentImage, "`image` the agent is copied from into each pod (make k8s-images builds sandbox-mcp-agent:<hash>)")
	fs.Var(&choice{v: &k.PullPolicy, allowed: []string{"", "Always", "IfNotPresent", "Never"}}, "pull-policy", "image pull `policy` of sandbox pods: Always, IfNotPresent (default) or Never")
	fs.StringVar(&k.ProxyListen, "proxy-listen", k.ProxyListen, "`host:port` the egress proxy listens on for pods (--backend kubernetes with --network=allowlist)")
	fs.StringVar(&k.ReplicaKeyFile, "replica-key-file", k.ReplicaKeyFile, "`file` holding the secret key every replica shares (--backend kubernetes, with a state directory they share): any replica then serves any sandbox handle")
	fs.StringVar(&k.ProxyAdvertise, "proxy-advertise", k.ProxyAdvertise, "`host:port` at which pods reach --proxy-listen (an address on the pod network, e.g. the node's, or the server pod's)")
}

// validateKube checks the Kubernetes flags, naming the flag to fix.
func (c Config) validateKube() error {
	k := c.Kube
	if k.Backend != BackendKubernetes {
		if k.Namespace != "" || k.AgentImage != "" || k.RuntimeClass != "" || k.SeccompLocalhost != "" || k.ReplicaKeyFile != "" {
			return errors.New("--namespace, --agent-image, --runtime-class, --seccomp-localhost-profile and --replica-key-file need --backend kubernetes (with Docker, --seccomp-profile takes a profile file)")
		}
		return nil
	}
	var errs []error
	if k.Namespace == "" {
		errs = append(errs, errors.New("--backend kubernetes needs --namespace"))
	}
	if k.AgentImage == "" {
		errs = append(errs, errors.New("--backend kubernetes needs --agent-image (make k8s-images prints the tag it built)"))
	}
	if s := k.SeccompLocalhost; s != "" && (path.IsAbs(s) || path.Clean(s) != s || s == ".." || strings.HasPrefix(s, "../")) {
		errs = append(errs, fmt.Errorf("--seccomp-localhost-profile %q: want a clean path relative to the kubelet's seccomp directory, e.g. sandbox-mcp/no-io_uring.json", s))
	}
	if c.Runtime != "" || c.SeccompProfileFile != "" {
		errs = append(errs, errors.New("--runtime and --seccomp-profile apply to Docker; with --backend kubernetes use --runtime-class and --seccomp-localhost-profile (a profile installed on every node)"))
	}
	if c.Policy.ReadOnly && c.WorkspaceFrom != "" {
		errs = append(errs, errors.New("--read-only with --workspace-from is not supported with --backend kubernetes (the content cannot be baked into a pod's image)"))
	}
	if c.Policy.Network == "allowlist" {
		if k.ProxyListen == "" || k.ProxyAdvertise == "" {
			errs = append(errs, errors.New("--network=allowlist with --backend kubernetes needs --proxy-listen and --proxy-advertise (where pods reach the egress proxy)"))
		} else if _, err := advertisedProxy(k.ProxyAdvertise); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// advertisedProxy turns --proxy-advertise into the NetworkPolicy peer.
func advertisedProxy(hostport string) (*kube.Proxy, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return nil, fmt.Errorf("--proxy-advertise %q: want IP:port (%v)", hostport, err)
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return nil, fmt.Errorf("--proxy-advertise %q: the host must be an IP address, which the sandboxes' network policy allows (%v)", hostport, err)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n <= 0 || n > 65535 {
		return nil, fmt.Errorf("--proxy-advertise %q: bad port", hostport)
	}
	return &kube.Proxy{Port: n, CIDR: netip.PrefixFrom(addr, addr.BitLen()).String()}, nil
}

// newKubeBackend builds the Kubernetes backend from the configuration;
// client-go's own logs (klog) go to log.
func newKubeBackend(cfg Config, instance string, log *slog.Logger) (*kube.Backend, error) {
	klog.SetSlogLogger(log.With("component", "client-go"))
	rc, err := kube.RESTConfig(cfg.Kube.Kubeconfig)
	if err != nil {
		return nil, err
	}
	kc := kube.Config{
		Namespace:        cfg.Kube.Namespace,
		Instance:         instance,
		AgentImage:       cfg.Kube.AgentImage,
		PullPolicy:       corev1.PullPolicy(cfg.Kube.PullPolicy),
		RuntimeClass:     cfg.Kube.RuntimeClass,
		SeccompLocalhost: cfg.Kube.SeccompLocalhost,
		Logger:           log,
	}
	if cfg.Policy.Network == "allowlist" {
		if kc.Proxy, err = advertisedProxy(cfg.Kube.ProxyAdvertise); err != nil {
			return nil, err
		}
	}
	c, err := kube.NewCluster(rc, kc)
	if err != nil {
		return nil, err
	}
	return kube.NewBackend(kube.BackendConfig{Cluster: c, Image: cfg.Image,
		ProxyListen: cfg.Kube.ProxyListen, ProxyAdvertise: cfg.Kube.ProxyAdvertise})
}

// newInstanceID names this server: its Lease and the label on its objects.
func newInstanceID() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return "srv-" + hex.EncodeToString(b[:])
}
