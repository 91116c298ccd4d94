package tools

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// forever is a wait no test reaches: a reservation that should not wait
// and does hangs the test instead of passing.
const forever = time.Hour

// waitFor spins until cond holds; the budget's own state says when a
// reservation is waiting, so no test sleeps to let one get there.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		runtime.Gosched()
	}
}

func mustReserve(t *testing.T, b *budget, key string, n int64) *reservation {
	t.Helper()
	r, err := b.reserve(context.Background(), key, n, 0)
	if err != nil {
		t.Fatalf("reserve(%q, %d): %v", key, n, err)
	}
	return r
}

func busyOf(t *testing.T, err error) *busyError {
	t.Helper()
	var busy *busyError
	if !errors.As(err, &busy) {
		t.Fatalf("err = %v, want a *busyError", err)
	}
	return busy
}

func TestBudgetSharesAndTotal(t *testing.T) {
	b := newBudget(100, 60)
	a1 := mustReserve(t, b, "a", 50)
	// The key's share is short: refused, and nothing taken from the total.
	_, err := b.reserve(context.Background(), "a", 20, 0)
	if busy := busyOf(t, err); !busy.session || busy.used != 50 || busy.limit != 60 || busy.need != 20 {
		t.Fatalf("busy = %+v, want the session's share short (50 of 60 used, 20 asked)", busy)
	}
	if total, _, _, _ := b.state(""); total != 50 {
		t.Fatalf("a refused reservation took bytes: %d in use, want 50", total)
	}
	// Another key fits its share but not the total.
	c1 := mustReserve(t, b, "c", 40)
	_, err = b.reserve(context.Background(), "d", 20, 0)
	if busy := busyOf(t, err); busy.session || busy.used != 90 || busy.limit != 100 {
		t.Fatalf("busy = %+v, want the total short (90 of 100 used)", busy)
	}
	if _, d, _, _ := b.state("d"); d != 0 {
		t.Fatalf("a reservation refused for the total kept %d bytes of its key's share", d)
	}
	// "" counts against the total only.
	e1 := mustReserve(t, b, "", 10)
	a1.release()
	c1.release()
	e1.release()
	a1.release() // a second release gives nothing back twice
	if total, _, keys, _ := b.state(""); total != 0 || keys != 0 {
		t.Fatalf("after every release: %d bytes and %d keys held, want none", total, keys)
	}
}

func TestBudgetNeverFitsIsRefusedAtOnce(t *testing.T) {
	b := newBudget(100, 60)
	_, err := b.reserve(context.Background(), "a", 61, forever)
	if busy := busyOf(t, err); !busy.session || busy.need <= busy.limit {
		t.Fatalf("busy = %+v, want need above the share", busy)
	}
	if !strings.Contains(err.Error(), "more than the 0.1 MiB this session's calls in flight may hold at once (--max-session-inflight-bytes)") {
		t.Fatalf("message %q does not say the call can never fit, and which flag bounds it", err)
	}
	_, err = b.reserve(context.Background(), "", 101, forever)
	if busy := busyOf(t, err); busy.session || !strings.Contains(err.Error(), "--max-inflight-bytes") {
		t.Fatalf("err = %v, want the total named", err)
	}
}

func TestBudgetWaiterGetsFreedBytes(t *testing.T) {
	b := newBudget(100, 100)
	held := mustReserve(t, b, "a", 80)
	got := make(chan error, 1)
	go func() {
		r, err := b.reserve(context.Background(), "b", 50, forever)
		if err == nil {
			defer r.release()
		}
		got <- err
	}()
	waitFor(t, func() bool { _, _, _, w := b.state(""); return w == 1 })
	held.release()
	if err := <-got; err != nil {
		t.Fatalf("the waiting reservation failed after bytes were freed: %v", err)
	}
}

func TestBudgetShrinkWakesWaiter(t *testing.T) {
	b := newBudget(100, 100)
	held := mustReserve(t, b, "a", 90)
	got := make(chan error, 1)
	go func() {
		_, err := b.reserve(context.Background(), "b", 50, forever)
		got <- err
	}()
	waitFor(t, func() bool { _, _, _, w := b.state(""); return w == 1 })
	if err := held.resize(40); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiting reservation failed after another shrank: %v", err)
	}
}

func TestBudgetWaitEnds(t *testing.T) {
	b := newBudget(100, 100)
	mustReserve(t, b, "a", 100)
	start := time.Now()
	_, err := b.reserve(context.Background(), "b", 1, 20*time.Millisecond)
	if busy := busyOf(t, err); busy.used != 100 {
		t.Fatalf("busy = %+v", busy)
	}
	if time.Since(start) < 20*time.Millisecond {
		t.Fatal("refused before its wait was over")
	}

	ctx, cancel := context.WithCancelCause(context.Background())
	cause := errors.New("the call was cancelled")
	got := make(chan error, 1)
	go func() {
		_, err := b.reserve(ctx, "b", 1, forever)
		got <- err
	}()
	waitFor(t, func() bool { _, _, _, w := b.state(""); return w == 1 })
	cancel(cause)
	if err := <-got; !errors.Is(err, cause) {
		t.Fatalf("err = %v, want the context's cause", err)
	}
	if _, _, _, w := b.state(""); w != 0 {
		t.Fatalf("%d reservations still counted as waiting", w)
	}
}

func TestReservationResize(t *testing.T) {
	b := newBudget(100, 60)
	r := mustReserve(t, b, "a", 30)
	other := mustReserve(t, b, "b", 45)
	// Growing within the share and the total works.
	if err := r.resize(50); err != nil {
		t.Fatal(err)
	}
	// Growing past the total is refused, without waiting, and keeps what
	// was held.
	if busy := busyOf(t, r.resize(58)); busy.session || busy.need != 8 || busy.used != 95 {
		t.Fatalf("busy = %+v, want 8 more refused for the total (95 used)", busy)
	}
	if total, a, _, _ := b.state("a"); total != 95 || a != 50 {
		t.Fatalf("after a refused resize: %d in all, %d for a; want 95 and 50", total, a)
	}
	// More than the share itself can never fit: the error says so.
	if busy := busyOf(t, r.resize(61)); !busy.session || busy.need != 61 || busy.limit != 60 {
		t.Fatalf("busy = %+v, want the whole 61 named against the share of 60", busy)
	}
	// Once the other call is gone, up to the share.
	other.release()
	if err := r.resize(60); err != nil {
		t.Fatal(err)
	}
	if err := r.resize(0); err != nil {
		t.Fatal(err)
	}
	if total, _, keys, _ := b.state(""); total != 0 || keys != 0 {
		t.Fatalf("a reservation resized to 0 holds %d bytes in %d keys", total, keys)
	}
	r.release()
	if total, _, _, _ := b.state(""); total != 0 {
		t.Fatalf("release after resize to 0 gave back twice: %d", total)
	}
}

// Many reservations at once never take more than the budget, whatever the
// interleaving (run with -race).
func TestBudgetConcurrent(t *testing.T) {
	const total, share = 1000, 400
	b := newBudget(total, share)
	var wg sync.WaitGroup
	var mu sync.Mutex
	over := ""
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := []string{"a", "b", "c", ""}[i%4]
			for j := range 200 {
				r, err := b.reserve(context.Background(), key, int64(50+(i*j)%150), time.Millisecond)
				if err != nil {
					busyOf(t, err)
					continue
				}
				used, k, _, _ := b.state(key)
				if used > total || (key != "" && k > share) {
					mu.Lock()
					over = "a reservation took the budget past its bounds"
					mu.Unlock()
				}
				if j%3 == 0 {
					_ = r.resize(r.n / 2)
				}
				r.release()
			}
		}()
	}
	wg.Wait()
	if over != "" {
		t.Fatal(over)
	}
	if used, _, keys, waiting := b.state(""); used != 0 || keys != 0 || waiting != 0 {
		t.Fatalf("after everything was released: %d bytes, %d keys, %d waiting", used, keys, waiting)
	}
}

func TestMemoryErrorCodes(t *testing.T) {
	b := newBudget(100, 60)
	mustReserve(t, b, "a", 50)
	_, err := b.reserve(context.Background(), "a", 20, 0)
	msg := memoryError(err, "or read less at once with offset and length").Error()
	if !strings.HasPrefix(msg, string(errcode.Busy)+": ") || !strings.Contains(msg, "retry when other calls have finished, or read less") {
		t.Fatalf("a call that fits later: %q, want BUSY with what to do", msg)
	}
	_, err = b.reserve(context.Background(), "a", 61, 0)
	msg = memoryError(err, "or read less at once with offset and length").Error()
	if !strings.HasPrefix(msg, string(errcode.TooLarge)+": ") || strings.Contains(msg, "retry") {
		t.Fatalf("a call that never fits: %q, want TOO_LARGE without a retry", msg)
	}
}

// One caller cannot starve another: alone, a caller may hold the whole
// budget; once another caller waits for bytes (or was refused for want of
// them in the last shareMemory), the first cannot grow past its fair share,
// max(total / active callers, per-key share), and the bytes it gives back
// go to the other.
func TestBudgetFairShareBetweenCallers(t *testing.T) {
	b := newBudget(100, 30)
	now := time.Unix(1000, 0)
	b.now = func() time.Time { return now }
	ctx := context.Background()
	take := func(caller, session string, n int64) *reservation {
		t.Helper()
		r, err := b.reserveFor(ctx, key{caller, session}, n, 0)
		if err != nil {
			t.Fatalf("%s/%s reserves %d: %v", caller, session, n, err)
		}
		return r
	}
	// Alone, A takes 90 of 100 over three sessions.
	a1, a2, a3 := take("A", "a1", 30), take("A", "a2", 30), take("A", "a3", 30)
	defer a2.release()
	defer a3.release()

	// B needs 20: it waits for A to give bytes back.
	got := make(chan error, 1)
	var br *reservation
	go func() {
		var err error
		br, err = b.reserveFor(ctx, key{"B", "b1"}, 20, forever)
		got <- err
	}()
	waitFor(t, func() bool { _, _, _, w := b.state(""); return w == 1 })

	// While B waits, A cannot take more (its share is 50 of 100), though
	// the total has room for it.
	_, err := b.reserveFor(ctx, key{"A", "a4"}, 10, 0)
	if busy := busyOf(t, err); !busy.caller || busy.used != 90 || busy.limit != 50 || busy.active != 2 {
		t.Fatalf("A grew past its share while B waited: %+v", busy)
	}
	if !strings.Contains(err.Error(), "fair share") || err.(*busyError).ServerWide() {
		t.Errorf("the refusal does not name the caller's share: %v", err)
	}
	// What A gives back goes to B.
	a1.release()
	if err := <-got; err != nil {
		t.Fatalf("B's reservation failed once A gave bytes back: %v", err)
	}
	if a, bb := b.callerState("A"), b.callerState("B"); a != 60 || bb != 20 {
		t.Fatalf("A holds %d and B %d, want 60 and 20", a, bb)
	}
	br.release()

	// B refused for want of room (no wait) still counts as active for
	// shareMemory: A may not take back what B retries for.
	a1 = take("A", "a1", 30) // A alone again: 90
	if _, err := b.reserveFor(ctx, key{"B", "b1"}, 20, 0); err == nil || !err.(*busyError).ServerWide() {
		t.Fatalf("B's 20 fit beside A's 90 of 100: %v", err)
	}
	a1.release()
	if _, err := b.reserveFor(ctx, key{"A", "a1"}, 30, 0); err == nil || !err.(*busyError).caller {
		t.Fatalf("A took back 30 right after B was refused: %v", err)
	}
	take("B", "b1", 20).release()
	now = now.Add(shareMemory)
	take("A", "a1", 30).release() // B is gone: A may use it all again
}
