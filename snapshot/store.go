// Package snapshot keeps workspace snapshots on the host: tar archives
// with a JSON record beside each, in the server's state directory, with
// their ids, retention limits (per caller and in all) and the reservation
// of room on disk for snapshots being written.
//
// Snapshots belong to the caller whose sandbox made them. A caller sees the
// store through Store.For, a view in which other callers' snapshots do not
// exist: looking one up is ErrNotFound, exactly as for an id never made.
// That rule lives here, once; the server reaches snapshots only through a
// view. The Store's own methods see every snapshot: they are the
// operator's (the snapshot command line).
//
// Package snapshot knows neither the engine nor MCP: the tar stream of a
// new snapshot comes from a function the caller passes.
package snapshot

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// Info describes a stored snapshot.
type Info struct {
	ID        string    `json:"id"`
	Label     string    `json:"label"`
	CreatedAt time.Time `json:"created_at"`
	SizeBytes int64     `json:"size_bytes"`
	Files     int       `json:"files"`
	SHA256    string    `json:"sha256"`
	Sandbox   string    `json:"sandbox"`
	// Owner is the caller whose sandbox made the snapshot ("" on stdio).
	Owner string `json:"owner,omitempty"`
}

// URI is the snapshot's MCP resource address.
func (s Info) URI() string { return "sandbox://snapshots/" + s.ID }

// Store keeps snapshots as tar files with a JSON record beside each,
// in one directory of the server's state directory. Snapshots outlive the
// sandbox and the server process; Retention bounds how many are kept, per
// caller and in all.
//
// Room on disk is reserved before a snapshot is written and granted as it
// is written: the archives stored plus the bytes of snapshots being written
// never pass the byte caps, not even for a moment (see Create).
type Store struct {
	dir string
	ret Retention

	mu sync.Mutex
	// stored is the index of the snapshots on disk, oldest first, read
	// again from the directory at every admission (another process may
	// have added or deleted some).
	stored  []Info
	flights map[string]*flight // snapshots being written, by id
	// freed is closed, and replaced, whenever a snapshot in flight ends,
	// for Create calls waiting for room.
	freed chan struct{}
}

// Retention bounds the snapshots kept. Each caller (owner) may keep at most
// PerCallerCount snapshots and PerCallerBytes bytes of them; when a new one
// would pass that, the caller's own oldest snapshots are deleted. The store
// as a whole keeps at most MaxCount snapshots and MaxBytes bytes; when a new
// one would pass that, the oldest snapshots of the caller holding the most
// (snapshots for MaxCount, bytes for MaxBytes, those being written
// included) are deleted first. Nothing older than MaxAge is kept. A
// snapshot is never deleted to make room for itself. Zero means no limit
// for each.
type Retention struct {
	MaxCount       int           // snapshots in the store
	MaxBytes       int64         // total size of the tar files in the store
	MaxAge         time.Duration // age since creation
	PerCallerCount int           // snapshots of one caller
	PerCallerBytes int64         // total size of one caller's tar files

	// MaxSnapshotBytes is the largest archive one snapshot can be (the
	// workspace's stream limit). Each snapshot being written reserves that
	// much room, or the smallest byte cap if that is less, and is cut with
	// TOO_LARGE when it outgrows its reservation. 0 means the smallest byte
	// cap.
	MaxSnapshotBytes int64
}

// flight is a snapshot being written.
type flight struct {
	owner    string
	reserved int64 // room it may take; 0: no byte cap applies
	written  int64 // room granted so far (the bytes in its file)
}

// staleIncoming is how long a snapshot file being written may go
// untouched before a store opening the directory takes it for the leftover
// of a server that died: several servers share one state directory, and a
// snapshot's write is bounded by 10 minutes.
const staleIncoming = 30 * time.Minute

var idPattern = regexp.MustCompile(`^snap-[0-9a-f]{20}$`)

// ValidID reports whether id has the form the store hands out. Ids
// are checked before they touch the file system.
func ValidID(id string) bool { return idPattern.MatchString(id) }

// OpenStore opens (creating if needed) the store in dir, removes
// what an interrupted write left, and applies the retention limits.
func OpenStore(dir string, ret Retention) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("snapshot store: %w", err)
	}
	s := &Store{dir: dir, ret: ret, flights: map[string]*flight{}, freed: make(chan struct{})}
	if names, err := os.ReadDir(dir); err == nil {
		for _, e := range names {
			if strings.HasPrefix(e.Name(), ".incoming-") || strings.HasSuffix(e.Name(), ".json.tmp") {
				// Another server sharing the directory may be writing
				// it now: only what nobody touched for longer than any
				// snapshot takes is left over.
				if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > staleIncoming {
					os.Remove(filepath.Join(dir, e.Name()))
				}
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.refresh(); err != nil {
		return nil, fmt.Errorf("snapshot store: %w", err)
	}
	owners := map[string]bool{}
	for _, in := range s.stored {
		owners[in.Owner] = true
	}
	for _, o := range slices.Sorted(maps.Keys(owners)) {
		if err := s.makeRoom(o, 0, ""); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// refresh reads the index from the directory; snapshots being written are
// counted as flights, not as stored. s.mu is held.
func (s *Store) refresh() error {
	all, err := s.List()
	if err != nil {
		return err
	}
	s.stored = slices.DeleteFunc(all, func(in Info) bool { return s.flights[in.ID] != nil })
	return nil
}

// usage is what one caller (or, with all set, every caller) holds: stored
// snapshots, and snapshots being written.
type usage struct {
	count, flights    int
	bytes             int64 // stored
	written, reserved int64 // by snapshots in flight
}

// usageOf sums the usage of owner, or of every caller when all is set.
// s.mu is held.
func (s *Store) usageOf(owner string, all bool) usage {
	var u usage
	for _, in := range s.stored {
		if all || in.Owner == owner {
			u.count++
			u.bytes += in.SizeBytes
		}
	}
	for _, f := range s.flights {
		if all || f.owner == owner {
			u.flights++
			u.written += f.written
			u.reserved += f.reserved
		}
	}
	return u
}

// errNoRoom means the retention limits cannot be met by deleting stored
// snapshots: what holds the room is being written. Reservations make it
// unreachable; it is checked all the same.
var errNoRoom = errors.New("snapshot store: no stored snapshot left to delete, yet the retention limits do not hold")

// makeRoom deletes stored snapshots, never protect, until owner can write
// extra more bytes and every limit holds: first snapshots past MaxAge, then
// owner's oldest while owner is past its own limits, then the oldest of the
// caller holding the most while the store is past its limits. s.mu is held.
func (s *Store) makeRoom(owner string, extra int64, protect string) error {
	r := s.ret
	if r.MaxAge > 0 {
		now := time.Now()
		for _, in := range slices.Clone(s.stored) {
			if in.ID != protect && now.Sub(in.CreatedAt) > r.MaxAge {
				if err := s.evict(in.ID); err != nil {
					return err
				}
			}
		}
	}
	for {
		var victim string
		mine, all := s.usageOf(owner, false), s.usageOf("", true)
		switch {
		case r.PerCallerCount > 0 && mine.count > r.PerCallerCount,
			r.PerCallerBytes > 0 && mine.bytes+mine.written+extra > r.PerCallerBytes:
			victim = s.oldestOf(owner, protect)
		case r.MaxCount > 0 && all.count > r.MaxCount:
			victim = s.oldestOfBiggest(protect, func(u usage) int64 { return int64(u.count + u.flights) })
		case r.MaxBytes > 0 && all.bytes+all.written+extra > r.MaxBytes:
			victim = s.oldestOfBiggest(protect, func(u usage) int64 { return u.bytes + u.written })
		default:
			return nil
		}
		if victim == "" {
			return errNoRoom
		}
		if err := s.evict(victim); err != nil {
			return err
		}
	}
}

// oldestOf returns the id of owner's oldest stored snapshot other than
// protect, or "". s.mu is held.
func (s *Store) oldestOf(owner, protect string) string {
	for _, in := range s.stored {
		if in.Owner == owner && in.ID != protect {
			return in.ID
		}
	}
	return ""
}

// oldestOfBiggest returns the oldest stored snapshot (other than protect)
// of the caller that holds the most by size, among callers with a snapshot
// that may be deleted; ties go to the caller whose oldest snapshot is the
// oldest. s.mu is held.
func (s *Store) oldestOfBiggest(protect string, size func(usage) int64) string {
	best, bestSize := "", int64(-1)
	seen := map[string]bool{}
	for _, in := range s.stored { // oldest first: the first of each owner is its oldest
		if in.ID == protect || seen[in.Owner] {
			continue
		}
		seen[in.Owner] = true
		if n := size(s.usageOf(in.Owner, false)); n > bestSize {
			best, bestSize = in.ID, n
		}
	}
	return best
}

// evict deletes a stored snapshot and drops it from the index. s.mu is held.
func (s *Store) evict(id string) error {
	if err := s.remove(id); err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("snapshot store: apply retention: %w", err)
	}
	s.stored = slices.DeleteFunc(s.stored, func(in Info) bool { return in.ID == id })
	return nil
}

// reservation is the room a new snapshot reserves, and the flag that sets
// it (for messages). 0 means no byte cap applies.
func (s *Store) reservation() (int64, string) {
	n, why := s.ret.MaxSnapshotBytes, "the largest snapshot of a workspace (--max-workspace-bytes)"
	if c := s.ret.PerCallerBytes; c > 0 && (n == 0 || c < n) {
		n, why = c, "--snapshot-max-bytes-per-caller"
	}
	if c := s.ret.MaxBytes; c > 0 && (n == 0 || c < n) {
		n, why = c, "--snapshot-max-bytes"
	}
	if s.ret.PerCallerBytes == 0 && s.ret.MaxBytes == 0 {
		return 0, ""
	}
	return n, why
}

// admit reserves room for a new snapshot of owner, or says why it cannot
// be had now (BUSY: snapshots being written hold it). s.mu is held.
func (s *Store) admit(id, owner string) error {
	if err := s.refresh(); err != nil {
		return fmt.Errorf("snapshot store: %w", err)
	}
	r := s.ret
	need, _ := s.reservation()
	mine, all := s.usageOf(owner, false), s.usageOf("", true)
	switch {
	case r.PerCallerCount > 0 && mine.flights+1 > r.PerCallerCount:
		return errcode.Errorf(errcode.Busy, "%d snapshots of yours are being written now, as many as a caller may keep (--snapshot-max-count-per-caller %d); try again when they finish", mine.flights, r.PerCallerCount)
	case r.PerCallerBytes > 0 && need > 0 && mine.reserved+need > r.PerCallerBytes:
		return errcode.Errorf(errcode.Busy, "%d snapshots of yours are being written now, and with one more they could pass the %d bytes a caller may keep (--snapshot-max-bytes-per-caller); try again when they finish", mine.flights, r.PerCallerBytes)
	case r.MaxCount > 0 && all.flights+1 > r.MaxCount:
		return errcode.Errorf(errcode.Busy, "%d snapshots are being written on this server now, as many as it keeps (--snapshot-max-count %d); try again in a moment", all.flights, r.MaxCount)
	case r.MaxBytes > 0 && need > 0 && all.reserved+need > r.MaxBytes:
		return errcode.Errorf(errcode.Busy, "%d snapshots are being written on this server now, and with one more they could pass the %d bytes it keeps (--snapshot-max-bytes); try again in a moment", all.flights, r.MaxBytes)
	}
	s.flights[id] = &flight{owner: owner, reserved: need}
	return nil
}

// grant lets a snapshot in flight put n more bytes on disk, deleting old
// snapshots to make room as needed. Past its reservation it is TOO_LARGE.
func (s *Store) grant(id string, n int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.flights[id]
	if f.reserved > 0 && f.written+n > f.reserved {
		_, why := s.reservation()
		return errcode.Errorf(errcode.TooLarge, "the snapshot passed %d bytes, the most one snapshot may take here (%s); delete files you no longer need from the workspace (large ones first) and try again", f.reserved, why)
	}
	if err := s.makeRoom(f.owner, n, ""); err != nil {
		return err
	}
	f.written += n
	return nil
}

// land ends a flight: its bytes are stored as info when ok, and freed (its
// file already removed) when not. s.mu is held.
func (s *Store) land(id string, info Info, ok bool) {
	delete(s.flights, id)
	if ok {
		s.stored = append(s.stored, info)
	}
	close(s.freed)
	s.freed = make(chan struct{})
}

// latest returns the newest snapshot of owner that sandbox made.
func (s *Store) latest(owner, sandbox string) (Info, bool) {
	all, err := s.List()
	if err != nil {
		return Info{}, false
	}
	for i := len(all) - 1; i >= 0; i-- {
		if all[i].Sandbox == sandbox && all[i].Owner == owner {
			return all[i], true
		}
	}
	return Info{}, false
}

// Dir returns the store's directory.
func (s *Store) Dir() string { return s.dir }

func (s *Store) paths(id string) (tarPath, metaPath string) {
	return filepath.Join(s.dir, id+".tar"), filepath.Join(s.dir, id+".json")
}

// maxLabel is the longest label kept.
const maxLabel = 200

// Create stores a new snapshot of the view's caller, made by sandbox,
// whose tar stream fill writes. The stream is
// hashed as it is stored, then read back as tar to count its entries: a
// stream that is not a valid tar is refused.
//
// Before fill runs, the snapshot reserves room (see Retention): when
// snapshots being written already hold the room the limits leave, Create
// returns BUSY at once and fill does not run. As the stream is written,
// each chunk is granted room first, old snapshots being deleted as the new
// one needs their room (so a snapshot that fails late may have cost some);
// a stream that outgrows its reservation is cut and refused with TOO_LARGE.
// When the snapshot is stored, the count and age limits are applied.
func (v *View) Create(label, sandbox string, fill func(io.Writer) error) (Info, error) {
	return v.s.create(nil, label, sandbox, v.owner, fill)
}

// CreateWait is Create that, instead of returning BUSY, waits until ctx
// ends for snapshots being written to leave room.
func (v *View) CreateWait(ctx context.Context, label, sandbox string, fill func(io.Writer) error) (Info, error) {
	return v.s.create(ctx, label, sandbox, v.owner, fill)
}

func (s *Store) create(wait context.Context, label, sandbox, owner string, fill func(io.Writer) error) (info Info, err error) {
	if len(label) > maxLabel {
		label = label[:maxLabel]
	}
	var rnd [10]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return Info{}, err
	}
	info = Info{
		ID:        "snap-" + hex.EncodeToString(rnd[:]),
		Label:     label,
		CreatedAt: time.Now().UTC(),
		Sandbox:   sandbox,
		Owner:     owner,
	}
	if err := s.reserve(wait, info.ID, owner); err != nil {
		return info, err
	}
	stored := false
	defer func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.land(info.ID, info, stored)
		if stored {
			if perr := s.makeRoom(owner, 0, info.ID); perr != nil {
				err = perr
			}
		}
	}()
	tarPath, metaPath := s.paths(info.ID)
	tmp, err := os.CreateTemp(s.dir, ".incoming-*")
	if err != nil {
		return info, fmt.Errorf("snapshot store: %w", err)
	}
	// Runs before the flight lands: its room is freed only once the file
	// is gone.
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	h := sha256.New()
	cw := &grantWriter{w: io.MultiWriter(tmp, h), grant: func(n int64) error { return s.grant(info.ID, n) }}
	if err := fill(cw); err != nil {
		return info, err
	}
	info.SizeBytes = cw.n
	info.SHA256 = hex.EncodeToString(h.Sum(nil))
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return info, err
	}
	files, err := countTar(tmp)
	if err != nil {
		return info, fmt.Errorf("snapshot is not a valid tar stream: %w", err)
	}
	info.Files = files
	if err := tmp.Close(); err != nil {
		return info, err
	}
	meta, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return info, err
	}
	if err := os.WriteFile(metaPath+".tmp", meta, 0o600); err != nil {
		return info, fmt.Errorf("snapshot store: %w", err)
	}
	if err := os.Rename(tmp.Name(), tarPath); err != nil {
		os.Remove(metaPath + ".tmp")
		return info, fmt.Errorf("snapshot store: %w", err)
	}
	if err := os.Rename(metaPath+".tmp", metaPath); err != nil {
		os.Remove(tarPath)
		return info, fmt.Errorf("snapshot store: %w", err)
	}
	stored = true
	return info, nil
}

// reserve admits a new snapshot, waiting for room until wait ends (nil:
// not at all).
func (s *Store) reserve(wait context.Context, id, owner string) error {
	for {
		s.mu.Lock()
		err := s.admit(id, owner)
		freed := s.freed
		s.mu.Unlock()
		if e, ok := errcode.As(err); !ok || e.Code != errcode.Busy || wait == nil {
			return err
		}
		select {
		case <-freed:
		case <-wait.Done():
			return fmt.Errorf("%w (waited %v)", err, context.Cause(wait))
		}
	}
}

// countTar counts the file entries (everything but PAX/GNU meta headers) of
// a tar stream.
func countTar(r io.Reader) (int, error) {
	tr := tar.NewReader(r)
	n := 0
	for {
		_, err := tr.Next()
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		n++
	}
}

// grantWriter asks for room before it writes, and counts what it wrote.
type grantWriter struct {
	w     io.Writer
	grant func(n int64) error
	n     int64
}

func (g *grantWriter) Write(p []byte) (int, error) {
	if err := g.grant(int64(len(p))); err != nil {
		return 0, err
	}
	n, err := g.w.Write(p)
	g.n += int64(n)
	return n, err
}

// ErrNotFound is returned for an unknown snapshot id.
var ErrNotFound = errors.New("snapshot not found")

// Get returns a snapshot's record.
func (s *Store) Get(id string) (Info, error) {
	var info Info
	if !ValidID(id) {
		return info, ErrNotFound
	}
	_, metaPath := s.paths(id)
	b, err := os.ReadFile(metaPath)
	if errors.Is(err, os.ErrNotExist) {
		return info, ErrNotFound
	}
	if err != nil {
		return info, err
	}
	if err := json.Unmarshal(b, &info); err != nil {
		return info, fmt.Errorf("snapshot %s: bad record: %w", id, err)
	}
	return info, nil
}

// Open returns a snapshot's record and its tar stream.
func (s *Store) Open(id string) (Info, *os.File, error) {
	info, err := s.Get(id)
	if err != nil {
		return info, nil, err
	}
	tarPath, _ := s.paths(id)
	f, err := os.Open(tarPath)
	if errors.Is(err, os.ErrNotExist) {
		return info, nil, ErrNotFound
	}
	return info, f, err
}

// List returns every snapshot's record, oldest first.
func (s *Store) List() ([]Info, error) {
	names, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, err
	}
	var out []Info
	for _, e := range names {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !ValidID(id) {
			continue
		}
		info, err := s.Get(id)
		if err != nil {
			continue
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b Info) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out, nil
}

// Delete removes a snapshot.
func (s *Store) Delete(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.remove(id); err != nil {
		return err
	}
	s.stored = slices.DeleteFunc(s.stored, func(in Info) bool { return in.ID == id })
	return nil
}

// remove deletes a snapshot's files.
func (s *Store) remove(id string) error {
	if !ValidID(id) {
		return ErrNotFound
	}
	tarPath, metaPath := s.paths(id)
	err := os.Remove(metaPath)
	if errors.Is(err, os.ErrNotExist) {
		return ErrNotFound
	}
	if err != nil {
		return err
	}
	return os.Remove(tarPath)
}
