package session

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

// TestRecordsAreWrittenWholeAndKeptPerSlot: a record replaces the last one
// atomically, a torn temporary file of a killed write is cleaned up and
// never read as a record, a damaged record is skipped with an error, and
// another slot's records are not seen.
func TestRecordsAreWrittenWholeAndKeptPerSlot(t *testing.T) {
	state := t.TempDir()
	slot, err := OpenSlot(state, AnySlot)
	if err != nil {
		t.Fatal(err)
	}
	defer slot.Close()
	recs, err := OpenRecords(slot)
	if err != nil {
		t.Fatal(err)
	}
	created := time.Date(2026, 12, 2, 6, 0, 0, 0, time.UTC)
	a := Record{Sandbox: "sb-0123456789abcdef", Owner: "alice", Created: created, Container: "sandbox-mcp-sb-0123456789abcdef-1", Generation: 1, Token: "t1"}
	if err := recs.Put(a); err != nil {
		t.Fatal(err)
	}
	a.Generation, a.Container, a.Snapshot = 2, "sandbox-mcp-sb-0123456789abcdef-2", "snap-00000000000000000001"
	if err := recs.Put(a); err != nil {
		t.Fatal(err)
	}
	if err := recs.Put(Record{Sandbox: "../escape"}); err == nil {
		t.Fatal("a record named outside the store was written")
	}
	dir := filepath.Join(slot.Dir(), "sandboxes")
	if fi, err := os.Stat(filepath.Join(dir, a.Sandbox+".json")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("record file: %v %v", fi, err)
	}
	os.WriteFile(filepath.Join(dir, ".tmp-123"), []byte(`{"sandbox":`), 0o600)
	os.WriteFile(filepath.Join(dir, "sb-broken.json"), []byte(`{"sandbox":`), 0o600)
	recs, err = OpenRecords(slot)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, ".tmp-123")); !os.IsNotExist(err) {
		t.Fatal("a torn temporary record was left")
	}
	list, err := recs.List()
	if err == nil {
		t.Fatal("a damaged record gave no error")
	}
	if len(list) != 1 || !reflect.DeepEqual(list[0], a) {
		t.Fatalf("records: %+v", list)
	}
	// A second server on the same state directory has a slot of its own.
	other, err := OpenSlot(state, AnySlot)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	orecs, err := OpenRecords(other)
	if err != nil {
		t.Fatal(err)
	}
	if l, _ := orecs.List(); len(l) != 0 {
		t.Fatalf("another slot sees %+v", l)
	}
	if err := recs.Delete(a.Sandbox); err != nil {
		t.Fatal(err)
	}
	if err := recs.Delete(a.Sandbox); err != nil {
		t.Fatalf("deleting again: %v", err)
	}
}
