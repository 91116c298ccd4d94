package session

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
)

// prepareLogEvery is how often the log says that a preparation still runs.
const prepareLogEvery = 15 * time.Second

// preparation makes ready what every sandbox needs (the backend's Prepare:
// the runtime image, a read-only workspace's seed image, the firewall
// chain; then the first sweep of what earlier servers left), in the
// background from the server's start, so that the server answers its
// client at once whatever the engine is doing. Calls that need a sandbox
// wait for it (wait). An attempt that fails gives its reason to every call
// waiting for it, and the next call tries again.
type preparation struct {
	// run is one attempt; step tells what it is doing.
	run func(ctx context.Context, step func(backend.Step)) error
	log *slog.Logger
	// ctx ends at the manager's Close, and every attempt with it; wg
	// counts the attempt under way.
	ctx context.Context
	wg  *sync.WaitGroup
	// logEvery is prepareLogEvery (tests shorten it).
	logEvery time.Duration

	mu      sync.Mutex
	ready   bool
	running bool
	step    backend.Step
	since   time.Time     // the start of the attempt under way, or of the last one
	took    time.Duration // how long the last attempt took, once it ended
	err     error         // why the last attempt failed; nil while one runs
	done    chan struct{} // closed when the attempt under way ends
	// stepped is closed (and made anew) when a step begins, so that
	// waiting calls tell their clients of it at once, not at their next
	// beat: a step shorter than a beat is still heard of.
	stepped  chan struct{}
	attempts int
}

// PrepareStatus is what the server's preparation of sandboxes is doing.
type PrepareStatus struct {
	// Ready says everything is prepared: sandboxes start at once.
	Ready bool
	// Running says an attempt is under way, doing Step.
	Running bool
	Step    backend.Step
	// Since is when the attempt under way (or the last one) started.
	Since time.Time
	// Took is how long the last attempt took, once it ended.
	Took time.Duration
	// Err is why the last attempt failed (nil while one runs, and once
	// one succeeded).
	Err error
	// Attempts counts the attempts made.
	Attempts int
}

// Progress says, in a line, what is being prepared and for how long: for
// the progress notifications of a call that waits for it.
func (s PrepareStatus) Progress() string {
	msg := s.Step.What
	if s.Step.Why != "" {
		msg += ", because " + s.Step.Why
	}
	msg += fmt.Sprintf(": %s so far", roundSecond(time.Since(s.Since)))
	if s.Step.Usually != "" {
		msg += ", " + s.Step.Usually
	}
	return msg
}

func roundSecond(d time.Duration) time.Duration { return d.Round(time.Second) }

// start begins an attempt unless one runs or one succeeded. p.mu is held.
func (p *preparation) start() {
	if p.ready || p.running || p.ctx.Err() != nil {
		return
	}
	p.running, p.err = true, nil
	p.since = time.Now()
	p.step = backend.Step{What: "preparing sandboxes"}
	p.done = make(chan struct{})
	p.attempts++
	p.wg.Add(1)
	go p.attempt(p.done, p.attempts)
}

// attempt runs one attempt, logging when it starts, every logEvery while
// it runs, each step, and when it ends.
func (p *preparation) attempt(done chan struct{}, n int) {
	defer p.wg.Done()
	log := p.log.With("attempt", n)
	log.Info("preparing sandboxes in the background; tool calls that need one wait for it")
	stop := make(chan struct{})
	var ticking sync.WaitGroup
	ticking.Go(func() {
		t := time.NewTicker(p.logEvery)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				s := p.status()
				log.Info("still preparing sandboxes", "step", s.Step.What, "why", s.Step.Why, "for", roundSecond(time.Since(s.Since)), "usually", s.Step.Usually)
			}
		}
	})
	err := p.run(p.ctx, func(st backend.Step) {
		p.mu.Lock()
		p.step = st
		if p.stepped != nil {
			close(p.stepped)
		}
		p.stepped = make(chan struct{})
		p.mu.Unlock()
		if st.Why != "" {
			log.Info("preparing sandboxes: "+st.What, "why", st.Why, "usually", st.Usually)
		} else {
			log.Debug("preparing sandboxes: " + st.What)
		}
	})
	close(stop)
	ticking.Wait()
	p.mu.Lock()
	p.running = false
	p.took = time.Since(p.since)
	took := p.took
	if err == nil {
		p.ready = true
	} else {
		if p.ctx.Err() != nil {
			err = errcode.Errorf(errcode.Unavailable, "the server is shutting down")
		}
		p.err = err
	}
	step := p.step.What
	p.mu.Unlock()
	close(done)
	if err != nil {
		log.Error("preparing sandboxes failed; the next tool call tries again", "step", step, "after", took.Round(time.Millisecond), "err", err)
		return
	}
	log.Info("sandboxes prepared", "took", took.Round(time.Millisecond))
}

// status returns what the preparation is doing.
func (p *preparation) status() PrepareStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	return PrepareStatus{Ready: p.ready, Running: p.running, Step: p.step, Since: p.since, Took: p.took, Err: p.err, Attempts: p.attempts}
}

// wait waits until everything is prepared, starting a new attempt if the
// last one failed. It waits at most maxWait (0: until ctx ends), and calls
// beat every `every` (if both are set) with what is being prepared. An
// attempt that fails while the call waits gives the call its reason.
func (p *preparation) wait(ctx context.Context, maxWait, every time.Duration, beat func(PrepareStatus)) error {
	p.mu.Lock()
	if p.ready {
		p.mu.Unlock()
		return nil
	}
	p.start()
	done := p.done
	if p.stepped == nil {
		p.stepped = make(chan struct{})
	}
	stepped := p.stepped
	p.mu.Unlock()
	if done == nil { // the manager closed before any attempt
		return errcode.Errorf(errcode.Unavailable, "the server is shutting down")
	}
	var timeout <-chan time.Time
	if maxWait > 0 {
		t := time.NewTimer(maxWait)
		defer t.Stop()
		timeout = t.C
	}
	var tick <-chan time.Time
	if beat != nil && every > 0 {
		beat(p.status()) // at once: the client learns why it waits

		t := time.NewTicker(every)
		defer t.Stop()
		tick = t.C
	} else {
		stepped = nil // nobody to tell
	}
	for {
		select {
		case <-done:
			s := p.status()
			if s.Ready {
				return nil
			}
			return failedPreparation(s)
		case <-tick:
			beat(p.status())
		case <-stepped:
			p.mu.Lock()
			stepped = p.stepped
			p.mu.Unlock()
			beat(p.status())
		case <-timeout:
			return stillPreparing(p.status(), maxWait)
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// failedPreparation is the error of the calls that waited for an attempt
// that failed.
func failedPreparation(s PrepareStatus) error {
	if e, ok := errcode.As(s.Err); ok {
		return errcode.Errorf(e.Code, "the server could not prepare sandboxes (%s): %s; calling again tries again", s.Step.What, e.Message)
	}
	return errcode.Errorf(errcode.Unavailable, "the server could not prepare sandboxes (%s): %w; calling again tries again, and `sandbox-mcp doctor` on the server says what to fix", s.Step.What, s.Err)
}

// stillPreparing is the error of a call that waited as long as it may.
func stillPreparing(s PrepareStatus, waited time.Duration) error {
	what := s.Step.What
	if s.Step.Why != "" {
		what += ", because " + s.Step.Why + ","
	}
	usually := ""
	if s.Step.Usually != "" {
		usually = "; " + s.Step.Usually
	}
	return errcode.Errorf(errcode.Unavailable, "sandboxes are not ready yet: the server has been %s since %s (%s ago%s), and this call waited %s, the most a call waits (--max-call-wait). "+
		"Nothing was run. Call again: the preparation goes on meanwhile, and a call made once it is done finds it ready",
		what, s.Since.UTC().Format("15:04:05 UTC"), roundSecond(time.Since(s.Since)), usually, roundSecond(waited))
}

// WaitPrepared waits until what sandboxes need is prepared (see
// PrepareStatus), at most maxWait (0: until ctx ends), calling beat with a
// line of progress every `every` while it waits (if both are set). A
// preparation that failed is tried again. Past maxWait, or when the
// attempt fails, the error is UNAVAILABLE and says why and what to do.
func (m *Manager) WaitPrepared(ctx context.Context, maxWait, every time.Duration, beat func(string)) error {
	var b func(PrepareStatus)
	if beat != nil {
		b = func(s PrepareStatus) { beat(s.Progress()) }
	}
	return m.prep.wait(ctx, maxWait, every, b)
}

// Preparation returns what the preparation of sandboxes is doing.
func (m *Manager) Preparation() PrepareStatus { return m.prep.status() }
