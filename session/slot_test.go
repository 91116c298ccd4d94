package session

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

func TestSlotsKeepTwoServersApart(t *testing.T) {
	state := t.TempDir()
	a, err := OpenSlot(state, AnySlot)
	if err != nil {
		t.Fatal(err)
	}
	// flock locks belong to an open file: a second open in this same
	// process is refused exactly as another process would be.
	b, err := OpenSlot(state, AnySlot)
	if err != nil {
		t.Fatal(err)
	}
	if a.Number() != 0 || b.Number() != 1 {
		t.Fatalf("slots %d and %d, want 0 and 1", a.Number(), b.Number())
	}
	if a.Dir() == b.Dir() {
		t.Fatalf("two servers share %s", a.Dir())
	}
	if _, err := OpenSlot(state, 0); err == nil || !strings.Contains(err.Error(), "held by another running server") ||
		!strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("pinning a held slot: %v", err)
	}
	a.Close()
	// The first free slot is the one let go of: a restarted server gets
	// its slot back while the other keeps its own.
	c, err := OpenSlot(state, AnySlot)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	defer b.Close()
	if c.Number() != 0 {
		t.Fatalf("after slot 0 was let go, got slot %d", c.Number())
	}
	if _, err := OpenSlot(state, MaxSlots); err == nil {
		t.Fatal("an out-of-range slot was accepted")
	}
}

// TestSlotIsFreedWhenItsServerIsKilled holds a slot in another process,
// kills it with SIGKILL, and takes the slot back: the lock is the kernel's,
// so no server that died leaves it held.
func TestSlotIsFreedWhenItsServerIsKilled(t *testing.T) {
	if dir := os.Getenv("SANDBOX_MCP_HOLD_SLOT"); dir != "" {
		s, err := OpenSlot(dir, AnySlot)
		if err != nil {
			os.Stdout.WriteString("error " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Stdout.WriteString("slot " + strconv.Itoa(s.Number()) + "\n")
		select {} // until killed
	}
	state := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestSlotIsFreedWhenItsServerIsKilled$")
	cmd.Env = append(os.Environ(), "SANDBOX_MCP_HOLD_SLOT="+state)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "slot 0\n" {
		cmd.Process.Kill()
		t.Fatalf("the other process said %q (%v)", line, err)
	}
	if _, err := OpenSlot(state, 0); err == nil {
		t.Fatal("slot 0 was taken while another process held it")
	}
	s, err := OpenSlot(state, AnySlot)
	if err != nil {
		t.Fatal(err)
	}
	if s.Number() != 1 {
		t.Fatalf("beside a running server, got slot %d, want 1", s.Number())
	}
	s.Close()
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	s, err = OpenSlot(state, 0)
	if err != nil {
		t.Fatalf("slot 0 after its server was killed: %v", err)
	}
	s.Close()
	if _, err := os.Stat(filepath.Join(state, "servers", "0", "lock")); err != nil {
		t.Fatal(err)
	}
}
