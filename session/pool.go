package session

import (
	"context"
	"sync"
	"time"
)

// pool keeps containers started ahead of need (--warm), so a new session's
// first call does not wait for a container to start. A warm container is a
// sandbox container like any other, hardened, labelled and seeded the same
// way, made under the sandbox id it will serve under; it counts against
// --max-sandboxes while it waits.
type pool struct {
	want int
	wake chan struct{}

	mu     sync.Mutex
	ready  []warm
	closed bool
}

type warm struct {
	id   string
	inst *instance
}

func newPool(want int) *pool {
	return &pool{want: want, wake: make(chan struct{}, 1)}
}

// poke asks the filler to look again.
func (p *pool) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// size returns the number of warm containers.
func (p *pool) size() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ready)
}

// take returns a live warm container, if there is one; each dead one it
// finds (it died while it waited) goes to discard.
func (p *pool) take(discard func(*instance)) (warm, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.poke()
	for len(p.ready) > 0 {
		w := p.ready[0]
		p.ready = p.ready[1:]
		if w.inst.conn.Err() == nil {
			return w, true
		}
		discard(w.inst)
	}
	return warm{}, false
}

// put adds a started container and returns the number ready, or false if
// the pool was drained: the caller removes the container.
func (p *pool) put(w warm) (int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, false
	}
	p.ready = append(p.ready, w)
	return len(p.ready), true
}

// drain closes the pool and returns its containers, for the caller to
// remove.
func (p *pool) drain() []warm {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	ready := p.ready
	p.ready = nil
	return ready
}

// needs reports whether the pool should grow, with active sandboxes of at
// most max (0: no limit): it is below its size and the sandboxes plus warm
// containers are below max.
func (p *pool) needs(active, max int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.ready) >= p.want {
		return false
	}
	return max == 0 || active+len(p.ready) < max
}

// takeWarm returns a live warm container, if there is one.
func (m *Manager) takeWarm() (warm, bool) {
	return m.pool.take(func(inst *instance) {
		// m.mu is held and the manager open (see Sandbox), so Close
		// waits for this removal.
		m.removals.do(func() { m.removeInstance(inst) })
	})
}

// poolNeeds reports whether the pool should grow (see pool.needs).
func (m *Manager) poolNeeds() bool {
	m.mu.Lock()
	active := len(m.byID)
	m.mu.Unlock()
	return m.pool.needs(active, m.opts.MaxSandboxes)
}

// fillLoop keeps the pool full in the background, one container at a time,
// backing off while starts fail (an engine that is down, say).
func (m *Manager) fillLoop() {
	defer m.wg.Done()
	backoff := time.Second
	for {
		for m.poolNeeds() {
			id := randomID("sb-")
			inst, err := m.newInstance(m.ctx, id, 1, m.def)
			if err != nil {
				if m.ctx.Err() != nil {
					return
				}
				m.log.Warn("warm pool: starting a container failed", "err", err, "retry_in", backoff)
				select {
				case <-m.ctx.Done():
					return
				case <-time.After(backoff):
				}
				backoff = min(2*backoff, 30*time.Second)
				continue
			}
			backoff = time.Second
			n, ok := m.pool.put(warm{id: id, inst: inst})
			if !ok {
				m.removeInstance(inst)
				return
			}
			m.log.Debug("warm pool", "ready", n, "want", m.pool.want)
		}
		select {
		case <-m.ctx.Done():
			return
		case <-m.pool.wake:
		}
	}
}

// drainPool removes every warm container.
func (m *Manager) drainPool() {
	var wg sync.WaitGroup
	for _, w := range m.pool.drain() {
		wg.Go(func() { m.removeInstance(w.inst) })
	}
	wg.Wait()
}

// newInstance starts a container of template tpl and fills its workspace
// from the template's seed (--workspace-from), if set.
func (m *Manager) newInstance(ctx context.Context, sandbox string, gen int, tpl *Template) (*instance, error) {
	inst, err := m.startInstance(ctx, sandbox, gen, tpl)
	if err != nil {
		return nil, err
	}
	if err := m.seedInstance(ctx, inst, tpl); err != nil {
		m.removeInstance(inst)
		return nil, err
	}
	return inst, nil
}
