package session

import (
	"archive/tar"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session/agentproto"
)

// SnapshotInfo describes a stored snapshot.
type SnapshotInfo struct {
	ID        string    `json:"id"`
	Label     string    `json:"label"`
	CreatedAt time.Time `json:"created_at"`
	SizeBytes int64     `json:"size_bytes"`
	Files     int       `json:"files"`
	SHA256    string    `json:"sha256"`
	Sandbox   string    `json:"sandbox"`
	// Owner is the caller whose sandbox made the snapshot ("" on stdio).
	Owner string `json:"owner,omitempty"`

	restored agentproto.RestoreResult // set by Sandbox.restoreInto
}

// URI is the snapshot's MCP resource address.
func (s SnapshotInfo) URI() string { return "sandbox://snapshots/" + s.ID }

// SnapshotStore keeps snapshots as tar files with a JSON record beside each,
// in one directory of the server's state directory. Snapshots outlive the
// sandbox and the server process; Retention bounds how many are kept.
type SnapshotStore struct {
	dir string
	ret Retention
	mu  sync.Mutex // serialises pruning
}

// Retention bounds the snapshots kept. When a new snapshot takes the store
// over a limit, the oldest snapshots are deleted until it is within all of
// them again (the new one is never deleted). Zero means no limit.
type Retention struct {
	MaxCount int           // snapshots
	MaxBytes int64         // total size of the tar files
	MaxAge   time.Duration // age since creation
}

var snapshotID = regexp.MustCompile(`^snap-[0-9a-f]{20}$`)

// ValidSnapshotID reports whether id has the form the store hands out. Ids
// are checked before they touch the file system.
func ValidSnapshotID(id string) bool { return snapshotID.MatchString(id) }

// OpenSnapshotStore opens (creating if needed) the store in dir, removes
// what an interrupted write left, and applies the retention limits.
func OpenSnapshotStore(dir string, ret Retention) (*SnapshotStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("snapshot store: %w", err)
	}
	s := &SnapshotStore{dir: dir, ret: ret}
	if names, err := os.ReadDir(dir); err == nil {
		for _, e := range names {
			if strings.HasPrefix(e.Name(), ".incoming-") || strings.HasSuffix(e.Name(), ".json.tmp") {
				os.Remove(filepath.Join(dir, e.Name()))
			}
		}
	}
	if _, err := s.Prune(""); err != nil {
		return nil, err
	}
	return s, nil
}

// Prune deletes the oldest snapshots until the store is within its
// retention limits, never the one named keep. It returns the ids deleted.
func (s *SnapshotStore) Prune(keep string) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	all, err := s.List()
	if err != nil {
		return nil, err
	}
	var total int64
	for _, in := range all {
		total += in.SizeBytes
	}
	var deleted []string
	now := time.Now()
	for _, in := range all { // oldest first
		over := (s.ret.MaxCount > 0 && len(all)-len(deleted) > s.ret.MaxCount) ||
			(s.ret.MaxBytes > 0 && total > s.ret.MaxBytes) ||
			(s.ret.MaxAge > 0 && now.Sub(in.CreatedAt) > s.ret.MaxAge)
		if !over || in.ID == keep {
			continue
		}
		if err := s.Delete(in.ID); err != nil && err != ErrSnapshotNotFound {
			return deleted, err
		}
		deleted = append(deleted, in.ID)
		total -= in.SizeBytes
	}
	return deleted, nil
}

// Latest returns the newest snapshot a sandbox made.
func (s *SnapshotStore) Latest(sandbox string) (SnapshotInfo, bool) {
	all, err := s.List()
	if err != nil {
		return SnapshotInfo{}, false
	}
	for i := len(all) - 1; i >= 0; i-- {
		if all[i].Sandbox == sandbox {
			return all[i], true
		}
	}
	return SnapshotInfo{}, false
}

// Dir returns the store's directory.
func (s *SnapshotStore) Dir() string { return s.dir }

func (s *SnapshotStore) paths(id string) (tarPath, metaPath string) {
	return filepath.Join(s.dir, id+".tar"), filepath.Join(s.dir, id+".json")
}

// maxLabel is the longest label kept.
const maxLabel = 200

// Create stores a new snapshot whose tar stream fill writes. The stream is
// hashed as it is stored, then read back as tar to count its entries: a
// stream that is not a valid tar is refused.
func (s *SnapshotStore) Create(label, sandbox, owner string, fill func(io.Writer) error) (SnapshotInfo, error) {
	if len(label) > maxLabel {
		label = label[:maxLabel]
	}
	var rnd [10]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return SnapshotInfo{}, err
	}
	info := SnapshotInfo{
		ID:        "snap-" + hex.EncodeToString(rnd[:]),
		Label:     label,
		CreatedAt: time.Now().UTC(),
		Sandbox:   sandbox,
		Owner:     owner,
	}
	tarPath, metaPath := s.paths(info.ID)
	tmp, err := os.CreateTemp(s.dir, ".incoming-*")
	if err != nil {
		return info, fmt.Errorf("snapshot store: %w", err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(tmp, h)}
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
	if _, err := s.Prune(info.ID); err != nil {
		return info, fmt.Errorf("snapshot store: apply retention: %w", err)
	}
	return info, nil
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

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// ErrSnapshotNotFound is returned for an unknown snapshot id.
var ErrSnapshotNotFound = errors.New("snapshot not found")

// Get returns a snapshot's record.
func (s *SnapshotStore) Get(id string) (SnapshotInfo, error) {
	var info SnapshotInfo
	if !ValidSnapshotID(id) {
		return info, ErrSnapshotNotFound
	}
	_, metaPath := s.paths(id)
	b, err := os.ReadFile(metaPath)
	if errors.Is(err, os.ErrNotExist) {
		return info, ErrSnapshotNotFound
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
func (s *SnapshotStore) Open(id string) (SnapshotInfo, *os.File, error) {
	info, err := s.Get(id)
	if err != nil {
		return info, nil, err
	}
	tarPath, _ := s.paths(id)
	f, err := os.Open(tarPath)
	if errors.Is(err, os.ErrNotExist) {
		return info, nil, ErrSnapshotNotFound
	}
	return info, f, err
}

// List returns every snapshot's record, oldest first.
func (s *SnapshotStore) List() ([]SnapshotInfo, error) {
	names, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, err
	}
	var out []SnapshotInfo
	for _, e := range names {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !ValidSnapshotID(id) {
			continue
		}
		info, err := s.Get(id)
		if err != nil {
			continue
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b SnapshotInfo) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out, nil
}

// Delete removes a snapshot.
func (s *SnapshotStore) Delete(id string) error {
	if !ValidSnapshotID(id) {
		return ErrSnapshotNotFound
	}
	tarPath, metaPath := s.paths(id)
	err := os.Remove(metaPath)
	if errors.Is(err, os.ErrNotExist) {
		return ErrSnapshotNotFound
	}
	if err != nil {
		return err
	}
	return os.Remove(tarPath)
}

// snapshotLimits are the caps on a workspace's tar stream, both ways. The
// stream holds the workspace's bytes plus headers and padding: the workspace
// cap plus some room for those is the ceiling.
func snapshotLimits(p policy.Policy) agentproto.Limits {
	return agentproto.Limits{MaxBytes: p.MaxWorkspaceBytes + p.MaxWorkspaceBytes/8 + 1<<20, MaxEntries: 1 << 20, MaxDepth: 256}
}
