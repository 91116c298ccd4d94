package session

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Record is what a server keeps on disk, in its slot, of a sandbox it owns,
// so that a server started again on the slot can take the sandbox back:
// its container (still running on the agent's lease: re-adopted, jobs
// included) or, when that is gone, its last snapshot.
type Record struct {
	// Sandbox is the sandbox's id (its handle).
	Sandbox string `json:"sandbox"`
	// Owner is the caller the sandbox belongs to ("" on stdio).
	Owner string `json:"owner"`
	// Label and Template are what the caller named the sandbox and the
	// template it was made from ("" for none).
	Label    string `json:"label,omitempty"`
	Template string `json:"template,omitempty"`
	// Handle says the sandbox was made by Create: it outlives sessions,
	// so a server started again keeps it under its handle; a session's
	// own sandbox is kept only for calls that name it by id.
	Handle bool `json:"handle,omitempty"`
	// Created is when the sandbox was made.
	Created time.Time `json:"created"`
	// Container is the backend's name of the sandbox's instance when the
	// record was written, and Generation its number.
	Container  string `json:"container,omitempty"`
	Generation int    `json:"generation,omitempty"`
	// Token is the secret the agent takes a resync marker with
	// (agentproto.Lease.Token). The file is the server's alone (0600).
	Token string `json:"token,omitempty"`
	// Snapshot is the sandbox's latest snapshot when the record was
	// written ("" for none); the snapshot store's latest wins at
	// re-adoption.
	Snapshot string `json:"snapshot,omitempty"`
	// Approved, Dropped and Offline are the sandbox's changes to its
	// allowlist at the egress proxy (NetworkLayers), which last as long
	// as it does: a server that takes it back gives them to its proxy
	// again, so a restart never widens what a sandbox may reach.
	Approved []string `json:"approved,omitempty"`
	Dropped  []string `json:"dropped,omitempty"`
	Offline  bool     `json:"offline,omitempty"`
}

// recordName is the form of a sandbox id that may name a record file.
var recordName = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$`)

// Records is the record store of one slot: a JSON file per sandbox in
// <slot>/sandboxes/. Each file is written whole (a temporary file, synced,
// then renamed over the old one), so a server killed at any point leaves
// either the old record or the new one, never a torn one. Only the slot's
// holder writes it (the slot's lock), so no two writers meet.
type Records struct {
	dir string
}

// OpenRecords opens (making it if needed) the record store of a slot.
func OpenRecords(slot *Slot) (*Records, error) {
	dir := filepath.Join(slot.Dir(), "sandboxes")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("session: records: %w", err)
	}
	// What a write killed halfway left.
	if names, err := os.ReadDir(dir); err == nil {
		for _, e := range names {
			if strings.HasPrefix(e.Name(), ".tmp-") {
				os.Remove(filepath.Join(dir, e.Name()))
			}
		}
	}
	return &Records{dir: dir}, nil
}

// Put writes rec, replacing the sandbox's earlier record atomically.
func (r *Records) Put(rec Record) error {
	if !recordName.MatchString(rec.Sandbox) {
		return fmt.Errorf("session: records: sandbox id %q cannot name a record", rec.Sandbox)
	}
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(r.dir, ".tmp-")
	if err != nil {
		return fmt.Errorf("session: records: %w", err)
	}
	defer os.Remove(f.Name()) // fails once renamed
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), r.path(rec.Sandbox))
	}
	if err != nil {
		return fmt.Errorf("session: records: write %s: %w", rec.Sandbox, err)
	}
	return nil
}

// Delete removes a sandbox's record; one that does not exist is no error.
func (r *Records) Delete(id string) error {
	if !recordName.MatchString(id) {
		return nil
	}
	if err := os.Remove(r.path(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("session: records: %w", err)
	}
	return nil
}

// List returns every record, and an error joining the files it could not
// read (which it skips).
func (r *Records) List() ([]Record, error) {
	names, err := os.ReadDir(r.dir)
	if err != nil {
		return nil, fmt.Errorf("session: records: %w", err)
	}
	var out []Record
	var errs []error
	for _, e := range names {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !recordName.MatchString(name) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(r.dir, e.Name()))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var rec Record
		if err := json.Unmarshal(b, &rec); err != nil || rec.Sandbox != name {
			errs = append(errs, fmt.Errorf("session: records: %s is not a record of sandbox %s (%v)", e.Name(), name, err))
			continue
		}
		out = append(out, rec)
	}
	return out, errors.Join(errs...)
}

func (r *Records) path(id string) string { return filepath.Join(r.dir, id+".json") }
