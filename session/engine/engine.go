// Package engine runs sandboxes as Docker containers: the sandbox backend
// (see package session/backend) for a Docker engine. It holds everything
// Docker: the engine calls the server makes, behind the narrow interface
// Engine; the hardened container spec (a pure function, tested field by
// field); the runtime image (a base image plus the agent); each sandbox's
// internal network with the egress proxy on its gateway and the nftables
// rules that keep it off the host; the labels on every object; and the
// sweep of what a server that is gone left behind.
//
// Package engine knows nothing of the agent's protocol, of snapshots or of
// MCP.
package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
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
	NetworkCreate(ctx context.Context, name string, options client.NetworkCreateOptions) (client.NetworkCreateResult, error)
	NetworkRemove(ctx context.Context, networkID string, options client.NetworkRemoveOptions) (client.NetworkRemoveResult, error)
	NetworkList(ctx context.Context, options client.NetworkListOptions) (client.NetworkListResult, error)
	NetworkInspect(ctx context.Context, networkID string, options client.NetworkInspectOptions) (client.NetworkInspectResult, error)
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
	// AgentBinary is the path of the static agent binary added to Image.
	AgentBinary string
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

// Docker is the Docker backend. Prepare must succeed before Start.
type Docker struct {
	cfg   Config
	cli   Engine
	log   *slog.Logger
	image string // runtime image, set by Prepare
	// toolbox is the image's toolbox manifest (LabelToolbox), set by
	// Prepare; "" if it has none.
	toolbox string
	fw      *firewall // nil without Egress
	// createGrace is DefaultCreateGrace (tests shorten it).
	createGrace time.Duration
}

var _ backend.Backend = (*Docker)(nil)

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

// Prepare builds the runtime image if needed and, with Egress, makes sure
// the firewall chain is in place.
func (d *Docker) Prepare(ctx context.Context) error {
	img, err := RuntimeImage(ctx, d.cli, d.cfg.Image, d.cfg.AgentBinary, d.cfg.Seed, d.cfg.UID, d.cfg.GID)
	if err != nil {
		return err
	}
	d.image = img
	if info, err := d.cli.ImageInspect(ctx, d.cfg.Image); err == nil && info.Config != nil {
		d.toolbox = info.Config.Labels[LabelToolbox]
	}
	if d.cfg.Egress {
		fw, err := newFirewall()
		if err != nil {
			return fmt.Errorf("--network=allowlist keeps each sandbox off every port of this host but the proxy's with nftables rules, and setting them failed (%v): run sandbox-mcp as root or with CAP_NET_ADMIN on a kernel with nftables (in a container: --network host --cap-add NET_ADMIN), or use --network=none", err)
		}
		fw.log = d.log
		d.fw = fw
	}
	return nil
}

// RuntimeImage returns the tag of the image sandboxes run (after Prepare).
func (d *Docker) RuntimeImage() string { return d.image }

// Toolbox returns the image's toolbox manifest (the LabelToolbox label of
// the image, as JSON), or "" when it has none (after Prepare).
func (d *Docker) Toolbox() string { return d.toolbox }

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
	opts := ContainerSpec(ContainerParams{
		Name:              name,
		Image:             d.image,
		Labels:            d.labels(spec.Sandbox),
		UID:               spec.UID,
		GID:               spec.GID,
		Env:               env,
		WorkspaceBytes:    l.WorkspaceBytes,
		WorkspaceReadOnly: spec.ReadOnly,
		WorkspaceInImage:  spec.ReadOnly && d.cfg.Seed != nil,
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
	c.stdin = att.Conn
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
		return errcode.Errorf(errcode.Unavailable, "cannot %s: the Docker engine is not reachable (%v); retrying will not help until it is back", what, err)
	}
	return errcode.Errorf(errcode.Unavailable, "cannot %s: %v; retrying may help if this was a passing engine fault", what, err)
}
