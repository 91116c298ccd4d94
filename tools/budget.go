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

// budget bounds the bytes that calls in flight may hold: in all, and per
// key (an MCP session, see budgetKey). A reservation takes from both at
// once or from neither, so calls never wait on each other while holding
// part of what they need. A call that does not fit waits a bounded time for
// others to give bytes back, then is refused; nothing waits forever.
type budget struct {
	total, perKey int64

	mu    sync.Mutex
	used  int64
	byKey map[string]int64 // only keys holding bytes
	// freed is closed, and replaced, whenever bytes are given back.
	freed chan struct{}
	// waiting counts the reservations waiting for bytes.
	waiting int
}

// newBudget returns a budget of total bytes, and perKey bytes for each key.
func newBudget(total, perKey int64) *budget {
	return &budget{total: total, perKey: perKey, byKey: make(map[string]int64), freed: make(chan struct{})}
}

// busyError says why a reservation was refused.
type busyError struct {
	// session is true when the key's share was short, false when the
	// total was.
	session bool
	used    int64 // bytes held already, in the scope that was short
	limit   int64 // that scope's size
	need    int64 // bytes asked for
}

func (e *busyError) Error() string {
	flag, scope := "--max-inflight-bytes", "the server's calls in flight"
	if e.session {
		flag, scope = "--max-session-inflight-bytes", "this session's calls in flight"
	}
	if e.need > e.limit {
		return fmt.Sprintf("this call needs %s of server memory, more than the %s %s may hold at once (%s)", mib(e.need), mib(e.limit), scope, flag)
	}
	return fmt.Sprintf("%s hold %s of the %s they may hold at once (%s), and this call needs %s more", scope, mib(e.used), mib(e.limit), flag, mib(e.need))
}

// mib renders a byte count for messages, rounded up to a tenth of a MiB.
func mib(n int64) string {
	tenths := (n*10 + 1<<20 - 1) >> 20
	return fmt.Sprintf("%d.%d MiB", tenths/10, tenths%10)
}

// fits returns nil if n more bytes fit for key, or why they do not. b.mu is
// held.
func (b *budget) fits(key string, n int64) *busyError {
	if k := b.byKey[key]; key != "" && k+n > b.perKey {
		return &busyError{session: true, used: k, limit: b.perKey, need: n}
	}
	if b.used+n > b.total {
		return &busyError{used: b.used, limit: b.total, need: n}
	}
	return nil
}

// take adds n bytes for key (n may be negative). b.mu is held.
func (b *budget) take(key string, n int64) {
	b.used += n
	if key != "" {
		if k := b.byKey[key] + n; k > 0 {
			b.byKey[key] = k
		} else {
			delete(b.byKey, key)
		}
	}
	if n < 0 {
		close(b.freed)
		b.freed = make(chan struct{})
	}
}

// reserve takes n bytes for key ("" counts against the total only),
// waiting up to wait for other calls to give bytes back. It fails with a
// *busyError when they do not, at once when n could never fit, and with
// ctx's error when ctx ends first.
func (b *budget) reserve(ctx context.Context, key string, n int64, wait time.Duration) (*reservation, error) {
	var timeout <-chan time.Time
	expired := false
	for {
		b.mu.Lock()
		busy := b.fits(key, n)
		if busy == nil {
			b.take(key, n)
			b.mu.Unlock()
			return &reservation{b: b, key: key, n: n}, nil
		}
		if busy.need > busy.limit || wait <= 0 || expired {
			b.mu.Unlock()
			return nil, busy
		}
		freed := b.freed
		b.waiting++
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
		b.mu.Unlock()
		if err != nil {
			return nil, err
		}
	}
}

// state returns the bytes held in all and for key, the number of keys
// holding bytes, and the reservations waiting.
func (b *budget) state(key string) (total, forKey int64, keys, waiting int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used, b.byKey[key], len(b.byKey), b.waiting
}

// reservation is bytes of a budget held by one call.
type reservation struct {
	b   *budget
	key string
	n   int64 // guarded by b.mu
}

// resize makes the reservation n bytes: it gives back what is above n at
// once, and takes more only if it fits now (it does not wait: the call
// already holds memory, and two calls waiting to grow would wait on each
// other).
func (r *reservation) resize(n int64) error {
	r.b.mu.Lock()
	defer r.b.mu.Unlock()
	if n > r.n {
		if busy := r.b.fits(r.key, n-r.n); busy != nil {
			if n > busy.limit {
				busy.need = n // it would not fit even alone
			}
			return busy
		}
	}
	r.b.take(r.key, n-r.n)
	r.n = n
	return nil
}

// release gives the whole reservation back; later calls do nothing.
func (r *reservation) release() {
	r.b.mu.Lock()
	defer r.b.mu.Unlock()
	if r.n != 0 {
		r.b.take(r.key, -r.n)
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

// reserve takes n bytes of the memory budget for the call, counted against
// its session and the whole server, and keeps them until the call's
// response is written (see wrap). advice ends the error a refused call gets:
// what to do besides retrying ("" for nothing else).
func (d *Deps) reserve(ctx context.Context, c *call, n int64, wait time.Duration, advice string) error {
	r, err := d.budget.reserve(ctx, budgetKey(c.req.Session), n, wait)
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
		r, err := d.budget.reserve(ctx, budgetKey(call.Session), n, 0)
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
