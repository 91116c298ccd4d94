package snapshot

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

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
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

func storeTar(t *testing.T, st *Store, sandbox, owner string, data []byte) Info {
	t.Helper()
	info, err := st.For(owner).Create("test", sandbox, func(w io.Writer) error { _, err := w.Write(data); return err })
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func TestSnapshotStore(t *testing.T) {
	dir := t.TempDir()
	st, err := OpenStore(dir, Retention{})
	if err != nil {
		t.Fatal(err)
	}
	data := tarOf(t, "a.txt", "hello", "d/", "", "d/b", "x", "l", "->a.txt")
	info := storeTar(t, st, "sb-1", "", data)
	if !ValidID(info.ID) || info.Files != 4 || info.SizeBytes != int64(len(data)) || len(info.SHA256) != 64 || info.URI() != "sandbox://snapshots/"+info.ID {
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
	if _, err := st.For("").Create("", "sb-1", func(w io.Writer) error { _, err := w.Write(bytes.Repeat([]byte("x"), 1024)); return err }); err == nil {
		t.Fatal("a non-tar stream was stored")
	}
	// Ids are checked before they touch the file system.
	for _, bad := range []string{"../x", "snap-../../etc/passwd", "", "snap-zz"} {
		if _, err := st.Get(bad); err != ErrNotFound {
			t.Errorf("Get(%q) = %v", bad, err)
		}
	}
	// A reopened store (a restarted server) has the snapshot.
	st2, err := OpenStore(dir, Retention{})
	if err != nil {
		t.Fatal(err)
	}
	if l, _ := st2.List(); len(l) != 1 || l[0].ID != info.ID {
		t.Fatalf("after reopening: %v", l)
	}
	if latest, ok := st2.For("").Latest("sb-1"); !ok || latest.ID != info.ID {
		t.Fatal("Latest")
	}
	if err := st2.Delete(info.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := st2.Get(info.ID); err != ErrNotFound {
		t.Fatal("deleted snapshot still there")
	}
	if err := st2.Delete(info.ID); err != ErrNotFound {
		t.Fatal("second delete")
	}
	if names, _ := os.ReadDir(dir); len(names) != 0 {
		t.Fatalf("files left: %v", names)
	}
}

func TestSnapshotRetention(t *testing.T) {
	data := tarOf(t, "a", strings.Repeat("x", 2000))
	// By count.
	st, _ := OpenStore(t.TempDir(), Retention{MaxCount: 2})
	a := storeTar(t, st, "sb", "", data)
	storeTar(t, st, "sb", "", data)
	c := storeTar(t, st, "sb", "", data)
	l, _ := st.List()
	if len(l) != 2 || l[0].ID == a.ID || l[1].ID != c.ID {
		t.Fatalf("by count: %v", l)
	}
	// By bytes: each is ~3.5 KB, so 8 KB keeps two.
	st, _ = OpenStore(t.TempDir(), Retention{MaxBytes: 8 << 10})
	for range 4 {
		storeTar(t, st, "sb", "", data)
	}
	if l, _ := st.List(); len(l) != 2 {
		t.Fatalf("by bytes: %d kept", len(l))
	}
	// By age: a record made long ago is pruned when the store opens.
	dir := t.TempDir()
	st, _ = OpenStore(dir, Retention{})
	old := storeTar(t, st, "sb", "", data)
	old.CreatedAt = time.Now().Add(-48 * time.Hour)
	b, _ := json.Marshal(old)
	os.WriteFile(filepath.Join(dir, old.ID+".json"), b, 0o600)
	fresh := storeTar(t, st, "sb", "", data)
	st, _ = OpenStore(dir, Retention{MaxAge: 24 * time.Hour})
	if l, _ := st.List(); len(l) != 1 || l[0].ID != fresh.ID {
		t.Fatalf("by age: %v", l)
	}
	// A new snapshot is never pruned by its own creation.
	st, _ = OpenStore(t.TempDir(), Retention{MaxCount: 1})
	storeTar(t, st, "sb", "", data)
	n := storeTar(t, st, "sb", "", data)
	if l, _ := st.List(); len(l) != 1 || l[0].ID != n.ID {
		t.Fatalf("the new snapshot was pruned: %v", l)
	}
	// One larger than the byte cap is refused, and leaves nothing behind.
	dir = t.TempDir()
	st, _ = OpenStore(dir, Retention{MaxBytes: 1 << 10})
	_, err := st.For("").Create("", "sb", func(w io.Writer) error { _, err := w.Write(data); return err })
	wantCode(t, err, errcode.TooLarge)
	if names, _ := os.ReadDir(dir); len(names) != 0 {
		t.Fatalf("files left: %v", names)
	}
}

// ids lists the ids of the stored snapshots of owner, oldest first.
func ids(t *testing.T, st *Store, owner string) []string {
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
	st, _ := OpenStore(t.TempDir(), Retention{PerCallerCount: 2})
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
	st, _ = OpenStore(t.TempDir(), Retention{PerCallerBytes: 8 << 10})
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
	st, _ = OpenStore(dir, Retention{})
	for range 3 {
		storeTar(t, st, "sb-a", "alice", data)
		storeTar(t, st, "sb-b", "bob", data)
	}
	st, _ = OpenStore(dir, Retention{PerCallerCount: 1})
	if len(ids(t, st, "alice")) != 1 || len(ids(t, st, "bob")) != 1 {
		t.Fatalf("after reopening with one per caller: %v %v", ids(t, st, "alice"), ids(t, st, "bob"))
	}
}

func TestSnapshotRetentionTotalTakesFromTheBiggest(t *testing.T) {
	small := tarOf(t, "a", "x")                       // 2 KiB as tar
	big := tarOf(t, "a", strings.Repeat("x", 20<<10)) // 22 KiB
	// By count: bob's two are the oldest, but alice holds more.
	st, _ := OpenStore(t.TempDir(), Retention{MaxCount: 5})
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
	st, _ = OpenStore(t.TempDir(), Retention{MaxBytes: 60 << 10})
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
	st, err := OpenStore(dir, Retention{MaxBytes: capBytes, MaxSnapshotBytes: 120 << 10})
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
		info Info
		err  error
	}
	results := make(chan result, 8)
	for range 8 {
		go func() {
			info, err := st.For("").Create("", "sb-new", func(w io.Writer) error {
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
	st, _ := OpenStore(dir, Retention{PerCallerBytes: 100 << 10, MaxSnapshotBytes: 40 << 10})
	keep := storeTar(t, st, "sb", "alice", tarOf(t, "a", strings.Repeat("x", 30<<10)))
	_, err := st.For("alice").Create("", "sb", func(w io.Writer) error {
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
	st, _ := OpenStore(t.TempDir(), Retention{PerCallerCount: 1})
	data := tarOf(t, "a", "x")
	writing, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, err := st.For("alice").Create("", "sb", func(w io.Writer) error {
			close(writing)
			<-release
			_, err := w.Write(data)
			return err
		})
		first <- err
	}()
	<-writing
	_, err := st.For("alice").Create("", "sb", func(w io.Writer) error { _, err := w.Write(data); return err })
	wantCode(t, err, errcode.Busy)
	// Another caller is not held up.
	storeTar(t, st, "sb-b", "bob", data)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = st.For("alice").CreateWait(ctx, "", "sb", func(w io.Writer) error { _, err := w.Write(data); return err })
	wantCode(t, err, errcode.Busy)
	second := make(chan error, 1)
	go func() {
		_, err := st.For("alice").CreateWait(context.Background(), "", "sb", func(w io.Writer) error { _, err := w.Write(data); return err })
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

func wantCode(t *testing.T, err error, code errcode.Code) *errcode.Error {
	t.Helper()
	e, ok := errcode.As(err)
	if !ok {
		t.Fatalf("error = %v (%T), want a %s *errcode.Error", err, err, code)
	}
	if e.Code != code {
		t.Fatalf("code = %s (%s), want %s", e.Code, e.Message, code)
	}
	return e
}

// TestOpenStoreSparesAnotherServersSnapshotInFlight: servers share the
// state directory, so a store opening it removes only the incoming files
// nobody has touched for a long time, never one another server writes now.
func TestOpenStoreSparesAnotherServersSnapshotInFlight(t *testing.T) {
	dir := t.TempDir()
	fresh, old := filepath.Join(dir, ".incoming-fresh"), filepath.Join(dir, ".incoming-old")
	for _, p := range []string{fresh, old} {
		if err := os.WriteFile(p, []byte("tar"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	past := time.Now().Add(-time.Hour)
	if err := os.Chtimes(old, past, past); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenStore(dir, Retention{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Fatalf("a snapshot being written was removed: %v", err)
	}
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Fatalf("a leftover of an hour ago was kept: %v", err)
	}
}
