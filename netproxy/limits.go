package netproxy

import (
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// sandboxState holds one sandbox's limits, shared by every Serve call for
// that sandbox id. refs is guarded by Proxy.mu; the rest by mu.
type sandboxState struct {
	id      string
	refs    int
	limiter *rate.Limiter

	mu      sync.Mutex
	tunnels int
	conns   int

	refusals refusals
	recent   recent // the latest kinds refused, for Proxy.Refusals

	// token is the hash of the sandbox's credential (Grant), guarded by
	// the Proxy's mu.
	token    [32]byte
	hasToken bool
}

func newSandboxState(id string, r rate.Limit, burst int) *sandboxState {
	return &sandboxState{id: id, limiter: rate.NewLimiter(r, burst)}
}

// acquire takes one unit of *n if it is below limit.
func (s *sandboxState) acquire(n *int, limit int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if *n >= limit {
		return false
	}
	*n++
	return true
}

func (s *sandboxState) release(n *int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	*n--
}

// allow takes a rate token, or reports how long until one is available.
func (s *sandboxState) allow(now time.Time) (ok bool, retryAfter time.Duration) {
	r := s.limiter.ReserveN(now, 1)
	if !r.OK() {
		return false, time.Second
	}
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, d
	}
	return true, 0
}

// retryAfterSeconds renders a Retry-After value: whole seconds, at least 1.
func retryAfterSeconds(d time.Duration) int {
	return max(1, int(math.Ceil(d.Seconds())))
}
