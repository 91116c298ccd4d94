// Package docker runs sandboxes as Docker containers: the sandbox backend
// (see package session/backend) for a Docker engine. It holds everything
// Docker: the engine calls the server makes, behind the narrow interface
// Engine; the hardened container spec (a pure function, tested field by
// field); the runtime image (a base image plus the agent); each sandbox's
// internal network with the egress proxy on its gateway and the nftables
// rules that keep it off the host; the labels on every object; and the
// sweep of what a server that is gone left behind.
//
// Package docker knows nothing of the agent's protocol, of snapshots or of
// MCP.
package docker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
)

// Engine is the part of the Docker engine API the server uses: exactly the
// calls made, with moby's signatures, so a *client.Client is one.
type Engine interface {
	ContainerCreate(ctx context.Context, options client.ContainerCreateOptions) (client.ContainerCreateResult, error)
	ContainerAttach(ctx context.Context, containerID string, options client.ContainerAttachOptions) (client.ContainerAttachResult, error)
	ContainerStart(ctx context.Context, containerID string, options client.ContainerStartOptions) (client.ContainerStartResult, error)
	ContainerRemove(ctx context.Context, containerID string, options client.ContainerRemoveOptions) (client.ContainerRemoveResult, error)
	ContainerInspect(ctx context.Context, containerID string, options client.ContainerInspectOptions) (client.ContainerInspectResult, error)
	ContainerList(ctx context.Context, options client.ContainerListOptions) (client.ContainerListResult, error)
	ImageInspect(ctx context.Context, imageID string, inspectOpts ...client.ImageInspectOption) (client.ImageInspectResult, error)
	ImageBuild(ctx context.Context, buildContext io.Reader, options client.ImageBuildOptions) (client.ImageBuildResult, error)
	ImageList(ctx context.Context, options client.ImageListOptions) (client.ImageListResult, error)
	NetworkCreate(ctx context.Context, name string, options client.NetworkCreateOptions) (client.NetworkCreateResult, error)
	NetworkRemove(ctx context.Context, networkID string, options client.NetworkRemoveOptions) (client.NetworkRemoveResult, error)
	NetworkList(ctx context.Context, options client.NetworkListOptions) (client.NetworkListResult, error)
	NetworkInspect(ctx context.Context, networkID string, options client.NetworkInspectOptions) (client.NetworkInspectResult, error)
	Ping(ctx context.Context, options client.PingOptions) (client.PingResult, error)
	DaemonHost() string
}

var _ Engine = (*client.Client)(nil)

// orphanGrace is how old a created-but-never-started container (or an
// unused network) must be before the sweep takes it for orphaned (its
// server may be setting it up).
const orphanGrace = 2 * time.Minute

// Config configures the Docker backend.
type Config struct {
	// Client is the engine. Required.
	Client Engine
	// Image is the base image of every sandbox; it must exist locally.
	Image string
	// Images are further base images, of operator templates
	// (backend.InstanceSpec.Image): Prepare checks each and gets it the
	// agent the way it does Image, without Seed.
	Images []string
	// AgentBinary is the path of the static agent binary given to every
	// sandbox (see AgentMount).
	AgentBinary string
	// AgentMount says how sandboxes get the agent: AgentMountBind,
	// AgentMountImage, or AgentMountAuto ("" too).
	AgentMount string
	// AgentDir is a directory of this host where the agent is copied, by
	// digest, for bind mounts; "" means AgentMountImage.
	AgentDir string
	// Seed, if set, is baked into the runtime image's /workspace, which
	// then gets no tmpfs: a read-only workspace that starts with content.
	Seed *Seed
	// UID and GID own the Seed's files in the image.
	UID, GID int
	// Instance names this server in labels. Required.
	Instance string
	// Runtime is the OCI runtime ("" for the engine default).
	Runtime string
	// SeccompProfile is a seccomp profile (JSON) for every sandbox in place
	// of the engine's default; "" keeps the default.
	SeccompProfile string
	// Egress says sandboxes get networks behind the egress proxy: Prepare
	// then sets up the firewall, and fails without the rights to.
	Egress bool
	// NetworkPool is where sandbox networks take /29 subnets; the zero
	// value means DefaultNetworkPool.
	NetworkPool netip.Prefix
	// Logger receives the backend's logs; nil discards them.
	Logger *slog.Logger
}

// How a sandbox gets the agent binary (Config.AgentMount).
const (
	// AgentMountAuto bind-mounts the agent where the engine runs on this
	// host (its socket is a local one, and a probe container shows that it
	// sees the file), and builds an image with it otherwise.
	AgentMountAuto = "auto"
	// AgentMountBind bind-mounts a copy of the agent, read-only, into
	// every container: nothing is built at start, whatever the agent.
	AgentMountBind = "bind"
	// AgentMountImage builds a runtime image, the base image with the
	// agent added, once per agent and base: what a remote engine needs.
	AgentMountImage = "image"
)

// pingTimeout bounds the first call to the engine.
const pingTimeout = 10 * time.Second

// Docker is the Docker backend. Prepare must succeed before Start.
type Docker struct {
	cfg Config
	cli Engine
	log *slog.Logger
	// mu guards what Prepare sets, which a Prepare tried again after a
	// failure may set again.
	mu     sync.Mutex
	image  string            // runtime image, set by Prepare
	images map[string]string // runtime image of each of Config.Images, set by Prepare
	// missing holds the template images (of Config.Images) Prepare did
	// not find on the engine: their templates' starts look again, and
	// prepare the image once it is there (tplMu serializes that).
	missing    map[string]bool
	plan       imagePlan // the default's plan, for a template image prepared late
	tplMu      sync.Mutex
	agentMount string    // host path of the agent bind-mounted into sandboxes; "" when the image holds it
	fw         *firewall // nil without Egress
	// kept are the ids of the containers and networks Detach let go of.
	kept map[string]bool
	// createGrace is DefaultCreateGrace (tests shorten it).
	createGrace time.Duration
}

var (
	_ backend.Backend    = (*Docker)(nil)
	_ backend.Reattacher = (*Docker)(nil)
	_ backend.Detacher   = (*sandboxContainer)(nil)
)

// New checks cfg and returns the backend. It calls no engine.
func New(cfg Config) (*Docker, error) {
	if cfg.Client == nil {
		return nil, errors.New("engine: Config.Client is required")
	}
	if cfg.Instance == "" {
		return nil, errors.New("engine: Config.Instance is required")
	}
	if !cfg.NetworkPool.IsValid() {
		cfg.NetworkPool = DefaultNetworkPool
	}
	if !cfg.NetworkPool.Addr().Is4() || cfg.NetworkPool.Bits() > 29 {
		return nil, fmt.Errorf("session: network pool %s must be an IPv4 prefix of /29 or larger", cfg.NetworkPool)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Docker{cfg: cfg, cli: cfg.Client, log: log, createGrace: DefaultCreateGrace}, nil
}

// Prepare connects to the engine, checks the base image, gives sandboxes
// the agent (a read-only bind mount of a copy of it, or a runtime image
// with it, see AgentMount), builds a read-only workspace's seed image, and,
// with Egress, makes sure the firewall chain is in place. It tells step
// what it is doing and why.
func (d *Docker) Prepare(ctx context.Context, step func(backend.Step)) error {
	step(backend.Step{What: "connecting to the Docker engine at " + d.cli.DaemonHost()})
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	_, err := d.cli.Ping(pctx, client.PingOptions{NegotiateAPIVersion: true})
	cancel()
	if err != nil {
		return fmt.Errorf("the Docker engine is not reachable (%v): start it, or set DOCKER_HOST; `sandbox-mcp doctor` checks the setup", err)
	}
	step(backend.Step{What: "checking the image " + d.cfg.Image})
	info, err := inspectBase(ctx, d.cli, d.cfg.Image)
	if err != nil {
		return err
	}
	agent, err := readAgent(d.cfg.AgentBinary)
	if err != nil {
		return err
	}
	plan := imagePlan{base: d.cfg.Image, baseID: info.ID, agent: agent, seed: d.cfg.Seed, uid: d.cfg.UID, gid: d.cfg.GID}
	mountPath := ""
	if how := d.agentMode(); how != AgentMountImage {
		step(backend.Step{What: "installing the agent for bind mounts in " + d.cfg.AgentDir})
		mountPath, err = installAgent(d.cfg.AgentDir, agent)
		if err == nil {
			step(backend.Step{What: "checking that the engine can bind-mount the agent"})
			err = d.probeMount(ctx, info.ID, mountPath)
		}
		switch {
		case err != nil && how == AgentMountBind:
			return fmt.Errorf("--agent-mount=bind: %w", err)
		case err != nil:
			d.log.Warn("the engine cannot bind-mount the agent from this host: building an image with it instead", "err", err)
			mountPath = ""
		default:
			plan.noAgent = true
		}
	}
	img, err := runtimeImage(ctx, d.cli, plan, step)
	if err != nil {
		return err
	}
	images, missing := map[string]string{}, map[string]bool{}
	for _, base := range d.cfg.Images {
		if _, done := images[base]; done || missing[base] {
			continue
		}
		step(backend.Step{What: "checking the template image " + base})
		// A template whose image is not there yet does not hold the
		// others back: its own starts fail, saying so, until it is.
		img, err := d.templateImage(ctx, plan, base, step)
		switch {
		case errors.As(err, new(*backend.ImageMissingError)):
			missing[base] = true // the session says so (MissingImages)
		case err != nil:
			return fmt.Errorf("a sandbox template's image: %w", err)
		default:
			images[base] = img
		}
	}
	if d.cfg.Egress {
		step(backend.Step{What: "setting up the firewall chain for --network=allowlist"})
		if _, err := d.egressFirewall(); err != nil {
			return fmt.Errorf("--network=allowlist keeps each sandbox off every port of this host but the proxy's with nftables rules, and setting them failed (%v): run sandbox-mcp as root or with CAP_NET_ADMIN on a kernel with nftables (in a container: --network host --cap-add NET_ADMIN), or use --network=none", err)
		}
	}
	d.mu.Lock()
	d.image, d.agentMount, d.images, d.missing, d.plan = img, mountPath, images, missing, imagePlan{}
	if len(missing) > 0 {
		d.plan = plan // the agent's bytes, kept only while an image may come late
	}
	d.mu.Unlock()
	return nil
}

// templateImage checks a template's base image and gives it the agent as
// plan gives the default's (without its seed). An image the engine does
// not have is a *backend.ImageMissingError.
func (d *Docker) templateImage(ctx context.Context, plan imagePlan, base string, step func(backend.Step)) (string, error) {
	bi, err := d.cli.ImageInspect(ctx, base)
	if cerrdefs.IsNotFound(err) {
		return "", &backend.ImageMissingError{Image: base, Where: "on this Docker engine, and the server pulls nothing"}
	}
	if err != nil {
		return "", fmt.Errorf("inspect image %q: %w", base, err)
	}
	tplan := imagePlan{base: base, baseID: bi.ID, agent: plan.agent, noAgent: plan.noAgent, uid: d.cfg.UID, gid: d.cfg.GID}
	return runtimeImage(ctx, d.cli, tplan, step)
}

// MissingImages returns the template images (of Config.Images) that are
// not on the engine yet, sorted: their templates' sandboxes cannot start
// until the operator builds or loads them.
func (d *Docker) MissingImages() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]string, 0, len(d.missing))
	for img := range d.missing {
		out = append(out, img)
	}
	sort.Strings(out)
	return out
}

// ImageReady checks that a template's base image is ready for a start:
// prepared, or there now and prepared by this call. A missing one is a
// *backend.ImageMissingError (wrapped).
func (d *Docker) ImageReady(ctx context.Context, base string) error {
	_, _, err := d.imageFor(ctx, base)
	return err
}

// imageFor returns the runtime image of a start's base image ("" for the
// default's) and the agent's bind-mount path. A template image Prepare did
// not find is looked for again, and prepared once it is there: the
// operator may build it while the server runs.
func (d *Docker) imageFor(ctx context.Context, base string) (img, agentMount string, err error) {
	d.mu.Lock()
	img, agentMount = d.image, d.agentMount
	missing, plan := d.missing[base], d.plan
	if base != "" {
		img = d.images[base]
	}
	d.mu.Unlock()
	switch {
	case img != "":
		return img, agentMount, nil
	case !missing:
		return "", "", errcode.Errorf(errcode.Unavailable, "cannot start the sandbox: its template's image %s was not prepared (the server's Docker backend lacks it in Config.Images)", base)
	}
	d.tplMu.Lock()
	defer d.tplMu.Unlock()
	d.mu.Lock()
	img = d.images[base]
	d.mu.Unlock()
	if img != "" {
		return img, agentMount, nil // another start prepared it meanwhile
	}
	img, err = d.templateImage(ctx, plan, base, func(s backend.Step) {
		d.log.Info("preparing a template's image", "image", base, "step", s.What)
	})
	if errors.As(err, new(*backend.ImageMissingError)) {
		return "", "", errcode.Errorf(errcode.Unavailable, "cannot start the sandbox: %w", err)
	}
	if err != nil {
		return "", "", engineError("prepare the template image "+base, err)
	}
	d.mu.Lock()
	d.images[base] = img
	delete(d.missing, base)
	d.mu.Unlock()
	d.log.Info("a sandbox template's image is there now", "image", base, "runtime_image", img)
	return img, agentMount, nil
}

// agentMode resolves AgentMountAuto: a bind mount where the engine is on
// this host, by its socket (a probe then checks it sees the file).
func (d *Docker) agentMode() string {
	switch {
	case d.cfg.AgentDir == "":
		return AgentMountImage
	case d.cfg.AgentMount == AgentMountBind, d.cfg.AgentMount == AgentMountImage:
		return d.cfg.AgentMount
	case LocalEngine(d.cli.DaemonHost()):
		return AgentMountAuto
	}
	return AgentMountImage
}

// LocalEngine reports whether an engine at host (DOCKER_HOST's form) runs
// on this machine: a Unix socket or a Windows named pipe. A TCP or SSH
// engine runs elsewhere, and cannot see this host's files.
func LocalEngine(host string) bool {
	return strings.HasPrefix(host, "unix://") || strings.HasPrefix(host, "npipe://")
}

// installAgent copies the agent into dir under its digest, read-only, once
// per agent, and returns the copy's path: the file bind-mounted into the
// sandboxes never changes under them, whatever is rebuilt at the agent's
// own path meanwhile.
//
// Copies no server used for AgentKeep are removed (a server marks its copy
// used at its start and at each sandbox's), so the directory holds the
// agents of the last weeks, not of every build ever made.
func installAgent(dir string, agent agentBinary) (string, error) {
	sub := filepath.Join(dir, agent.digest[:32])
	path := filepath.Join(sub, "sandbox-agent")
	defer pruneAgents(dir, sub)
	if data, err := os.ReadFile(path); err == nil {
		if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) == agent.digest {
			touch(path)
			return path, nil
		}
		os.Remove(path) // a torn copy: made again below
	}
	if err := os.MkdirAll(sub, 0o755); err != nil {
		return "", fmt.Errorf("install the agent for bind mounts: %w", err)
	}
	f, err := os.CreateTemp(sub, ".agent-*")
	if err != nil {
		return "", fmt.Errorf("install the agent for bind mounts: %w", err)
	}
	_, err = f.Write(agent.data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o555)
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("install the agent for bind mounts: %w", err)
	}
	return path, nil
}

// AgentKeep is how long a copy of the agent for bind mounts is kept after
// a server last used it.
const AgentKeep = 30 * 24 * time.Hour

// touch marks a copy of the agent used now.
func touch(path string) {
	now := time.Now()
	_ = os.Chtimes(path, now, now)
}

// pruneAgents removes the copies of the agent in dir, but keep, that no
// server used for AgentKeep.
func pruneAgents(dir, keep string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		sub := filepath.Join(dir, e.Name())
		if !e.IsDir() || sub == keep {
			continue
		}
		st, err := os.Stat(filepath.Join(sub, "sandbox-agent"))
		if err != nil {
			// Another server may be installing it: judge by the
			// directory's own time.
			st, err = e.Info()
		}
		if err != nil || time.Since(st.ModTime()) < AgentKeep {
			continue
		}
		os.RemoveAll(sub)
	}
}

// probeMount creates (and removes, never starting it) a container that
// bind-mounts the agent at path: the engine checks the source exists on
// its side when it creates one, so an engine that does not share this
// host's files (one in a VM, or the server in a container of its own) says
// so here rather than at a sandbox's start.
func (d *Docker) probeMount(ctx context.Context, image, path string) error {
	l := d.labels("agent-probe")
	cctx, stop := d.creating(ctx)
	created, err := d.cli.ContainerCreate(cctx, client.ContainerCreateOptions{
		Config: &container.Config{Image: image, Entrypoint: []string{AgentPath}, Labels: l},
		HostConfig: &container.HostConfig{
			NetworkMode: "none",
			LogConfig:   container.LogConfig{Type: "none"},
			Mounts:      agentMounts(path),
		},
	})
	stop()
	if err != nil {
		return fmt.Errorf("a container bind-mounting %s could not be created: %w", path, err)
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := removeContainer(rctx, d.cli, created.ID); err != nil {
		d.log.Warn("remove the agent probe container", "container", created.ID, "err", err)
	}
	return nil
}

var (
	_ backend.Image        = (*Docker)(nil)
	_ backend.ReadOnlySeed = (*Docker)(nil)
	_ backend.Leftovers    = (*Docker)(nil)
)

// SeedReadOnly bakes a read-only workspace's content into the runtime
// image (Config.Seed); call it before Prepare.
func (d *Docker) SeedReadOnly(digest string, tar func() io.Reader) {
	d.cfg.Seed = &Seed{Digest: digest, Tar: tar}
}

// RuntimeImage returns the tag of the image sandboxes run (after Prepare).
func (d *Docker) RuntimeImage() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.image
}

// AgentMountPath returns the host path of the agent bind-mounted into the
// sandboxes, or "" when the runtime image holds it (after Prepare).
func (d *Docker) AgentMountPath() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.agentMount
}

// Toolbox reads the image's toolbox manifest (the LabelToolbox label of
// --image) with one inspect cut at 2 s, apart from Prepare, so that the
// server's instructions can say what the image has before its sandboxes are
// prepared; "" when the image has none or the engine does not answer in time.
func (d *Docker) Toolbox(ctx context.Context) string {
	return d.ImageToolbox(ctx, d.cfg.Image)
}

// ImageToolbox is Toolbox for another image (a template's).
func (d *Docker) ImageToolbox(ctx context.Context, image string) string {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	info, err := d.cli.ImageInspect(ctx, image)
	if err != nil || info.Config == nil {
		return ""
	}
	return info.Config.Labels[LabelToolbox]
}

// Instance returns the server instance id used in labels.
func (d *Docker) Instance() string { return d.cfg.Instance }

// labels returns the labels of a sandbox's engine objects.
func (d *Docker) labels(sandbox string) map[string]string {
	l := ownerLabels()
	l[LabelManaged] = "1"
	l[LabelInstance] = d.cfg.Instance
	l[LabelSandbox] = sandbox
	l[LabelCreated] = time.Now().UTC().Format(time.RFC3339)
	return l
}

// sandboxContainer is one sandbox container: a backend.Instance.
type sandboxContainer struct {
	d      *Docker
	id     string
	name   string
	net    *sandboxNet // nil with no network
	stdout io.Reader
	stdin  io.WriteCloser
	stderr *lineLogger
	// createCut is set when the create call was cut before the engine
	// answered (see DefaultCreateGrace): the container may exist all the
	// same.
	createCut bool

	removeOnce sync.Once
	removeErr  error
}

func (c *sandboxContainer) Name() string          { return c.name }
func (c *sandboxContainer) Stdout() io.Reader     { return c.stdout }
func (c *sandboxContainer) Stdin() io.WriteCloser { return c.stdin }
func (c *sandboxContainer) StderrTail() string    { return c.stderr.tail() }

// Remove force-removes the container, waits until the engine has let go of
// it, then closes its network.
func (c *sandboxContainer) Remove(ctx context.Context) error {
	c.removeOnce.Do(func() {
		if c.stdin != nil {
			c.stdin.Close()
		}
		// A create whose answer never came (see DefaultCreateGrace) may
		// still have made the container: its name finds it.
		id := c.id
		if id == "" && c.createCut {
			id = c.name
		}
		if id != "" {
			if err := removeContainer(ctx, c.d.cli, id); err != nil {
				c.removeErr = err
				c.d.log.Warn("remove container", "container", id, "err", err)
			}
		}
		if c.net != nil {
			c.d.closeNet(c.net)
		}
	})
	return c.removeErr
}

// egressFirewall returns the firewall of --network=allowlist, setting it
// up on first use: in Prepare, or earlier for a sandbox taken over at the
// start (Reattach runs beside Prepare), whose rules it keeps from then on.
func (d *Docker) egressFirewall() (*firewall, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fw != nil || !d.cfg.Egress {
		return d.fw, nil
	}
	fw, err := newFirewall()
	if err != nil {
		return nil, err
	}
	fw.log = d.log
	d.fw = fw
	return fw, nil
}

// Detach lets go of the container without ending it (backend.Detacher):
// the attach closes as a killed server's would, so the agent lives on its
// lease for the next server on the state directory. The container's
// network and its firewall rules stay (they guard the container while it
// runs); this server's proxy listener for it stops. Remove does nothing
// afterwards, and RemoveLeftovers passes the container and its network by.
func (c *sandboxContainer) Detach() {
	c.removeOnce.Do(func() {
		c.d.keep(c.id, c.net)
		if sc, ok := c.stdin.(*stdinCloser); ok {
			sc.once.Do(func() {}) // closing it no longer removes the container
			sc.WriteCloser.Close()
		} else if c.stdin != nil {
			c.stdin.Close()
		}
		if n := c.net; n != nil {
			if n.stop != nil {
				n.stop()
				<-n.served
			}
			if n.revoke != nil {
				n.revoke()
			}
			if n.firewalled {
				c.d.fw.forget(n.name)
			}
		}
		c.d.log.Info("container left running for the next server", "container", c.name)
	})
}

// keep notes a container (and its network) let go of by Detach, which
// RemoveLeftovers must not take for left over.
func (d *Docker) keep(id string, n *sandboxNet) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.kept == nil {
		d.kept = map[string]bool{}
	}
	if id != "" {
		d.kept[id] = true
	}
	if n != nil && n.id != "" {
		d.kept[n.id] = true
	}
}

// isKept reports whether Detach let go of the engine object with this id.
func (d *Docker) isKept(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.kept[id]
}

// DefaultCreateGrace is how long a call that creates an engine object (a
// network, a container) may go on after the start that made it was
// abandoned. Such a call is not cut when its start is: the engine may
// finish a create whose client stopped listening, and the object would
// then be on the engine under an id nobody learned. Letting the call
// answer (it takes milliseconds, seconds on a loaded engine) gives the
// start the id, and the start removes the object. Only an engine that does
// not answer for this long after the start's end has the call cut; the
// object is then sought by name, and Close (and the sweeps of other
// servers) find by label what the engine makes later still.
const DefaultCreateGrace = 30 * time.Second

// creating returns the context of an engine call that creates an object
// for a start whose context is ctx: ctx's values apply, but not its
// deadline, and its end cuts the call only createGrace later. stop
// releases it.
func (d *Docker) creating(ctx context.Context) (cctx context.Context, stop func()) {
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	grace := d.createGrace
	after := context.AfterFunc(ctx, func() {
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-cctx.Done():
		}
	})
	return cctx, func() {
		after()
		cancel()
	}
}

// abandoned is the error of a start whose context ended after one of its
// steps: what that step made is removed.
func abandoned(ctx context.Context, step string) error {
	return engineError(step, context.Cause(ctx))
}

// Start creates the network (with a proxy), creates, attaches and starts
// the container, and returns it with its stream demultiplexed. On failure,
// and when ctx ends at any point, nothing is left behind: every object is
// owned from the moment the request that creates it is sent (see
// DefaultCreateGrace), and removed before Start returns.
func (d *Docker) Start(ctx context.Context, spec backend.InstanceSpec) (_ backend.Instance, err error) {
	name := fmt.Sprintf("sandbox-mcp-%s-%d", spec.Sandbox, spec.Generation)
	c := &sandboxContainer{d: d, name: name}
	defer func() {
		if err != nil {
			rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c.Remove(rctx)
		}
	}()
	if ctx.Err() != nil {
		return nil, abandoned(ctx, "start the sandbox")
	}
	img, agentMount, err := d.imageFor(ctx, spec.Image)
	if err != nil {
		return nil, err
	}
	env := append([]string(nil), spec.Env...)
	netName, dns, addr := "none", []netip.Addr(nil), netip.Addr{}
	if spec.Proxy != nil {
		n, err := d.openNet(ctx, spec.Sandbox, name, spec.Proxy)
		c.net = n // closed by Remove whatever openNet made of it
		if err != nil {
			return nil, err
		}
		env = append(env, n.env()...)
		netName, dns, addr = n.name, []netip.Addr{n.gateway}, n.client
	}
	l := spec.Limits
	if agentMount != "" {
		touch(agentMount) // in use: not pruned by another server's start
	}
	opts := ContainerSpec(ContainerParams{
		Name:              name,
		Image:             img,
		AgentMount:        agentMount,
		Labels:            d.labels(spec.Sandbox),
		UID:               spec.UID,
		GID:               spec.GID,
		Env:               env,
		WorkspaceBytes:    l.WorkspaceBytes,
		WorkspaceReadOnly: spec.ReadOnly,
		WorkspaceInImage:  spec.ReadOnly && d.cfg.Seed != nil && spec.Image == "",
		TmpBytes:          l.TmpBytes,
		Memory:            l.Memory,
		NanoCPUs:          l.NanoCPUs,
		Pids:              l.Pids,
		NoFile:            l.NoFile,
		Network:           netName,
		NetworkAddr:       addr,
		DNS:               dns,
		Runtime:           d.cfg.Runtime,
		SeccompProfile:    d.cfg.SeccompProfile,
	})
	if ctx.Err() != nil {
		return nil, abandoned(ctx, "create the sandbox container")
	}
	cctx, stop := d.creating(ctx)
	created, err := d.cli.ContainerCreate(cctx, opts)
	c.createCut = err != nil && cctx.Err() != nil
	stop()
	if err != nil {
		return nil, engineError("create the sandbox container", err)
	}
	c.id = created.ID
	if ctx.Err() != nil {
		return nil, abandoned(ctx, "create the sandbox container")
	}
	// The calls below may be cut: the container's id is known.
	att, err := d.cli.ContainerAttach(ctx, created.ID, client.ContainerAttachOptions{Stream: true, Stdin: true, Stdout: true, Stderr: true})
	if err != nil {
		return nil, engineError("attach to the sandbox container", err)
	}
	c.stdin = d.attachStdin(att.Conn, created.ID)
	if _, err := d.cli.ContainerStart(ctx, created.ID, client.ContainerStartOptions{}); err != nil {
		return nil, engineError("start the sandbox container", err)
	}
	log := d.log.With("sandbox", spec.Sandbox, "container", created.ID[:12])
	c.stdout, c.stderr = demuxAttach(att.Reader, log)
	return c, nil
}

// removeContainer force-removes a container and waits until it is gone.
func removeContainer(ctx context.Context, cli Engine, id string) error {
	_, err := cli.ContainerRemove(ctx, id, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
	// A conflict means a removal is already in progress (the engine
	// auto-removes a stopped sandbox); wait for it like for ours.
	if err != nil && !cerrdefs.IsNotFound(err) && !cerrdefs.IsConflict(err) {
		return err
	}
	// An auto-removing container may still be on its way out.
	for {
		if _, err := cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{}); err != nil {
			if cerrdefs.IsNotFound(err) {
				return nil
			}
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// engineError reports an engine failure as UNAVAILABLE, saying whether retrying
// helps.
func engineError(what string, err error) error {
	if client.IsErrConnectionFailed(err) {
		return errcode.Errorf(errcode.Unavailable, "cannot %s: the Docker engine is not reachable (%w); retrying will not help until it is back", what, err)
	}
	return errcode.Errorf(errcode.Unavailable, "cannot %s: %w; retrying may help if this was a passing engine fault", what, err)
}
