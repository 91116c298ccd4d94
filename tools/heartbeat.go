package tools

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// defaultProgressBeat is the longest a call that holds a progress token
// goes without a progress notification: clients give up on a call they
// hear nothing of (Claude Code after 300 s), and a silent build says
// nothing for minutes.
const defaultProgressBeat = 15 * time.Second

// keepAlive makes p send a notification whenever none went for every
// ("running 2m10s, no new output", the time counted from started), until
// the returned stop is called; stop returns once no more can be sent. It
// must be called before p sends anything.
func (p *progress) keepAlive(every time.Duration, started time.Time) (stop func()) {
	var last atomic.Int64 // unix nanos of the last notification
	last.Store(time.Now().UnixNano())
	notify := p.notify
	p.notify = func(sent float64, msg string) {
		last.Store(time.Now().UnixNano())
		notify(sent, msg)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTimer(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			if quiet := time.Since(time.Unix(0, last.Load())); quiet < every {
				t.Reset(every - quiet)
				continue
			}
			p.beat(fmt.Sprintf("running %s, no new output", time.Since(started).Round(time.Second)))
			t.Reset(every)
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

// beat sends a notification that carries no output. The progress value
// goes up by one, as each notification's must (it counts the output's
// bytes and the beats).
func (p *progress) beat(msg string) {
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return
	}
	p.sent++
	p.notify(p.sent, msg)
}
