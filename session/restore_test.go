package session

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/snapshot"
)

// tarOf builds a tar stream from name/content pairs (a trailing "/" makes a
// directory, "->" a symlink).
func tarOf(t *testing.T, entries ...string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i := 0; i+1 < len(entries); i += 2 {
		name, body := entries[i], entries[i+1]
		h := &tar.Header{Name: name, Mode: 0o644, ModTime: time.Now()}
		switch {
		case strings.HasSuffix(name, "/"):
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
		case strings.HasPrefix(body, "->"):
			h.Typeflag, h.Linkname = tar.TypeSymlink, strings.TrimPrefix(body, "->")
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(body))
		}
	}
	tw.Close()
	return buf.Bytes()
}

func storeTar(t *testing.T, st *snapshot.Store, sandbox, owner string, data []byte) snapshot.Info {
	t.Helper()
	info, err := st.For(owner).Create("test", sandbox, func(w io.Writer) error { _, err := w.Write(data); return err })
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// dirBytes sums the sizes of the archives and of the records in dir.
func dirBytes(t *testing.T, dir string) (archives, records int64) {
	names, err := os.ReadDir(dir)
	if err != nil {
		t.Error(err)
		return 0, 0
	}
	for _, e := range names {
		fi, err := e.Info()
		if err != nil {
			continue // deleted meanwhile
		}
		if strings.HasSuffix(e.Name(), ".json") || strings.HasSuffix(e.Name(), ".json.tmp") {
			records += fi.Size()
		} else {
			archives += fi.Size()
		}
	}
	return archives, records
}

func TestRestoreAndFork(t *testing.T) {
	m := testManager(t, nil)
	ctx := context.Background()
	a, _ := m.Sandbox("a", "alice")
	sh(t, a, "mkdir -p src && echo v1 > src/main.txt && ln -s src/main.txt link && chmod 750 src")
	info, err := a.Snapshot(ctx, "v1")
	if err != nil {
		t.Fatal(err)
	}
	sh(t, a, "echo v2 > src/main.txt && rm link && echo junk > extra")
	if _, _, err := a.Restore(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	got := string(sh(t, a, "cat src/main.txt; readlink link; ls; stat -c %a src").Stdout)
	if got != "v1\nsrc/main.txt\nlink\nsrc\n750\n" {
		t.Fatalf("after restore: %q", got)
	}
	// A fork: another sandbox of the same owner starts from the snapshot.
	b, _ := m.Sandbox("b", "alice")
	if _, res, err := b.Restore(ctx, info.ID); err != nil || res.Files < 3 {
		t.Fatalf("fork: %+v %v", res, err)
	}
	if got := string(sh(t, b, "cat src/main.txt").Stdout); got != "v1\n" {
		t.Fatalf("fork content: %q", got)
	}
	// Another owner's snapshot is not found.
	c, _ := m.Sandbox("c", "mallory")
	_, _, err = c.Restore(ctx, info.ID)
	wantCode(t, err, errcode.NotFound)
	_, _, err = c.Restore(ctx, "snap-00000000000000000000")
	wantCode(t, err, errcode.NotFound)
}

func TestRestoreRefusesHostileArchives(t *testing.T) {
	m := testManager(t, nil)
	ctx := context.Background()
	sb := newSandbox(t, m)
	sh(t, sb, "echo keep > keep.txt")
	for name, data := range map[string][]byte{
		"dot-dot":            tarOf(t, "../x", "evil"),
		"absolute":           tarOf(t, "/tmp/x", "evil"),
		"symlink-then-write": tarOf(t, "link", "->/tmp", "link/x", "evil"),
	} {
		info := storeTar(t, m.Snapshots(), sb.ID(), "", data)
		_, _, err := sb.Restore(ctx, info.ID)
		if e, ok := errcode.As(err); !ok || e.Code != errcode.InvalidArgument {
			t.Errorf("%s: %v, want INVALID_ARGUMENT", name, err)
		}
	}
	if got := string(sh(t, sb, "cat keep.txt; ls -A /tmp").Stdout); got != "keep\n" {
		t.Fatalf("the workspace changed or /tmp was written: %q", got)
	}
	// Setuid bits are neutralised.
	info := storeTar(t, m.Snapshots(), sb.ID(), "", func() []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: "s", Mode: 0o4755, Size: 2, Typeflag: tar.TypeReg})
		tw.Write([]byte("x\n"))
		tw.Close()
		return buf.Bytes()
	}())
	if _, _, err := sb.Restore(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(sh(t, sb, "stat -c %a s").Stdout)); got != "755" {
		t.Fatalf("mode after restore: %s", got)
	}
}

func TestLostContainerRecoversFromLatestSnapshot(t *testing.T) {
	m := testManager(t, nil)
	ctx := context.Background()
	sb := newSandbox(t, m)
	sh(t, sb, "echo saved > work.txt")
	info, err := sb.Snapshot(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ContainerID()
	if _, err := testenv.Engine(t).ContainerRemove(ctx, id, client.ContainerRemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, testenv.Engine(t), id)
	_, err = sb.Exec(ctx, ExecRequest{Argv: []string{"true"}, Cwd: ".", Timeout: 10 * time.Second})
	e := wantCode(t, err, errcode.Unavailable)
	if !strings.Contains(e.Message, info.ID) {
		t.Fatalf("the message does not name the snapshot the next call restores: %s", e.Message)
	}
	if got := string(run(t, sb, "cat", "work.txt").Stdout); got != "saved\n" {
		t.Fatalf("after recovery: %q", got)
	}
	// The same when the agent dies under a call.
	err = execKillingAgent(t, m, sb)
	if e := wantCode(t, err, errcode.Unavailable); !strings.Contains(e.Message, info.ID) {
		t.Fatalf("message: %s", e.Message)
	}
	if got := string(run(t, sb, "cat", "work.txt").Stdout); got != "saved\n" {
		t.Fatalf("after the agent died: %q", got)
	}
}

func TestIdleRemovalKeepsTheWork(t *testing.T) {
	m := testManager(t, func(o *Options) { o.IdleTimeout = time.Second })
	sb := newSandbox(t, m)
	sh(t, sb, "echo mine > work.txt")
	id := sb.ContainerID()
	waitGone(t, testenv.Engine(t), id)
	_, err := sb.Exec(context.Background(), ExecRequest{Argv: []string{"true"}, Cwd: ".", Timeout: 10 * time.Second})
	e := wantCode(t, err, errcode.Unavailable)
	if !strings.Contains(e.Message, "saved as snapshot") {
		t.Fatalf("message: %s", e.Message)
	}
	if got := string(run(t, sb, "cat", "work.txt").Stdout); got != "mine\n" {
		t.Fatalf("after idle removal: %q", got)
	}
}

func TestSnapshotsSurviveAServerRestart(t *testing.T) {
	state := t.TempDir()
	m1 := testManager(t, func(o *Options) { o.StateDir = state })
	sb, _ := m1.Sandbox("one", "")
	sh(t, sb, "echo persisted > p.txt")
	info, err := sb.Snapshot(context.Background(), "before restart")
	if err != nil {
		t.Fatal(err)
	}
	if err := m1.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	m2 := testManager(t, func(o *Options) { o.StateDir = state })
	sb2, _ := m2.Sandbox("two", "")
	if _, _, err := sb2.Restore(context.Background(), info.ID); err != nil {
		t.Fatal(err)
	}
	if got := string(run(t, sb2, "cat", "p.txt").Stdout); got != "persisted\n" {
		t.Fatalf("after a restart: %q", got)
	}
}

// TestConcurrentSnapshotsOfAWorkspaceStayUnderTheByteCap: eight snapshots
// of a 100 MiB workspace at once, against a 300 MiB cap that one earlier
// snapshot shares, while the snapshot directory is sampled: it never holds
// more than the cap. Each reserves the workspace's stream limit (145 MiB),
// so two are written, the old one deleted to make room for them, and six
// get BUSY at once.
func TestConcurrentSnapshotsOfAWorkspaceStayUnderTheByteCap(t *testing.T) {
	const capBytes = 300 << 20
	state := t.TempDir()
	m := testManager(t, func(o *Options) {
		o.StateDir = state
		o.Policy.MaxWorkspaceBytes = 128 << 20
		o.Policy.Memory = 512 << 20
		o.Retention = snapshot.Retention{MaxBytes: capBytes}
	})
	sb := newSandbox(t, m)
	sh(t, sb, "head -c 104857600 /dev/urandom > big")
	dir := filepath.Join(state, "snapshots")
	// One stored already: with two more it passes the cap, and makes room.
	old, err := sb.Snapshot(context.Background(), "old")
	if err != nil {
		t.Fatal(err)
	}

	stop := make(chan struct{})
	sampled := make(chan int64)
	go func() {
		var peak int64
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			a, _ := dirBytes(t, dir)
			peak = max(peak, a)
			select {
			case <-stop:
				sampled <- peak
				return
			case <-tick.C:
			}
		}
	}()
	errs := make(chan error, 8)
	for range 8 {
		go func() {
			_, err := sb.Snapshot(context.Background(), "")
			errs <- err
		}()
	}
	var ok, busy int
	for range 8 {
		err := <-errs
		switch e, isErr := errcode.As(err); {
		case err == nil:
			ok++
		case isErr && e.Code == errcode.Busy:
			busy++
		default:
			t.Errorf("snapshot: %v", err)
		}
	}
	close(stop)
	peak := <-sampled
	t.Logf("%d stored, %d busy; at most %d MiB of archives on disk", ok, busy, peak>>20)
	if ok != 2 || busy != 6 {
		t.Errorf("%d stored, %d busy; want 2 and 6", ok, busy)
	}
	if peak > capBytes {
		t.Errorf("the snapshot directory held %d bytes of archives at a time, more than the %d-byte cap", peak, capBytes)
	}
	if a, _ := dirBytes(t, dir); a > capBytes {
		t.Errorf("%d bytes of archives left, more than the cap", a)
	}
	if _, err := m.Snapshots().Get(old.ID); err != snapshot.ErrNotFound {
		t.Errorf("the old snapshot was not deleted to make room: %v", err)
	}
}
