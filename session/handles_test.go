package session

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
)

// create makes a sandbox by handle for owner, failing the test if it
// cannot.
func create(t *testing.T, m *Manager, owner string, o CreateOptions) *Sandbox {
	t.Helper()
	sb, err := m.Create(context.Background(), owner, o)
	if err != nil {
		t.Fatalf("Create(%q, %+v): %v", owner, o, err)
	}
	return sb
}

// TestHandlesAreIsolatedAndOwned: one caller's two sandboxes by handle
// have their own workspaces; a handle has 128 random bits; another caller
// naming it gets the very error of a handle never made, and cannot end it.
func TestHandlesAreIsolatedAndOwned(t *testing.T) {
	m := testManager(t, nil)
	ctx := context.Background()
	a := create(t, m, "alice", CreateOptions{Label: "clean"})
	b := create(t, m, "alice", CreateOptions{})
	if !regexp.MustCompile(`^sb-[0-9a-f]{32}$`).MatchString(a.ID()) || a.ID() == b.ID() {
		t.Fatalf("handles %q and %q: want sb- and 32 hex digits each, distinct", a.ID(), b.ID())
	}
	sh(t, a, "echo mine > only-in-a.txt")
	if res := run(t, b, "cat", "only-in-a.txt"); res.ExitCode == 0 {
		t.Fatalf("sandbox b reads a's file: %q", res.Stdout)
	}
	if res := run(t, a, "cat", "only-in-a.txt"); string(res.Stdout) != "mine\n" {
		t.Fatalf("a's own file: %q", res.Stdout)
	}

	// Another owner: the same NOT_FOUND as a handle never made, byte for
	// byte but the handle itself; and Lookup, List and End agree.
	never := "sb-" + strings.Repeat("0", 32)
	_, errOther := m.Find(a.ID(), "bob")
	_, errNever := m.Find(never, "bob")
	wantCode(t, errOther, errcode.NotFound)
	if got, want := errOther.Error(), strings.ReplaceAll(errNever.Error(), never, a.ID()); got != want {
		t.Fatalf("another caller's handle:\n%s\nwant the error of one never made:\n%s", got, want)
	}
	for _, hint := range []string{"sandbox_status", "sandbox_create"} {
		if !strings.Contains(errNever.Error(), hint) {
			t.Errorf("the error does not say to call %s: %s", hint, errNever)
		}
	}
	if _, ok := m.Lookup(a.ID(), "bob"); ok {
		t.Fatal("Lookup finds another caller's sandbox")
	}
	if _, err := m.End(ctx, a.ID(), "bob", false); err == nil || err.Error() != errOther.Error() {
		t.Fatalf("another caller's End: %v; want %v", err, errOther)
	}
	if got := m.List(ctx, "bob"); len(got) != 0 {
		t.Fatalf("bob lists %+v", got)
	}
	list := m.List(ctx, "alice")
	if len(list) != 2 || list[0].Handle != a.ID() || list[1].Handle != b.ID() {
		t.Fatalf("alice lists %+v, want a then b", list)
	}
	if list[0].Label != "clean" || list[0].Template != "default" || list[0].State != StateRunning || list[0].Jobs != 0 || list[0].Session {
		t.Fatalf("a listed as %+v", list[0])
	}
	// a is still alice's after bob's tries.
	if res := run(t, a, "cat", "only-in-a.txt"); string(res.Stdout) != "mine\n" {
		t.Fatalf("after another caller's End: %q", res.Stdout)
	}
}

// TestHandleStatusStartsNothing: a new handle is listed as new without a
// container, and listing it does not count as its use.
func TestHandleStatusStartsNothing(t *testing.T) {
	m := testManager(t, nil)
	a := create(t, m, "", CreateOptions{})
	before := a.lastUsed.Load()
	time.Sleep(10 * time.Millisecond)
	list := m.List(context.Background(), "")
	if len(list) != 1 || list[0].State != StateNew || a.ContainerID() != "" || a.lastUsed.Load() != before {
		t.Fatalf("listed %+v, container %q, last used moved: %v", list, a.ContainerID(), a.lastUsed.Load() != before)
	}
}

// TestEndWithSnapshotThenCreateFromIt: End saves the workspace first, a
// later call naming the handle says it ended and names that snapshot, and
// a sandbox created from it has the files.
func TestEndWithSnapshotThenCreateFromIt(t *testing.T) {
	m := testManager(t, nil)
	ctx := context.Background()
	a := create(t, m, "alice", CreateOptions{})
	sh(t, a, "echo kept > work.txt")
	container := a.ContainerID()
	saved, err := m.End(ctx, a.ID(), "alice", true)
	if err != nil || saved == nil {
		t.Fatalf("End: %v %v", saved, err)
	}
	waitGone(t, testenv.Engine(t), container)
	_, err = m.Find(a.ID(), "alice")
	if e := wantCode(t, err, errcode.NotFound); !strings.Contains(e.Message, saved.ID) || !strings.Contains(e.Message, "sandbox_create") {
		t.Fatalf("a call naming the ended handle: %s", e.Message)
	}
	// A call holding the old sandbox gets the same.
	if _, err := a.Exec(ctx, ExecRequest{Argv: []string{"true"}, Cwd: ".", Timeout: time.Second}); err == nil || !strings.Contains(err.Error(), saved.ID) {
		t.Fatalf("a call into the ended sandbox: %v", err)
	}
	// Another caller learns nothing of it.
	_, errOther := m.Find(a.ID(), "bob")
	_, errNever := m.Find("sb-x", "bob")
	if errOther.Error() != strings.ReplaceAll(errNever.Error(), "sb-x", a.ID()) {
		t.Fatalf("another caller naming an ended handle: %v", errOther)
	}
	b := create(t, m, "alice", CreateOptions{Snapshot: saved.ID})
	if got := b.Info().From; got != saved.ID {
		t.Fatalf("made from %q, want %q", got, saved.ID)
	}
	if res := run(t, b, "cat", "work.txt"); string(res.Stdout) != "kept\n" {
		t.Fatalf("created from the snapshot: %q", res.Stdout)
	}
	c := create(t, m, "alice", CreateOptions{Snapshot: "latest"})
	if res := run(t, c, "cat", "work.txt"); string(res.Stdout) != "kept\n" {
		t.Fatalf("created from latest: %q", res.Stdout)
	}
	// Another caller cannot start from alice's snapshot.
	_, err = m.Create(ctx, "bob", CreateOptions{Snapshot: saved.ID})
	wantCode(t, err, errcode.NotFound)
	_, err = m.Create(ctx, "alice", CreateOptions{Template: "python"})
	if e := wantCode(t, err, errcode.InvalidArgument); !strings.Contains(e.Message, "default") {
		t.Fatalf("an unknown template: %s", e.Message)
	}
}

// TestIdleHandleComesBackFromItsSnapshot: past --idle-timeout a handle's
// container goes, its record stays, and its next call succeeds in a
// container restored from the saved workspace, with a notice saying so.
func TestIdleHandleComesBackFromItsSnapshot(t *testing.T) {
	m := testManager(t, func(o *Options) { o.IdleTimeout = time.Second })
	a := create(t, m, "", CreateOptions{})
	sh(t, a, "echo mine > work.txt")
	waitGone(t, testenv.Engine(t), a.ContainerID())
	if list := m.List(context.Background(), ""); len(list) != 1 || list[0].State != StateIdleSaved {
		t.Fatalf("listed %+v, want one idle-saved", list)
	}
	if res := run(t, a, "cat", "work.txt"); string(res.Stdout) != "mine\n" {
		t.Fatalf("after the idle removal: %q", res.Stdout)
	}
	n := a.TakeNotice()
	if !strings.Contains(n, "--idle-timeout") || !strings.Contains(n, "restored from snapshot snap-") {
		t.Fatalf("notice: %q", n)
	}
	if again := a.TakeNotice(); again != "" {
		t.Fatalf("a second notice: %q", again)
	}
}

// TestLifetimeEndsAHandle: --max-sandbox-lifetime saves the workspace,
// then ends the handle; later calls get NOT_FOUND naming the snapshot,
// from which a new sandbox starts with the files.
func TestLifetimeEndsAHandle(t *testing.T) {
	m := testManager(t, func(o *Options) { o.MaxLifetime = time.Second })
	a := create(t, m, "", CreateOptions{})
	// Its lifetime starts once the work is done, however long the
	// container took to start.
	setCreated := func(s *Sandbox, at time.Time) {
		m.mu.Lock()
		s.created = at
		m.mu.Unlock()
	}
	setCreated(a, time.Now().Add(time.Hour))
	sh(t, a, "echo late > work.txt")
	container := a.ContainerID()
	implicit := newSandbox(t, m) // a session's own is not ended by it
	run(t, implicit, "true")
	setCreated(a, time.Now().Add(-time.Minute))
	var err error
	for deadline := time.Now().Add(90 * time.Second); ; {
		if _, err = m.Find(a.ID(), ""); err != nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	e := wantCode(t, err, errcode.NotFound)
	if !strings.Contains(e.Message, "--max-sandbox-lifetime") {
		t.Fatalf("message: %s", e.Message)
	}
	snap := regexp.MustCompile(`snap-[0-9a-f]+`).FindString(e.Message)
	if snap == "" {
		t.Fatalf("the message names no snapshot: %s", e.Message)
	}
	waitGone(t, testenv.Engine(t), container)
	b := create(t, m, "", CreateOptions{Snapshot: snap})
	setCreated(b, time.Now().Add(time.Hour))
	if res := run(t, b, "cat", "work.txt"); string(res.Stdout) != "late\n" {
		t.Fatalf("from the lifetime's snapshot: %q", res.Stdout)
	}
	if _, err := m.Find(implicit.ID(), ""); err != nil {
		t.Fatalf("the session's own sandbox was ended: %v", err)
	}
}

// TestSandboxQuotasAtCreation: --max-sandboxes-per-caller and
// --max-sandboxes count every sandbox, a session's own included, when it
// is made, and say what to do.
func TestSandboxQuotasAtCreation(t *testing.T) {
	m := testManager(t, func(o *Options) { o.MaxSandboxes, o.MaxSandboxesPerCaller = 3, 2 })
	ctx := context.Background()
	if _, err := m.Sandbox("alice-session", "alice"); err != nil {
		t.Fatal(err)
	}
	a := create(t, m, "alice", CreateOptions{})
	_, err := m.Create(ctx, "alice", CreateOptions{})
	if e := wantCode(t, err, errcode.Busy); !strings.Contains(e.Message, "--max-sandboxes-per-caller") || !strings.Contains(e.Message, "sandbox_end") {
		t.Fatalf("past the caller's share: %s", e.Message)
	}
	_, err = m.Sandbox("alice-other-session", "alice")
	wantCode(t, err, errcode.Busy)
	create(t, m, "bob", CreateOptions{})
	_, err = m.Create(ctx, "carol", CreateOptions{})
	if e := wantCode(t, err, errcode.Busy); !strings.Contains(e.Message, "--max-sandboxes)") || !strings.Contains(e.Message, "sandbox_end") {
		t.Fatalf("past the server's: %s", e.Message)
	}
	_, err = m.Sandbox("carol-session", "carol")
	wantCode(t, err, errcode.Busy)
	if _, err := m.End(ctx, a.ID(), "alice", false); err != nil {
		t.Fatal(err)
	}
	create(t, m, "carol", CreateOptions{})
}
