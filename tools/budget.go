package tools

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// budget bounds the bytes that calls in flight (and, over HTTP, request
// bodies arriving) may hold: in all, per key (an MCP session, see
// budgetKey), and per caller (a bearer token) by a fair share. A
// reservation takes from every scope at once or from none, so calls never
// wait on each other while holding part of what they need. A call that does
// not fit waits a bounded time for others to give bytes back, then is
// refused; nothing waits forever.
//
// The fair share: a caller may hold at most max(total / active callers,
// perKey), where the active callers are the one asking, those holding
// bytes, those waiting for bytes, and those refused for want of room in the
// last shareMemory. A caller alone may use the whole budget; once another
// caller asks, the first cannot grow past its share, and the bytes it
// gives back as its calls end go to the others. Nothing is taken back from
// a call already holding bytes: a caller over its share shrinks as its
// calls end (each is bounded in time). The floor of perKey keeps the
// largest single call possible however many callers are active.
type budget struct {
	total, perKey int64

	mu       sync.Mutex
	used     int64
	byKey    map[string]int64 // only keys holding bytes
	byCaller map[string]int64 // only callers holding bytes
	// waitingBy counts the reservations waiting for bytes, per caller.
	waitingBy map[string]int
	// refusedAt is when a caller was last refused for want of room in
	// the total or its share; it counts as active for shareMemory after.
	refusedAt map[string]time.Time
	// freed is closed, and replaced, whenever bytes are given back.
	freed chan struct{}
	// waiting counts the reservations waiting for bytes.
	waiting int
	now     func() time.Time // time.Now; tests may set it
}

// shareMemory is how long a caller refused for want of room still counts
// among the active callers: as long as a refused request is told to wait
// before it retries (Retry-After), so that the bytes others give back in
// the meantime are not all taken again before it does.
const shareMemory = 30 * time.Second

// newBudget returns a budget of total bytes, and perKey bytes for each key.
func newBudget(total, perKey int64) *budget {
	return &budget{total: total, perKey: perKey, byKey: make(map[string]int64), byCaller: make(map[string]int64),
		waitingBy: make(map[string]int), refusedAt: make(map[string]time.Time), freed: make(chan struct{}), now: time.Now}
}

// busyError says why a reservation was refused.
type busyError struct {
	// session is true when the key's share was short, caller when the
	// caller's fair share was, neither when the total was.
	session bool
	caller  bool
	active  int   // callers sharing the budget, when caller is set
	used    int64 // bytes held already, in the scope that was short
	limit   int64 // that scope's size
	need    int64 // bytes asked for
}

func (e *busyError) Error() string {
	flag, scope := "--max-inflight-bytes", "the server's calls in flight"
	switch {
	case e.session:
		flag, scope = "--max-session-inflight-bytes", "this session's calls in flight"
	case e.caller:
		return fmt.Sprintf("your calls and requests in flight hold %s of the %s one caller may hold while %d callers use this server (its fair share of --max-inflight-bytes), and this needs %s more",
			mib(e.used), mib(e.limit), e.active, mib(e.need))
	}
	if e.need > e.limit {
		return fmt.Sprintf("this call needs %s of server memory, more than the %s %s may hold at once (%s)", mib(e.need), mib(e.limit), scope, flag)
	}
	return fmt.Sprintf("%s hold %s of the %s they may hold at once (%s), and this call needs %s more", scope, mib(e.used), mib(e.limit), flag, mib(e.need))
}

// ServerWide reports whether the server's total was short, rather than
// the asking caller's share or session's share (HTTP answers 503 for the
// first, 429 for the others).
func (e *busyError) ServerWide() bool { return !e.session && !e.caller }

// mib renders a byte count for messages, rounded up to a tenth of a MiB.
func mib(n int64) string {
	tenths := (n*10 + 1<<20 - 1) >> 20
	return fmt.Sprintf("%d.%d MiB", tenths/10, tenths%10)
}

// share returns a caller's fair share and the number of active callers.
// b.mu is held.
func (b *budget) share(caller string) (int64, int) {
	now := b.now()
	active := map[string]bool{caller: true}
	for c := range b.byCaller {
		active[c] = true
	}
	for c := range b.waitingBy {
		active[c] = true
	}
	for c, at := range b.refusedAt {
		if now.Sub(at) >= shareMemory {
			delete(b.refusedAt, c)
		} else {
			active[c] = true
		}
	}
	return max(b.total/int64(len(active)), b.perKey), len(active)
}

// fits returns nil if n more bytes fit for k, or why they do not. b.mu is
// held.
func (b *budget) fits(k key, n int64) *busyError {
	if used := b.byKey[k.session]; k.session != "" && used+n > b.perKey {
		return &busyError{session: true, used: used, limit: b.perKey, need: n}
	}
	if share, active := b.share(k.caller); active > 1 && b.byCaller[k.caller]+n > share {
		return &busyError{caller: true, active: active, used: b.byCaller[k.caller], limit: share, need: n}
	}
	if b.used+n > b.total {
		return &busyError{used: b.used, limit: b.total, need: n}
	}
	return nil
}

// take adds n bytes for k (n may be negative). b.mu is held.
func (b *budget) take(k key, n int64) {
	b.used += n
	if k.session != "" {
		if v := b.byKey[k.session] + n; v > 0 {
			b.byKey[k.session] = v
		} else {
			delete(b.byKey, k.session)
		}
	}
	if v := b.byCaller[k.caller] + n; v > 0 {
		b.byCaller[k.caller] = v
	} else {
		delete(b.byCaller, k.caller)
	}
	if n < 0 {
		close(b.freed)
		b.freed = make(chan struct{})
	}
}

// key names the scopes a reservation counts in: a caller (a bearer token,
// "" without tokens) and a key within the per-key share ("" for none).
type key struct {
	caller, session string
}

// reserve takes n bytes for key session ("" counts against the total
// only) of the caller "", waiting up to wait for other calls to give bytes
// back. See reserveFor.
func (b *budget) reserve(ctx context.Context, session string, n int64, wait time.Duration) (*reservation, error) {
	return b.reserveFor(ctx, key{session: session}, n, wait)
}

// reserveFor takes n bytes for k, waiting up to wait for other calls to
// give bytes back. It fails with a *busyError when they do not, at once
// when n could never fit, and with ctx's error when ctx ends first.
func (b *budget) reserveFor(ctx context.Context, k key, n int64, wait time.Duration) (*reservation, error) {
	var timeout <-chan time.Time
	expired := false
	for {
		b.mu.Lock()
		busy := b.fits(k, n)
		if busy == nil {
			b.take(k, n)
			b.mu.Unlock()
			return &reservation{b: b, k: k, n: n}, nil
		}
		if (busy.need > busy.limit && !busy.caller) || wait <= 0 || expired {
			if !busy.session {
				b.refusedAt[k.caller] = b.now()
			}
			b.mu.Unlock()
			return nil, busy
		}
		freed := b.freed
		b.waiting++
		b.waitingBy[k.caller]++
		b.mu.Unlock()
		if timeout == nil {
			t := time.NewTimer(wait)
			defer t.Stop()
			timeout = t.C
		}
		var err error
		select {
		case <-freed:
		case <-timeout:
			expired = true // one last look, then refuse
		case <-ctx.Done():
			err = context.Cause(ctx)
		}
		b.mu.Lock()
		b.waiting--
		if b.waitingBy[k.caller]--; b.waitingBy[k.caller] == 0 {
			delete(b.waitingBy, k.caller)
		}
		b.mu.Unlock()
		if err != nil {
			return nil, err
		}
	}
}

// state returns the bytes held in all and for key, the number of keys
// holding bytes, and the reservations waiting.
func (b *budget) state(session string) (total, forKey int64, keys, waiting int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used, b.byKey[session], len(b.byKey), b.waiting
}

// callerState returns the bytes a caller holds.
func (b *budget) callerState(caller string) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.byCaller[caller]
}

// reservation is bytes of a budget held by one call.
type reservation struct {
	b *budget
	k key
	n int64 // guarded by b.mu
}

// resize makes the reservation n bytes: it gives back what is above n at
// once, and takes more only if it fits now (it does not wait: the call
// already holds memory, and two calls waiting to grow would wait on each
// other).
func (r *reservation) resize(n int64) error {
	r.b.mu.Lock()
	defer r.b.mu.Unlock()
	if n > r.n {
		if busy := r.b.fits(r.k, n-r.n); busy != nil {
			if n > busy.limit && !busy.caller {
				busy.need = n // it would not fit even alone
			}
			if !busy.session {
				r.b.refusedAt[r.k.caller] = r.b.now()
			}
			return busy
		}
	}
	r.b.take(r.k, n-r.n)
	r.n = n
	return nil
}

// release gives the whole reservation back; later calls do nothing.
func (r *reservation) release() {
	r.b.mu.Lock()
	defer r.b.mu.Unlock()
	if r.n != 0 {
		r.b.take(r.k, -r.n)
		r.n = 0
	}
}

// reserveWait is how long a call waits for memory held by other calls
// before it is refused with BUSY. A write does not wait: its content is
// already in memory, and it is better refused at once.
const reserveWait = 2 * time.Second

// budgetKey names the share of the budget an MCP session's calls take.
// Each session has one sandbox; a call that names another sandbox counts
// against the session that made it.
func budgetKey(ss *mcp.ServerSession) string { return fmt.Sprintf("session-%p", ss) }

// budgetKey returns the scopes a request's reservations count in: its
// caller's fair share and its MCP session's share.
func (d *Deps) budgetKey(req mcp.Request) key {
	ss, _ := req.GetSession().(*mcp.ServerSession)
	k := key{session: budgetKey(ss)}
	if d.Sessions != nil && d.Sessions.OwnerOf != nil {
		k.caller = d.Sessions.OwnerOf(req.GetExtra())
	}
	return k
}

// reserve takes n bytes of the memory budget for the call, counted against
// its session, its caller's fair share and the whole server, and keeps them until the call's
// response is written (see wrap). advice ends the error a refused call gets:
// what to do besides retrying ("" for nothing else).
func (d *Deps) reserve(ctx context.Context, c *call, n int64, wait time.Duration, advice string) error {
	r, err := d.budget.reserveFor(ctx, d.budgetKey(c.req), n, wait)
	if err != nil {
		return memoryError(err, advice)
	}
	c.held = r
	return nil
}

// holdArguments is the receiving middleware that reserves what a tool
// call's arguments cost the server (policy.ArgumentsReserve) before the SDK
// checks and decodes them, and gives it back when the call's response is
// written. A call that does not fit is refused at once, as a tool error:
// its arguments are in memory already, and are freed sooner that way.
func (d *Deps) holdArguments(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		call, ok := req.(*mcp.CallToolRequest)
		if !ok || method != "tools/call" || call.Params == nil {
			return next(ctx, method, req)
		}
		n := policy.ArgumentsReserve(int64(len(call.Params.Arguments)))
		if n == 0 {
			return next(ctx, method, req)
		}
		r, err := d.budget.reserveFor(ctx, d.budgetKey(call), n, 0)
		if err != nil {
			res := &mcp.CallToolResult{}
			res.SetError(memoryError(err, "or send less at once (a write in parts with append)"))
			return res, nil
		}
		res, err := next(ctx, method, req)
		context.AfterFunc(ctx, r.release)
		return res, err
	}
}

// resize makes the call's reservation n bytes (see reservation.resize).
func (c *call) resize(n int64, advice string) error {
	if err := c.held.resize(n); err != nil {
		return memoryError(err, advice)
	}
	return nil
}

// memoryError turns a refused reservation into the tool error: BUSY when
// the call would fit once others finish, TOO_LARGE when it never would.
func memoryError(err error, advice string) error {
	var busy *busyError
	if !errors.As(err, &busy) {
		return err
	}
	if busy.need > busy.limit && advice != "" {
		return &errcode.Error{Code: errcode.TooLarge, Message: busy.Error() + "; " + advice}
	}
	msg := busy.Error() + "; retry when other calls have finished"
	if advice != "" {
		msg += ", " + advice
	}
	return &errcode.Error{Code: errcode.Busy, Message: msg}
}
