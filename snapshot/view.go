package snapshot

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
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

// Latest is what sandbox_restore and sandbox_create take for the caller's
// newest snapshot.
const Latest = "latest"

// listYours is how a caller sees its snapshots.
const listYours = "sandbox_snapshot with list: true shows yours"

// Resolve turns what a caller names a snapshot by (an id, Latest, or a
// label no other snapshot of the caller has) into one of its snapshot ids.
// An id is returned as it is: whether it is the caller's is for Open to
// say.
func (v *View) Resolve(name string) (string, error) {
	if ValidID(name) {
		return name, nil
	}
	mine, err := v.List()
	if err != nil {
		return "", err
	}
	if name == Latest {
		if len(mine) == 0 {
			return "", errcode.Errorf(errcode.NotFound, "you have no snapshots to restore; sandbox_snapshot makes one")
		}
		return mine[len(mine)-1].ID, nil // oldest first
	}
	var ids []string
	for i := len(mine) - 1; i >= 0; i-- {
		if mine[i].Label == name {
			ids = append(ids, fmt.Sprintf("%s (%s)", mine[i].ID, mine[i].CreatedAt.UTC().Format(time.RFC3339)))
		}
	}
	switch len(ids) {
	case 0:
		return "", errcode.Errorf(errcode.NotFound, "no snapshot of yours has the id or label %q; %s", name, listYours)
	case 1:
		id, _, _ := strings.Cut(ids[0], " ")
		return id, nil
	}
	return "", errcode.Errorf(errcode.InvalidArgument, "%d snapshots of yours have the label %q: %s (newest first); pass the id of the one to use", len(ids), name, strings.Join(ids, ", "))
}
