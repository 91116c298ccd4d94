package snapshot

import (
	"errors"
	"testing"
)

// TestViewHidesOtherCallers: in a caller's view another caller's snapshot
// does not exist. Get, Open and Delete answer exactly as for an id never
// made, List and Latest leave it out, and Delete leaves it on disk; the
// owner's own view, and the operator's store, see it.
func TestViewHidesOtherCallers(t *testing.T) {
	st, err := OpenStore(t.TempDir(), Retention{})
	if err != nil {
		t.Fatal(err)
	}
	alices := storeTar(t, st, "sb-a", "alice", tarOf(t, "a.txt", "alice's"))
	bobs := storeTar(t, st, "sb-b", "bob", tarOf(t, "b.txt", "bob's"))
	const never = "snap-00000000000000000000"
	bob := st.For("bob")

	for _, id := range []string{alices.ID, never} {
		if _, err := bob.Get(id); !errors.Is(err, ErrNotFound) {
			t.Errorf("bob.Get(%s) = %v, want ErrNotFound", id, err)
		}
		if _, f, err := bob.Open(id); !errors.Is(err, ErrNotFound) || f != nil {
			t.Errorf("bob.Open(%s) = %v, %v, want ErrNotFound and no file", id, f, err)
		}
		if err := bob.Delete(id); !errors.Is(err, ErrNotFound) {
			t.Errorf("bob.Delete(%s) = %v, want ErrNotFound", id, err)
		}
	}
	if _, ok := bob.Latest("sb-a"); ok {
		t.Error("bob.Latest finds alice's sandbox's snapshot")
	}
	list, err := bob.List()
	if err != nil || len(list) != 1 || list[0].ID != bobs.ID {
		t.Errorf("bob.List() = %v, %v, want only %s", list, err, bobs.ID)
	}
	// The anonymous caller (stdio) is a caller like any other.
	if list, _ := st.For("").List(); len(list) != 0 {
		t.Errorf("the anonymous caller sees %v", list)
	}

	alice := st.For("alice")
	if _, err := alice.Get(alices.ID); err != nil {
		t.Fatalf("alice cannot see her own snapshot after bob's delete: %v", err)
	}
	if latest, ok := alice.Latest("sb-a"); !ok || latest.ID != alices.ID {
		t.Errorf("alice.Latest = %v, %v", latest, ok)
	}
	if all, _ := st.List(); len(all) != 2 {
		t.Errorf("the operator's store lists %d snapshots, want 2", len(all))
	}
	if err := alice.Delete(alices.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Get(alices.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("after alice's delete: %v", err)
	}
}
