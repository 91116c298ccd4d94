package agent

import (
	"io"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseUser(t *testing.T) {
	if u, err := ParseUser("1000:1001"); err != nil || u != (User{1000, 1001}) {
		t.Fatalf("1000:1001: %+v %v", u, err)
	}
	for _, bad := range []string{"", "1000", "0:1000", "1000:0", "-1:5", "a:b", "1000:1000:1"} {
		if _, err := ParseUser(bad); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
}

func TestCheckStartCaps(t *testing.T) {
	if err := checkStartCaps(unix.CapUserData{Permitted: launchCaps, Effective: launchCaps}); err != nil {
		t.Fatalf("CAP_SETUID and CAP_SETGID: %v", err)
	}
	for _, tc := range []struct {
		perm  uint32
		found string
	}{
		{1 << unix.CAP_SETUID, "CapAdd SETUID, SETGID"},
		{0, "CapAdd SETUID, SETGID"},
		{launchCaps | 1<<unix.CAP_KILL, "beyond"},
		{launchCaps | 1<<unix.CAP_DAC_OVERRIDE, "beyond"},
	} {
		err := checkStartCaps(unix.CapUserData{Permitted: tc.perm})
		if err == nil || !strings.Contains(err.Error(), tc.found) {
			t.Errorf("permitted %#x: %v, want an error about %q", tc.perm, err, tc.found)
		}
	}
}

func TestCommandGroupRange(t *testing.T) {
	for _, tc := range []struct {
		gidMap       string
		first, count uint32
	}{
		// No user namespace remapping: every id is mapped.
		{"         0          0 4294967295\n", CommandGroupBase, CommandGroupCount},
		// Remapping to 65536 ids: the top half, below the overflow ids.
		{"         0     100000      65536\n", 32768, 65534 - 32768},
		// Two extents: the highest one.
		{"0 100000 2000\n2000 300000 63536\n", 2000 + 63536/2, 65534 - (2000 + 63536/2)},
		// The usual range mapped, but only partly.
		{"0 0 2000001024\n", CommandGroupBase, 1024},
	} {
		first, count, err := commandGroupRange(strings.NewReader(tc.gidMap), 1000)
		if err != nil || first != tc.first || count != tc.count {
			t.Errorf("%q: %d+%d %v, want %d+%d", tc.gidMap, first, count, err, tc.first, tc.count)
		}
	}
	for _, bad := range []string{"0 100000 1000\n", "", "garbage\n"} {
		if _, _, err := commandGroupRange(strings.NewReader(bad), 1000); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
}

func TestGroupPool(t *testing.T) {
	busy := map[uint32]bool{}
	calls := 0
	p := &groupPool{first: 10, count: 3, inUse: func() map[uint32]bool { calls++; return busy }}
	var got []uint32
	for range 3 {
		g, err := p.take()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, g)
	}
	if !slices.Equal(got, []uint32{10, 11, 12}) || calls > 1 {
		t.Fatalf("first pass: %v (%d scans), want 10 11 12 without scanning", got, calls)
	}
	// After a wrap an id is reused only when no process holds it.
	busy[10], busy[12] = true, true
	for range 2 {
		if g, err := p.take(); err != nil || g != 11 {
			t.Fatalf("after the wrap: %d %v, want 11 (10 and 12 are held)", g, err)
		}
	}
	busy[11] = true
	if g, err := p.take(); err == nil {
		t.Fatalf("every id held: got %d", g)
	}
}

func TestParseStatus(t *testing.T) {
	const st = "Name:\tsleep\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t42\nUid:\t1000\t1000\t1000\t1000\n" +
		"Gid:\t1000\t1000\t1000\t1000\nFDSize:\t64\nGroups:\t1000 2000000003 \nNStgid:\t42\n"
	p, ok := parseStatus(42, []byte(st))
	if !ok || !p.live || !slices.Equal(p.groups, []uint32{1000, 2000000003}) || !p.in(2000000003) || p.in(2000000004) {
		t.Fatalf("%+v %v", p, ok)
	}
	z, ok := parseStatus(42, []byte(strings.Replace(st, "S (sleeping)", "Z (zombie)", 1)))
	if !ok || z.live {
		t.Fatalf("zombie: %+v %v", z, ok)
	}
	none, ok := parseStatus(1, []byte(strings.Replace(st, "Groups:\t1000 2000000003 ", "Groups:\t", 1)))
	if !ok || len(none.groups) != 0 {
		t.Fatalf("no groups: %+v %v", none, ok)
	}
	if _, ok := parseStatus(42, []byte("Name:\tx\nState:\tR (running)\n")); ok {
		t.Fatal("a status without Groups parsed")
	}
}

// TestTreeKillFindsDescendants: without a group of its own, a command's
// processes are found by its process group and by descent, a child that
// left the process group included, and killTree ends them all.
func TestTreeKillFindsDescendants(t *testing.T) {
	// The shell leaves two sleeps: one in its process group, one in a new
	// session of its own (setsid), both children of the shell.
	cmd := exec.Command("sh", "-c", "sleep 300 & setsid sleep 301 & echo ok; wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() })
	buf := make([]byte, 3)
	if _, err := io.ReadFull(out, buf); err != nil {
		t.Fatal(err)
	}
	kids := func() []procInfo {
		var ks []procInfo
		for _, p := range scanProcs() {
			if p.live && p.ppid == cmd.Process.Pid {
				ks = append(ks, p)
			}
		}
		return ks
	}
	// Both children exist once the shell printed (they were forked first).
	var before []procInfo
	for range 1000 {
		if before = kids(); len(before) == 2 {
			break
		}
		runtime.Gosched()
	}
	if len(before) != 2 {
		t.Fatalf("want the shell's two children, found %d", len(before))
	}
	n := killTree(cmd.Process.Pid, treeMembers(cmd.Process.Pid, false))
	if n < 3 {
		t.Fatalf("killTree signalled %d processes, want the shell and its two children", n)
	}
	_ = cmd.Wait()
	for _, k := range before {
		// A killed child is gone, or a zombie until its new parent reaps it.
		for range 1000 {
			if p, ok := readStatus(k.pid); !ok || !p.live {
				break
			}
			runtime.Gosched()
		}
		if p, ok := readStatus(k.pid); ok && p.live {
			t.Fatalf("process %d (%+v) survived the kill", k.pid, p)
		}
	}
}
