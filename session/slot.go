package session

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// MaxSlots is how many servers may use one state directory at once (see
// OpenSlot): enough for an editor window each and a few HTTP servers.
const MaxSlots = 64

// AnySlot asks OpenSlot for the first free slot.
const AnySlot = -1

// Slot is one server's place in a state directory: <state>/servers/<n>/,
// holding the records of the sandboxes that server owns (see Records). A
// server holds its slot with an exclusive flock(2) on <slot>/lock for as
// long as it runs; the kernel lets go of the lock when the process ends,
// however it ends (kill -9 included), so a restarted server takes the
// slot back, and with it the records, while a second server running at the
// same time gets another slot and never sees the first one's records.
//
// The rest of the state directory is shared by every server in it: the
// snapshot store (snapshot.Store is written for several processes: random
// ids, files renamed into place, its index read again from the directory),
// the audit key and the agent copies.
type Slot struct {
	dir  string
	n    int
	lock *os.File
}

// OpenSlot takes slot n of stateDir (creating the directories if needed),
// or with n = AnySlot the first slot no running server holds, lowest
// number first: a server started again after a crash gets the slot it had
// (if it was the lowest free one, as it is when one server uses the
// directory), and its records with it. A slot held by a running server is
// never shared: pinning one that is held fails with a message naming the
// process that holds it.
func OpenSlot(stateDir string, n int) (*Slot, error) {
	if n != AnySlot && (n < 0 || n >= MaxSlots) {
		return nil, errcode.Errorf(errcode.InvalidArgument, "state slot %d is out of range: give 0 to %d, or leave it to the server", n, MaxSlots-1)
	}
	root := filepath.Join(stateDir, "servers")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("session: state directory: %w", err)
	}
	if n != AnySlot {
		s, err := trySlot(root, n)
		if errors.Is(err, errSlotHeld) {
			return nil, fmt.Errorf("session: state slot %d of %s is held by another running server%s; stop it, or give another slot (or none, to take the first free one)",
				n, stateDir, holderOf(root, n))
		}
		return s, err
	}
	for i := range MaxSlots {
		s, err := trySlot(root, i)
		if errors.Is(err, errSlotHeld) {
			continue
		}
		return s, err
	}
	return nil, fmt.Errorf("session: all %d state slots of %s are held by running servers; stop one, or give this server another --state-dir", MaxSlots, stateDir)
}

var errSlotHeld = errors.New("slot held")

// trySlot takes slot n under root if no process holds it.
func trySlot(root string, n int) (*Slot, error) {
	dir := filepath.Join(root, strconv.Itoa(n))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("session: state slot: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("session: state slot: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err != unix.EINTR {
			break
		}
	}
	if errors.Is(err, unix.EWOULDBLOCK) {
		f.Close()
		return nil, errSlotHeld
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("session: lock state slot %s: %w", dir, err)
	}
	// The holder's pid, for the message a pinned slot gets; the lock,
	// not this, is what counts.
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &Slot{dir: dir, n: n, lock: f}, nil
}

// holderOf names the process that last took slot n, for a message.
func holderOf(root string, n int) string {
	b, err := os.ReadFile(filepath.Join(root, strconv.Itoa(n), "lock"))
	if err != nil {
		return ""
	}
	pid, err := strconv.Atoi(string(trimNL(b)))
	if err != nil {
		return ""
	}
	return fmt.Sprintf(" (pid %d)", pid)
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

// Dir is the slot's directory.
func (s *Slot) Dir() string { return s.dir }

// Number is the slot's number.
func (s *Slot) Number() int { return s.n }

// Close lets go of the slot. Its records stay for the next server that
// takes it.
func (s *Slot) Close() error { return s.lock.Close() }
