package agent

import (
	"errors"
	"fmt"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// User is the sandbox user: the identity every command runs as, and the
// identity the agent's own file operations run as (its effective uid).
type User struct {
	UID, GID int
}

// ParseUser reads "UID:GID" (numbers, neither 0).
func ParseUser(s string) (User, error) {
	us, gs, ok := strings.Cut(s, ":")
	uid, err1 := strconv.Atoi(us)
	gid, err2 := strconv.Atoi(gs)
	if !ok || err1 != nil || err2 != nil {
		return User{}, fmt.Errorf("sandbox user %q: want UID:GID, two numbers", s)
	}
	u := User{UID: uid, GID: gid}
	return u, u.check()
}

func (u User) check() error {
	if u.UID <= 0 || u.GID <= 0 {
		return fmt.Errorf("sandbox user %d:%d: the uid and the gid must be above 0 (commands never run as root)", u.UID, u.GID)
	}
	return nil
}

func (u User) String() string { return fmt.Sprintf("%d:%d", u.UID, u.GID) }

// launchCaps are the only capabilities the agent keeps: exactly what it needs
// to start a command as the sandbox user in a group of its own. It never
// needs CAP_KILL: its effective uid is the sandbox user's, which lets it
// signal every command.
const launchCaps = 1<<unix.CAP_SETUID | 1<<unix.CAP_SETGID

// DropPrivileges turns a process started as root, holding CAP_SETUID and
// CAP_SETGID and no other capability, into the agent's identity: real and
// saved uid and gid 0, effective uid and gid those of u, no supplementary
// group, no effective capability (CAP_SETUID and CAP_SETGID stay permitted),
// and not dumpable. It must run before the agent serves anything; Go applies
// the id changes to every thread.
//
// The result: files the agent creates belong to u and it opens only what u
// may open (the file-system uid follows the effective uid); it may signal u's
// processes (its effective uid is their real uid); and no process of u can
// signal it, trace it or open its /proc files, because its real and saved
// uid are 0 and it is not dumpable.
func DropPrivileges(u User) error {
	if err := u.check(); err != nil {
		return err
	}
	if r, e, s := unix.Getresuid(); r != 0 || e != 0 || s != 0 {
		return fmt.Errorf("the agent must start as uid 0 (its container runs with User 0:0 and CapAdd SETUID, SETGID); it started as uid %d", e)
	}
	caps, err := threadCaps()
	if err != nil {
		return err
	}
	if err := checkStartCaps(caps); err != nil {
		return err
	}
	if err := syscall.Setgroups([]int{}); err != nil {
		return fmt.Errorf("drop supplementary groups: %w", err)
	}
	if err := syscall.Setresgid(0, u.GID, 0); err != nil {
		return fmt.Errorf("set the effective gid to %d: %w", u.GID, err)
	}
	// With the effective uid leaving 0 the kernel clears the effective
	// capabilities; the permitted ones stay, as the real uid stays 0.
	if err := syscall.Setresuid(0, u.UID, 0); err != nil {
		return fmt.Errorf("set the effective uid to %d: %w", u.UID, err)
	}
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("clear the dumpable flag: %w", err)
	}
	return checkDropped(u)
}

// checkStartCaps accepts the capabilities the agent starts with: CAP_SETUID
// and CAP_SETGID permitted, nothing else permitted.
func checkStartCaps(c unix.CapUserData) error {
	if uint64(c.Permitted)&launchCaps != launchCaps {
		return errors.New("the agent needs CAP_SETUID and CAP_SETGID to start commands as the sandbox user; its container must be created with CapAdd SETUID, SETGID")
	}
	if extra := uint64(c.Permitted) &^ launchCaps; extra != 0 {
		return fmt.Errorf("the agent holds capabilities beyond CAP_SETUID and CAP_SETGID (mask %#x); its container must be created with CapDrop ALL and CapAdd SETUID, SETGID only", extra)
	}
	return nil
}

// checkDropped verifies what DropPrivileges promises, as the kernel reports
// it.
func checkDropped(u User) error {
	r, e, s := unix.Getresuid()
	rg, eg, sg := unix.Getresgid()
	if r != 0 || e != u.UID || s != 0 || rg != 0 || eg != u.GID || sg != 0 {
		return fmt.Errorf("after the drop the agent's uids are %d %d %d and gids %d %d %d, want 0 %d 0 and 0 %d 0", r, e, s, rg, eg, sg, u.UID, u.GID)
	}
	caps, err := threadCaps()
	if err != nil {
		return err
	}
	if caps.Effective != 0 || uint64(caps.Permitted) != launchCaps {
		return fmt.Errorf("after the drop the agent's capabilities are effective %#x permitted %#x, want 0 and %#x", caps.Effective, caps.Permitted, uint64(launchCaps))
	}
	if d, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0); err != nil || d != 0 {
		return fmt.Errorf("after the drop the agent is still dumpable (%d, %v)", d, err)
	}
	return nil
}

// threadCaps returns the calling thread's capability sets (the low 32 bits,
// where CAP_SETUID and CAP_SETGID live; the high word is checked empty).
func threadCaps() (unix.CapUserData, error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return unix.CapUserData{}, fmt.Errorf("read capabilities: %w", err)
	}
	if data[1].Permitted != 0 || data[1].Effective != 0 {
		return data[0], fmt.Errorf("the agent holds capabilities beyond CAP_SETUID and CAP_SETGID (high mask %#x); its container must be created with CapDrop ALL and CapAdd SETUID, SETGID only", data[1].Permitted)
	}
	return data[0], nil
}

// setThreadCaps sets the calling thread's effective capabilities to eff
// (a subset of launchCaps), keeping launchCaps permitted and nothing
// inheritable. Capabilities belong to a thread, not to the process.
func setThreadCaps(eff uint32) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := [2]unix.CapUserData{{Effective: eff, Permitted: launchCaps}}
	return unix.Capset(&hdr, &data[0])
}

// startAs starts cmd as u with the supplementary groups u.GID and group.
// The child process changes its ids before it executes the program, which
// needs CAP_SETUID and CAP_SETGID in its effective set: the clone copies the
// capabilities of the thread that makes it. So the start runs on a thread
// of its own (locked to this goroutine, which the Go runtime never clones
// new threads from) that raises the two capabilities for the start only.
// In the child, setuid makes every uid non-zero, which clears every
// capability; with no_new_privs set and no uid 0 left, nothing it executes
// can get one back.
func startAs(cmd *exec.Cmd, u User, group uint32) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Credential = &syscall.Credential{
		Uid:    uint32(u.UID),
		Gid:    uint32(u.GID),
		Groups: []uint32{uint32(u.GID), group},
	}
	runtime.LockOSThread()
	if err := setThreadCaps(launchCaps); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("cannot start commands as the sandbox user: raising CAP_SETUID and CAP_SETGID failed (%v); the agent must run as set up by DropPrivileges", err)
	}
	err := cmd.Start()
	// A thread whose capabilities could not be lowered again stays locked:
	// it ends with this goroutine and never runs other work.
	if setThreadCaps(0) == nil {
		runtime.UnlockOSThread()
	}
	return err
}
