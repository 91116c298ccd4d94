package session

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
)

// Replicas: servers that share a cluster (the Kubernetes backend) and a
// state directory serve each other's handles (docs/kubernetes.md,
// "Replicas"). What a handle is lives outside any one server: its record
// in <state>/handles/ (owner, template, label, created; a tombstone once
// it ended) and its running pod, found by its sandbox label. A server that
// gets a call naming a handle it does not hold reads the record, checks
// the owner, and takes the pod's agent over (agent protocol 5's resume,
// with a token every replica derives from the shared key and no sandbox
// can): the server that held it sees its stream cut and takes it back the
// same way at its own next call.

// SharedBackend is what a backend offers for replicas: instances any
// server can find by sandbox and take over (backend.Reattacher).
type SharedBackend interface {
	backend.Reattacher
	// FindSandbox returns the name and generation of the running
	// instance of a sandbox, whichever server started it; ok is false
	// when none runs.
	FindSandbox(ctx context.Context, sandbox string) (name string, gen int, ok bool, err error)
	// RemoveSandbox removes every instance of a sandbox, whichever
	// server holds it (the sandbox ended).
	RemoveSandbox(ctx context.Context, sandbox string) error
}

// handleRecord is a handle as the servers sharing a state directory know
// it: <state>/handles/<id>.json.
type handleRecord struct {
	// Owner is the owner's tag (callerTag), never the caller itself.
	Owner    string    `json:"owner"`
	Template string    `json:"template,omitempty"`
	Label    string    `json:"label,omitempty"`
	From     string    `json:"from,omitempty"`
	Created  time.Time `json:"created"`
	// Ended is set once the handle ended: Why and Snapshot are what a
	// later call naming it is told.
	Ended    bool   `json:"ended,omitempty"`
	Why      string `json:"why,omitempty"`
	Snapshot string `json:"snapshot,omitempty"`
}

// shared returns the backend for replicas, or nil when this server serves
// its own handles only (no ReplicaKey, or a backend that cannot share).
func (m *Manager) shared() SharedBackend {
	if len(m.opts.ReplicaKey) == 0 {
		return nil
	}
	sb, _ := m.backend.(SharedBackend)
	return sb
}

func (m *Manager) mac(what, id string) string {
	h := hmac.New(sha256.New, m.opts.ReplicaKey)
	h.Write([]byte(what + "\x00" + id))
	return hex.EncodeToString(h.Sum(nil))
}

// resumeToken is the token of a sandbox's agent, the same on every
// replica: an HMAC of its id under the replicas' key, which never enters a
// sandbox.
func (m *Manager) resumeToken(id string) string { return m.mac("resume", id) }

// callerTag names an owner in what other replicas and the cluster see: a
// keyed hash (40 hex digits), not the caller's name.
func (m *Manager) callerTag(owner string) string { return m.mac("caller", owner)[:40] }

func (m *Manager) handlePath(id string) (string, bool) {
	if !recordName.MatchString(id) {
		return "", false
	}
	return filepath.Join(m.opts.StateDir, "handles", id+".json"), true
}

// putHandle writes a handle's shared record whole (temporary file, synced,
// renamed), so that a reader sees the old record or the new one.
func (m *Manager) putHandle(id string, rec handleRecord) error {
	path, ok := m.handlePath(id)
	if !ok {
		return fmt.Errorf("session: handle %q cannot name a record", id)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	return err
}

// getHandle reads a handle's shared record; ok is false when there is none.
func (m *Manager) getHandle(id string) (rec handleRecord, ok bool, err error) {
	path, valid := m.handlePath(id)
	if !valid {
		return rec, false, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return rec, false, nil
	}
	if err != nil {
		return rec, false, err
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, false, fmt.Errorf("session: handle record %s: %w", id, err)
	}
	return rec, true, nil
}

// countHandles counts the handles of owner that have not ended, across
// every replica (their shared records).
func (m *Manager) countHandles(owner string) int {
	tag := m.callerTag(owner)
	names, _ := os.ReadDir(filepath.Join(m.opts.StateDir, "handles"))
	n := 0
	for _, e := range names {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		if rec, ok, err := m.getHandle(id); err == nil && ok && !rec.Ended && rec.Owner == tag {
			n++
		}
	}
	return n
}

// adoptShared takes up a handle this server does not hold, from its shared
// record: another caller's, an unknown one and a damaged record are
// NOT_FOUND as a handle never made; an ended one says so. The sandbox is
// registered at once, its takeover running as a transition (calls wait for
// it as for a start). m.mu is held.
func (m *Manager) adoptShared(id, owner string) (*Sandbox, error) {
	rec, ok, err := m.getHandle(id)
	if err != nil {
		m.log.Warn("a handle's shared record cannot be read", "sandbox", id, "err", err)
		return nil, notFound(id)
	}
	if !ok || !hmac.Equal([]byte(rec.Owner), []byte(m.callerTag(owner))) {
		return nil, notFound(id)
	}
	if rec.Ended {
		return nil, endedSandbox{owner: owner, why: rec.Why, snapshot: rec.Snapshot}.err(id)
	}
	tpl, err := m.template(rec.Template)
	if err != nil {
		m.log.Warn("a shared handle's template is not known here; it is served with the default one", "sandbox", id, "template", rec.Template)
		tpl = m.def
	}
	ctx, cancel := context.WithCancel(m.ctx)
	s := &Sandbox{
		m: m, id: id, owner: owner, tpl: tpl, handle: true, label: rec.Label, from: rec.From,
		created: rec.Created, ctx: ctx, cancel: cancel, execs: make(chan struct{}, tpl.Policy.MaxExecs),
	}
	if !tpl.isDefault {
		if err := m.shape(s); err != nil {
			cancel()
			return nil, err
		}
	}
	s.lastUsed.Store(time.Now().UnixNano())
	p := &transition{done: make(chan struct{})}
	s.busy = p
	m.byID[id] = s
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer close(p.done)
		tctx, tcancel := context.WithTimeout(s.ctx, m.opts.StartTimeout)
		defer tcancel()
		inst, gen, err := m.takeOver(tctx, s)
		s.mu.Lock()
		defer s.mu.Unlock()
		s.busy = nil
		if s.closed {
			if inst != nil {
				go m.removeInstance(inst)
			}
			return
		}
		s.gen = max(s.gen, gen)
		if err == nil {
			s.cur = inst
			return
		}
		if !errors.Is(err, backend.ErrGone) {
			m.log.Warn("taking over a shared handle's instance failed", "sandbox", id, "err", err)
		}
		// No instance runs (removed when idle, or lost): the next call
		// starts one from the handle's latest snapshot, or its first.
		s.restoreFrom = rec.From
		s.planRecovery()
		if s.restoreFrom != "" && s.restoreFrom != rec.From {
			s.lost = "was not running (its container was removed when idle, or lost)"
		}
	}()
	m.log.Info("taking up a handle another server made or held", "sandbox", id)
	return s, nil
}

// takeOver takes the running instance of s, wherever it runs, and returns
// it and its generation; backend.ErrGone when none runs.
func (m *Manager) takeOver(ctx context.Context, s *Sandbox) (*instance, int, error) {
	sb := m.shared()
	name, gen, ok, err := sb.FindSandbox(ctx, s.id)
	if err != nil {
		return nil, 0, err
	}
	if !ok {
		return nil, 0, backend.ErrGone
	}
	start := time.Now()
	inst, res, err := m.reattach(ctx, Record{Sandbox: s.id, Container: name, Token: m.resumeToken(s.id)}, s.tpl)
	if err != nil {
		return nil, gen, err
	}
	s.jobSeq.Store(max(s.jobSeq.Load(), inst.conn.MaxJob()))
	m.log.Info("took a sandbox over from another server", "sandbox", s.id, "container", name, "jobs", len(res.Jobs),
		"detached", res.Detached, "cancelled", res.Cancelled, "duration", time.Since(start).Round(time.Millisecond))
	return inst, gen, nil
}

// resumeQuiet is how long a takeover of box stays silent first: none for
// a backend that hands the agent whole frames only (the pod's hub).
func resumeQuiet(box backend.Instance) time.Duration {
	if w, ok := box.(interface{ WholeFrames() bool }); ok && w.WholeFrames() {
		return 0
	}
	return agentproto.ResumeQuiet
}

// takeBack is ready's step for a handle of a server with replicas, before
// it starts a container: the handle may have ended on another replica (its
// tombstone: the call gets that error), or run there (this server takes it
// back). It returns nil, nil when neither: ready starts a container as
// usual. s.mu is not held; s.busy is this call's transition.
func (s *Sandbox) takeBack(ctx context.Context) (*instance, error) {
	m := s.m
	if rec, ok, err := m.getHandle(s.id); err == nil && ok && rec.Ended {
		e := endedSandbox{owner: s.owner, why: rec.Why, snapshot: rec.Snapshot}
		m.endHere(s, e)
		return nil, e.err(s.id)
	}
	inst, gen, err := m.takeOver(ctx, s)
	if err != nil {
		if !errors.Is(err, backend.ErrGone) {
			m.log.Warn("taking a sandbox back from another server failed", "sandbox", s.id, "err", err)
		}
		s.mu.Lock()
		s.gen = max(s.gen, gen)
		s.mu.Unlock()
		return nil, nil
	}
	s.mu.Lock()
	s.gen = max(s.gen, gen)
	s.mu.Unlock()
	return inst, nil
}

// endHere forgets a sandbox another replica ended: from now on it is not
// found (its calls hear that it ended), and what it still has here goes
// in the background (its pod was removed by the other replica).
func (m *Manager) endHere(s *Sandbox, e endedSandbox) {
	m.mu.Lock()
	if m.byID[s.id] != s || s.ending {
		m.mu.Unlock()
		return
	}
	s.ending = true
	m.ended.add(s.id, e)
	m.mu.Unlock()
	s.mu.Lock()
	s.gone = e.err(s.id)
	s.mu.Unlock()
	// In the background: the removal waits for the transition of the
	// call that found the tombstone.
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.remove(s)
	}()
}

// takeBackLocked runs takeBack as a transition of s, for ready: s.mu is
// held, and is released when ok (ready returns inst, err), held again when
// not (no instance runs anywhere: ready goes on to start one).
func (s *Sandbox) takeBackLocked(ctx context.Context) (inst *instance, err error, ok bool) {
	old := s.cur
	s.cur = nil
	p := &transition{done: make(chan struct{})}
	s.busy = p
	s.mu.Unlock()
	if old != nil {
		// Its pod stays if another replica holds it (the kube backend
		// deletes only a pod labelled as this server's).
		s.m.removeInstance(old)
	}
	inst, err = s.takeBack(ctx)
	s.mu.Lock()
	s.busy = nil
	close(p.done)
	switch {
	case s.closed:
		gone := s.gone
		s.mu.Unlock()
		if inst != nil {
			s.m.removeInstance(inst)
		}
		if gone == nil {
			gone = sessionEnded()
		}
		return nil, gone, true
	case err != nil:
		s.mu.Unlock()
		return nil, err, true
	case inst != nil:
		s.cur, s.lost = inst, ""
		s.mu.Unlock()
		return inst, nil, true
	}
	// No instance runs anywhere. If the handle ran before (here or on
	// another replica, whose idle removal saved it), its next container
	// starts from its latest snapshot, and the call says so.
	before := s.restoreFrom
	s.planRecovery()
	switch {
	case s.lost != "":
	case old != nil && !old.reported.Load() && !errors.Is(old.conn.Err(), backend.ErrSuperseded):
		s.lost = fmt.Sprintf("lost its workspace and its jobs: its container stopped (%v)", old.conn.Err())
	case old != nil || s.restoreFrom != before:
		s.lost = "was not running: its container was removed while another server (replica) held it (idle, or lost); its processes and jobs are gone"
	}
	return nil, nil, false
}

// endedElsewhere reports whether another replica ended the handle (its
// shared record is a tombstone), and then ends it here: s.gone is the
// error its calls get. One small file read per call. s.mu is held.
func (s *Sandbox) endedElsewhere() bool {
	rec, ok, err := s.m.getHandle(s.id)
	if err != nil || !ok || !rec.Ended {
		return false
	}
	e := endedSandbox{owner: s.owner, why: rec.Why, snapshot: rec.Snapshot}
	s.gone = e.err(s.id)
	s.mu.Unlock()
	s.m.endHere(s, e)
	s.mu.Lock()
	return true
}
