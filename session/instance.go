package session

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agentclient"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/netproxy"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
)

// instance is one started instance of a sandbox (a container) and the
// connection to its agent.
type instance struct {
	box  backend.Instance
	conn *agentclient.Conn
	// allowed maps each resolved allowlist entry to its spelling.
	allowed  map[string]string
	reported atomic.Bool // a call has told the model this container is gone
	// quiet, when closed, stops the heartbeats (a test uses it to play a
	// frozen server).
	quiet chan struct{}
	// shell is the shell command strings run through, once looked up.
	shell atomic.Pointer[[2]string]
	// token lets a later server take the agent over (agentproto.Lease);
	// "" when the server keeps no records.
	token string
	// recorded is set once the sandbox's record names this instance.
	recorded atomic.Bool
}

// startInstance starts instance number gen of the sandbox with the given id,
// of template tpl, and waits for its agent. On failure nothing is left
// behind.
func (m *Manager) startInstance(ctx context.Context, sandbox string, gen int, tpl *Template) (inst *instance, err error) {
	// A tool call waited already, with progress and within its budget;
	// this covers every other start (the warm pool, the doctor).
	if err := m.prep.wait(ctx, 0, 0, nil); err != nil {
		return nil, err
	}
	caller := ctx
	ctx, cancel := context.WithTimeout(ctx, m.opts.StartTimeout)
	defer cancel()
	p := tpl.Policy
	inst = &instance{quiet: make(chan struct{})}
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
	start := time.Now()
	box, err := m.backend.Start(ctx, backend.InstanceSpec{
		Sandbox:    sandbox,
		Generation: gen,
		UID:        m.opts.UID,
		GID:        m.opts.GID,
		Image:      tpl.Image,
		Env:        append(m.sandboxEnv(tpl), m.secretEnv(sandbox, tpl)...),
		Limits: backend.Limits{
			Memory:         p.Memory,
			NanoCPUs:       int64(p.CPUs * 1e9),
			Pids:           p.Pids,
			NoFile:         DefaultNoFile,
			WorkspaceBytes: p.MaxWorkspaceBytes,
			TmpBytes:       m.opts.TmpBytes,
		},
		ReadOnly: p.ReadOnly,
		Proxy:    m.proxyFor(tpl),
	})
	if err != nil {
		if terr := templateImageError(tpl, err); terr != nil {
			return inst, terr
		}
		return inst, err
	}
	inst.box = box
	log := m.log.With("sandbox", sandbox, "container", box.Name())
	if m.shared() != nil {
		// Any replica can take this agent over (replicas.go): the
		// token is one they all derive.
		inst.token = m.resumeToken(sandbox)
	} else if m.opts.Slot != nil {
		// A server that keeps records can take this agent back after a
		// crash (see adopt.go); the token proves it to the agent.
		inst.token = agentclient.NewToken()
	}
	c, err := agentclient.New(ctx, box.Stdout(), box.Stdin(), box.Stdin(), m.opts.Lease, inst.token, log)
	if err != nil {
		return inst, errcode.Errorf(errcode.Unavailable, "the sandbox's agent did not start: %w (agent output: %s)", err, box.StderrTail())
	}
	inst.conn = c
	if err := m.setupSandbox(ctx, c, box, tpl); err != nil {
		return inst, err
	}
	if p.NeedsResolve() {
		paths, err := c.Resolve(ctx, p.AllowCmds, ".")
		if err != nil {
			return inst, fmt.Errorf("resolve the command allowlist: %w", err)
		}
		inst.allowed = make(map[string]string)
		for i, path := range paths {
			if path == "" {
				log.Warn("allowlisted command not found in the image", "cmd", p.AllowCmds[i])
				continue
			}
			inst.allowed[path] = p.AllowCmds[i]
		}
	}
	m.wg.Add(1)
	go m.keepAlive(inst, log)
	hello := c.Hello()
	log.Info("sandbox started", "template", tpl.Name, "image", orDefault(tpl.Image, m.RuntimeImage()), "duration", time.Since(start).Round(time.Millisecond), "agent", hello.Agent, "agent_pid", hello.PID,
		"agent_uids", hello.UIDs, "command_uid", hello.CommandUID, "command_groups", hello.CommandGroups)
	return inst, nil
}

// sandboxEnv is the environment every sandbox container of template tpl
// gets. Nothing else of the server's environment enters a sandbox. The
// operator's --env (the template's env) replaces a package manager's
// setting of the same name.
func (m *Manager) sandboxEnv(tpl *Template) []string {
	env := []string{"HOME=/tmp"}
	for _, kv := range tpl.pmEnv {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.ContainsFunc(tpl.Env, func(e string) bool { return strings.HasPrefix(e, name+"=") }) {
			env = append(env, kv)
		}
	}
	return append(env, tpl.Env...)
}

// orDefault returns s, or def when s is "".
func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// Package registries, as the package managers of the default image reach
// them.
const (
	pipRegistry = "pypi.org"
	npmRegistry = "registry.npmjs.org"
)

// packageManagerEnv returns the settings that make pip and npm fail at once
// where their registry cannot be reached: with no network (allow nil), or
// when the proxy's allowlist does not have the registry. Without them a
// refused or unresolvable registry costs pip 10-25 s of retries and npm
// 73-78 s (its fetch retries back off from 10 s), past the default timeout.
// Where the registry is allowed they keep their defaults (retries
// included). No retries, and no version or update checks, which would
// reach for the network on every run; the messages stay those of a network
// failure (npm's getaddrinfo EAI_AGAIN), which the exec result explains.
func packageManagerEnv(allow *netproxy.Allowlist) []string {
	reachable := func(host string) bool {
		if allow == nil {
			return false
		}
		_, ok := allow.Match(host, 443)
		return ok
	}
	var env []string
	if !reachable(pipRegistry) {
		env = append(env, "PIP_RETRIES=0", "PIP_DISABLE_PIP_VERSION_CHECK=1")
	}
	if !reachable(npmRegistry) {
		env = append(env, "npm_config_fetch_retries=0", "npm_config_update_notifier=false")
	}
	return env
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
		case <-inst.conn.Done():
			m.removeInstance(inst)
			return
		case <-m.ctx.Done():
			return
		case <-quiet:
			t.Stop()
			quiet = nil
		case <-t.C:
			ctx, cancel := context.WithTimeout(m.ctx, max(m.opts.Lease/2, time.Second))
			err := inst.conn.Ping(ctx)
			cancel()
			if err != nil && m.ctx.Err() == nil {
				inst.conn.Fail(fmt.Errorf("the agent stopped answering: %w", err))
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
		inst.conn.Fail(agentclient.ErrRemoved)
	}
	if inst.box != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		inst.box.Remove(ctx) // it logs what it could not remove
	}
}
