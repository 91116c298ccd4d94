package session

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
	"github.com/sandbox-mcp/sandbox-mcp/snapshot"
)

// Sandbox is one MCP session's sandbox, or one made by Create (a handle,
// see handles.go): a record that outlives any one container. Its container
// starts at the first call that needs it; if the container is lost (the
// agent died, it was removed from outside, or it sat idle too long) the
// next call says so and the call after that gets a fresh container (a
// handle's next call gets it at once, with a notice).
type Sandbox struct {
	m     *Manager
	id    string
	owner string
	// key is the session's whose own sandbox this is; "" for one made by
	// Create (handle), whose label and template are the caller's.
	key     string
	handle  bool
	label   string
	from    string // the snapshot Create made it from
	created time.Time
	// tpl is the template the sandbox was made from: its containers'
	// image, limits, network, secrets, environment and seed, and the
	// policy its calls are checked against.
	tpl *Template
	// clearShape takes back the sandbox's own allowlist and secrets at
	// the egress proxy (a template's sandbox with a network), or is nil.
	clearShape func()

	// ctx ends when the sandbox is removed (its session ended); every call
	// into the sandbox is tied to it.
	ctx    context.Context
	cancel context.CancelFunc

	execs    chan struct{} // one token per foreground command allowed to run at once
	jobSeq   atomic.Uint64 // the last job id given out
	inflight atomic.Int64
	lastUsed atomic.Int64 // unix nanos

	closeOnce sync.Once

	mu     sync.Mutex
	busy   *transition // a start or an idle save under way, or nil
	cur    *instance
	gen    int
	lost   string // why the last container went away, until a call reports it
	closed bool
	// restoreFrom is the snapshot the next container starts from, after a
	// container was lost (or, for a handle, the one it was made from).
	restoreFrom string
	// notice is what the next call's result tells about how a handle's
	// container came back (TakeNotice).
	notice string
	// gone is the error of a call to a handle that was ended (End,
	// MaxLifetime): set before it is closed.
	gone error
	// ending is set, under Manager.mu, once End or MaxLifetime took the
	// sandbox: it is no longer found.
	ending bool
}

// ID returns the sandbox's id, as reported in every tool result.
func (s *Sandbox) ID() string { return s.id }

// Owner returns the caller the sandbox belongs to ("" on stdio).
func (s *Sandbox) Owner() string { return s.owner }

// ContainerID returns the name of the sandbox's current container (which
// the engine takes wherever it takes an id), or "".
func (s *Sandbox) ContainerID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		return ""
	}
	return s.cur.box.Name()
}

// begin marks a call in flight and ties ctx to the sandbox's life.
func (s *Sandbox) begin(ctx context.Context) (context.Context, func()) {
	s.inflight.Add(1)
	s.lastUsed.Store(time.Now().UnixNano())
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(s.ctx, func() {
		cancel(s.ended())
	})
	return ctx, func() {
		stop()
		cancel(nil)
		s.lastUsed.Store(time.Now().UnixNano())
		s.inflight.Add(-1)
	}
}

// transition is a change of the sandbox's container under way outside s.mu: a
// start (with the restore of its latest snapshot) or an idle removal's save
// of the workspace. done is closed when it has finished and its result is
// in the sandbox (cur, lost, restoreFrom); a call that finds one waits for
// done, or leaves when its own context ends while the change goes on.
type transition struct {
	done chan struct{}
}

// call runs f on the sandbox's running container (started if there is
// none) as one call: in flight, tied to the sandbox's life, and an error f
// returns passed through failed, so a lost container is reported once.
func call[T any](ctx context.Context, s *Sandbox, f func(context.Context, *instance) (T, error)) (T, error) {
	ctx, end := s.begin(ctx)
	defer end()
	inst, err := s.ready(ctx)
	if err != nil {
		var zero T
		return zero, err
	}
	res, err := f(ctx, inst)
	return res, s.failed(inst, err)
}

// awaitTransition waits, with s.mu held, until no start or idle save is
// under way. It returns with s.mu held, or, when ctx ends first, with s.mu
// released and ctx's cause.
func (s *Sandbox) awaitTransition(ctx context.Context) error {
	for s.busy != nil {
		p := s.busy
		s.mu.Unlock()
		select {
		case <-p.done:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		s.mu.Lock()
	}
	return nil
}

// ready returns the running container, starting one if there is none. The
// start runs outside s.mu, so a call waiting for it can give up.
func (s *Sandbox) ready(ctx context.Context) (*instance, error) {
	s.mu.Lock()
	if err := s.awaitTransition(ctx); err != nil {
		return nil, err
	}
	if s.closed {
		gone := s.gone
		s.mu.Unlock()
		if gone != nil {
			return nil, gone
		}
		return nil, errcode.Errorf(errcode.Unavailable, "the session ended, and its sandbox was removed; start a new session")
	}
	if s.handle && s.m.shared() != nil && s.endedElsewhere() {
		err := s.gone
		s.mu.Unlock()
		return nil, err
	}
	if s.handle && s.m.shared() != nil && (s.cur == nil || s.cur.conn.Err() != nil) {
		// Another replica may hold the handle now (it took the agent
		// over, which cut this server's stream), or have ended it.
		if inst, err, ok := s.takeBackLocked(ctx); ok {
			return inst, err
		}
	}
	var old *instance // a container found dead, removed outside s.mu
	if s.cur != nil {
		if err := s.cur.conn.Err(); err == nil {
			inst := s.cur
			s.mu.Unlock()
			s.record(inst)
			return inst, nil
		} else {
			old = s.cur
			s.cur = nil
			if !old.reported.Load() {
				s.lost = fmt.Sprintf("lost its workspace and its jobs: its container stopped (%v)", err)
			}
			s.planRecovery()
		}
	}
	if s.lost != "" && s.handle {
		// A handle outlives its containers: this call starts the next
		// one, and its result says what happened.
		s.notice = fmt.Sprintf("sandbox %s %s. This call started it again: %s", s.id, s.lost, s.nextStartNow())
		s.lost = ""
	}
	if s.lost != "" {
		why := s.lost
		s.lost = ""
		err := errcode.Errorf(errcode.Unavailable, "sandbox %s %s. Call again: %s", s.id, why, s.nextStart())
		s.mu.Unlock()
		if old != nil {
			s.m.removeInstance(old)
		}
		return nil, err
	}
	s.gen++
	gen, from := s.gen, s.restoreFrom
	s.restoreFrom = ""
	p := &transition{done: make(chan struct{})}
	s.busy = p
	s.mu.Unlock()
	defer close(p.done)
	if old != nil {
		s.m.removeInstance(old)
	}
	inst, err := s.start(ctx, gen, from)
	s.mu.Lock()
	closed := s.closed
	if !closed && inst != nil {
		s.cur = inst
	}
	s.busy = nil
	s.mu.Unlock()
	if closed && inst != nil {
		// The session ended while the container started; close waits
		// for done, so the container is gone when close returns.
		s.m.removeInstance(inst)
		return nil, s.ended()
	}
	if err != nil {
		s.mu.Lock()
		s.notice = "" // the error says what happened
		s.mu.Unlock()
		return nil, err
	}
	s.record(inst)
	return inst, nil
}

// start starts generation gen of the sandbox's container, restoring the
// snapshot from into it if from is set. A restore that fails still returns
// the started instance with its error: the sandbox keeps it, empty.
func (s *Sandbox) start(ctx context.Context, gen int, from string) (*instance, error) {
	if from == "" {
		return s.m.newInstance(ctx, s.id, gen, s.tpl)
	}
	inst, err := s.m.startInstance(ctx, s.id, gen, s.tpl)
	if err != nil {
		return nil, err
	}
	if _, _, err := s.restoreInto(ctx, inst, from); err != nil {
		s.m.log.Warn("restoring the latest snapshot into a fresh sandbox failed", "sandbox", s.id, "snapshot", from, "err", err)
		return inst, errcode.Errorf(errcode.Unavailable, "sandbox %s started afresh, but restoring its latest snapshot %s failed (%v); the workspace is empty. Call sandbox_restore to try again", s.id, from, err)
	}
	s.m.log.Info("fresh sandbox restored from its latest snapshot", "sandbox", s.id, "snapshot", from)
	return inst, nil
}

// planRecovery makes the next container start from the sandbox's latest
// snapshot, if it has one. s.mu is held.
func (s *Sandbox) planRecovery() {
	if s.tpl.Policy.ReadOnly {
		return // the workspace never changed: a fresh one is the same
	}
	if latest, ok := s.snaps().Latest(s.id); ok {
		s.restoreFrom = latest.ID
	}
}

// nextStart says what the next call does after a container was lost. s.mu
// is held.
func (s *Sandbox) nextStart() string {
	if s.restoreFrom == "" {
		return "the next call starts a fresh, empty sandbox"
	}
	return fmt.Sprintf("the next call starts a fresh sandbox from its latest snapshot %s (files only: no job survives)", s.restoreFrom)
}

// nextStartNow says what the call that starts a handle's next container
// does. s.mu is held.
func (s *Sandbox) nextStartNow() string {
	if s.restoreFrom == "" {
		return "its workspace is new and empty"
	}
	return fmt.Sprintf("its workspace was restored from snapshot %s (files only: no process or job survived)", s.restoreFrom)
}

// ended is the error of a call whose sandbox was removed while it ran.
func (s *Sandbox) ended() error {
	s.mu.Lock()
	gone := s.gone
	s.mu.Unlock()
	if gone != nil {
		return gone
	}
	return sessionEnded()
}

// failed notes that a call saw the container go away, so the model is told
// (here, with what happens next) and the next call starts afresh.
func (s *Sandbox) failed(inst *instance, err error) error {
	if err != nil && (s.ctx.Err() != nil || s.isClosed()) {
		// The sandbox went with its session: whatever broke the call
		// (its container removed under it), there is no next call here.
		return s.ended()
	}
	if e, ok := errcode.As(err); ok && e.Code == errcode.Unavailable && inst.conn.Err() != nil {
		if errors.Is(inst.conn.Err(), backend.ErrSuperseded) {
			return errcode.Errorf(errcode.Unavailable, "another server (replica) took sandbox %s over while this call ran: two calls on one sandbox through two replicas at once cut each other. "+
				"Its processes and jobs run on (a command this call ran goes on as a job: sandbox_job lists it); call again", s.id)
		}
		if inst.reported.Swap(true) {
			return err
		}
		next := "the next call starts a fresh, empty sandbox"
		if !s.tpl.Policy.ReadOnly {
			if latest, ok := s.snaps().Latest(s.id); ok {
				next = fmt.Sprintf("the next call starts a fresh sandbox from its latest snapshot %s (files only: no job survives)", latest.ID)
			}
		}
		return errcode.Errorf(errcode.Unavailable, "sandbox %s stopped (%v); its workspace is lost and its jobs ended. Call again: %s", s.id, inst.conn.Err(), next)
	}
	return err
}

// isClosed reports whether the sandbox was closed or let go of (detach).
func (s *Sandbox) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// sessionEnded is the error of a call whose sandbox was removed with its
// session (an HTTP DELETE, the server stopping) while it ran.
func sessionEnded() error {
	return errcode.Errorf(errcode.Unavailable, "the session ended while this call ran, and its sandbox was removed with every process in it; "+
		"calling again in this session cannot help: start a new session")
}

// Exec runs a command. A command that ends by itself is a result whatever
// its exit code; the error is for commands that could not run.
func (s *Sandbox) Exec(ctx context.Context, req ExecRequest) (ExecResult, error) {
	select {
	case s.execs <- struct{}{}:
		defer func() { <-s.execs }()
	default:
		return ExecResult{}, errcode.Errorf(errcode.Busy,
			"%d commands are already running in this sandbox, the most it runs at once (--max-jobs); wait for one to finish (sandbox_job with wait_ms), or end one (sandbox_job with signal KILL)", cap(s.execs))
	}
	return call(ctx, s, func(ctx context.Context, inst *instance) (ExecResult, error) {
		jo := s.jobOpts()
		if req.OnStart != nil {
			req.OnStart(strconv.FormatUint(jo.ID, 10))
		}
		start := time.Now()
		res, err := inst.conn.Exec(ctx, req, jo)
		res.NetworkRefused = s.m.refusedSince(s.id, start)
		return res, err
	})
}

// refusedSince returns what the egress proxy refused the sandbox id at or
// after t (nil without a proxy).
func (m *Manager) refusedSince(id string, t time.Time) []NetworkRefusal {
	if m.proxy == nil {
		return nil
	}
	var out []NetworkRefusal
	for _, r := range m.proxy.Refusals(id, t) {
		out = append(out, NetworkRefusal{Host: r.Host, Port: r.Port, Reason: r.Reason, Unlisted: r.Unlisted})
	}
	return out
}

// Resolve resolves program names the way exec does (see
// agentproto.ResolveRequest); "" marks a name not found.
func (s *Sandbox) Resolve(ctx context.Context, names []string, cwd string) ([]string, error) {
	return call(ctx, s, func(ctx context.Context, inst *instance) ([]string, error) {
		return inst.conn.Resolve(ctx, names, cwd)
	})
}

// Program is what a command would run as in one container, as one call
// found it: the program (or shell) resolved, and that container's resolved
// command allowlist, so that the policy decides on one container's answer.
type Program struct {
	// Name is the shell a command line runs through; for argv, the
	// name asked about.
	Name string
	// Path is what Name resolves to; "" when the container has no such
	// program.
	Path string
	// Allowed is the container's resolved command allowlist (resolved
	// program → entry as configured); nil without an allowlist.
	Allowed map[string]string
}

// Program answers in one call what a command would run as: for a command
// line (shell), the shell it runs through (see Shell); else what name
// resolves to from cwd the way exec does it; and, with either, the resolved
// allowlist of the same container.
func (s *Sandbox) Program(ctx context.Context, name, cwd string, shell bool) (Program, error) {
	return call(ctx, s, func(ctx context.Context, inst *instance) (Program, error) {
		pr := Program{Name: name, Allowed: inst.allowed}
		if shell {
			sh, err := inst.shellOf(ctx)
			pr.Name, pr.Path = sh[0], sh[1]
			return pr, err
		}
		paths, err := inst.conn.Resolve(ctx, []string{name}, cwd)
		if err != nil {
			return pr, err
		}
		if len(paths) != 1 {
			return pr, fmt.Errorf("session: the sandbox resolved %d names for 1", len(paths))
		}
		pr.Path = paths[0]
		return pr, nil
	})
}

// Shell returns the shell a command string runs through: the first of
// policy.Shells the container has, by name and resolved path ("" when it
// has none).
func (s *Sandbox) Shell(ctx context.Context) (name, path string, err error) {
	sh, err := call(ctx, s, func(ctx context.Context, inst *instance) ([2]string, error) {
		return inst.shellOf(ctx)
	})
	return sh[0], sh[1], err
}

// shellOf returns the container's shell, name and path. It is looked up
// once per container: the programs on the agent's PATH are outside the
// workspace, on a read-only root filesystem.
func (inst *instance) shellOf(ctx context.Context) ([2]string, error) {
	if sh := inst.shell.Load(); sh != nil {
		return *sh, nil
	}
	found, err := inst.conn.Resolve(ctx, policy.Shells, ".")
	if err != nil {
		return [2]string{}, err
	}
	sh := [2]string{policy.Shells[0], ""}
	for i, p := range found {
		if p != "" {
			sh = [2]string{policy.Shells[i], p}
			break
		}
	}
	inst.shell.Store(&sh)
	return sh, nil
}

// ReadFile reads up to maxBytes of a file.
func (s *Sandbox) ReadFile(ctx context.Context, path string, offset, length, maxBytes int64) (ReadResult, error) {
	return call(ctx, s, func(ctx context.Context, inst *instance) (ReadResult, error) {
		return inst.conn.ReadFile(ctx, path, offset, length, maxBytes)
	})
}

// WriteFile writes (or appends to) a file.
func (s *Sandbox) WriteFile(ctx context.Context, path string, data []byte, appendTo bool, mode uint32) (WriteResult, error) {
	return s.WriteFileFrom(ctx, path, bytes.NewReader(data), int64(len(data)), appendTo, mode)
}

// WriteFileFrom writes (or appends to) a file the size bytes read from r,
// streamed to the sandbox without a copy of the whole content. If r fails
// or holds fewer bytes, the file is left as it was and r's error returned.
func (s *Sandbox) WriteFileFrom(ctx context.Context, path string, r io.Reader, size int64, appendTo bool, mode uint32) (WriteResult, error) {
	return call(ctx, s, func(ctx context.Context, inst *instance) (WriteResult, error) {
		return inst.conn.WriteFile(ctx, path, r, size, appendTo, mode)
	})
}

// List lists a directory (or one file).
func (s *Sandbox) List(ctx context.Context, path string, o ListOptions) (ListResult, error) {
	return call(ctx, s, func(ctx context.Context, inst *instance) (ListResult, error) {
		return inst.conn.List(ctx, path, o)
	})
}

// snaps is the sandbox owner's view of the snapshot store.
func (s *Sandbox) snaps() *snapshot.View { return s.m.snaps.For(s.owner) }

// Snapshot archives the workspace into the server's snapshot store.
func (s *Sandbox) Snapshot(ctx context.Context, label string) (snapshot.Info, error) {
	return call(ctx, s, func(ctx context.Context, inst *instance) (snapshot.Info, error) {
		return s.snaps().Create(label, s.id, func(w io.Writer) error {
			_, err := inst.conn.Snapshot(ctx, w, snapshotLimits(s.tpl.Policy))
			return err
		})
	})
}

// RestoreResult is what a restore did.
type RestoreResult = agentproto.RestoreResult

// Restore replaces the workspace with a snapshot: one of this sandbox's, or
// (a fork) one another sandbox of the same owner made. Another owner's
// snapshot is not found.
func (s *Sandbox) Restore(ctx context.Context, id string) (snapshot.Info, RestoreResult, error) {
	if d := s.tpl.Policy.CanWrite(); !d.Allow {
		return snapshot.Info{}, RestoreResult{}, d.Err()
	}
	type restored struct {
		info snapshot.Info
		res  RestoreResult
	}
	r, err := call(ctx, s, func(ctx context.Context, inst *instance) (restored, error) {
		info, res, err := s.restoreInto(ctx, inst, id)
		if err != nil {
			return restored{info: info}, err
		}
		return restored{info, res}, nil
	})
	return r.info, r.res, err
}

// restoreInto streams one of the owner's snapshots into an instance's
// workspace.
func (s *Sandbox) restoreInto(ctx context.Context, inst *instance, id string) (snapshot.Info, RestoreResult, error) {
	info, f, err := s.snaps().Open(id)
	if errors.Is(err, snapshot.ErrNotFound) {
		return info, RestoreResult{}, errcode.Errorf(errcode.NotFound, "no snapshot %q belongs to you; sandbox_snapshot makes one, and sandbox_snapshot with list: true shows yours", id)
	}
	if err != nil {
		return info, RestoreResult{}, err
	}
	defer f.Close()
	res, err := inst.conn.Restore(ctx, f, snapshotLimits(s.tpl.Policy))
	return info, res, err
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
		p := s.busy
		s.mu.Unlock()
		if p != nil {
			// A start, cancelled with s.ctx, removes what it made; an
			// idle save ends with s.ctx too.
			<-p.done
		}
		if inst != nil {
			s.m.removeInstance(inst)
		}
		if s.clearShape != nil {
			s.clearShape()
		}
		s.forget()
		s.m.log.Info("sandbox removed", "sandbox", s.id)
	})
}

// idleFor reports how long the sandbox has had no call in flight, or 0.
func (s *Sandbox) idleFor(now time.Time) time.Duration {
	if s.inflight.Load() > 0 {
		return 0
	}
	return now.Sub(time.Unix(0, s.lastUsed.Load()))
}
