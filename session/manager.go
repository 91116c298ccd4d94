// Package session runs one sandbox per MCP session: it creates the hardened
// container at a session's first call, talks to the agent inside it over one
// attach stream, and removes it when the session ends. It also sweeps what an
// earlier server left behind and keeps snapshots in the state directory.
//
// Package session knows Docker and the agent protocol; it does not know MCP.
// Callers key sandboxes by an opaque string of their own.
package session

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/netproxy"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// Defaults for Options' zero values.
const (
	DefaultLease        = 60 * time.Second
	DefaultStartTimeout = 60 * time.Second
	DefaultUID          = 1000
	DefaultTmpBytes     = 64 << 20
	DefaultNoFile       = 4096
	// orphanGrace is how old a created-but-never-started container must be
	// before the sweep takes it for orphaned (its server may be starting it).
	orphanGrace = 2 * time.Minute
	// removalWait is how long a new sandbox waits for the removal of an
	// ended session's container when the cap is reached.
	removalWait = 30 * time.Second
)

// Options configure a Manager.
type Options struct {
	// Client is the engine client. Required.
	Client *client.Client
	// Image is the base image of every sandbox; it must exist locally.
	Image string
	// AgentBinary is the path of the static agent binary added to Image.
	AgentBinary string
	// Policy gives the limits, the read-only flag and the allowlist.
	Policy policy.Policy
	// Env is the NAME=VALUE list every sandbox gets (the operator's --env).
	Env []string
	// StateDir holds snapshots and the server's records. Required.
	StateDir string
	// Retention bounds the snapshots kept in StateDir. Its
	// MaxSnapshotBytes is set from Policy (the workspace's stream limit).
	Retention Retention
	// Warm is the number of containers kept started ahead of need, so a
	// new session's first call does not wait for one (0: none).
	Warm int
	// WorkspaceFrom is a host directory every new workspace starts with a
	// copy of ("" for an empty workspace). It is read once, at start,
	// capped at the workspace size, without following symlinks, refusing a
	// file hard-linked from outside it.
	WorkspaceFrom string
	// Instance names this server in labels; "" picks a random one.
	Instance string
	// Runtime is the OCI runtime ("" for the engine default).
	Runtime string
	// SeccompProfile is a seccomp profile (JSON) for every sandbox in place
	// of the engine's default; "" keeps the default.
	SeccompProfile string
	// Lease is how long an agent lives without hearing from the server; 0
	// means DefaultLease.
	Lease time.Duration
	// StartTimeout bounds the start of a container; 0 means
	// DefaultStartTimeout.
	StartTimeout time.Duration
	// IdleTimeout removes the container of a sandbox unused this long; 0
	// means never.
	IdleTimeout time.Duration
	// UID and GID are the sandbox user; 0 means DefaultUID.
	UID, GID int
	// TmpBytes is the size of /tmp; 0 means DefaultTmpBytes.
	TmpBytes int64
	// MaxSandboxes caps the sandboxes alive at once; a new session's
	// sandbox beyond it gets BUSY. 0 means no cap.
	MaxSandboxes int

	// With Policy.Network = allowlist, each sandbox gets its own internal
	// network whose only way out is the egress proxy on its gateway. The
	// fields below configure that.

	// NetworkPool is where sandbox networks take /29 subnets; the zero
	// value means DefaultNetworkPool.
	NetworkPool netip.Prefix
	// Resolver and Dialer replace the proxy's defaults (tests use them).
	Resolver netproxy.Resolver
	Dialer   netproxy.Dialer
	// DenyAddrs are addresses no tunnel may reach, such as the MCP HTTP
	// listener (port 0: every port).
	DenyAddrs []netip.AddrPort
	// OnProxyDecision, if set, sees every proxy decision (for the audit
	// log); it must be quick and safe for concurrent use.
	OnProxyDecision func(netproxy.Decision)
	// Secrets go into requests to their hosts at the proxy; each sandbox
	// gets placeholders and trusts the proxy's CA (see netproxy.Secret).
	// They need Policy.Network allowlist.
	Secrets []netproxy.Secret
	// OnSecretUse, if set, sees each use of a secret (for the audit log).
	OnSecretUse func(netproxy.SecretUse)
	// Logger receives the manager's logs; nil discards them.
	Logger *slog.Logger
}

// Manager owns every sandbox of one server.
type Manager struct {
	opts  Options
	cli   *client.Client
	log   *slog.Logger
	image string // runtime image
	snaps *SnapshotStore
	seed  *seed // nil without --workspace-from
	pool  *pool
	proxy *netproxy.Proxy // nil unless the policy allows some hosts
	fw    *firewall

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // background work: removals, reaper, pings
	// removals counts ReleaseSoon's removals still under way; Add happens
	// under mu while the manager is open, so Close can wait for them.
	removals sync.WaitGroup
	// removing counts those removals; removed is closed (and replaced)
	// whenever one ends, for a new sandbox waiting for room. Both under mu.
	removing int
	removed  chan struct{}

	mu     sync.Mutex
	byKey  map[string]*Sandbox
	byID   map[string]*Sandbox
	closed bool
}

// NewManager checks the engine and the image, builds the runtime image if
// needed, sweeps what earlier servers left behind, and returns a Manager.
func NewManager(ctx context.Context, opts Options) (*Manager, error) {
	if opts.Client == nil {
		return nil, errors.New("session: Options.Client is required")
	}
	if opts.StateDir == "" {
		return nil, errors.New("session: Options.StateDir is required")
	}
	if err := opts.Policy.Validate(); err != nil {
		return nil, err
	}
	if opts.Instance == "" {
		opts.Instance = randomID("srv-")
	}
	if opts.Lease <= 0 {
		opts.Lease = DefaultLease
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = DefaultStartTimeout
	}
	if opts.UID == 0 {
		opts.UID, opts.GID = DefaultUID, DefaultUID
	}
	if opts.TmpBytes == 0 {
		opts.TmpBytes = DefaultTmpBytes
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	opts.Retention.MaxSnapshotBytes = snapshotLimits(opts.Policy).MaxBytes
	snaps, err := OpenSnapshotStore(filepath.Join(opts.StateDir, "snapshots"), opts.Retention)
	if err != nil {
		return nil, err
	}
	var sd *seed
	if opts.WorkspaceFrom != "" {
		if sd, err = newSeed(opts.WorkspaceFrom, opts.Policy.MaxWorkspaceBytes); err != nil {
			return nil, err
		}
	}
	// A read-only workspace cannot be filled after the start: its content
	// goes into the image instead.
	var imageSeed *seed
	if opts.Policy.ReadOnly {
		imageSeed = sd
	}
	img, err := RuntimeImage(ctx, opts.Client, opts.Image, opts.AgentBinary, imageSeed, opts.UID, opts.GID)
	if err != nil {
		if sd != nil {
			sd.close()
		}
		return nil, err
	}
	if !opts.NetworkPool.IsValid() {
		opts.NetworkPool = DefaultNetworkPool
	}
	if !opts.NetworkPool.Addr().Is4() || opts.NetworkPool.Bits() > 29 {
		return nil, fmt.Errorf("session: network pool %s must be an IPv4 prefix of /29 or larger", opts.NetworkPool)
	}
	var proxy *netproxy.Proxy
	var fw *firewall
	if len(opts.Secrets) > 0 && opts.Policy.Network != policy.NetworkAllowlist {
		return nil, errors.New("session: secrets are put into requests by the egress proxy, which only --network=allowlist has")
	}
	if opts.Policy.Network == policy.NetworkAllowlist {
		allow, err := netproxy.ParseAllowlist(opts.Policy.AllowHosts)
		if err != nil {
			return nil, err
		}
		proxy, err = netproxy.New(netproxy.Config{
			Allow:        allow,
			AllowPrivate: opts.Policy.AllowPrivateNetworks,
			Resolver:     opts.Resolver,
			Dialer:       opts.Dialer,
			Logger:       log,
			OnDecision:   opts.OnProxyDecision,
			DenyAddrs:    opts.DenyAddrs,
			Secrets:      opts.Secrets,
			OnSecretUse:  opts.OnSecretUse,
		})
		if err != nil {
			return nil, err
		}
		if fw, err = newFirewall(); err != nil {
			return nil, fmt.Errorf("--network=allowlist keeps each sandbox off every port of this host but the proxy's with iptables rules, and setting them failed (%v): run sandbox-mcp as root or with CAP_NET_ADMIN, with iptables installed (in a container: --network host --cap-add NET_ADMIN), or use --network=none", err)
		}
	}
	mctx, cancel := context.WithCancel(context.Background())
	m := &Manager{
		opts:    opts,
		cli:     opts.Client,
		log:     log.With("instance", opts.Instance),
		image:   img,
		snaps:   snaps,
		seed:    sd,
		pool:    newPool(opts.Warm),
		proxy:   proxy,
		fw:      fw,
		ctx:     mctx,
		cancel:  cancel,
		removed: make(chan struct{}),
		byKey:   make(map[string]*Sandbox),
		byID:    make(map[string]*Sandbox),
	}
	if _, err := m.Sweep(ctx); err != nil {
		m.log.Warn("session: sweep of leftovers failed", "err", err)
	}
	if _, err := m.sweepNetworks(ctx); err != nil {
		m.log.Warn("session: sweep of leftover networks failed", "err", err)
	}
	if opts.IdleTimeout > 0 {
		m.wg.Add(1)
		go m.reapLoop()
	}
	if opts.Warm > 0 {
		m.wg.Add(1)
		go m.fillLoop()
	}
	m.log.Info("session: ready", "image", opts.Image, "runtime_image", img)
	return m, nil
}

// Instance returns the server instance id used in labels.
func (m *Manager) Instance() string { return m.opts.Instance }

// RuntimeImage returns the tag of the image sandboxes run.
func (m *Manager) RuntimeImage() string { return m.image }

// Snapshots returns the snapshot store.
func (m *Manager) Snapshots() *SnapshotStore { return m.snaps }

// Sandbox returns the sandbox for key, making a record for it on first use.
// The container starts at the sandbox's first call. owner is the caller the
// sandbox belongs to ("" on stdio).
func (m *Manager) Sandbox(key, owner string) (*Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, errcode.Errorf(errcode.Unavailable, "the server is shutting down")
	}
	if s := m.byKey[key]; s != nil {
		return s, nil
	}
	// A sandbox whose session ended still counts until its container is
	// gone; wait a little for such removals rather than refuse.
	for wait := time.NewTimer(removalWait); ; {
		max := m.opts.MaxSandboxes
		if max <= 0 || len(m.byID) < max {
			wait.Stop()
			break
		}
		if m.removing == 0 {
			wait.Stop()
			return nil, errcode.Errorf(errcode.Busy, "this server already runs %d sandboxes, its limit (--max-sessions); try again when a session ends", max)
		}
		removed := m.removed
		m.mu.Unlock()
		select {
		case <-removed:
		case <-wait.C:
			m.mu.Lock()
			return nil, errcode.Errorf(errcode.Busy, "this server already runs %d sandboxes, its limit (--max-sessions), and the ones being removed took longer than %s; try again shortly", max, removalWait)
		}
		m.mu.Lock()
		if m.closed {
			wait.Stop()
			return nil, errcode.Errorf(errcode.Unavailable, "the server is shutting down")
		}
		if s := m.byKey[key]; s != nil {
			wait.Stop()
			return s, nil
		}
	}
	ctx, cancel := context.WithCancel(m.ctx)
	s := &Sandbox{
		m:      m,
		id:     randomID("sb-"),
		owner:  owner,
		ctx:    ctx,
		cancel: cancel,
		execs:  make(chan struct{}, m.opts.Policy.MaxExecs),
	}
	if w, ok := m.takeWarm(); ok {
		s.id, s.cur, s.gen = w.id, w.inst, 1
		m.log.Info("session: sandbox taken from the warm pool", "sandbox", s.id)
	}
	s.lastUsed.Store(time.Now().UnixNano())
	m.byKey[key] = s
	m.byID[s.id] = s
	return s, nil
}

// Lookup finds a sandbox by id for owner. Another owner's sandbox is not
// found.
func (m *Manager) Lookup(id, owner string) (*Sandbox, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.byID[id]
	if s == nil || s.owner != owner {
		return nil, false
	}
	return s, true
}

// Count returns the number of sandboxes.
func (m *Manager) Count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.byKey)
}

// Release removes the sandbox for key: its calls end and its container is
// removed before Release returns.
func (m *Manager) Release(key string) {
	if s, _ := m.detach(key, false); s != nil {
		m.remove(s)
	}
}

// ReleaseSoon ends the calls of the sandbox for key at once and removes its
// container in the background, so an HTTP DELETE is answered without
// waiting for the engine; Close waits for such removals. It reports whether
// there was a sandbox.
func (m *Manager) ReleaseSoon(key string) bool {
	s, later := m.detach(key, true)
	if s == nil {
		return false
	}
	if !later { // the server is closing: Close removes it
		m.remove(s)
		return true
	}
	s.cancel() // end its calls now
	go func() {
		defer m.removals.Done()
		m.remove(s)
		m.removedSoon()
	}()
	return true
}

// detach takes the sandbox for key out of the registry of keys. With soon,
// and unless the manager is closing, it also counts a removal in the
// background, under the same lock that Close takes before it waits for them.
func (m *Manager) detach(key string, soon bool) (s *Sandbox, later bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s = m.byKey[key]
	delete(m.byKey, key)
	if s != nil && soon && !m.closed {
		m.removals.Add(1)
		m.removing++
		later = true
	}
	return s, later
}

// remove closes a detached sandbox and forgets it.
func (m *Manager) remove(s *Sandbox) {
	s.close()
	m.mu.Lock()
	delete(m.byID, s.id)
	m.mu.Unlock()
	m.pool.poke() // room for another warm container
}

// removedSoon notes the end of one of ReleaseSoon's removals.
func (m *Manager) removedSoon() {
	m.mu.Lock()
	m.removing--
	close(m.removed)
	m.removed = make(chan struct{})
	m.mu.Unlock()
}

// Close removes every sandbox (waiting for removals already under way) and
// stops background work.
func (m *Manager) Close(ctx context.Context) error {
	m.mu.Lock()
	m.closed = true
	all := make([]*Sandbox, 0, len(m.byID))
	for _, s := range m.byID {
		all = append(all, s)
	}
	clear(m.byKey)
	m.mu.Unlock()
	done := make(chan struct{})
	go func() {
		var wg sync.WaitGroup
		for _, s := range all {
			wg.Go(s.close)
		}
		wg.Go(m.drainPool)
		wg.Wait()
		m.removals.Wait()
		m.cancel()
		m.wg.Wait()
		if m.seed != nil {
			m.seed.close()
		}
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// labels returns the labels of a sandbox's engine objects.
func (m *Manager) labels(sandbox string) map[string]string {
	l := ownerLabels()
	l[LabelManaged] = "1"
	l[LabelInstance] = m.opts.Instance
	l[LabelSandbox] = sandbox
	l[LabelCreated] = time.Now().UTC().Format(time.RFC3339)
	return l
}

// startInstance creates, attaches and starts container number gen of the
// sandbox with the given id and waits for its agent. On failure nothing is
// left behind.
func (m *Manager) startInstance(ctx context.Context, sandbox string, gen int) (inst *instance, err error) {
	caller := ctx
	ctx, cancel := context.WithTimeout(ctx, m.opts.StartTimeout)
	defer cancel()
	name := fmt.Sprintf("sandbox-mcp-%s-%d", sandbox, gen)
	p := m.opts.Policy
	inst = &instance{name: name, quiet: make(chan struct{})}
	defer func() {
		if err != nil {
			m.removeInstance(inst)
			// A call that ended while its container started is not an
			// engine fault: report why it ended.
			if cause := context.Cause(caller); cause != nil {
				err = cause
			}
		}
	}()
	env := m.sandboxEnv()
	netName, dns, addr := "none", []netip.Addr(nil), netip.Addr{}
	if m.proxy != nil {
		n, err := m.openNet(ctx, sandbox, name)
		if err != nil {
			return inst, err
		}
		inst.net = n
		env = append(append(env, n.env()...), m.secretEnv(sandbox)...)
		netName, dns, addr = n.name, []netip.Addr{n.gateway}, n.client
	}
	spec := ContainerSpec(ContainerParams{
		Name:              name,
		Image:             m.image,
		Labels:            m.labels(sandbox),
		UID:               m.opts.UID,
		GID:               m.opts.GID,
		Env:               env,
		WorkspaceBytes:    p.MaxWorkspaceBytes,
		WorkspaceReadOnly: p.ReadOnly,
		WorkspaceInImage:  p.ReadOnly && m.seed != nil,
		TmpBytes:          m.opts.TmpBytes,
		Memory:            p.Memory,
		NanoCPUs:          int64(p.CPUs * 1e9),
		Pids:              p.Pids,
		NoFile:            DefaultNoFile,
		Network:           netName,
		NetworkAddr:       addr,
		DNS:               dns,
		Runtime:           m.opts.Runtime,
		SeccompProfile:    m.opts.SeccompProfile,
	})
	start := time.Now()
	created, err := m.cli.ContainerCreate(ctx, spec)
	if err != nil {
		return inst, engineError("create the sandbox container", err)
	}
	inst.containerID = created.ID
	att, err := m.cli.ContainerAttach(ctx, created.ID, client.ContainerAttachOptions{Stream: true, Stdin: true, Stdout: true, Stderr: true})
	if err != nil {
		return inst, engineError("attach to the sandbox container", err)
	}
	if _, err := m.cli.ContainerStart(ctx, created.ID, client.ContainerStartOptions{}); err != nil {
		att.Close()
		return inst, engineError("start the sandbox container", err)
	}
	log := m.log.With("sandbox", sandbox, "container", created.ID[:12])
	frames, agentLog := demuxAttach(att.Reader, log)
	c, err := newConn(ctx, frames, att.Conn, att.Conn, m.opts.Lease, log)
	if err != nil {
		return inst, errcode.Errorf(errcode.Unavailable, "the sandbox's agent did not start: %v (agent output: %s)", err, agentLog.tail())
	}
	inst.conn = c
	if err := m.setupSandbox(ctx, c); err != nil {
		return inst, err
	}
	if m.opts.Policy.NeedsResolve() {
		paths, err := c.resolve(ctx, m.opts.Policy.AllowCmds, ".")
		if err != nil {
			return inst, fmt.Errorf("resolve the command allowlist: %w", err)
		}
		inst.allowed = make(map[string]string)
		for i, p := range paths {
			if p == "" {
				log.Warn("session: allowlisted command not found in the image", "cmd", m.opts.Policy.AllowCmds[i])
				continue
			}
			inst.allowed[p] = m.opts.Policy.AllowCmds[i]
		}
	}
	m.wg.Add(1)
	go m.keepAlive(inst, log)
	log.Info("session: sandbox started", "image", m.image, "duration", time.Since(start).Round(time.Millisecond), "agent", c.hello.Agent, "agent_pid", c.hello.PID,
		"agent_uids", c.hello.UIDs, "command_uid", c.hello.CommandUID, "command_groups", c.hello.CommandGroups)
	return inst, nil
}

// sandboxEnv is the environment every sandbox container gets. Nothing else
// of the server's environment enters a sandbox.
func (m *Manager) sandboxEnv() []string {
	env := []string{"HOME=/tmp"}
	return append(env, m.opts.Env...)
}

// keepAlive pings the agent while the instance lives, so the agent's lease
// does not run out, and ends an instance whose agent stops answering. When
// the connection ends for any reason, the container is removed.
func (m *Manager) keepAlive(inst *instance, log *slog.Logger) {
	defer m.wg.Done()
	every := max(m.opts.Lease/4, 100*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	quiet := inst.quiet
	for {
		select {
		case <-inst.conn.dead:
			m.removeInstance(inst)
			return
		case <-m.ctx.Done():
			return
		case <-quiet:
			t.Stop()
			quiet = nil
		case <-t.C:
			ctx, cancel := context.WithTimeout(m.ctx, max(m.opts.Lease/2, time.Second))
			err := inst.conn.ping(ctx)
			cancel()
			if err != nil && m.ctx.Err() == nil {
				inst.conn.fail(fmt.Errorf("the agent stopped answering: %w", err))
			}
		}
	}
}

// stopKeepAlive stops an instance's heartbeats, as a frozen server would.
func (m *Manager) stopKeepAlive(inst *instance) { close(inst.quiet) }

// removeInstance ends an instance's connection and removes its container,
// waiting until the engine has let go of it.
func (m *Manager) removeInstance(inst *instance) {
	if inst.conn != nil {
		inst.conn.fail(errors.New("the sandbox was removed"))
	}
	if inst.containerID != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := removeContainer(ctx, m.cli, inst.containerID); err != nil {
			m.log.Warn("session: remove container", "container", inst.containerID, "err", err)
		}
	}
	if inst.net != nil {
		m.closeNet(inst.net)
	}
}

// Sweep removes sandbox containers that are provably orphaned: stopped ones
// (a running sandbox's agent ends, and its container is removed, as soon as
// its server lets go of the stream), and ones created but never started
// long ago. It never touches a running container: that belongs to a live
// server beside this one. It returns the number removed.
func (m *Manager) Sweep(ctx context.Context) (int, error) {
	list, err := m.cli.ContainerList(ctx, client.ContainerListOptions{
		All:     true,
		Filters: make(client.Filters).Add("label", LabelManaged+"=1"),
	})
	if err != nil {
		return 0, engineError("list containers", err)
	}
	n := 0
	now := time.Now()
	for _, c := range list.Items {
		if !orphaned(string(c.State), time.Unix(c.Created, 0), now) &&
			!(string(c.State) == "created" && ownerGone(c.Labels)) {
			continue
		}
		if err := removeContainer(ctx, m.cli, c.ID); err != nil {
			m.log.Warn("session: sweep: remove container", "container", c.ID, "err", err)
			continue
		}
		n++
		m.log.Info("session: swept orphaned container", "container", c.ID[:12], "state", c.State,
			"sandbox", c.Labels[LabelSandbox], "instance", c.Labels[LabelInstance])
	}
	return n, nil
}

// orphaned decides whether a labelled container in the given state, made at
// created, is left over from a server that is gone.
func orphaned(state string, created, now time.Time) bool {
	switch state {
	case "exited", "dead":
		return true
	case "created":
		return now.Sub(created) > orphanGrace
	}
	return false // running, paused, restarting, removing: a live server's
}

func randomID(prefix string) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return prefix + hex.EncodeToString(b[:])
}

// isGone reports an engine error that means the object no longer exists.
func isGone(err error) bool { return cerrdefs.IsNotFound(err) }

// engineError reports an engine failure as UNAVAILABLE, saying whether
// retrying helps.
func engineError(what string, err error) error {
	if client.IsErrConnectionFailed(err) {
		return errcode.Errorf(errcode.Unavailable, "cannot %s: the Docker engine is not reachable (%v); retrying will not help until it is back", what, err)
	}
	return errcode.Errorf(errcode.Unavailable, "cannot %s: %v; retrying may help if this was a passing engine fault", what, err)
}
