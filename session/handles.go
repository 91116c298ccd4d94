package session

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/snapshot"
)

// A handle is a sandbox's id, made by Create, owned by the caller that
// made it, and not tied to any MCP session or connection: any call of that
// caller can name it. It lives until End, until its idle timeout (its
// workspace is saved, its container removed, and its next call starts it
// again from that snapshot), or until Options.MaxLifetime (saved, then
// ended). A session's own sandbox (Manager.Sandbox) is one too, but it
// ends with its session.

// Bounds on what Create takes.
const (
	// MaxLabelBytes bounds a sandbox's label.
	MaxLabelBytes = 128
	// endedKept is how many ended sandboxes are remembered, so that a
	// call naming one says it ended (and from which snapshot to start
	// again) rather than that it never was.
	endedKept = 1024
	// statusJobsWait bounds List's question to a running sandbox's agent
	// about its jobs.
	statusJobsWait = 2 * time.Second
)

// States of a sandbox, as List reports them.
const (
	StateNew       = "new"        // made, no container yet: its first call starts one
	StateStarting  = "starting"   // its container is starting
	StateRunning   = "running"    // its container is up
	StateIdleSaved = "idle-saved" // its container was removed; its next call starts one from its saved workspace
	StateLost      = "lost"       // its container went away; its next call says so and starts afresh
)

// CreateOptions say what Create makes.
type CreateOptions struct {
	// Label is the caller's name for the sandbox (not unique; at most
	// MaxLabelBytes).
	Label string
	// Template names the operator's template the sandbox is made from;
	// "" is the default one.
	Template string
	// Snapshot, if set, is one of the owner's snapshots the sandbox's
	// first container starts from: its id, a label no other snapshot of
	// the owner has, or snapshot.Latest.
	Snapshot string
}

// SandboxInfo is one sandbox as List reports it.
type SandboxInfo struct {
	Handle   string
	Label    string
	Template string
	State    string
	// Session is true for the sandbox of an MCP session (made by a call
	// without a handle, ended with its session).
	Session  bool
	Created  time.Time
	LastUsed time.Time
	// Jobs counts the jobs running, asked of a running container's agent
	// within statusJobsWait; -1 when it did not answer in time. A
	// sandbox without a running container has none.
	Jobs int
	// From is the snapshot Create made it from ("" for none).
	From string
}

// endedSandbox is what is remembered of an ended sandbox.
type endedSandbox struct {
	owner    string
	why      string // "was ended by sandbox_end", ...
	snapshot string // the snapshot its workspace was saved as, or ""
}

// endedBook remembers the last endedKept sandboxes ended. Its methods are
// called under Manager.mu.
type endedBook struct {
	byID  map[string]endedSandbox
	order []string
}

func (b *endedBook) add(id string, e endedSandbox) {
	if b.byID == nil {
		b.byID = make(map[string]endedSandbox)
	}
	if _, ok := b.byID[id]; !ok {
		b.order = append(b.order, id)
	}
	b.byID[id] = e
	for len(b.order) > endedKept {
		delete(b.byID, b.order[0])
		b.order = b.order[1:]
	}
}

// notFound is the error for a handle that is not owner's: the same for a
// handle never made, another caller's, and one of owner's that ended long
// ago, so that it tells a caller nothing about other callers' sandboxes.
func notFound(id string) error {
	return errcode.Errorf(errcode.NotFound,
		"no sandbox %q belongs to you; sandbox_status lists yours and sandbox_create makes one (or omit \"sandbox\" to use this session's own)", clipHandle(id))
}

// clipHandle bounds what an error quotes of a handle the caller gave.
func clipHandle(id string) string {
	if len(id) > 64 {
		return id[:64] + "..."
	}
	return id
}

// endedError is the error for a call naming one of its caller's ended
// sandboxes.
func (e endedSandbox) err(id string) error {
	msg := fmt.Sprintf("sandbox %s %s", id, e.why)
	if e.snapshot != "" {
		msg += fmt.Sprintf("; its workspace was saved as snapshot %s: sandbox_create with snapshot %q starts a new sandbox from it", e.snapshot, e.snapshot)
	} else {
		msg += "; sandbox_create makes a new one"
	}
	return errcode.Errorf(errcode.NotFound, "%s", msg)
}

// Create makes a sandbox for owner that no session owns: its handle (its
// id) names it in any call of owner's until End, its idle timeout or
// Options.MaxLifetime. Its container starts at its first call, from
// o.Snapshot if set. Past --max-sandboxes or owner's share
// (--max-sandboxes-per-caller) it is BUSY.
func (m *Manager) Create(ctx context.Context, owner string, o CreateOptions) (*Sandbox, error) {
	tpl, err := m.template(o.Template)
	if err != nil {
		return nil, err
	}
	if err := m.checkTemplateImage(ctx, tpl); err != nil {
		return nil, err
	}
	if len(o.Label) > MaxLabelBytes || !utf8.ValidString(o.Label) || strings.ContainsFunc(o.Label, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return nil, errcode.Errorf(errcode.InvalidArgument, "label must be valid UTF-8 text of at most %d bytes without control characters", MaxLabelBytes)
	}
	var from string
	if o.Snapshot != "" {
		if d := tpl.Policy.CanWrite(); !d.Allow {
			return nil, d.Err()
		}
		id, err := m.snaps.For(owner).Resolve(o.Snapshot)
		if err != nil {
			return nil, err
		}
		if _, err := m.snaps.For(owner).Get(id); errors.Is(err, snapshot.ErrNotFound) {
			return nil, errcode.Errorf(errcode.NotFound, "no snapshot %q belongs to you; sandbox_snapshot with list: true shows yours", id)
		} else if err != nil {
			return nil, err
		}
		from = id
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, errcode.Errorf(errcode.Unavailable, "the server is shutting down")
	}
	if _, err := m.room(owner, nil); err != nil {
		return nil, err
	}
	if share := m.opts.MaxSandboxesPerCaller; m.shared() != nil && share > 0 && m.countHandles(owner) >= share {
		// Counted across the replicas, from the handles' shared
		// records: two creates on two replicas at once may both pass.
		return nil, errcode.Errorf(errcode.Busy, "you already hold %d sandboxes, the most one caller may (--max-sandboxes-per-caller); end one with sandbox_end (sandbox_status lists them), then try again", share)
	}
	s, err := m.newSandbox(owner, "", tpl, from == "")
	if err != nil {
		return nil, err
	}
	s.handle, s.label, s.restoreFrom, s.from = true, o.Label, from, from
	if m.shared() != nil {
		rec := handleRecord{Owner: m.callerTag(owner), Template: tpl.Name, Label: o.Label, From: from, Created: s.created}
		if err := m.putHandle(s.id, rec); err != nil {
			delete(m.byID, s.id)
			go s.close()
			return nil, errcode.Errorf(errcode.Unavailable, "cannot write the sandbox's record in the shared state directory: %v", err)
		}
	}
	m.log.Info("sandbox created", "sandbox", s.id, "template", tpl.Name, "snapshot", from)
	return s, nil
}

// Find returns owner's sandbox id, or a NOT_FOUND error: the same message
// for a handle never made and another caller's, and for one of owner's
// that ended, what ended it and the snapshot to start again from.
func (m *Manager) Find(id, owner string) (*Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.findLocked(id, owner)
}

func (m *Manager) findLocked(id, owner string) (*Sandbox, error) {
	if s := m.byID[id]; s != nil && s.owner == owner && !s.ending {
		return s, nil
	}
	if e, ok := m.ended.byID[id]; ok && e.owner == owner {
		return nil, e.err(id)
	}
	if m.shared() != nil && m.byID[id] == nil && !m.closed {
		return m.adoptShared(id, owner)
	}
	return nil, notFound(id)
}

// List returns owner's sandboxes, oldest first. It starts no container and
// counts as no use of any sandbox: asking a running one's agent about its
// jobs takes at most statusJobsWait.
func (m *Manager) List(ctx context.Context, owner string) []SandboxInfo {
	m.mu.Lock()
	var mine []*Sandbox
	for _, s := range m.byID {
		if s.owner == owner && !s.ending {
			mine = append(mine, s)
		}
	}
	m.mu.Unlock()
	slices.SortFunc(mine, func(a, b *Sandbox) int { return a.created.Compare(b.created) })
	out := make([]SandboxInfo, len(mine))
	ctx, cancel := context.WithTimeout(ctx, statusJobsWait)
	defer cancel()
	var wg sync.WaitGroup
	for i, s := range mine {
		var inst *instance
		out[i], inst = s.info()
		if inst != nil {
			wg.Go(func() { out[i].Jobs = runningJobs(ctx, inst, 2*s.tpl.Policy.MaxExecs+1) })
		}
	}
	wg.Wait()
	return out
}

// runningJobs counts the jobs running in inst, or -1 if its agent does not
// answer before ctx ends.
func runningJobs(ctx context.Context, inst *instance, max int) int {
	jobs, err := inst.conn.Jobs(ctx, max)
	if err != nil {
		return -1
	}
	n := 0
	for _, j := range jobs {
		if j.State == agentproto.JobRunning {
			n++
		}
	}
	return n
}

// info describes the sandbox, and returns its running container, if any.
func (s *Sandbox) info() (SandboxInfo, *instance) {
	s.mu.Lock()
	defer s.mu.Unlock()
	in := SandboxInfo{
		Handle: s.id, Label: s.label, Template: s.tpl.Name, Session: !s.handle,
		Created: s.created, LastUsed: time.Unix(0, s.lastUsed.Load()), From: s.from,
	}
	if in.Template == "" {
		in.Template = "default"
	}
	var up *instance
	switch {
	case s.busy != nil && s.lost != "":
		in.State = StateIdleSaved // its workspace is being saved
	case s.busy != nil:
		in.State = StateStarting
	case s.cur != nil && s.cur.conn.Err() == nil:
		in.State, up = StateRunning, s.cur
	case s.cur != nil:
		in.State = StateLost
	case s.restoreFrom != "" && s.gen > 0:
		in.State = StateIdleSaved
	case s.lost != "":
		in.State = StateLost
	default:
		in.State = StateNew
	}
	return in, up
}

// End ends owner's sandbox id: its calls in flight end, its container is
// removed, and later calls naming it get NOT_FOUND saying it ended. With
// snapshotFirst its workspace is saved first, and End returns that
// snapshot (nil if the sandbox never started: there is nothing to save);
// if the save fails, the sandbox is not ended.
func (m *Manager) End(ctx context.Context, id, owner string, snapshotFirst bool) (*snapshot.Info, error) {
	s, err := m.Find(id, owner)
	if err != nil {
		return nil, err
	}
	var saved *snapshot.Info
	if snapshotFirst {
		if saved, err = s.save(ctx, "before sandbox_end"); err != nil {
			return nil, err
		}
	}
	if !m.end(s, "was ended by sandbox_end", saved) {
		// Ended meanwhile (another call, its lifetime, the server
		// stopping): say how, as a later call would hear it.
		if _, err := m.Find(id, owner); err != nil {
			return nil, err
		}
		return nil, notFound(id)
	}
	return saved, nil
}

// save snapshots the workspace for the end of the sandbox: the running
// container's; the snapshot an idle removal saved, if its container is
// gone; nothing (nil) if it never started.
func (s *Sandbox) save(ctx context.Context, label string) (*snapshot.Info, error) {
	s.mu.Lock()
	if err := s.awaitTransition(ctx); err != nil {
		return nil, err
	}
	up := s.cur != nil && s.cur.conn.Err() == nil
	pending := s.restoreFrom
	s.mu.Unlock()
	switch {
	case up:
		info, err := s.Snapshot(ctx, label)
		if err != nil {
			return nil, err
		}
		return &info, nil
	case pending != "":
		info, err := s.snaps().Get(pending)
		if err != nil {
			return nil, err
		}
		return &info, nil
	}
	return nil, nil
}

// end takes the sandbox out of the registry (remembering why, and the
// snapshot saved, for later calls naming it), removes its container and
// reports whether it was the one to end it.
func (m *Manager) end(s *Sandbox, why string, saved *snapshot.Info) bool {
	m.mu.Lock()
	if m.byID[s.id] != s || s.ending || m.closed {
		m.mu.Unlock()
		return false
	}
	s.ending = true
	if s.key != "" && m.byKey[s.key] == s {
		delete(m.byKey, s.key) // the session's next call makes a new one
	}
	e := endedSandbox{owner: s.owner, why: why}
	if saved != nil {
		e.snapshot = saved.ID
	}
	m.ended.add(s.id, e)
	m.mu.Unlock()
	if sb := m.shared(); s.handle && sb != nil {
		defer func() {
			// Another replica may hold its pod: it goes too.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := sb.RemoveSandbox(ctx, s.id); err != nil {
				m.log.Warn("removing an ended sandbox's pods held by another replica failed", "sandbox", s.id, "err", err)
			}
		}()
		// Every replica's next call naming it hears that it ended.
		rec, _, _ := m.getHandle(s.id)
		rec.Owner, rec.Ended, rec.Why, rec.Snapshot = m.callerTag(s.owner), true, why, e.snapshot
		if err := m.putHandle(s.id, rec); err != nil {
			m.log.Warn("the ended sandbox's shared record could not be written; other replicas may take it up again", "sandbox", s.id, "err", err)
		}
	}
	s.mu.Lock()
	s.gone = e.err(s.id)
	s.mu.Unlock()
	m.remove(s)
	m.log.Info("sandbox ended", "sandbox", s.id, "why", why, "snapshot", e.snapshot)
	return true
}

// expire ends a sandbox that reached Options.MaxLifetime, saving its
// workspace first (within idleSnapshotTimeout): it ends even when the
// save fails.
func (m *Manager) expire(s *Sandbox) {
	ctx, cancel := context.WithTimeout(s.ctx, idleSnapshotTimeout(s.tpl.Policy))
	defer cancel()
	why := fmt.Sprintf("ended after %s, its most (--max-sandbox-lifetime)", m.opts.MaxLifetime)
	var saved *snapshot.Info
	if !s.tpl.Policy.ReadOnly {
		var err error
		if saved, err = s.save(ctx, "auto: at --max-sandbox-lifetime"); err != nil {
			m.log.Warn("saving the workspace of a sandbox at its lifetime failed", "sandbox", s.id, "err", err)
			why += fmt.Sprintf(", and saving its workspace failed (%v)", err)
		}
	}
	m.end(s, why, saved)
}

// TakeNotice returns, once, what the model should know about what
// happened to the sandbox before the call that just ran (its container
// was removed and started again from its saved workspace), or "".
func (s *Sandbox) TakeNotice() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.notice
	s.notice = ""
	return n
}

// Info describes the sandbox as List does, without asking about its jobs.
func (s *Sandbox) Info() SandboxInfo {
	in, _ := s.info()
	return in
}
