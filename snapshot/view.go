package snapshot

import (
	"errors"
	"os"
	"slices"
)

// View is one caller's view of the store: the snapshots that caller's
// sandboxes made, and nothing else. Another caller's snapshot does not
// exist in it (ErrNotFound, as for an id never made), so a caller can
// neither read, restore, list nor delete it, nor learn that it exists.
type View struct {
	s     *Store
	owner string
}

// For returns owner's view of the store ("" is the caller on stdio, which
// has no authentication).
func (s *Store) For(owner string) *View { return &View{s: s, owner: owner} }

// Owner returns the caller whose view this is.
func (v *View) Owner() string { return v.owner }

// Get returns the record of one of the caller's snapshots.
func (v *View) Get(id string) (Info, error) {
	info, err := v.s.Get(id)
	if err == nil && info.Owner != v.owner {
		return Info{}, ErrNotFound
	}
	return info, err
}

// Open returns the record and the tar stream of one of the caller's
// snapshots; the caller closes the file.
func (v *View) Open(id string) (Info, *os.File, error) {
	info, f, err := v.s.Open(id)
	if err == nil && info.Owner != v.owner {
		f.Close()
		return Info{}, nil, ErrNotFound
	}
	return info, f, err
}

// List returns the caller's snapshots, oldest first.
func (v *View) List() ([]Info, error) {
	all, err := v.s.List()
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(all, func(in Info) bool { return in.Owner != v.owner }), nil
}

// Delete deletes one of the caller's snapshots. One deleted meanwhile by
// another call (or by retention) counts as deleted.
func (v *View) Delete(id string) error {
	if _, err := v.Get(id); err != nil {
		return err
	}
	if err := v.s.Delete(id); err != nil && !errors.Is(err, ErrNotFound) {
		return err
	}
	return nil
}

// Latest returns the caller's newest snapshot that sandbox made.
func (v *View) Latest(sandbox string) (Info, bool) { return v.s.latest(v.owner, sandbox) }
