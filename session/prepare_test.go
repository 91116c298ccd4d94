package session

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
)

// slowPrepare is a fake backend whose Prepare says it builds an image and
// then waits until the test lets it end, with the error the test gives.
type slowPrepare struct {
	*fakeBackend
	calls   atomic.Int64
	started chan struct{} // one value per Prepare begun
	results chan error    // what each Prepare returns, in turn
	mu      sync.Mutex
	steps   []backend.Step
}

func (b *slowPrepare) Prepare(ctx context.Context, step func(backend.Step)) error {
	b.calls.Add(1)
	st := backend.Step{What: "building the sandbox image", Why: "the agent changed since the last start", Usually: "usually 1-3 min"}
	step(st)
	b.mu.Lock()
	b.steps = append(b.steps, st)
	b.mu.Unlock()
	b.started <- struct{}{}
	select {
	case err := <-b.results:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func newSlowPrepare(t *testing.T) *slowPrepare {
	return &slowPrepare{fakeBackend: newFakeBackend(t), started: make(chan struct{}, 8), results: make(chan error, 8)}
}

func prepManager(t *testing.T, b *slowPrepare, edit func(*Options)) *Manager {
	t.Helper()
	opts := Options{Backend: b, Policy: policy.Default(), StateDir: t.TempDir(), Instance: "fake", Logger: testLogger(t)}
	if edit != nil {
		edit(&opts)
	}
	start := time.Now()
	m, err := NewManager(context.Background(), opts)
	if err != nil {
		t.Fatalf("NewManager: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("NewManager took %s: it waits for the preparation", d)
	}
	t.Cleanup(func() {
		if err := m.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return m
}

// TestPreparationRunsInTheBackground: NewManager returns while the backend
// still prepares; a call that waits for it hears what is prepared and why
// at once and then every beat; past its budget it gets UNAVAILABLE saying
// what, since when, and that calling again will find it ready; once the
// preparation ends, calls go through, and the sandbox starts.
func TestPreparationRunsInTheBackground(t *testing.T) {
	b := newSlowPrepare(t)
	m := prepManager(t, b, nil)
	<-b.started
	if s := m.Preparation(); s.Ready || !s.Running || s.Step.What != "building the sandbox image" {
		t.Fatalf("status while preparing: %+v", s)
	}
	var beats []string
	var mu sync.Mutex
	start := time.Now()
	err := m.WaitPrepared(context.Background(), 350*time.Millisecond, 100*time.Millisecond, func(msg string) {
		mu.Lock()
		beats = append(beats, msg)
		mu.Unlock()
	})
	if d := time.Since(start); d < 350*time.Millisecond || d > 5*time.Second {
		t.Errorf("the wait took %s, want its budget of 350ms", d)
	}
	e, ok := errcode.As(err)
	if !ok || e.Code != errcode.Unavailable {
		t.Fatalf("past its budget: %v, want UNAVAILABLE", err)
	}
	for _, want := range []string{"building the sandbox image", "the agent changed since the last start", " UTC", "Call again", "finds it ready", "--max-call-wait"} {
		if !strings.Contains(e.Message, want) {
			t.Errorf("the error does not say %q: %s", want, e.Message)
		}
	}
	mu.Lock()
	if len(beats) < 2 || !strings.Contains(beats[0], "building the sandbox image, because the agent changed since the last start: 0s so far, usually 1-3 min") {
		t.Errorf("progress while waiting: %q, want one at once and one every 100ms", beats)
	}
	mu.Unlock()

	// A sandbox's call waits for the preparation too.
	sb, err := m.Sandbox("a", "")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := sb.WriteFile(context.Background(), "a", []byte("x"), false, 0o644)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("a call ran before the preparation ended: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	b.results <- nil
	if err := m.WaitPrepared(context.Background(), 10*time.Second, 0, nil); err != nil {
		t.Fatalf("after the preparation: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the call that waited: %v", err)
	}
	if s := m.Preparation(); !s.Ready || s.Running || s.Err != nil || s.Attempts != 1 {
		t.Fatalf("status once prepared: %+v", s)
	}
	if n := b.calls.Load(); n != 1 {
		t.Errorf("%d Prepare calls, want 1", n)
	}
}

// TestFailedPreparationIsReportedAndRetried: every call waiting for an
// attempt that fails gets its reason; the next call tries again.
func TestFailedPreparationIsReportedAndRetried(t *testing.T) {
	b := newSlowPrepare(t)
	m := prepManager(t, b, nil)
	<-b.started
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- m.WaitPrepared(context.Background(), time.Minute, 0, nil) }()
	}
	time.Sleep(50 * time.Millisecond)
	cause := errors.New("image \"x\" is not on this engine: build it with `make image`")
	b.results <- cause
	for range 2 {
		err := <-errs
		if e, ok := errcode.As(err); !ok || e.Code != errcode.Unavailable || !strings.Contains(e.Message, "make image") || !strings.Contains(e.Message, "calling again tries again") {
			t.Fatalf("a waiting call got %v, want the failure's reason", err)
		}
		if !errors.Is(err, cause) {
			t.Fatalf("a waiting call got %v, which does not wrap the failure (errors.Is)", err)
		}
	}
	if s := m.Preparation(); s.Ready || s.Running || s.Err == nil {
		t.Fatalf("status after a failure: %+v", s)
	}
	// The next call starts another attempt, which succeeds.
	next := make(chan error, 1)
	go func() { next <- m.WaitPrepared(context.Background(), time.Minute, 0, nil) }()
	select {
	case <-b.started:
	case <-time.After(10 * time.Second):
		t.Fatal("the next call did not try again")
	}
	b.results <- nil
	if err := <-next; err != nil {
		t.Fatalf("after the retry: %v", err)
	}
	if s := m.Preparation(); !s.Ready || s.Attempts != 2 {
		t.Fatalf("status after the retry: %+v", s)
	}
}

// TestPreparationLogsWhileItRuns: the log says when it starts, what and
// why, every logEvery while it runs, and when it ends.
func TestPreparationLogsWhileItRuns(t *testing.T) {
	log := &lockedBuilder{}
	p := &preparation{
		log:      slog.New(slog.NewTextHandler(log, nil)),
		ctx:      context.Background(),
		wg:       &sync.WaitGroup{},
		logEvery: 50 * time.Millisecond,
		run: func(ctx context.Context, step func(backend.Step)) error {
			step(backend.Step{What: "building the sandbox image", Why: "the agent changed since the last start"})
			time.Sleep(180 * time.Millisecond)
			return nil
		},
	}
	p.mu.Lock()
	p.start()
	p.mu.Unlock()
	if err := p.wait(context.Background(), 0, 0, nil); err != nil {
		t.Fatal(err)
	}
	p.wg.Wait()
	out := log.String()
	for _, want := range []string{"preparing sandboxes in the background", `why="the agent changed since the last start"`, `msg="still preparing sandboxes"`, `step="building the sandbox image"`, "sandboxes prepared"} {
		if !strings.Contains(out, want) {
			t.Errorf("the log does not say %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "still preparing"); n < 1 {
		t.Errorf("%d progress lines in 180ms at one per 50ms:\n%s", n, out)
	}
}

// lockedBuilder is a strings.Builder safe for concurrent use.
type lockedBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuilder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestWaitersHearOfEachStep: a call waiting for the preparation is told
// of every step when it begins, not only at its beats: a step shorter than
// a beat (a seed image built in 4 s against beats of 5 s) was never heard
// of by the client.
func TestWaitersHearOfEachStep(t *testing.T) {
	steps := []string{"checking the image", "building the read-only workspace's image", "sweeping"}
	var mu sync.Mutex
	var heard []string
	heardOf := func(what string) bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(heard, what)
	}
	p := &preparation{
		log:      slog.New(slog.DiscardHandler),
		ctx:      context.Background(),
		wg:       &sync.WaitGroup{},
		logEvery: time.Hour,
		run: func(ctx context.Context, step func(backend.Step)) error {
			for _, what := range steps {
				step(backend.Step{What: what})
				// The next step begins once this one is heard of, or
				// after 5 s when it never is.
				for end := time.Now().Add(5 * time.Second); !heardOf(what) && time.Now().Before(end); {
					time.Sleep(5 * time.Millisecond)
				}
			}
			return nil
		},
	}
	beat := func(s PrepareStatus) {
		mu.Lock()
		heard = append(heard, s.Step.What)
		mu.Unlock()
	}
	if err := p.wait(context.Background(), time.Minute, time.Hour, beat); err != nil {
		t.Fatal(err)
	}
	p.wg.Wait()
	for _, want := range steps {
		if !heardOf(want) {
			t.Errorf("the waiting call never heard of %q (its beats come once an hour): %q", want, heard)
		}
	}
}
