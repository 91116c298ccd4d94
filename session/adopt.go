package session

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agentclient"
	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
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
	box, err := ra.Reattach(ctx, rec.Container)
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
	m := s.m
	if m.records == nil || inst.token == "" || !inst.recorded.CompareAndSwap(false, true) {
		return
	}
	rec := Record{Sandbox: s.id, Owner: s.owner, Label: s.label, Template: s.tpl.Name, Handle: s.handle, Created: s.created, Container: inst.box.Name(), Token: inst.token}
	s.mu.Lock()
	rec.Generation = s.gen
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return // ended meanwhile: its record is gone and stays gone
	}
	if latest, ok := s.snaps().Latest(s.id); ok {
		rec.Snapshot = latest.ID
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
