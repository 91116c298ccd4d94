package netproxy

import (
	"fmt"
	"sync"
	"time"
)

// Refusal aggregation defaults (see Config.RefusalInterval).
const (
	DefaultRefusalInterval = time.Minute
	DefaultMaxRefusalKinds = 16
)

// refusalKey is what makes two refusals of one sandbox the same kind.
type refusalKey struct {
	host   string
	port   int
	status int
	reason string
}

// refusalTally is one kind of refusal in the current interval: the first
// one, recorded when it happened, and how many followed.
type refusalTally struct {
	first   Decision
	repeats int
}

// refusals aggregates one sandbox's refusals, so that what a sandbox sends
// cannot grow the logs faster than a fixed number of records per interval.
// An interval starts with the first refusal after the last one ended.
type refusals struct {
	mu    sync.Mutex
	kinds map[refusalKey]*refusalTally
	order []*refusalTally // kinds in the order first seen
	other int             // refusals of kinds past the cap
	timer *time.Timer     // ends the interval; nil between intervals
}

// note counts a refusal. It reports whether the refusal is the first of its
// kind in this interval, which is recorded at once; the others are counted
// for the interval's summaries. The first refusal of an interval arms a
// timer that calls flush when the interval ends.
func (r *refusals) note(d *Decision, maxKinds int, interval time.Duration, flush func()) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.timer == nil {
		r.kinds = map[refusalKey]*refusalTally{}
		r.timer = time.AfterFunc(interval, flush)
	}
	k := refusalKey{d.Host, d.Port, d.Status, d.Reason}
	if t := r.kinds[k]; t != nil {
		t.repeats++
		return false
	}
	if len(r.kinds) >= maxKinds {
		r.other++
		return false
	}
	t := &refusalTally{first: *d}
	r.kinds[k] = t
	r.order = append(r.order, t)
	return true
}

// take ends the current interval and returns its summaries: one per kind
// that repeated, with the count of repeats, and one for the refusals of
// kinds past the cap.
func (r *refusals) take(sandbox string, maxKinds int) []Decision {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.timer == nil {
		return nil
	}
	r.timer.Stop()
	var out []Decision
	for _, t := range r.order {
		if t.repeats == 0 {
			continue
		}
		d := t.first
		d.Count, d.Summary, d.Duration = t.repeats, true, 0
		out = append(out, d)
	}
	if r.other > 0 {
		out = append(out, Decision{
			Sandbox: sandbox, Count: r.other, Summary: true,
			Reason: fmt.Sprintf("refusals of other hosts or reasons: this sandbox was refused more than %d kinds of request in this interval, and only the first %d are named", maxKinds, maxKinds),
		})
	}
	r.kinds, r.order, r.other, r.timer = nil, nil, 0, nil
	return out
}
