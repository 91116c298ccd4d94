package session

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/snapshot"
)

// waitGoneWithin is waitGone with a deadline of the test's choosing.
func waitGoneWithin(t *testing.T, cli *client.Client, id string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		_, err := cli.ContainerInspect(context.Background(), id, client.ContainerInspectOptions{})
		if isGone(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %s still exists after %s (%v)", id, limit, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestIdleReaperIsNotHeldUpByAStalledSandbox: the agent of one sandbox is
// frozen (its container paused from the host) and that sandbox is due for
// reaping first. The others are still saved and removed on time, while
// its snapshot hangs; it is removed once its snapshot deadline passes, and
// its next call says saving failed.
func TestIdleReaperIsNotHeldUpByAStalledSandbox(t *testing.T) {
	m := testManager(t, func(o *Options) {
		o.IdleTimeout = 5 * time.Second
		// The heartbeat must not find the frozen agent dead before the
		// reaper's own deadline does.
		o.Lease = 10 * time.Minute
		o.Policy.MaxWorkspaceBytes = 128 << 20
	})
	limit := idleSnapshotTimeout(m.opts.Policy) // 26 s
	ctx := context.Background()
	// Starting a container can take many seconds on a loaded machine:
	// until everything is set up, no sandbox is due.
	notYet := func(sb *Sandbox) { sb.lastUsed.Store(time.Now().Add(time.Hour).UnixNano()) }
	stalled, _ := m.Sandbox("stalled", "")
	sh(t, stalled, "echo frozen > f")
	notYet(stalled)
	var others []*Sandbox
	var otherIDs []string
	for i := range 3 {
		sb, _ := m.Sandbox(fmt.Sprintf("other-%d", i), "")
		sh(t, sb, fmt.Sprintf("echo mine-%d > f", i))
		notYet(sb)
		others = append(others, sb)
		otherIDs = append(otherIDs, sb.ContainerID())
	}
	frozen := stalled.ContainerID()
	if _, err := testenv.Engine(t).ContainerPause(ctx, frozen, client.ContainerPauseOptions{}); err != nil {
		t.Fatal(err)
	}
	// The frozen one is due now, the others in five seconds: a reaper that
	// takes one sandbox at a time is stuck on the frozen one by then.
	stuckSince := time.Now()
	stalled.lastUsed.Store(stuckSince.Add(-time.Hour).UnixNano())
	for _, sb := range others {
		sb.lastUsed.Store(stuckSince.UnixNano())
	}

	for _, id := range otherIDs {
		waitGoneWithin(t, testenv.Engine(t), id, limit-time.Second-time.Since(stuckSince))
	}
	if _, err := testenv.Engine(t).ContainerInspect(ctx, frozen, client.ContainerInspectOptions{}); err != nil {
		t.Fatalf("the frozen sandbox was gone before the others (%v, %s after it stalled): this run cannot tell whether they waited for it", err, time.Since(stuckSince))
	}
	for i, sb := range others {
		_, err := sb.Exec(ctx, ExecRequest{Argv: []string{"true"}, Cwd: ".", Timeout: 10 * time.Second})
		if e := wantCode(t, err, errcode.Unavailable); !strings.Contains(e.Message, "saved as snapshot") {
			t.Fatalf("other sandbox: %s", e.Message)
		}
		if got := string(run(t, sb, "cat", "f").Stdout); got != fmt.Sprintf("mine-%d\n", i) {
			t.Fatalf("other sandbox after reaping: %q", got)
		}
	}

	// The frozen one goes at its deadline, not the old ten minutes.
	waitGoneWithin(t, testenv.Engine(t), frozen, limit+20*time.Second-time.Since(stuckSince))
	_, err := stalled.Exec(ctx, ExecRequest{Argv: []string{"true"}, Cwd: ".", Timeout: 10 * time.Second})
	if e := wantCode(t, err, errcode.Unavailable); !strings.Contains(e.Message, "saving its workspace failed") || !strings.Contains(e.Message, limit.String()) {
		t.Fatalf("stalled sandbox: %s", e.Message)
	}
	run(t, stalled, "true") // a fresh container
}

// TestIdleSnapshotSurvivesAnotherCallersSnapshots: the snapshot the reaper
// takes of alice's idle sandbox is what her next container starts from;
// bob taking the store past its count cap loses his own oldest instead.
func TestIdleSnapshotSurvivesAnotherCallersSnapshots(t *testing.T) {
	m := testManager(t, func(o *Options) {
		o.IdleTimeout = time.Second
		o.Retention = snapshot.Retention{MaxCount: 2}
	})
	ctx := context.Background()
	a, _ := m.Sandbox("a", "alice")
	sh(t, a, "echo alice-work > f")
	waitGone(t, testenv.Engine(t), a.ContainerID())
	auto, ok := m.Snapshots().For("alice").Latest(a.ID())
	if !ok || !strings.HasPrefix(auto.Label, "auto:") {
		t.Fatalf("no idle snapshot of alice's sandbox: %+v", auto)
	}
	b, _ := m.Sandbox("b", "bob")
	for i := range 3 {
		if _, err := b.Snapshot(ctx, fmt.Sprint("bob ", i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.Snapshots().Get(auto.ID); err != nil {
		t.Fatalf("bob's snapshots deleted alice's idle snapshot: %v", err)
	}
	_, err := a.Exec(ctx, ExecRequest{Argv: []string{"true"}, Cwd: ".", Timeout: 10 * time.Second})
	wantCode(t, err, errcode.Unavailable)
	if got := string(run(t, a, "cat", "f").Stdout); got != "alice-work\n" {
		t.Fatalf("alice's workspace after her sandbox was reaped: %q", got)
	}
}
