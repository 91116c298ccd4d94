package session

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// reapParallel is how many idle sandboxes the reaper saves and removes at
// once: a sandbox whose snapshot stalls holds one of these slots until its
// deadline, and the others go on.
const reapParallel = 4

// idleSnapshotTimeout bounds the snapshot taken of an idle sandbox before
// its container is removed: 10 s, plus 1 s per 8 MiB the workspace may
// hold (74 s for the default 512 MiB). A healthy agent streams a full
// 500 MB workspace in about 10 s on a busy 2-core host, so this is several
// times what it needs even with reapParallel snapshots at once, while an
// agent that stalls (stopped, or busy with something else) keeps its slot,
// and a call to its own sandbox, waiting no longer than that. The wait for
// room in the snapshot store counts against it.
func idleSnapshotTimeout(p policy.Policy) time.Duration {
	return 10*time.Second + time.Duration(p.MaxWorkspaceBytes/(8<<20))*time.Second
}

// reapLoop removes the containers of idle sandboxes, reapParallel at a
// time, those idle longest first. A sandbox is never reaped twice at once;
// one whose turn does not come this tick is taken at a later one.
func (m *Manager) reapLoop() {
	defer m.wg.Done()
	every := m.opts.IdleTimeout
	if every == 0 || (m.opts.MaxLifetime > 0 && m.opts.MaxLifetime < every) {
		every = m.opts.MaxLifetime
	}
	t := time.NewTicker(max(every/10, 100*time.Millisecond))
	defer t.Stop()
	reaping := map[*Sandbox]bool{}
	// Each reaper sends once; the loop takes them while it runs.
	done := make(chan *Sandbox, reapParallel)
	for {
		select {
		case <-m.ctx.Done():
			return
		case s := <-done:
			delete(reaping, s)
		case now := <-t.C:
			type candidate struct {
				s    *Sandbox
				idle time.Duration
			}
			var due, expired []candidate
			m.mu.Lock()
			for _, s := range m.byID {
				switch {
				case reaping[s] || s.ending || s.ctx.Err() != nil:
				case m.opts.MaxLifetime > 0 && s.handle && now.Sub(s.created) >= m.opts.MaxLifetime:
					expired = append(expired, candidate{s, 0})
				case m.opts.IdleTimeout > 0:
					if d := s.idleFor(now); d >= m.opts.IdleTimeout {
						due = append(due, candidate{s, d})
					}
				}
			}
			m.mu.Unlock()
			for _, e := range expired {
				reaping[e.s] = true
				m.wg.Add(1)
				go func() {
					defer m.wg.Done()
					m.expire(e.s)
					select {
					case done <- e.s:
					case <-m.ctx.Done():
					}
				}()
			}
			slices.SortFunc(due, func(a, b candidate) int { return cmp.Compare(b.idle, a.idle) })
			for _, d := range due[:max(0, min(len(due), reapParallel-len(reaping)))] {
				reaping[d.s] = true
				m.wg.Add(1)
				go func() {
					defer m.wg.Done()
					d.s.reapIdle(m.opts.IdleTimeout)
					select {
					case done <- d.s:
					case <-m.ctx.Done():
					}
				}()
			}
		}
	}
}

// reapIdle removes the container of a sandbox idle for too long; the next
// call reports it and the one after starts afresh. The workspace is saved
// first (within idleSnapshotTimeout), and the next container starts from
// that snapshot.
func (s *Sandbox) reapIdle(idle time.Duration) {
	s.mu.Lock()
	inst := s.cur
	if inst == nil || s.busy != nil || s.closed || s.inflight.Load() > 0 {
		s.mu.Unlock()
		return
	}
	if s.m.shared() != nil && s.handle && inst.conn.Err() != nil {
		// Another replica took it over (or it was lost): there is
		// nothing here to save, and its next call here takes it back.
		s.mu.Unlock()
		return
	}
	// The save runs outside s.mu: a call that comes meanwhile waits for
	// it, within its own context.
	lost := fmt.Sprintf("was removed after %s unused (--idle-timeout)", idle.Round(time.Second))
	s.cur = nil
	s.lost = lost // set now so that idle() sees there is a loss to report
	p := &transition{done: make(chan struct{})}
	s.busy = p
	s.mu.Unlock()
	if !s.tpl.Policy.ReadOnly {
		limit := idleSnapshotTimeout(s.tpl.Policy)
		ctx, cancel := context.WithTimeout(s.ctx, limit)
		info, err := s.snaps().CreateWait(ctx, "auto: before removal after "+idle.Round(time.Second).String()+" idle", s.id, func(w io.Writer) error {
			_, err := inst.conn.Snapshot(ctx, w, snapshotLimits(s.tpl.Policy))
			return err
		})
		if err != nil && ctx.Err() != nil {
			err = fmt.Errorf("it did not finish within %s: %w", limit, err)
		}
		cancel()
		if err != nil {
			s.m.log.Warn("saving an idle sandbox's workspace failed", "sandbox", s.id, "err", err)
			lost += fmt.Sprintf(", and saving its workspace failed (%v)", err)
		} else {
			lost += fmt.Sprintf("; its workspace was saved as snapshot %s", info.ID)
		}
	}
	s.mu.Lock()
	s.lost = lost
	s.planRecovery()
	s.busy = nil
	s.mu.Unlock()
	close(p.done)
	s.m.removeInstance(inst)
}
