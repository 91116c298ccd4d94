package session

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/netip"
	"path/filepath"
	"sync"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/netproxy"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
	"github.com/sandbox-mcp/sandbox-mcp/snapshot"
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
	// leftoverWait bounds Close's removal of what the sandboxes left on
	// the engine.
	leftoverWait = 30 * time.Second
)

// Options configure a Manager.
type Options struct {
	// Backend runs the sandboxes' instances (Docker containers, package
	// session/backend/docker; Kubernetes pods, session/backend/kube);
	// main builds it. Required. A backend that implements backend.Image,
	// backend.Leftovers gets those calls too (backend.ReadOnlySeed gets
	// its call from LoadSeed).
	Backend backend.Backend
	// Policy gives the limits, the read-only flag and the allowlist.
	Policy policy.Policy
	// Env is the NAME=VALUE list every sandbox gets (the operator's --env).
	Env []string
	// StateDir holds snapshots and the server's records. Required.
	StateDir string
	// Retention bounds the snapshots kept in StateDir. Its
	// MaxSnapshotBytes is set from Policy (the workspace's stream limit).
	Retention snapshot.Retention
	// Warm is the number of containers kept started ahead of need, so a
	// new session's first call does not wait for one (0: none).
	Warm int
	// Seed is what every new workspace starts with a copy of (nil for an
	// empty workspace): a host directory (--workspace-from) read once by
	// LoadSeed, which gave a read-only workspace's to the Backend. The
	// Manager owns it from NewManager on, and closes it.
	Seed *Seed
	// Instance names this server in labels; "" picks a random one.
	Instance string
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
	// SweepEvery runs the backend's sweep again at this interval while
	// the server runs, not only at the start: where several servers share
	// a cluster, the survivors remove what a server that died left, once
	// its lease has run out. 0 means at the start only.
	SweepEvery time.Duration

	// With Policy.Network = allowlist, each sandbox gets its own network
	// whose only way out is the egress proxy. The fields below configure
	// the proxy.

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
	opts    Options
	backend backend.Backend
	log     *slog.Logger
	snaps   *snapshot.Store
	seed    *Seed // nil without --workspace-from
	prep    *preparation
	pool    *pool
	proxy   *netproxy.Proxy // nil unless the policy allows some hosts
	pmEnv   []string        // package managers' settings (packageManagerEnv)

	ctx      context.Context // ends at Close
	cancel   context.CancelFunc
	wg       sync.WaitGroup // background work: removals, reaper, pings
	removals removals       // removals in the background; under mu

	mu     sync.Mutex
	byKey  map[string]*Sandbox
	byID   map[string]*Sandbox
	closed bool
}

// NewManager checks the options and returns a
// Manager at once: what sandboxes need (the runtime image, the firewall
// chain; see backend.Backend.Prepare) is prepared in the background, then
// what earlier servers left behind is swept. Calls that need a sandbox wait
// for that (WaitPrepared).
func NewManager(ctx context.Context, opts Options) (*Manager, error) {
	sd := opts.Seed
	if opts.Backend == nil {
		return nil, closeSeed(sd, errors.New("session: Options.Backend is required"))
	}
	if opts.StateDir == "" {
		return nil, closeSeed(sd, errors.New("session: Options.StateDir is required"))
	}
	if err := opts.Policy.Validate(); err != nil {
		return nil, closeSeed(sd, err)
	}
	if sd != nil && sd.readOnly != opts.Policy.ReadOnly {
		// A read-only workspace's content is in what the backend's
		// instances run, a writable one's is copied in at each start.
		return nil, closeSeed(sd, errors.New("session: Options.Seed was loaded for another workspace mode than Policy.ReadOnly"))
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
	snaps, err := snapshot.OpenStore(filepath.Join(opts.StateDir, "snapshots"), opts.Retention)
	if err != nil {
		return nil, closeSeed(sd, err)
	}
	var (
		proxy *netproxy.Proxy
		allow *netproxy.Allowlist
	)
	if len(opts.Secrets) > 0 && opts.Policy.Network != policy.NetworkAllowlist {
		return nil, closeSeed(sd, errors.New("session: secrets are put into requests by the egress proxy, which only --network=allowlist has"))
	}
	if opts.Policy.Network == policy.NetworkAllowlist {
		allow, err = netproxy.ParseAllowlist(opts.Policy.AllowHosts)
		if err != nil {
			return nil, closeSeed(sd, err)
		}
		proxy, err = netproxy.New(netproxy.Config{
			Allow:        allow,
			AllowPrivate: opts.Policy.AllowPrivateNetworks,
			Resolver:     opts.Resolver,
			Dialer:       opts.Dialer,
			Logger:       log.With("component", "proxy"),
			OnDecision:   opts.OnProxyDecision,
			DenyAddrs:    opts.DenyAddrs,
			Secrets:      opts.Secrets,
			OnSecretUse:  opts.OnSecretUse,
		})
		if err != nil {
			return nil, closeSeed(sd, err)
		}
	}
	be := opts.Backend
	mctx, cancel := context.WithCancel(context.Background())
	m := &Manager{
		opts:     opts,
		backend:  be,
		log:      log.With("component", "session", "instance", opts.Instance),
		snaps:    snaps,
		seed:     sd,
		pool:     newPool(opts.Warm),
		proxy:    proxy,
		pmEnv:    packageManagerEnv(allow),
		ctx:      mctx,
		cancel:   cancel,
		removals: removals{ended: make(chan struct{})},
		byKey:    make(map[string]*Sandbox),
		byID:     make(map[string]*Sandbox),
	}
	m.prep = &preparation{run: m.prepare, log: m.log, ctx: mctx, wg: &m.wg, logEvery: prepareLogEvery}
	m.prep.mu.Lock()
	m.prep.start()
	m.prep.mu.Unlock()
	if opts.IdleTimeout > 0 {
		m.wg.Add(1)
		go m.reapLoop()
	}
	if opts.Warm > 0 {
		m.wg.Add(1)
		go m.fillLoop()
	}
	return m, nil
}

// prepare is one attempt at preparing sandboxes: the backend's Prepare,
// then, the first time it succeeds, the sweep of what earlier servers left
// behind (and its loop, with SweepEvery).
func (m *Manager) prepare(ctx context.Context, step func(backend.Step)) error {
	if err := m.backend.Prepare(ctx, step); err != nil {
		return err
	}
	step(backend.Step{What: "sweeping what earlier servers left behind"})
	if err := m.Sweep(ctx); err != nil {
		m.log.Warn("sweep of leftovers failed", "err", err)
	}
	if m.opts.SweepEvery > 0 {
		m.wg.Add(1)
		go m.sweepLoop(m.opts.SweepEvery)
	}
	m.log.Info("ready", "runtime_image", m.RuntimeImage(), "agent_mount", m.AgentMountPath())
	return nil
}

// AgentMountPath is the host path of the agent bind-mounted into
// sandboxes, or "" (the runtime image holds it, or the backend prepares
// no image: backend.Image), once prepared.
func (m *Manager) AgentMountPath() string {
	if im, ok := m.backend.(backend.Image); ok {
		return im.AgentMountPath()
	}
	return ""
}

// Instance returns the server instance id used in labels.
func (m *Manager) Instance() string { return m.opts.Instance }

// RuntimeImage returns the tag of the image sandboxes run, or "" when the
// backend prepares no image (backend.Image).
func (m *Manager) RuntimeImage() string {
	if im, ok := m.backend.(backend.Image); ok {
		return im.RuntimeImage()
	}
	return ""
}

// Toolbox returns the sandbox image's toolbox manifest (JSON, see
// docker.LabelToolbox), or "" when the image has none, the backend cannot
// read it in 2 s, or it does not inspect images (backend.Image; Kubernetes'
// does not).
func (m *Manager) Toolbox(ctx context.Context) string {
	if im, ok := m.backend.(backend.Image); ok {
		return im.Toolbox(ctx)
	}
	return ""
}

// Snapshots returns the snapshot store; a caller's snapshots are its view
// Snapshots().For(caller).
func (m *Manager) Snapshots() *snapshot.Store { return m.snaps }

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
		if m.removals.sandboxes == 0 {
			wait.Stop()
			return nil, errcode.Errorf(errcode.Busy, "this server already runs %d sandboxes, its limit (--max-sessions); try again when a session ends", max)
		}
		removed := m.removals.ended
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
		m.log.Info("sandbox taken from the warm pool", "sandbox", s.id)
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

// Peek returns the sandbox of key if there is one, without making one.
func (m *Manager) Peek(key string) (*Sandbox, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.byKey[key]
	return s, s != nil
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
		m.remove(s)
		m.mu.Lock()
		m.removals.sandboxEnded()
		m.mu.Unlock()
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
		m.removals.sandboxBegins()
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
	if m.proxy != nil {
		m.proxy.Forget(s.id) // its approved and narrowed hosts
	}
	m.pool.poke() // room for another warm container
}

// removals counts the removals under way in the background, for Close to
// wait for them and a new sandbox to wait for room. Every method but wait
// is called under Manager.mu while the manager is open.
type removals struct {
	wg sync.WaitGroup // every removal in the background
	// sandboxes counts those of sandboxes (ReleaseSoon's), which still
	// count against --max-sessions; ended is closed (and replaced)
	// whenever one of them ends.
	sandboxes int
	ended     chan struct{}
}

// sandboxBegins counts a sandbox's removal, which the caller then runs and
// ends with sandboxEnded.
func (r *removals) sandboxBegins() {
	r.wg.Add(1)
	r.sandboxes++
}

// sandboxEnded notes the end of a sandbox's removal.
func (r *removals) sandboxEnded() {
	r.sandboxes--
	close(r.ended)
	r.ended = make(chan struct{})
	r.wg.Done()
}

// do runs remove in the background, counted (a container, not a sandbox).
func (r *removals) do(remove func()) { r.wg.Go(remove) }

// wait returns when every removal counted has ended.
func (r *removals) wait() { r.wg.Wait() }

// Close removes every sandbox (waiting for removals already under way, and
// for starts under way, which remove what they made when they are
// abandoned), stops background work, then removes whatever is still on the
// engine under this server's label.
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
		m.removals.wait()
		m.cancel()
		m.wg.Wait()
		// No start runs any more: what carries this server's label
		// now is left over (a create the engine finished after its
		// start gave up on it), and goes too.
		if lo, ok := m.backend.(backend.Leftovers); ok {
			rctx, cancel := context.WithTimeout(context.Background(), leftoverWait)
			if err := lo.RemoveLeftovers(rctx); err != nil {
				m.log.Warn("removing what the sandboxes left behind", "err", err)
			}
			cancel()
		}
		if m.seed != nil {
			m.seed.Close()
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

func randomID(prefix string) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return prefix + hex.EncodeToString(b[:])
}
