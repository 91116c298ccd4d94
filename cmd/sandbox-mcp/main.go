// Command sandbox-mcp is an MCP server that gives LLM agents a place to run
// code that cannot hurt the machine it runs on: one hardened Docker container
// per MCP session, every call checked against the operator's policy.
//
// Usage:
//
//	sandbox-mcp [flags]        serve MCP over stdio
//	sandbox-mcp --http ADDR    serve streamable HTTP at http://ADDR/mcp
//	sandbox-mcp doctor [flags] check the engine, the image and the agent
//	sandbox-mcp prepare [flags] prepare what sandboxes need, then exit
//	sandbox-mcp image          print the default image's tag (to build on)
//	sandbox-mcp uninstall      remove everything it made (images, sandboxes, state, firewall table)
//	sandbox-mcp version        print the version
//
// Every flag also reads from SANDBOX_MCP_<NAME> and from the JSON file
// --config names; flags win over the environment, which wins over the file.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/moby/moby/client"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/cmd/sandbox-mcp/internal/audit"
	"github.com/sandbox-mcp/sandbox-mcp/image"
	"github.com/sandbox-mcp/sandbox-mcp/netproxy"
	"github.com/sandbox-mcp/sandbox-mcp/preview"
	"github.com/sandbox-mcp/sandbox-mcp/session"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/kube"
	"github.com/sandbox-mcp/sandbox-mcp/tools"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = ""

// shutdownTimeout bounds the removal of every sandbox at exit.
const shutdownTimeout = 30 * time.Second

// protocolVersions are the MCP versions served, side by side: 2026-07-28
// (no protocol sessions: over stdio by server/discover and each request's
// _meta, over HTTP by the stateless handler, see httpguard) and the older
// ones (initialize; over HTTP by the handler with sessions).
var protocolVersions = []string{"2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"}

func main() {
	// SIGINT and SIGTERM stay caught for the whole life of the process:
	// run's handlers stop shutdown-worthy work, and once they are
	// unregistered (run returning) the default action would kill a server
	// that is removing its sandboxes or exiting. Clients send SIGTERM a
	// moment after closing stdin (mcp-go after 2 s), so one often lands
	// there.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGINT, syscall.SIGTERM)
	os.Exit(run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv))
}

// run is main, testable: it returns the exit status.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) > 0 {
		switch args[0] {
		case "version", "--version", "-version":
			fmt.Fprintln(stdout, "sandbox-mcp", buildVersion())
			return 0
		case "doctor":
			return doctor(ctx, args[1:], stdout, getenv)
		case "prepare":
			return prepareCmd(ctx, args[1:], stderr, getenv)
		case "snapshot":
			return snapshotCmd(args[1:], stdout, stderr, getenv)
		case "audit":
			return auditCmd(args[1:], stdin, stdout, stderr, getenv)
		case "image":
			return imageCmd(args[1:], stdout, stderr)
		case "uninstall":
			return uninstallCmd(ctx, args[1:], stdout, stderr, getenv)
		case "help", "-h", "--help", "-help":
			usage(stdout, getenv)
			return 0
		}
	}
	cfg, err := ParseConfig(args, getenv)
	if errors.Is(err, flag.ErrHelp) {
		usage(stdout, getenv)
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "sandbox-mcp: %v\n", err)
		return 2
	}
	// The server stops as on EOF when its stderr goes away (see logSink),
	// or at SIGINT/SIGTERM.
	signal.Ignore(syscall.SIGPIPE)
	ctx, lose := context.WithCancelCause(ctx)
	defer lose(nil)
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log := newLogger(&logSink{w: stderr, lost: func() { lose(errStderrClosed) }}, cfg.LogLevel)
	if getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(cfg.MemoryLimit())
	}
	var auditLog *audit.Log
	if cfg.AuditLog != "" {
		key, err := audit.LoadKey(cfg.StateDir)
		if err == nil {
			auditLog, err = audit.Open(cfg.AuditLog, key, log)
		}
		if err != nil {
			log.Error("sandbox-mcp not started", "err", err)
			return 1
		}
		defer auditLog.Close()
		auditLog.Server("start", "")
	}
	if cfg.HTTP.Addr != "" {
		err = serveHTTP(ctx, cfg, log, auditLog)
	} else {
		err = serveStdio(ctx, cfg, stdin, stdout, log, auditLog)
	}
	if auditLog != nil {
		auditLog.Server("stop", stopReason(ctx, cfg, err))
	}
	if err != nil {
		log.Error("sandbox-mcp stopped", "err", err)
		return 1
	}
	return 0
}

// stopReason says why the server stopped, for the audit log.
func stopReason(ctx context.Context, cfg Config, err error) string {
	switch {
	case err != nil:
		return err.Error()
	case ctx.Err() != nil:
		return context.Cause(ctx).Error()
	case cfg.HTTP.Addr == "":
		return "the client closed stdin"
	}
	return "stopped"
}

func newLogger(w io.Writer, level string) *slog.Logger {
	var l slog.Level
	_ = l.UnmarshalText([]byte(level))
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l}))
}

func buildVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// newManager makes the session manager, which prepares what sandboxes need
// in the background (see session.NewManager).
// deny lists addresses the egress proxy must never reach (the MCP HTTP
// listener); auditLog, if not nil, gets a record per proxy decision.
//
// A server (stdio or HTTP) takes a slot of the state directory
// (session.OpenSlot) for the records of its sandboxes, with which a server
// started again after a crash re-adopts them; withSlot is false for the
// commands that only prepare or check (they own no sandbox).
func newManager(ctx context.Context, cfg Config, log *slog.Logger, auditLog *audit.Log, withSlot bool, deny ...netip.AddrPort) (*session.Manager, func(), error) {
	var (
		be      backend.Backend
		kb      *kube.Backend
		release func()
		slotOpt *session.Slot
		m       *session.Manager
	)
	instance := newInstanceID()
	if cfg.Kube.Backend == BackendKubernetes {
		var err error
		if kb, err = newKubeBackend(cfg, instance, log); err != nil {
			return nil, nil, fmt.Errorf("kubernetes backend: %w", err)
		}
		be = kb
		// After the manager removed its pods: the lease and policy go.
		release = func() {
			cctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
			defer cancel()
			if err := kb.Close(cctx); err != nil {
				log.Warn("kubernetes backend: close", "err", err)
			}
		}
	} else {
		// The engine is first called by the preparation, in the
		// background: the client is answered at once, and a call that
		// needs a sandbox says what is wrong with the engine.
		cli, err := client.New(client.FromEnv)
		if err != nil {
			return nil, nil, fmt.Errorf("docker client: %w", err)
		}
		dk, err := newDockerBackend(cfg, cli, instance, log)
		if err != nil {
			cli.Close()
			return nil, nil, err
		}
		be = dk
		release = func() { cli.Close() }
	}
	if withSlot {
		slot, err := session.OpenSlot(cfg.StateDir, cfg.StateSlot)
		if err != nil {
			release()
			return nil, nil, err
		}
		log.Info("state slot taken", "slot", slot.Number(), "dir", slot.Dir())
		beRelease := release
		release = func() { beRelease(); slot.Close() }
		slotOpt = slot
	}
	opts := session.Options{
		Slot:             slotOpt,
		Backend:          be,
		Instance:         instance,
		Policy:           cfg.Policy,
		Env:              cfg.Env,
		StateDir:         cfg.StateDir,
		IdleTimeout:      cfg.IdleTimeout,
		Lease:            cfg.Lease,
		EndHandlesAtStop: cfg.EndHandlesAtStop,
		DenyAddrs:        deny,
		// Counted where sandboxes are made, whatever made them.
		MaxSandboxes:          cfg.HTTP.MaxSandboxes,
		MaxSandboxesPerCaller: cfg.HTTP.SandboxesPerCaller(),
		MaxLifetime:           cfg.MaxSandboxLifetime,
		Warm:                  cfg.Warm,
		Retention:             cfg.SnapshotRetention(),
		Logger:                log,
	}
	var err error
	if opts.Seed, err = loadSeed(cfg, be); err != nil {
		release()
		return nil, nil, err
	}
	if opts.Templates, err = loadTemplates(cfg, opts.Seed); err != nil {
		if opts.Seed != nil {
			opts.Seed.Close()
		}
		release()
		return nil, nil, err
	}
	opts.Secrets = cfg.Secrets
	if auditLog != nil {
		opts.OnProxyDecision = func(d netproxy.Decision) { auditLog.Proxy(d) }
		opts.OnSecretUse = func(u netproxy.SecretUse) { auditLog.SecretUse(u) }
	}
	if kb != nil {
		// Replicas share the namespace: each sweeps again once a lease
		// term, so a dead replica's pods go within two lease terms.
		opts.SweepEvery = kube.DefaultLeaseDuration
		if f := cfg.Kube.ReplicaKeyFile; f != "" {
			key, err := os.ReadFile(f)
			if err == nil && len(bytes.TrimSpace(key)) < 16 {
				err = errors.New("the key is shorter than 16 bytes")
			}
			if err != nil {
				release()
				return nil, nil, fmt.Errorf("--replica-key-file: %w", err)
			}
			opts.ReplicaKey = bytes.TrimSpace(key)
		}
	}
	m, err = session.NewManager(ctx, opts)
	if err != nil {
		release()
		return nil, nil, err
	}
	return m, release, nil
}

// loadSeed reads --workspace-from, if set, once for whichever backend was
// built: a writable workspace's content goes to the manager, which copies
// it in at each start; a read-only one's goes into what the backend's
// instances run (Docker's seed image). The Kubernetes backend has no way
// to, so validateKube refuses --read-only with --workspace-from, and
// session.LoadSeed would too.
func loadSeed(cfg Config, be backend.Backend) (*session.Seed, error) {
	if cfg.WorkspaceFrom == "" {
		return nil, nil
	}
	return session.LoadSeed(cfg.WorkspaceFrom, cfg.Policy.MaxWorkspaceBytes, cfg.Policy.ReadOnly, be)
}

// newServer builds the MCP server with every tool and resource; auditLog, if
// not nil, gets a record per tool call.
func newServer(cfg Config, m *session.Manager, sessions *tools.Sessions, mem *tools.Memory, log *slog.Logger, auditLog *audit.Log, previews *preview.Registry) *mcp.Server {
	view := tools.ViewOf(cfg.Policy, cfg.Image, cfg.Env)
	if m != nil {
		view.Toolbox = tools.ParseToolbox(m.Toolbox(context.Background())) // the image's own manifest, read in at most 2 s
	}
	for _, sec := range cfg.Secrets {
		view.Secrets = append(view.Secrets, tools.SecretViewOf(sec.Name, sec.Hosts))
	}
	view.ImplicitSandbox = sessions.Sessionless.String()
	view.Templates = templateViews(cfg, m)
	if cfg.HTTP.Addr != "" {
		view.MaxSessions = cfg.HTTP.MaxSandboxes
		view.MaxSessionsPerCaller = cfg.HTTP.SandboxesPerCaller()
		view.MaxCallsPerCaller = cfg.HTTP.CallsPerCaller()
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "sandbox-mcp", Title: "sandbox-mcp", Version: buildVersion()}, &mcp.ServerOptions{
		Instructions:              tools.Instructions(view, image.DefaultTag()),
		Logger:                    log,
		SupportedProtocolVersions: protocolVersions,
		SetCacheable:              tools.SetCacheable,
	})
	deps := &tools.Deps{
		Policy:     cfg.Policy,
		PolicyView: view,
		Sessions:   sessions,
		Memory:     mem,
		Logger:     log,
	}
	if previews != nil {
		deps.Previews = previews
	} else {
		deps.PreviewsOff = previewsOff
	}
	if auditLog != nil {
		deps.Audit = func(r tools.Record) { auditLog.Record(auditTool(r)) }
		deps.AuditApproval = func(r tools.ApprovalRecord) { auditLog.Approval(auditApproval(r)) }
	}
	tools.Register(s, deps)
	return s
}

// templateViews describes the operator's templates for the policy resource
// and the instructions, each image's manifest read at once (each read is
// cut at 2 s).
func templateViews(cfg Config, m *session.Manager) []tools.TemplateView {
	out := make([]tools.TemplateView, len(cfg.Templates))
	var wg sync.WaitGroup
	for i, t := range cfg.Templates {
		v := tools.TemplateView{Name: t.Name, PolicyView: tools.ViewOf(t.Policy, t.Image, t.Env)}
		for _, name := range t.Secrets {
			if j := slices.IndexFunc(cfg.Secrets, func(s netproxy.Secret) bool { return s.Name == name }); j >= 0 {
				v.Secrets = append(v.Secrets, tools.SecretViewOf(name, cfg.Secrets[j].Hosts))
			}
		}
		out[i] = v
		if m != nil {
			wg.Go(func() { out[i].Toolbox = tools.ParseToolbox(m.TemplateToolbox(context.Background(), t.Name)) })
		}
	}
	wg.Wait()
	return out
}

// serveStdio serves one MCP session over stdin and stdout until the client
// closes stdin or a signal arrives; every sandbox is removed before it
// returns.
func serveStdio(ctx context.Context, cfg Config, stdin io.Reader, stdout io.Writer, log *slog.Logger, auditLog *audit.Log) error {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	m, release, err := newManager(ctx, cfg, log, auditLog, true)
	if err != nil {
		return err
	}
	defer release()
	logPolicy(log, cfg)
	sessions := tools.NewSessions(m)
	var previews *preview.Registry
	if cfg.HTTP.PreviewListen != "" {
		if previews, err = listenPreviews(ctx, cfg, log); err != nil {
			return err
		}
	}
	server := newServer(cfg, m, sessions, nil, log, auditLog, previews)

	// On a signal, end the calls in flight first: the SDK waits for them.
	closed := make(chan error, 1)
	go func() {
		<-ctx.Done()
		cctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		closed <- m.Close(cctx)
	}()
	err = server.Run(ctx, unansweredCancels{&mcp.IOTransport{Reader: io.NopCloser(stdin), Writer: nopWriteCloser{stdout}}})
	stop()
	if cerr := <-closed; cerr != nil {
		log.Warn("removing sandboxes at exit", "err", cerr)
	}
	if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, io.EOF) {
		return err
	}
	log.Info("sandbox-mcp stopped")
	return nil
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// logPolicy logs the effective policy at start. Env values are secrets:
// only names are logged.
func logPolicy(log *slog.Logger, cfg Config) {
	p := cfg.Policy
	names := make([]string, len(cfg.Env))
	for i, kv := range cfg.Env {
		names[i], _, _ = strings.Cut(kv, "=")
	}
	log.Info("policy",
		"exec", p.Exec, "allow_cmd", strings.Join(p.AllowCmds, ","), "read_only", p.ReadOnly,
		"max_file_bytes", p.MaxFileBytes, "max_output_bytes", p.MaxOutputBytes, "max_workspace_bytes", p.MaxWorkspaceBytes,
		"exec_timeout", p.ExecTimeout, "max_exec_timeout", p.MaxExecTimeout,
		"memory", p.Memory, "cpus", p.CPUs, "pids", p.Pids, "max_jobs", p.MaxExecs, "max_job_output_bytes", p.MaxJobOutputBytes,
		"max_inflight_bytes", p.MaxInflightBytes, "max_session_inflight_bytes", p.MaxSessionInflightBytes,
		"network", p.Network, "allow_host", strings.Join(p.AllowHosts, ","), "allow_private_networks", p.AllowPrivateNetworks,
		"image", cfg.Image, "env", strings.Join(names, ","),
		"state_dir", cfg.StateDir, "idle_timeout", cfg.IdleTimeout, "runtime", cfg.Runtime,
		"seccomp_profile", cfg.SeccompProfileFile, "secret", strings.Join(cfg.SecretSpecs, ";"))
	for _, t := range cfg.Templates {
		p := t.Policy
		log.Info("template", "name", t.Name, "sets", strings.Join(t.Keys, ","), "image", t.Image,
			"exec", p.Exec, "allow_cmd", strings.Join(p.AllowCmds, ","), "read_only", p.ReadOnly, "max_workspace_bytes", p.MaxWorkspaceBytes,
			"memory", p.Memory, "cpus", p.CPUs, "pids", p.Pids, "network", p.Network, "allow_host", strings.Join(p.AllowHosts, ","),
			"secret", strings.Join(t.Secrets, ","), "workspace_from", t.WorkspaceFrom)
	}
}
