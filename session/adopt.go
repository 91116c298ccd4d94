package session

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agentclient"
	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
)

// adoptedKey is the registry key of a sandbox taken back from the records:
// no MCP session holds it any more, so it is reached by its id (and reaped
// when idle, or removed when the server stops).
func adoptedKey(id string) string { return "adopted-" + id }

// adopt opens the slot's records, if the server keeps them, and takes back
// every sandbox they name: each is in the registry at once, its
// re-adoption running in the background as a transition (calls wait for
// it, as for a start). A sandbox whose container runs and whose agent
// answers comes back whole (processes, jobs and their output); one whose
// container is gone comes back from its latest snapshot at its next call,
// which says so. Called once by NewManager.
func (m *Manager) adopt() error {
	if m.opts.Slot == nil {
		return nil
	}
	recs, err := OpenRecords(m.opts.Slot)
	if err != nil {
		return err
	}
	m.records = recs
	list, err := recs.List()
	if err != nil {
		m.log.Warn("some sandbox records could not be read; their sandboxes are not taken back", "err", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, rec := range list {
		if m.byID[rec.Sandbox] != nil {
			continue
		}
		tpl, err := m.template(rec.Template)
		if err != nil {
			// The operator removed the template: the sandbox comes
			// back in the default shape rather than not at all.
			m.log.Warn("a recorded sandbox's template is gone; it is taken back with the default one", "sandbox", rec.Sandbox, "template", rec.Template)
			tpl = m.def
		}
		ctx, cancel := context.WithCancel(m.ctx)
		s := &Sandbox{
			m:       m,
			id:      rec.Sandbox,
			owner:   rec.Owner,
			tpl:     tpl,
			handle:  rec.Handle,
			label:   rec.Label,
			created: rec.Created,
			ctx:     ctx,
			cancel:  cancel,
			execs:   make(chan struct{}, tpl.Policy.MaxExecs),
			gen:     rec.Generation,
		}
		if s.created.IsZero() {
			s.created = time.Now()
		}
		if !tpl.isDefault {
			if err := m.shape(s); err != nil {
				cancel()
				m.log.Warn("a recorded sandbox could not be given its template's network; it is not taken back", "sandbox", rec.Sandbox, "err", err)
				continue
			}
		}
		m.restoreLayers(rec)
		s.lastUsed.Store(time.Now().UnixNano())
		p := &transition{done: make(chan struct{})}
		s.busy = p
		if !s.handle {
			// Its session is gone with the last server: only calls
			// naming it by id reach it, and the reaper ends it when
			// idle, as a session's.
			s.key = adoptedKey(s.id)
			m.byKey[s.key] = s
		}
		m.byID[s.id] = s
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			s.readopt(rec, p)
		}()
	}
	if len(list) > 0 {
		m.log.Info("taking back the sandboxes of the last server on this state slot", "slot", m.opts.Slot.Number(), "sandboxes", len(list))
	}
	return nil
}

// restoreLayers gives the proxy a recorded sandbox's allowlist changes
// again: its drops first (narrowing wins), then its approvals.
func (m *Manager) restoreLayers(rec Record) {
	if m.proxy == nil || (len(rec.Dropped) == 0 && !rec.Offline && len(rec.Approved) == 0) {
		return
	}
	if err := m.proxy.Narrow(rec.Sandbox, rec.Dropped, rec.Offline); err != nil {
		// Never wider than it was: what cannot be dropped again makes
		// it offline.
		m.log.Warn("a recorded sandbox's dropped hosts could not be restored; it goes offline", "sandbox", rec.Sandbox, "err", err)
		m.proxy.Narrow(rec.Sandbox, nil, true)
	}
	for _, e := range rec.Approved {
		host, port, err := net.SplitHostPort(e)
		n, perr := strconv.Atoi(port)
		if err == nil && perr == nil {
			err = m.proxy.Approve(rec.Sandbox, host, n)
		}
		if err != nil || perr != nil {
			m.log.Warn("a recorded sandbox's approved host could not be restored", "sandbox", rec.Sandbox, "host", e, "err", errors.Join(err, perr))
		}
	}
}

// readopt takes the sandbox's container back, or plans its restore from
// its latest snapshot, and ends the transition p.
func (s *Sandbox) readopt(rec Record, p *transition) {
	defer close(p.done)
	m := s.m
	ctx, cancel := context.WithTimeout(s.ctx, m.opts.StartTimeout)
	defer cancel()
	start := time.Now()
	inst, res, err := m.reattach(ctx, rec, s.tpl)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.busy = nil
	if s.closed {
		if inst != nil {
			go m.removeInstance(inst)
		}
		return
	}
	if err == nil {
		s.cur = inst
		s.jobSeq.Store(inst.conn.MaxJob())
		inst.recorded.Store(true)
		m.log.Info("sandbox taken back: its container and jobs run on", "sandbox", s.id, "container", rec.Container,
			"jobs", len(res.Jobs), "detached", res.Detached, "cancelled", res.Cancelled, "duration", time.Since(start).Round(time.Millisecond))
		return
	}
	s.planRecovery()
	if rec.Container == "" {
		// A handle that had no container when its server stopped (not
		// started yet, or lost): it starts at its next call, from the
		// snapshot it was to start from.
		if s.restoreFrom == "" && rec.Snapshot != "" && !s.tpl.Policy.ReadOnly {
			s.restoreFrom = rec.Snapshot
		}
		return
	}
	why := "its container is gone"
	if !errors.Is(err, backend.ErrGone) {
		why = fmt.Sprintf("its container could not be taken over (%v) and was removed", err)
	}
	s.lost = fmt.Sprintf("was not running when this server started again on the last one's state (%s): its processes and jobs are gone", why)
	m.log.Info("sandbox taken back without its container", "sandbox", s.id, "container", rec.Container, "err", err, "restore_from", s.restoreFrom)
}

// reattach attaches again to the container of a record and resumes its
// agent. On failure nothing of the container is left (it is removed when
// it runs but cannot be taken over).
func (m *Manager) reattach(ctx context.Context, rec Record, tpl *Template) (*instance, agentproto.Resumed, error) {
	var res agentproto.Resumed
	ra, ok := m.backend.(backend.Reattacher)
	if !ok {
		return nil, res, fmt.Errorf("%w: this backend cannot take a sandbox over", backend.ErrGone)
	}
	if rec.Container == "" || rec.Token == "" {
		return nil, res, backend.ErrGone
	}
	// A sandbox that holds secrets trusts the dead proxy's CA and holds
	// its placeholders, both made in that process's memory and never
	// written down: its network cannot be served as it was.
	proxy := m.proxyFor(tpl)
	if m.holdsSecrets(tpl) {
		proxy = nil
	}
	box, err := ra.Reattach(ctx, rec.Container, proxy)
	if err != nil {
		return nil, res, err
	}
	log := m.log.With("sandbox", rec.Sandbox, "container", box.Name())
	c, res, err := agentclient.Resume(ctx, box.Stdout(), box.Stdin(), box.Stdin(), rec.Token, m.opts.Lease, resumeQuiet(box), log)
	inst := &instance{box: box, conn: c, quiet: make(chan struct{}), token: rec.Token}
	if err != nil {
		inst.conn = nil
		m.removeInstance(inst)
		return nil, res, fmt.Errorf("resume the agent: %w (agent output: %s)", err, box.StderrTail())
	}
	if p := tpl.Policy; p.NeedsResolve() {
		paths, err := c.Resolve(ctx, p.AllowCmds, ".")
		if err != nil {
			m.removeInstance(inst)
			return nil, res, fmt.Errorf("resolve the command allowlist: %w", err)
		}
		inst.allowed = make(map[string]string)
		for i, p := range paths {
			if p != "" {
				inst.allowed[p] = tpl.Policy.AllowCmds[i]
			}
		}
	}
	m.wg.Add(1)
	go m.keepAlive(inst, log)
	return inst, res, nil
}

// record writes the record of a sandbox whose instance runs, once per
// instance (the first call that finds it running), so that a server
// started again on this slot can take it back.
func (s *Sandbox) record(inst *instance) {
	if s.m.records == nil || inst.token == "" || !inst.recorded.CompareAndSwap(false, true) {
		return
	}
	s.putRecord(inst)
}

// recordLayers writes the record again after a change of the sandbox's
// allowlist layers (ApproveHost, NarrowNetwork), if it names the running
// instance; otherwise the next record written has them.
func (s *Sandbox) recordLayers() {
	if s.m.records == nil {
		return
	}
	s.mu.Lock()
	inst := s.cur
	s.mu.Unlock()
	if inst != nil && inst.recorded.Load() {
		s.putRecord(inst)
	}
}

// putRecord writes the sandbox's record, naming inst (nil for none: a
// handle with no running container, see recordIdle).
func (s *Sandbox) putRecord(inst *instance) {
	m := s.m
	rec := Record{Sandbox: s.id, Owner: s.owner, Label: s.label, Template: s.tpl.Name, Handle: s.handle, Created: s.created}
	if inst != nil {
		rec.Container, rec.Token = inst.box.Name(), inst.token
	}
	s.mu.Lock()
	rec.Generation = s.gen
	closed := s.closed
	if inst == nil {
		rec.Snapshot = s.restoreFrom
	}
	s.mu.Unlock()
	if closed {
		return // ended meanwhile: its record is gone and stays gone
	}
	if latest, ok := s.snaps().Latest(s.id); ok && rec.Snapshot == "" {
		rec.Snapshot = latest.ID
	}
	if m.proxy != nil {
		l := m.proxy.Allowed(s.id)
		rec.Approved, rec.Dropped, rec.Offline = l.Approved, l.Dropped, l.Offline
	}
	if err := m.records.Put(rec); err != nil {
		m.log.Warn("the sandbox's record could not be written; a server started again will not take it back", "sandbox", s.id, "err", err)
	}
}

// forget removes the record of a sandbox that ended.
func (s *Sandbox) forget() {
	if s.m.records == nil {
		return
	}
	if err := s.m.records.Delete(s.id); err != nil {
		s.m.log.Warn("remove the record of an ended sandbox", "sandbox", s.id, "err", err)
	}
}

// detach is close for a handle at a graceful stop: its container is left
// running (backend.Detacher) and its record kept, so the next server on
// the slot takes it back whole, as after a kill. Its calls in flight end as
// they would at a kill (a foreground exec goes on as a job). A handle
// whose container is not running keeps a record too, so that it comes back
// from its snapshot. A backend instance that cannot be let go of is
// removed, and the record then names a container that is gone.
// detachable reports whether a stop can leave s running for the next
// server: its instance, if it has one, can be let go of without ending it
// (backend.Detacher: Docker's containers; a pod's stream cannot be, and
// the pod ends with the sandbox, as before).
func (s *Sandbox) detachable() bool {
	s.mu.Lock()
	inst := s.cur
	s.mu.Unlock()
	if inst == nil {
		return true
	}
	_, ok := inst.box.(backend.Detacher)
	return ok
}

func (s *Sandbox) detach() {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		p := s.busy
		s.mu.Unlock()
		if p != nil {
			// A start or an idle save under way: let it finish (a start
			// gives its instance to s.cur), within the sandbox's start
			// timeout, then end it with the sandbox.
			select {
			case <-p.done:
			case <-time.After(s.m.opts.StartTimeout):
			}
		}
		s.mu.Lock()
		inst := s.cur
		s.mu.Unlock()
		if inst != nil && inst.conn.Err() == nil {
			s.record(inst)
		} else {
			s.recordIdle()
		}
		s.mu.Lock()
		s.gone = errcode.Errorf(errcode.Unavailable, "the server is stopping; sandbox %s stays for the server started next on this state directory (within --lease): call it again there", s.id)
		s.closed = true
		s.cur = nil
		p = s.busy
		s.mu.Unlock()
		d, detachable := backend.Instance(nil), false
		if inst != nil {
			d = inst.box
			_, detachable = d.(backend.Detacher)
		}
		if detachable {
			// First the stream, then the calls: a cancel no longer
			// reaches the agent, which keeps a foreground exec as a job.
			d.(backend.Detacher).Detach()
			inst.conn.Fail(errDetached)
		}
		s.cancel()
		if p != nil {
			<-p.done
		}
		if inst != nil && !detachable {
			s.m.removeInstance(inst)
		}
		if s.clearShape != nil {
			s.clearShape()
		}
		s.m.log.Info("sandbox left running for the next server on this state directory", "sandbox", s.id, "running", detachable)
	})
}

// errDetached ends the connection to an agent the server left running.
var errDetached = errors.New("the server let go of the sandbox for the next one")

// recordIdle writes the record of a handle with no running container (not
// started yet, or lost): no container to take back, only the snapshot its
// next container starts from.
func (s *Sandbox) recordIdle() {
	if s.m.records != nil {
		s.putRecord(nil)
	}
}
