package session

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session/agentproto"
)

// Sandbox is one MCP session's sandbox: a record that outlives any one
// container. Its container starts at the first call that needs it; if the
// container is lost (the agent died, it was removed from outside, or it sat
// idle too long) the next call says so and the call after that gets a fresh
// container.
type Sandbox struct {
	m     *Manager
	id    string
	owner string

	// ctx ends when the sandbox is removed (its session ended); every call
	// into the sandbox is tied to it.
	ctx    context.Context
	cancel context.CancelFunc

	execs    chan struct{} // one token per command allowed to run at once
	inflight atomic.Int64
	lastUsed atomic.Int64 // unix nanos

	closeOnce sync.Once

	mu     sync.Mutex
	cur    *instance
	gen    int
	lost   string // why the last container went away, until a call reports it
	closed bool
}

// instance is one container of a sandbox.
type instance struct {
	containerID string
	name        string
	conn        *conn
	// allowed maps each resolved allowlist entry to its spelling.
	allowed  map[string]string
	reported atomic.Bool // a call has told the model this container is gone
	// quiet, when closed, stops the heartbeats (a test uses it to play a
	// frozen server).
	quiet chan struct{}
	net   *sandboxNet // nil with --network=none
}

// ID returns the sandbox's id, as reported in every tool result.
func (s *Sandbox) ID() string { return s.id }

// Owner returns the caller the sandbox belongs to ("" on stdio).
func (s *Sandbox) Owner() string { return s.owner }

// ContainerID returns the id of the sandbox's current container, or "".
func (s *Sandbox) ContainerID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		return ""
	}
	return s.cur.containerID
}

// begin marks a call in flight and ties ctx to the sandbox's life.
func (s *Sandbox) begin(ctx context.Context) (context.Context, func()) {
	s.inflight.Add(1)
	s.lastUsed.Store(time.Now().UnixNano())
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(s.ctx, func() {
		cancel(errorf(policy.Unavailable, "the session ended, and its sandbox was removed"))
	})
	return ctx, func() {
		stop()
		cancel(nil)
		s.lastUsed.Store(time.Now().UnixNano())
		s.inflight.Add(-1)
	}
}

// ready returns the running container, starting one if there is none.
func (s *Sandbox) ready(ctx context.Context) (*instance, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errorf(policy.Unavailable, "the session ended, and its sandbox was removed; start a new session")
	}
	if s.cur != nil {
		if err := s.cur.conn.err(); err == nil {
			return s.cur, nil
		} else {
			old := s.cur
			s.cur = nil
			if !old.reported.Load() {
				s.lost = fmt.Sprintf("its container stopped (%v)", err)
			}
			s.m.removeInstance(old)
		}
	}
	if s.lost != "" {
		why := s.lost
		s.lost = ""
		return nil, errorf(policy.Unavailable,
			"sandbox %s lost its workspace: %s. Call again: the next call starts a fresh, empty sandbox", s.id, why)
	}
	inst, err := s.m.startInstance(ctx, s)
	if err != nil {
		return nil, err
	}
	s.cur = inst
	return inst, nil
}

// failed notes that a call saw the container go away, so the model has been
// told and the next call starts afresh.
func (s *Sandbox) failed(inst *instance, err error) error {
	if e, ok := AsError(err); ok && e.Code == policy.Unavailable && inst.conn.err() != nil {
		inst.reported.Store(true)
	}
	return err
}

// Exec runs a command. A command that ends by itself is a result whatever
// its exit code; the error is for commands that could not run.
func (s *Sandbox) Exec(ctx context.Context, req ExecRequest) (ExecResult, error) {
	select {
	case s.execs <- struct{}{}:
		defer func() { <-s.execs }()
	default:
		return ExecResult{}, errorf(policy.Busy,
			"%d commands are already running in this sandbox, the most it runs at once; wait for one to finish, or start long work in the background", cap(s.execs))
	}
	ctx, end := s.begin(ctx)
	defer end()
	inst, err := s.ready(ctx)
	if err != nil {
		return ExecResult{}, err
	}
	res, err := inst.conn.exec(ctx, req)
	return res, s.failed(inst, err)
}

// Resolve resolves program names the way exec does (see
// agentproto.ResolveRequest); "" marks a name not found.
func (s *Sandbox) Resolve(ctx context.Context, names []string, cwd string) ([]string, error) {
	ctx, end := s.begin(ctx)
	defer end()
	inst, err := s.ready(ctx)
	if err != nil {
		return nil, err
	}
	out, err := inst.conn.resolve(ctx, names, cwd)
	return out, s.failed(inst, err)
}

// AllowedPrograms returns the resolved command allowlist of the current
// container (resolved program → entry as configured).
func (s *Sandbox) AllowedPrograms(ctx context.Context) (map[string]string, error) {
	ctx, end := s.begin(ctx)
	defer end()
	inst, err := s.ready(ctx)
	if err != nil {
		return nil, err
	}
	return inst.allowed, nil
}

// ReadFile reads up to maxBytes of a file.
func (s *Sandbox) ReadFile(ctx context.Context, path string, offset, length, maxBytes int64) (ReadResult, error) {
	ctx, end := s.begin(ctx)
	defer end()
	inst, err := s.ready(ctx)
	if err != nil {
		return ReadResult{}, err
	}
	res, err := inst.conn.readFile(ctx, path, offset, length, maxBytes)
	return res, s.failed(inst, err)
}

// WriteFile writes (or appends to) a file.
func (s *Sandbox) WriteFile(ctx context.Context, path string, data []byte, appendTo bool, mode uint32) (WriteResult, error) {
	ctx, end := s.begin(ctx)
	defer end()
	inst, err := s.ready(ctx)
	if err != nil {
		return WriteResult{}, err
	}
	res, err := inst.conn.writeFile(ctx, path, data, appendTo, mode)
	return res, s.failed(inst, err)
}

// List lists a directory (or one file).
func (s *Sandbox) List(ctx context.Context, path string, recursive bool, maxEntries int) ([]Entry, bool, error) {
	ctx, end := s.begin(ctx)
	defer end()
	inst, err := s.ready(ctx)
	if err != nil {
		return nil, false, err
	}
	entries, truncated, err := inst.conn.list(ctx, path, recursive, maxEntries)
	return entries, truncated, s.failed(inst, err)
}

// Snapshot archives the workspace into the server's snapshot store.
func (s *Sandbox) Snapshot(ctx context.Context, label string) (SnapshotInfo, error) {
	ctx, end := s.begin(ctx)
	defer end()
	inst, err := s.ready(ctx)
	if err != nil {
		return SnapshotInfo{}, err
	}
	maxBytes, maxEntries, maxDepth := snapshotLimits(s.m.opts.Policy)
	info, err := s.m.snaps.Create(label, s.id, s.owner, func(w io.Writer) error {
		_, err := inst.conn.snapshot(ctx, w, agentproto.Limits{MaxBytes: maxBytes, MaxEntries: maxEntries, MaxDepth: maxDepth})
		return err
	})
	return info, s.failed(inst, err)
}

// close removes the sandbox's container and ends its calls. It runs once;
// a second caller waits until the first is done.
func (s *Sandbox) close() {
	s.closeOnce.Do(func() {
		s.cancel()
		s.mu.Lock()
		s.closed = true
		inst := s.cur
		s.cur = nil
		s.mu.Unlock()
		if inst != nil {
			s.m.removeInstance(inst)
		}
		s.m.log.Info("session: sandbox removed", "sandbox", s.id)
	})
}

// idleFor reports how long the sandbox has had no call in flight, or 0.
func (s *Sandbox) idleFor(now time.Time) time.Duration {
	if s.inflight.Load() > 0 {
		return 0
	}
	return now.Sub(time.Unix(0, s.lastUsed.Load()))
}

// reapIdle removes the container of a sandbox idle for too long; the next
// call reports it and the one after starts afresh.
func (s *Sandbox) reapIdle(idle time.Duration) {
	s.mu.Lock()
	inst := s.cur
	if inst == nil || s.inflight.Load() > 0 {
		s.mu.Unlock()
		return
	}
	s.cur = nil
	s.lost = fmt.Sprintf("it was removed after %s unused (--idle-timeout)", idle.Round(time.Second))
	s.mu.Unlock()
	s.m.removeInstance(inst)
}

// removeContainer force-removes a container and waits until it is gone.
func removeContainer(ctx context.Context, cli *client.Client, id string) error {
	_, err := cli.ContainerRemove(ctx, id, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
	// A conflict means a removal is already in progress (the engine
	// auto-removes a stopped sandbox); wait for it like for ours.
	if err != nil && !isGone(err) && !cerrdefs.IsConflict(err) {
		return err
	}
	// An auto-removing container may still be on its way out.
	for {
		if _, err := cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{}); err != nil {
			if isGone(err) {
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
