package netproxy

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Defaults applied to zero Config fields.
const (
	DefaultHeaderTimeout  = 10 * time.Second
	DefaultDNSTimeout     = 5 * time.Second
	DefaultConnectTimeout = 10 * time.Second
	DefaultIdleTimeout    = 5 * time.Minute
	DefaultMaxLifetime    = time.Hour
	DefaultMaxTunnels     = 16
	DefaultMaxConns       = 64
	DefaultRate           = rate.Limit(20)
	DefaultBurst          = 40
	DefaultMaxHeaderBytes = 8 << 10

	// The shared listener's unauthenticated phase (ServeShared): the time a
	// connection has to send its credential, and how many connections may
	// be in that phase at once, per source address and in all.
	DefaultAuthTimeout       = 3 * time.Second
	DefaultMaxPendingPerAddr = 16
	DefaultMaxPending        = 1024
)

// Resolver looks up host names. *net.Resolver satisfies it. It must return
// promptly once ctx is done.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Dialer opens upstream connections. *net.Dialer satisfies it. The proxy
// always passes network "tcp4" or "tcp6" and an IP-literal address that it
// has already checked.
type Dialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// Config configures a Proxy. The zero value of every field is usable and
// means the documented default; a zero Config is a proxy that refuses every
// request (nil Allow).
type Config struct {
	// Allow lists the host:port pairs that may be tunnelled to. nil or empty
	// refuses everything.
	Allow *Allowlist

	// AllowPrivate lets allowed names resolve to loopback (127/8, ::1),
	// private (10/8, 172.16/12, 192.168/16, fc00::/7) and CGNAT (100.64/10)
	// addresses, for tests and intranets. Every other special class stays
	// refused even then: metadata, link-local, unspecified, this-network,
	// multicast, broadcast, documentation, benchmarking, reserved, site-local,
	// and the IPv4 embeddings in IPv6 (compatible, translated, NAT64, 6to4,
	// Teredo; an IPv4-mapped address counts as the IPv4 address it carries).
	// The proxy's own listeners and DenyAddrs stay refused too.
	AllowPrivate bool

	// Resolver resolves allowed names, once per request. nil means
	// &net.Resolver{PreferGo: true}: the pure-Go resolver, which does not
	// read numeric host names as addresses the way the C library does.
	Resolver Resolver

	// Dialer connects to the checked address. nil means a net.Dialer whose
	// Control function checks the address again just before connect(2).
	// A custom Dialer gets the checked IP literal but no such second check.
	// Half-closes reach the upstream only if the returned connection has a
	// CloseWrite method, as *net.TCPConn does.
	Dialer Dialer

	// Logger receives the "proxy decision" records (one per allowed
	// request; refusals aggregated, see RefusalInterval) and one "proxy
	// tunnel closed" record per tunnel. nil discards them.
	Logger *slog.Logger

	// OnDecision, if set, is called with every Decision record, after it
	// is logged: once per allowed request, and for refusals as they are
	// aggregated (see RefusalInterval). OnClose, if set, is called with
	// every Close, once per tunnel. Both are called from connection and
	// timer goroutines, concurrently; they must be quick and safe for
	// concurrent use.
	OnDecision func(Decision)
	OnClose    func(Close)

	// RefusalInterval bounds the records a sandbox's refusals make, so
	// that nothing a sandbox sends grows the logs without bound. Within an
	// interval (which starts at a sandbox's first refusal after the last
	// interval ended) the first refusal of each kind (the same host, port,
	// status and reason) is recorded as it happens, with Count 1; its
	// repeats are counted, and recorded as one summary Decision (Summary
	// set, Count the repeats) when the interval ends or the sandbox's last
	// Serve returns. Zero means DefaultRefusalInterval (1m).
	RefusalInterval time.Duration
	// MaxRefusalKinds caps the kinds of refusal recorded per sandbox per
	// interval; refusals of further kinds are counted into one summary
	// whose Host is empty. A sandbox's refusals thus make at most
	// 2*MaxRefusalKinds+1 records per interval. Zero means
	// DefaultMaxRefusalKinds (16).
	MaxRefusalKinds int

	// DenyAddrs are further addresses that tunnels may never reach, such as
	// the MCP HTTP listener. Port 0 denies every port of the address; an
	// unspecified address (0.0.0.0 or ::) stands for every address of this
	// host (loopback and every interface address). The addresses of the
	// listeners passed to Serve are always denied, in the same way.
	DenyAddrs []netip.AddrPort

	// HeaderTimeout bounds the time to read a request header (slowloris).
	// Zero means DefaultHeaderTimeout (10s).
	HeaderTimeout time.Duration
	// DNSTimeout bounds one lookup. Zero means DefaultDNSTimeout (5s).
	DNSTimeout time.Duration
	// ConnectTimeout bounds the upstream dial. Zero means
	// DefaultConnectTimeout (10s).
	ConnectTimeout time.Duration
	// IdleTimeout closes a tunnel when no byte has moved in either
	// direction for this long. Zero means DefaultIdleTimeout (5m).
	IdleTimeout time.Duration
	// MaxLifetime closes a tunnel this long after it opened, however busy.
	// Zero means DefaultMaxLifetime (1h).
	MaxLifetime time.Duration

	// MaxTunnels caps one sandbox's concurrent tunnels, counting requests
	// from the allowlist match on (lookup and dial included); the next
	// request gets 429 with Retry-After. Zero means DefaultMaxTunnels (16).
	MaxTunnels int
	// MaxConns caps one sandbox's concurrent client connections in any
	// state (still sending headers, tunnelling, being refused); a further
	// connection gets 429 and is closed. Zero means DefaultMaxConns (64).
	MaxConns int
	// Rate and Burst shape one sandbox's requests (a token bucket); a
	// request over the rate gets 429 with Retry-After. Zero means
	// DefaultRate (20/s) and DefaultBurst (40); rate.Inf disables the limit.
	Rate  rate.Limit
	Burst int
	// AuthTimeout bounds a shared listener's unauthenticated phase
	// (ServeShared): a connection's whole request header, which carries
	// its credential, must arrive within it, or it gets 408 and is closed.
	// Zero means DefaultAuthTimeout (3s); HeaderTimeout still applies when
	// it is shorter.
	AuthTimeout time.Duration
	// MaxPendingPerAddr caps the connections one source address may have
	// in a shared listener's unauthenticated phase (accepted, credential
	// not read yet, or being refused for the lack of one); a further
	// connection from that address is closed unanswered. MaxPending caps
	// them for every address together, a bound on the memory they hold.
	// A source that fills its share affects no other source. Zero means
	// DefaultMaxPendingPerAddr (16) and DefaultMaxPending (1024).
	MaxPendingPerAddr int
	MaxPending        int
	// MaxHeaderBytes caps the request line plus headers; larger requests
	// get 431. Zero means DefaultMaxHeaderBytes (8 KiB). It bounds each
	// request's header on an intercepted tunnel too.
	MaxHeaderBytes int

	// Secrets are credentials the proxy puts into requests to their hosts
	// (see [Secret]). Tunnels to those hosts are intercepted: the proxy
	// terminates TLS with a certificate from a CA it makes in New (see
	// [Proxy.CACert]) and forwards each HTTP/1.1 request to the real host
	// with the sandbox's placeholders replaced. Every secret's host must be
	// on Allow. Empty: nothing is intercepted and no CA is made.
	Secrets []Secret
	// RootCAs verifies the real hosts' certificates on intercepted tunnels.
	// nil means the system's roots (which honour SSL_CERT_FILE and
	// SSL_CERT_DIR).
	RootCAs *x509.CertPool
	// OnSecretUse, if set, is called the first time each secret is put into
	// a request on an intercepted tunnel, after it is logged. Like
	// OnDecision it must be quick and safe for concurrent use.
	OnSecretUse func(SecretUse)
}

// withDefaults returns cfg with zero fields replaced by defaults, or an error
// naming a negative field.
func (cfg Config) withDefaults() (Config, error) {
	durations := []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"HeaderTimeout", &cfg.HeaderTimeout, DefaultHeaderTimeout},
		{"DNSTimeout", &cfg.DNSTimeout, DefaultDNSTimeout},
		{"ConnectTimeout", &cfg.ConnectTimeout, DefaultConnectTimeout},
		{"IdleTimeout", &cfg.IdleTimeout, DefaultIdleTimeout},
		{"MaxLifetime", &cfg.MaxLifetime, DefaultMaxLifetime},
		{"RefusalInterval", &cfg.RefusalInterval, DefaultRefusalInterval},
		{"AuthTimeout", &cfg.AuthTimeout, DefaultAuthTimeout},
	}
	for _, d := range durations {
		if *d.v < 0 {
			return cfg, fmt.Errorf("netproxy: %s is negative (%v); use 0 for the default %v", d.name, *d.v, d.def)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	ints := []struct {
		name string
		v    *int
		def  int
	}{
		{"MaxTunnels", &cfg.MaxTunnels, DefaultMaxTunnels},
		{"MaxConns", &cfg.MaxConns, DefaultMaxConns},
		{"Burst", &cfg.Burst, DefaultBurst},
		{"MaxHeaderBytes", &cfg.MaxHeaderBytes, DefaultMaxHeaderBytes},
		{"MaxRefusalKinds", &cfg.MaxRefusalKinds, DefaultMaxRefusalKinds},
		{"MaxPendingPerAddr", &cfg.MaxPendingPerAddr, DefaultMaxPendingPerAddr},
		{"MaxPending", &cfg.MaxPending, DefaultMaxPending},
	}
	for _, d := range ints {
		if *d.v < 0 {
			return cfg, fmt.Errorf("netproxy: %s is negative (%d); use 0 for the default %d", d.name, *d.v, d.def)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if cfg.Rate < 0 {
		return cfg, fmt.Errorf("netproxy: Rate is negative (%v); use 0 for the default %v/s", cfg.Rate, DefaultRate)
	}
	if cfg.Rate == 0 {
		cfg.Rate = DefaultRate
	}
	return cfg, nil
}

// Proxy is an HTTP CONNECT proxy that tunnels only to allowed host names
// resolving to permitted addresses. One Proxy serves any number of sandboxes,
// each through its own listener (see Serve). It is safe for concurrent use.
type Proxy struct {
	cfg      Config
	log      *slog.Logger
	resolver Resolver
	dialer   Dialer

	mu        sync.Mutex
	sandboxes map[string]*sandboxState   // by id, while a Serve for it runs
	listeners map[netip.AddrPort]int     // addresses of served listeners, refcounted
	deny      []netip.AddrPort           // cfg.DenyAddrs, normalised
	tokens    map[[32]byte]*sandboxState // granted credentials (Grant), by token hash
	anon      *sandboxState              // refusals of requests with no known credential
	layers    map[string]*layer          // approved and narrowed hosts, by sandbox id, until Forget
	granted   Granted                    // grants kept outside the proxy (SetGranted); nil: none

	secrets *secretSet // nil without Config.Secrets
	shapes  shapes     // sandboxes' own allowlists and secrets (SetShape)
	ca      *ca        // the interception CA; nil without Config.Secrets
}

// New checks cfg and returns a Proxy. It fails on negative limits and on
// secrets that are invalid or name a host Allow does not list. With
// secrets, it makes the interception CA.
func New(cfg Config) (*Proxy, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	p := &Proxy{
		cfg:       cfg,
		log:       cfg.Logger,
		resolver:  cfg.Resolver,
		dialer:    cfg.Dialer,
		sandboxes: map[string]*sandboxState{},
		listeners: map[netip.AddrPort]int{},
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if p.resolver == nil {
		p.resolver = &net.Resolver{PreferGo: true}
	}
	if p.dialer == nil {
		p.dialer = &net.Dialer{Control: p.control}
	}
	for _, ap := range cfg.DenyAddrs {
		p.deny = append(p.deny, netip.AddrPortFrom(ap.Addr().Unmap().WithZone(""), ap.Port()))
	}
	if len(cfg.Secrets) > 0 {
		if p.secrets, err = newSecretSet(cfg.Secrets, cfg.Allow); err != nil {
			return nil, fmt.Errorf("netproxy: %w", err)
		}
		if p.ca, err = newCA(time.Now()); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Serve accepts connections on l for one sandbox until ctx ends or l is
// closed, and answers each with one CONNECT decision (and, if allowed, a
// tunnel). sandbox names the sandbox in logs and keys its limits: concurrent
// Serve calls with the same id share one set of limits.
//
// clients, if any, are the only addresses connections are served from: the
// sandbox's own. A connection from any other address (another container
// that can reach l, a process of this host) is refused with 403 before its
// request is read; at most MaxConns such connections are answered at once,
// and more are closed unanswered. They take none of the sandbox's slots.
// With no clients, any address is served.
//
// Serve closes l when ctx ends. Before it returns it closes every connection
// it accepted, active tunnels included, and waits for their goroutines. It
// returns nil when ctx ends or l is closed, or the accept error otherwise.
func (p *Proxy) Serve(ctx context.Context, l net.Listener, sandbox string, clients ...netip.Addr) error {
	sb := p.register(sandbox, l.Addr())
	defer func() {
		if p.unregister(sandbox, l.Addr()) {
			p.flushRefusals(sb) // the sandbox's last Serve: no interval left open
		}
	}()
	s := &served{sb: sb}
	for _, a := range clients {
		s.clients = append(s.clients, a.Unmap().WithZone(""))
	}
	return p.serve(ctx, l, s)
}

// serve is the accept loop of Serve and ServeShared.
func (p *Proxy) serve(ctx context.Context, l net.Listener, s *served) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()

	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // runs before wg.Wait: ends every connection

	var backoff time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			if te, ok := err.(interface{ Temporary() bool }); ok && te.Temporary() {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				select {
				case <-time.After(backoff):
					continue
				case <-ctx.Done():
					return nil
				}
			}
			return fmt.Errorf("netproxy: accept: %w", err)
		}
		backoff = 0
		wg.Go(func() { p.handle(ctx, c, s) })
	}
}

func listenerAddr(a net.Addr) (netip.AddrPort, bool) {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return netip.AddrPort{}, false
	}
	ap := ta.AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap().WithZone(""), ap.Port()), ap.IsValid()
}

func (p *Proxy) register(id string, la net.Addr) *sandboxState {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ap, ok := listenerAddr(la); ok {
		p.listeners[ap]++
	}
	sb := p.sandboxes[id]
	if sb == nil {
		sb = newSandboxState(id, p.cfg.Rate, p.cfg.Burst)
		p.sandboxes[id] = sb
	}
	sb.refs++
	return sb
}

// unregister undoes register. It reports whether that was the sandbox's
// last Serve.
func (p *Proxy) unregister(id string, la net.Addr) (last bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ap, ok := listenerAddr(la); ok {
		if p.listeners[ap]--; p.listeners[ap] <= 0 {
			delete(p.listeners, ap)
		}
	}
	if sb := p.sandboxes[id]; sb != nil {
		if sb.refs--; sb.refs <= 0 {
			delete(p.sandboxes, id)
			return true
		}
	}
	return false
}

// served is one Serve call: its sandbox, the addresses it serves, and the
// connections from other addresses being refused.
type served struct {
	sb        *sandboxState // shared: the state refusals without a credential count on
	shared    bool          // the sandbox comes from each request's credential
	clients   []netip.Addr  // unmapped, no zone; empty: any
	strangers atomic.Int64
	pending   pendingSet // shared: connections whose credential is not known yet
}

// pendingSet counts a shared listener's connections in their
// unauthenticated phase, per source address and in all.
type pendingSet struct {
	mu     sync.Mutex
	byAddr map[netip.Addr]int
	total  int
}

// take counts one more connection from addr, unless addr already has
// perAddr of them or all addresses together have total.
func (s *pendingSet) take(addr netip.Addr, perAddr, total int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.total >= total || s.byAddr[addr] >= perAddr {
		return false
	}
	if s.byAddr == nil {
		s.byAddr = map[netip.Addr]int{}
	}
	s.byAddr[addr]++
	s.total++
	return true
}

// done undoes one take.
func (s *pendingSet) done(addr netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total--
	if s.byAddr[addr]--; s.byAddr[addr] <= 0 {
		delete(s.byAddr, addr)
	}
}

// admits reports whether a connection from addr is served.
func (s *served) admits(addr netip.Addr) bool {
	return len(s.clients) == 0 || slices.Contains(s.clients, addr)
}
