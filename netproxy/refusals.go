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

// MaxRecentRefusals is how many kinds of refusal (host, port and reason)
// Proxy.Refusals keeps per sandbox: the most recent ones, each with the time
// of its latest occurrence. A sandbox's record therefore holds at most this
// many entries of at most 256 bytes of host and one reason sentence each,
// whatever it sends, and goes with the sandbox's last Serve or Grant.
const MaxRecentRefusals = 8

// Refusal is one kind of request the proxy refused a sandbox recently.
type Refusal struct {
	Host   string    // the host as requested (normalised if it was a valid name), at most 256 bytes
	Port   int       // the requested port; 0 if it could not be parsed
	Status int       // the HTTP status sent
	Reason string    // the refusal sentence sent to the client
	Last   time.Time // when the latest refusal of this kind happened
	Count  int       // how many refusals of this kind the record has seen
	// Unlisted: the host is on none of the sandbox's lists (see
	// Decision.Unlisted); approving it would lift the refusal.
	Unlisted bool
}

// recent keeps a sandbox's latest kinds of refusal for Proxy.Refusals.
type recent struct {
	mu    sync.Mutex
	kinds []Refusal // at most MaxRecentRefusals, oldest Last first
}

// add records a refusal at now.
func (r *recent) add(d *Decision, now time.Time) {
	host := d.Normalized
	if host == "" {
		host = d.Host
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, k := range r.kinds {
		if k.Host == host && k.Port == d.Port && k.Status == d.Status && k.Reason == d.Reason {
			k.Last, k.Count = now, k.Count+1
			// Move it to the end: the slice stays ordered by Last.
			r.kinds = append(append(r.kinds[:i:i], r.kinds[i+1:]...), k)
			return
		}
	}
	if len(r.kinds) >= MaxRecentRefusals {
		r.kinds = append(r.kinds[:0:0], r.kinds[1:]...)
	}
	r.kinds = append(r.kinds, Refusal{Host: host, Port: d.Port, Status: d.Status, Reason: d.Reason, Last: now, Count: 1, Unlisted: d.Unlisted})
}

// since returns the kinds refused at or after t, oldest first.
func (r *recent) since(t time.Time) []Refusal {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Refusal
	for _, k := range r.kinds {
		if !k.Last.Before(t) {
			out = append(out, k)
		}
	}
	return out
}

// Refusals returns the kinds of request the proxy refused the sandbox with
// this id (as given to Serve or Grant) at or after since, oldest first: at
// most MaxRecentRefusals, the most recent kinds. It is how a caller learns,
// after a command ran, what the command was refused. Refusals of
// connections from addresses the sandbox's listener does not serve are not
// the sandbox's and are not recorded. nil when the sandbox is not served.
func (p *Proxy) Refusals(sandbox string, since time.Time) []Refusal {
	p.mu.Lock()
	sb := p.sandboxes[sandbox]
	p.mu.Unlock()
	if sb == nil {
		return nil
	}
	return sb.recent.since(since)
}
