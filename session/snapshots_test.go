package session

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
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

func storeTar(t *testing.T, st *SnapshotStore, sandbox, owner string, data []byte) SnapshotInfo {
	t.Helper()
	info, err := st.Create("test", sandbox, owner, func(w io.Writer) error { _, err := w.Write(data); return err })
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func TestSnapshotStore(t *testing.T) {
	dir := t.TempDir()
	st, err := OpenSnapshotStore(dir, Retention{})
	if err != nil {
		t.Fatal(err)
	}
	data := tarOf(t, "a.txt", "hello", "d/", "", "d/b", "x", "l", "->a.txt")
	info := storeTar(t, st, "sb-1", "", data)
	if !ValidSnapshotID(info.ID) || info.Files != 4 || info.SizeBytes != int64(len(data)) || len(info.SHA256) != 64 || info.URI() != "sandbox://snapshots/"+info.ID {
		t.Fatalf("info: %+v", info)
	}
	got, f, err := st.Open(info.ID)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(f)
	f.Close()
	if !bytes.Equal(b, data) || got.SHA256 != info.SHA256 {
		t.Fatal("stored bytes differ")
	}
	// Not a tar: refused, nothing kept.
	if _, err := st.Create("", "sb-1", "", func(w io.Writer) error { _, err := w.Write(bytes.Repeat([]byte("x"), 1024)); return err }); err == nil {
		t.Fatal("a non-tar stream was stored")
	}
	// Ids are checked before they touch the file system.
	for _, bad := range []string{"../x", "snap-../../etc/passwd", "", "snap-zz"} {
		if _, err := st.Get(bad); err != ErrSnapshotNotFound {
			t.Errorf("Get(%q) = %v", bad, err)
		}
	}
	// A reopened store (a restarted server) has the snapshot.
	st2, err := OpenSnapshotStore(dir, Retention{})
	if err != nil {
		t.Fatal(err)
	}
	if l, _ := st2.List(); len(l) != 1 || l[0].ID != info.ID {
		t.Fatalf("after reopening: %v", l)
	}
	if latest, ok := st2.Latest("sb-1"); !ok || latest.ID != info.ID {
		t.Fatal("Latest")
	}
	if err := st2.Delete(info.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := st2.Get(info.ID); err != ErrSnapshotNotFound {
		t.Fatal("deleted snapshot still there")
	}
	if err := st2.Delete(info.ID); err != ErrSnapshotNotFound {
		t.Fatal("second delete")
	}
	if names, _ := os.ReadDir(dir); len(names) != 0 {
		t.Fatalf("files left: %v", names)
	}
}

func TestSnapshotRetention(t *testing.T) {
	data := tarOf(t, "a", strings.Repeat("x", 2000))
	// By count.
	st, _ := OpenSnapshotStore(t.TempDir(), Retention{MaxCount: 2})
	a := storeTar(t, st, "sb", "", data)
	storeTar(t, st, "sb", "", data)
	c := storeTar(t, st, "sb", "", data)
	l, _ := st.List()
	if len(l) != 2 || l[0].ID == a.ID || l[1].ID != c.ID {
		t.Fatalf("by count: %v", l)
	}
	// By bytes: each is ~3.5 KB, so 8 KB keeps two.
	st, _ = OpenSnapshotStore(t.TempDir(), Retention{MaxBytes: 8 << 10})
	for range 4 {
		storeTar(t, st, "sb", "", data)
	}
	if l, _ := st.List(); len(l) != 2 {
		t.Fatalf("by bytes: %d kept", len(l))
	}
	// By age: a record made long ago is pruned when the store opens.
	dir := t.TempDir()
	st, _ = OpenSnapshotStore(dir, Retention{})
	old := storeTar(t, st, "sb", "", data)
	old.CreatedAt = time.Now().Add(-48 * time.Hour)
	b, _ := json.Marshal(old)
	os.WriteFile(filepath.Join(dir, old.ID+".json"), b, 0o600)
	fresh := storeTar(t, st, "sb", "", data)
	st, _ = OpenSnapshotStore(dir, Retention{MaxAge: 24 * time.Hour})
	if l, _ := st.List(); len(l) != 1 || l[0].ID != fresh.ID {
		t.Fatalf("by age: %v", l)
	}
	// A new snapshot is never pruned by its own creation.
	st, _ = OpenSnapshotStore(t.TempDir(), Retention{MaxCount: 1})
	storeTar(t, st, "sb", "", data)
	n := storeTar(t, st, "sb", "", data)
	if l, _ := st.List(); len(l) != 1 || l[0].ID != n.ID {
		t.Fatalf("the new snapshot was pruned: %v", l)
	}
	// One larger than the byte cap is refused, and leaves nothing behind.
	dir = t.TempDir()
	st, _ = OpenSnapshotStore(dir, Retention{MaxBytes: 1 << 10})
	_, err := st.Create("", "sb", "", func(w io.Writer) error { _, err := w.Write(data); return err })
	wantCode(t, err, errcode.TooLarge)
	if names, _ := os.ReadDir(dir); len(names) != 0 {
		t.Fatalf("files left: %v", names)
	}
}

// ids lists the ids of the stored snapshots of owner, oldest first.
func ids(t *testing.T, st *SnapshotStore, owner string) []string {
	t.Helper()
	all, err := st.List()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, in := range all {
		if in.Owner == owner {
			out = append(out, in.ID)
		}
	}
	return out
}

func TestSnapshotRetentionPerCaller(t *testing.T) {
	data := tarOf(t, "a", strings.Repeat("x", 2000)) // 3.5 KB as tar
	// By count: A making many never deletes B's.
	st, _ := OpenSnapshotStore(t.TempDir(), Retention{PerCallerCount: 2})
	b := storeTar(t, st, "sb-b", "bob", data)
	var a []string
	for range 5 {
		a = append(a, storeTar(t, st, "sb-a", "alice", data).ID)
	}
	if got := ids(t, st, "alice"); !slices.Equal(got, a[3:]) {
		t.Fatalf("alice keeps %v, want her newest two %v", got, a[3:])
	}
	if got := ids(t, st, "bob"); !slices.Equal(got, []string{b.ID}) {
		t.Fatalf("bob's snapshot went: %v", got)
	}
	// By bytes: 8 KiB each keeps two of A's, and B's.
	st, _ = OpenSnapshotStore(t.TempDir(), Retention{PerCallerBytes: 8 << 10})
	b = storeTar(t, st, "sb-b", "bob", data)
	for range 4 {
		storeTar(t, st, "sb-a", "alice", data)
	}
	if got := ids(t, st, "alice"); len(got) != 2 {
		t.Fatalf("alice keeps %d, want 2", len(got))
	}
	if got := ids(t, st, "bob"); !slices.Equal(got, []string{b.ID}) {
		t.Fatalf("bob's snapshot went: %v", got)
	}
	// A caller's lower cap applied when the store opens.
	dir := t.TempDir()
	st, _ = OpenSnapshotStore(dir, Retention{})
	for range 3 {
		storeTar(t, st, "sb-a", "alice", data)
		storeTar(t, st, "sb-b", "bob", data)
	}
	st, _ = OpenSnapshotStore(dir, Retention{PerCallerCount: 1})
	if len(ids(t, st, "alice")) != 1 || len(ids(t, st, "bob")) != 1 {
		t.Fatalf("after reopening with one per caller: %v %v", ids(t, st, "alice"), ids(t, st, "bob"))
	}
}

func TestSnapshotRetentionTotalTakesFromTheBiggest(t *testing.T) {
	small := tarOf(t, "a", "x")                       // 2 KiB as tar
	big := tarOf(t, "a", strings.Repeat("x", 20<<10)) // 22 KiB
	// By count: bob's two are the oldest, but alice holds more.
	st, _ := OpenSnapshotStore(t.TempDir(), Retention{MaxCount: 5})
	b1 := storeTar(t, st, "sb-b", "bob", small)
	b2 := storeTar(t, st, "sb-b", "bob", small)
	var a []string
	for range 3 {
		a = append(a, storeTar(t, st, "sb-a", "alice", small).ID)
	}
	c := storeTar(t, st, "sb-c", "carol", small)
	if got := ids(t, st, "alice"); !slices.Equal(got, a[1:]) {
		t.Fatalf("alice keeps %v, want %v", got, a[1:])
	}
	if !slices.Equal(ids(t, st, "bob"), []string{b1.ID, b2.ID}) || !slices.Equal(ids(t, st, "carol"), []string{c.ID}) {
		t.Fatalf("bob %v, carol %v: a smaller caller lost a snapshot", ids(t, st, "bob"), ids(t, st, "carol"))
	}
	// By bytes: bob has more snapshots, alice more bytes; bob's new one
	// takes alice's oldest.
	st, _ = OpenSnapshotStore(t.TempDir(), Retention{MaxBytes: 60 << 10})
	for range 3 {
		storeTar(t, st, "sb-b", "bob", small)
	}
	a1 := storeTar(t, st, "sb-a", "alice", big)
	a2 := storeTar(t, st, "sb-a", "alice", big)
	storeTar(t, st, "sb-b", "bob", big)
	if got := ids(t, st, "alice"); !slices.Equal(got, []string{a2.ID}) {
		t.Fatalf("alice keeps %v, want only %s (her older one, %s, goes)", got, a2.ID, a1.ID)
	}
	if got := ids(t, st, "bob"); len(got) != 4 {
		t.Fatalf("bob keeps %d, want all 4", len(got))
	}
}

// dirBytes sums the sizes of the archives, records and partial files in dir.
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

// TestSnapshotConcurrentStayUnderTheByteCap: eight snapshots written at
// once, each about 100 KiB, against a 300 KiB cap with 270 KiB stored
// already: the disk never holds more than the cap, snapshots that could
// not all fit get BUSY before writing anything, and old snapshots make
// room as the new ones are written.
func TestSnapshotConcurrentStayUnderTheByteCap(t *testing.T) {
	const capBytes = 300 << 10
	dir := t.TempDir()
	st, err := OpenSnapshotStore(dir, Retention{MaxBytes: capBytes, MaxSnapshotBytes: 120 << 10})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		storeTar(t, st, "sb-old", "", tarOf(t, "old", strings.Repeat("o", 88<<10)))
	}
	data := tarOf(t, "new", strings.Repeat("n", 100<<10))
	var peak atomic.Int64
	sample := func() {
		a, _ := dirBytes(t, dir)
		for {
			p := peak.Load()
			if a <= p || peak.CompareAndSwap(p, a) {
				return
			}
		}
	}
	inFill := make(chan struct{}, 8)
	start := make(chan struct{})
	type result struct {
		info SnapshotInfo
		err  error
	}
	results := make(chan result, 8)
	for range 8 {
		go func() {
			info, err := st.Create("", "sb-new", "", func(w io.Writer) error {
				inFill <- struct{}{}
				<-start
				for p := data; len(p) > 0; {
					n := min(4<<10, len(p))
					if _, err := w.Write(p[:n]); err != nil {
						return err
					}
					p = p[n:]
					sample()
				}
				return nil
			})
			results <- result{info, err}
		}()
	}
	// Every Create either got BUSY or is writing before any writes.
	var got []result
	admitted := 0
	for admitted+len(got) < 8 {
		select {
		case <-inFill:
			admitted++
		case r := <-results:
			got = append(got, r)
		}
	}
	close(start)
	for len(got) < 8 {
		got = append(got, <-results)
	}
	var ok, busy int
	for _, r := range got {
		if r.err == nil {
			ok++
			continue
		}
		if e, isErr := errcode.As(r.err); isErr && e.Code == errcode.Busy {
			busy++
			continue
		}
		t.Errorf("unexpected error: %v", r.err)
	}
	if admitted != 2 || ok != 2 || busy != 6 {
		t.Errorf("admitted %d, stored %d, busy %d; want 2 room for 2 of 120 KiB in 300 KiB, 6 busy", admitted, ok, busy)
	}
	if p := peak.Load(); p > capBytes {
		t.Errorf("the snapshot directory held %d bytes of archives at a time, more than the %d-byte cap", p, capBytes)
	}
	a, _ := dirBytes(t, dir)
	if a > capBytes || len(ids(t, st, "")) != 3 {
		t.Errorf("after: %d bytes in %d snapshots, want under %d in 3 (2 new, 1 old)", a, len(ids(t, st, "")), capBytes)
	}
	// Every reservation was released: a new one fits.
	storeTar(t, st, "sb-new", "", data)
}

// TestSnapshotOutgrowingItsReservation: a stream past its reservation is
// cut with TOO_LARGE, deletes nothing, and gives its room back.
func TestSnapshotOutgrowingItsReservation(t *testing.T) {
	dir := t.TempDir()
	st, _ := OpenSnapshotStore(dir, Retention{PerCallerBytes: 100 << 10, MaxSnapshotBytes: 40 << 10})
	keep := storeTar(t, st, "sb", "alice", tarOf(t, "a", strings.Repeat("x", 30<<10)))
	_, err := st.Create("", "sb", "alice", func(w io.Writer) error {
		_, err := w.Write(make([]byte, 50<<10))
		return err
	})
	if e := wantCode(t, err, errcode.TooLarge); !strings.Contains(e.Message, "40960 bytes") {
		t.Fatalf("message: %s", e.Message)
	}
	if got := ids(t, st, "alice"); !slices.Equal(got, []string{keep.ID}) {
		t.Fatalf("stored: %v", got)
	}
	if a, _ := dirBytes(t, dir); a != keep.SizeBytes {
		t.Fatalf("%d bytes of archives on disk, want %d", a, keep.SizeBytes)
	}
	storeTar(t, st, "sb", "alice", tarOf(t, "a", "x"))
}

// TestSnapshotCreateWaitsForRoom: with room for one snapshot in flight, a
// second Create gets BUSY while CreateWait waits and then stores.
func TestSnapshotCreateWaitsForRoom(t *testing.T) {
	st, _ := OpenSnapshotStore(t.TempDir(), Retention{PerCallerCount: 1})
	data := tarOf(t, "a", "x")
	writing, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, err := st.Create("", "sb", "alice", func(w io.Writer) error {
			close(writing)
			<-release
			_, err := w.Write(data)
			return err
		})
		first <- err
	}()
	<-writing
	_, err := st.Create("", "sb", "alice", func(w io.Writer) error { _, err := w.Write(data); return err })
	wantCode(t, err, errcode.Busy)
	// Another caller is not held up.
	storeTar(t, st, "sb-b", "bob", data)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = st.CreateWait(ctx, "", "sb", "alice", func(w io.Writer) error { _, err := w.Write(data); return err })
	wantCode(t, err, errcode.Busy)
	second := make(chan error, 1)
	go func() {
		_, err := st.CreateWait(context.Background(), "", "sb", "alice", func(w io.Writer) error { _, err := w.Write(data); return err })
		second <- err
	}()
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil {
		t.Fatalf("CreateWait: %v", err)
	}
	if got := ids(t, st, "alice"); len(got) != 1 {
		t.Fatalf("alice keeps %v, want one", got)
	}
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
		o.Retention = Retention{MaxBytes: capBytes}
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
	if _, err := m.Snapshots().Get(old.ID); err != ErrSnapshotNotFound {
		t.Errorf("the old snapshot was not deleted to make room: %v", err)
	}
}
