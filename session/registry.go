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
	// Slot is this server's slot of StateDir (OpenSlot), which holds the
	// records of its sandboxes; the caller holds it for the Manager's
	// life and closes it after Close. nil keeps no records (doctor,
	// prepare, tests): nothing then outlives the process.
	Slot *Slot
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
	// MaxSandboxes caps the sandboxes alive at once, a session's own and
	// those made by Create alike (--max-sandboxes); one more gets BUSY.
	// 0 means no cap.
	MaxSandboxes int
	// MaxSandboxesPerCaller caps the sandboxes one owner holds at once
	// (--max-sandboxes-per-caller); one more gets BUSY. 0 means no cap
	// but MaxSandboxes.
	MaxSandboxesPerCaller int
	// MaxLifetime ends a sandbox made by Create this long after its
	// creation, its workspace saved first (--max-sandbox-lifetime). 0
	// means never.
	MaxLifetime time.Duration
	// SweepEvery runs the backend's sweep again at this interval while
	// the server runs, not only at the start: where several servers share
	// a cluster, the survivors remove what a server that died left, once
	// its lease has run out. 0 means at the start only.
	SweepEvery time.Duration
	// EndHandlesAtStop makes Close end the sandboxes made by Create as it
	// ends sessions' own (--end-handles-at-stop). Without it, and with a
	// Slot and a backend whose instances outlive the server
	// (backend.Reattacher, backend.Detacher), Close leaves them running,
	// their records kept, for the next server on the slot (an upgrade);
	// their agents end by themselves once --lease passes without one.
	EndHandlesAtStop bool

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

	// Templates are the operator's named shapes of sandbox, by name
	// (SandboxWithTemplate); the fields above (Policy, Env, Seed, Secrets,
	// the backend's image) make the default template. Their secrets are
	// names among Secrets. The warm pool holds default sandboxes only.
	Templates map[string]Template
	// ReplicaKey, when set with a backend that can share its instances
	// (SharedBackend: Kubernetes), makes this server one of replicas that
	// share the cluster and StateDir and serve each other's handles: the
	// same secret on every replica, never given to a sandbox (see
	// replicas.go and docs/kubernetes.md).
	ReplicaKey []byte
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
	// def is the default template (the options' own), templates the
	// operator's named ones.
	def       *Template
	templates map[string]*Template

	ctx      context.Context // ends at Close
	cancel   context.CancelFunc
	wg       sync.WaitGroup // background work: removals, reaper, pings
	removals removals       // removals in the background; under mu

	// records are the sandboxes' records in the server's state slot
	// (adopt.go); nil without Options.Slot.
	records *Records

	// grants are what a person allowed for all of a caller's sandboxes
	// for a while (grants.go).
	grants callerGrants

	mu     sync.Mutex
	byKey  map[string]*Sandbox
	byID   map[string]*Sandbox
	ended  endedBook // sandboxes ended, for the calls that still name them
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
		return nil, closeSeeds(opts, errors.New("session: Options.Backend is required"))
	}
	if opts.StateDir == "" {
		return nil, closeSeeds(opts, errors.New("session: Options.StateDir is required"))
	}
	if err := opts.Policy.Validate(); err != nil {
		return nil, closeSeeds(opts, err)
	}
	if sd != nil && sd.readOnly != opts.Policy.ReadOnly {
		// A read-only workspace's content is in what the backend's
		// instances run, a writable one's is copied in at each start.
		return nil, closeSeeds(opts, errors.New("session: Options.Seed was loaded for another workspace mode than Policy.ReadOnly"))
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
	templates, err := checkTemplates(opts)
	if err != nil {
		return nil, closeSeeds(opts, err)
	}
	opts.Retention.MaxSnapshotBytes = snapshotLimits(opts.Policy).MaxBytes
	for _, t := range templates {
		// A snapshot of any template's workspace fits the store.
		opts.Retention.MaxSnapshotBytes = max(opts.Retention.MaxSnapshotBytes, snapshotLimits(t.Policy).MaxBytes)
	}
	snaps, err := snapshot.OpenStore(filepath.Join(opts.StateDir, "snapshots"), opts.Retention)
	if err != nil {
		return nil, closeSeeds(opts, err)
	}
	var (
		proxy *netproxy.Proxy
		allow *netproxy.Allowlist
	)
	if len(opts.Secrets) > 0 && opts.Policy.Network != policy.NetworkAllowlist {
		return nil, closeSeeds(opts, errors.New("session: secrets are put into requests by the egress proxy, which only --network=allowlist has"))
	}
	needProxy := opts.Policy.Network == policy.NetworkAllowlist
	for _, t := range templates {
		needProxy = needProxy || t.networked()
	}
	if opts.Policy.Network == policy.NetworkAllowlist {
		allow, err = netproxy.ParseAllowlist(opts.Policy.AllowHosts)
		if err != nil {
			return nil, closeSeeds(opts, err)
		}
	}
	if needProxy {
		// A template may need the proxy where the default has no
		// network: the default's sandboxes then never get it, and its
		// Config.Allow (nil) refuses everything.
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
			return nil, closeSeeds(opts, err)
		}
	}
	be := opts.Backend
	mctx, cancel := context.WithCancel(context.Background())
	m := &Manager{
		opts:      opts,
		backend:   be,
		log:       log.With("component", "session", "instance", opts.Instance),
		snaps:     snaps,
		seed:      sd,
		pool:      newPool(opts.Warm),
		proxy:     proxy,
		def:       defaultTemplate(opts, allow),
		templates: templates,
		ctx:       mctx,
		cancel:    cancel,
		removals:  removals{ended: make(chan struct{})},
		byKey:     make(map[string]*Sandbox),
		byID:      make(map[string]*Sandbox),
	}
	if proxy != nil {
		proxy.SetGranted(m.granted)
	}
	if err := m.adopt(); err != nil {
		cancel()
		return nil, closeSeed(sd, err)
	}
	m.prep = &preparation{run: m.prepare, log: m.log, ctx: mctx, wg: &m.wg, logEvery: prepareLogEvery}
	m.prep.mu.Lock()
	m.prep.start()
	m.prep.mu.Unlock()
	if opts.IdleTimeout > 0 || opts.MaxLifetime > 0 {
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
	m.warnMissingImages()
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
// sandbox belongs to ("" on stdio). A sandbox made here is of the default
// template.
func (m *Manager) Sandbox(key, owner string) (*Sandbox, error) {
	return m.SandboxWithTemplate(key, owner, "")
}

// SandboxWithTemplate is Sandbox for a sandbox of the named template ("" or
// "default": the default one): a sandbox made on first use has its image,
// limits, network, secrets, environment and seed, and the tools check its
// calls against its policy. A key that already has a sandbox returns it,
// whatever its template. An unknown template is INVALID_ARGUMENT. Only
// default sandboxes come from the warm pool.
func (m *Manager) SandboxWithTemplate(key, owner, template string) (*Sandbox, error) {
	tpl, err := m.template(template)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, errcode.Errorf(errcode.Unavailable, "the server is shutting down")
	}
	if s := m.byKey[key]; s != nil {
		return s, nil
	}
	if s, err := m.room(owner, func() *Sandbox { return m.byKey[key] }); s != nil || err != nil {
		return s, err
	}
	s, err := m.newSandbox(owner, key, tpl, true)
	if err != nil {
		return nil, err
	}
	m.byKey[key] = s
	return s, nil
}

// room waits, with m.mu held, until owner may have one more sandbox under
// --max-sandboxes and --max-sandboxes-per-caller, or says why not (BUSY).
// A sandbox whose session ended still counts until its container is gone:
// room waits a little for such removals rather than refuse. If found is
// set and returns a sandbox once m.mu was let go and taken again, room
// returns that one (made meanwhile by another call for the same session).
func (m *Manager) room(owner string, found func() *Sandbox) (*Sandbox, error) {
	wait := time.NewTimer(removalWait)
	defer wait.Stop()
	for {
		max, share := m.opts.MaxSandboxes, m.opts.MaxSandboxesPerCaller
		mine := 0
		if share > 0 {
			for _, s := range m.byID {
				if s.owner == owner {
					mine++
				}
			}
		}
		var full error
		switch {
		case max > 0 && len(m.byID) >= max:
			full = errcode.Errorf(errcode.Busy, "this server already runs %d sandboxes, its limit (--max-sandboxes); end one of yours with sandbox_end (sandbox_status lists them), or try again when others end", max)
		case share > 0 && mine >= share:
			full = errcode.Errorf(errcode.Busy, "you already hold %d sandboxes, the most one caller may (--max-sandboxes-per-caller); end one with sandbox_end (sandbox_status lists them), then try again", share)
		default:
			return nil, nil
		}
		if m.removals.sandboxes == 0 {
			return nil, full
		}
		removed := m.removals.ended
		m.mu.Unlock()
		select {
		case <-removed:
		case <-wait.C:
			m.mu.Lock()
			return nil, errcode.Errorf(errcode.Busy, "%s (the sandboxes being removed took longer than %s to go)", full.(*errcode.Error).Message, removalWait)
		}
		m.mu.Lock()
		if m.closed {
			return nil, errcode.Errorf(errcode.Unavailable, "the server is shutting down")
		}
		if found != nil {
			if s := found(); s != nil {
				return s, nil
			}
		}
	}
}

// newSandbox makes and registers a sandbox record of template tpl for
// owner (key is its session's, "" for one made by Create), taking a warm
// container if warm, tpl is the default and there is one. m.mu is held.
func (m *Manager) newSandbox(owner, key string, tpl *Template, warm bool) (*Sandbox, error) {
	ctx, cancel := context.WithCancel(m.ctx)
	s := &Sandbox{
		m:       m,
		id:      randomID("sb-"),
		owner:   owner,
		key:     key,
		tpl:     tpl,
		created: time.Now(),
		ctx:     ctx,
		cancel:  cancel,
		execs:   make(chan struct{}, tpl.Policy.MaxExecs),
	}
	if !tpl.isDefault {
		if err := m.shape(s); err != nil {
			cancel()
			return nil, err
		}
	} else if warm {
		if w, ok := m.takeWarm(); ok {
			s.id, s.cur, s.gen = w.id, w.inst, 1
			m.log.Info("sandbox taken from the warm pool", "sandbox", s.id)
		}
	}
	s.lastUsed.Store(time.Now().UnixNano())
	m.byID[s.id] = s
	return s, nil
}

// Lookup finds a sandbox by id for owner. Another owner's sandbox is not
// found (Find says why).
func (m *Manager) Lookup(id, owner string) (*Sandbox, bool) {
	s, err := m.Find(id, owner)
	return s, err == nil
}

// Peek returns the sandbox of key if there is one, without making one.
func (m *Manager) Peek(key string) (*Sandbox, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.byKey[key]
	return s, s != nil
}

// Count returns the number of sandboxes, sessions' own and by handle.
func (m *Manager) Count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.byID)
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

// closeParallel bounds the sandboxes Close ends (or detaches) at once.
const closeParallel = 16

// Close removes every sandbox (waiting for removals already under way, and
// for starts under way, which remove what they made when they are
// abandoned), stops background work, then removes whatever is still on the
// engine under this server's label. Sandboxes made by Create are the
// exception where the server keeps records (keepsHandles): they are left
// running for the next server on the slot (Sandbox.detach).
func (m *Manager) Close(ctx context.Context) error {
	m.mu.Lock()
	m.closed = true
	all := make([]*Sandbox, 0, len(m.byID))
	for _, s := range m.byID {
		all = append(all, s)
	}
	clear(m.byKey)
	m.mu.Unlock()
	keep := m.keepsHandles()
	done := make(chan struct{})
	go func() {
		var wg sync.WaitGroup
		// At most closeParallel at once: a thousand removals at once
		// drove a 2-core host's load average past 600 (make bench's
		// density step), the engine serialises much of them anyway.
		slots := make(chan struct{}, closeParallel)
		for _, s := range all {
			end := s.close
			if keep && s.handle && s.detachable() {
				end = s.detach
			}
			wg.Go(func() {
				slots <- struct{}{}
				defer func() { <-slots }()
				end()
			})
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
		for _, t := range m.templates {
			if t.Seed != nil && t.Seed != m.seed {
				t.Seed.Close()
			}
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

// keepsHandles reports whether Close leaves handles running for the next
// server: the server keeps records, the backend can take an instance over
// and let go of one, and the operator did not ask for everything to end.
func (m *Manager) keepsHandles() bool {
	_, reattach := m.backend.(backend.Reattacher)
	return m.records != nil && reattach && !m.opts.EndHandlesAtStop
}

// shape gives a template's sandbox its own allowlist and secrets at the
// egress proxy, for its whole life (every container it starts); its close
// takes them back.
func (m *Manager) shape(s *Sandbox) error {
	proxy := m.proxyFor(s.tpl)
	if proxy == nil {
		return nil
	}
	clear, err := proxy.SetShape(s.id, netproxy.Shape{Allow: s.tpl.allow, Secrets: s.tpl.Secrets})
	if err != nil {
		return fmt.Errorf("session: template %s: %w", s.tpl.Name, err)
	}
	s.clearShape = clear
	return nil
}

// closeSeeds closes the options' seeds (the default's and the templates'),
// and returns err: for the failures of NewManager.
func closeSeeds(opts Options, err error) error {
	closeSeed(opts.Seed, nil)
	for _, t := range opts.Templates {
		if t.Seed != nil && t.Seed != opts.Seed {
			t.Seed.Close()
		}
	}
	return err
}

// randomID returns prefix and 128 random bits in hex: a sandbox's id is
// its handle, which must not be guessed (though it is never authority
// alone: every call checks its owner).
func randomID(prefix string) string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return prefix + hex.EncodeToString(b[:])
}
