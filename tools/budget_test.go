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
