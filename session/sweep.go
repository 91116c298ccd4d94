package session

import (
	"context"
	"time"
)

// Sweep removes what servers that are gone left behind (see
// backend.Backend.Sweep); NewManager runs it once, and again every
// Options.SweepEvery if that is set.
func (m *Manager) Sweep(ctx context.Context) error {
	return m.backend.Sweep(ctx)
}

// sweepLoop sweeps every interval until the manager closes. A sweep that
// fails is logged and tried again at the next tick; one sweep at a time,
// each bounded by the interval (a slow API server does not pile them up).
func (m *Manager) sweepLoop(every time.Duration) {
	defer m.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(m.ctx, every)
		err := m.Sweep(ctx)
		cancel()
		if err != nil && m.ctx.Err() == nil {
			m.log.Warn("session: periodic sweep failed; trying again", "err", err, "every", every)
		}
	}
}
