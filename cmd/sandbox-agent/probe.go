package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ProbeIOURing is the hidden subcommand `sandbox-mcp doctor` runs inside a
// sandbox to learn whether its seccomp profile lets programs use io_uring.
const ProbeIOURing = "probe-io-uring"

// probeIOURing calls io_uring_setup once and prints "allowed", or "blocked:"
// and the errno's name (EPERM from a seccomp profile, ENOSYS from a kernel
// without io_uring or one that disables it).
func probeIOURing(w io.Writer) {
	var params [120]byte // struct io_uring_params, all zero
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params[0])), 0)
	if errno != 0 {
		name := unix.ErrnoName(errno)
		if name == "" {
			name = errno.Error()
		}
		fmt.Fprintf(w, "blocked: %s\n", name)
		return
	}
	unix.Close(int(fd))
	fmt.Fprintln(w, "allowed")
}

// ProbePids is the hidden subcommand `sandbox-mcp doctor --backend
// kubernetes` runs inside a sandbox pod to learn the process limit the pod
// really gets: Kubernetes has no per-pod field for it, the kubelet's
// podPidsLimit sets it on the pod's cgroup, and that cgroup is above the
// container's, out of its sight.
const ProbePids = "probe-pids"

// cgroupPidsMax are where a container sees its own cgroup's pids.max
// (cgroup v1, then v2).
var cgroupPidsMax = []string{"/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/pids.max"}

// probePids prints the container's own pids.max ("cgroup N" or "cgroup
// max"), then creates threads, each blocked in a read of a pipe, until the
// process has upTo of them: it prints "reached N" if it got there. A limit
// below upTo (the pod's pids.max counts threads too) makes a thread's
// creation fail; the Go runtime then ends the process with "failed to
// create new OS thread (have N already; errno=11)" on stderr, which the
// doctor reads. The threads end with the process either way, within
// milliseconds of reaching the limit.
func probePids(w io.Writer, upTo int) {
	own := "unknown"
	for _, p := range cgroupPidsMax {
		if b, err := os.ReadFile(p); err == nil {
			own = strings.TrimSpace(string(b))
			break
		}
	}
	fmt.Fprintf(w, "cgroup %s\n", own)
	debug.SetTraceback("none") // at the limit the runtime's last words are enough
	debug.SetMaxThreads(upTo + 64)
	var fds [2]int
	if err := unix.Pipe(fds[:]); err != nil {
		fmt.Fprintf(w, "error %v\n", err)
		return
	}
	for range upTo {
		go func() {
			runtime.LockOSThread()
			var b [1]byte
			unix.Read(fds[0], b[:]) // blocks this thread until the process ends
		}()
	}
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if n := threads(); n >= upTo {
			fmt.Fprintf(w, "reached %d\n", n)
			return
		}
	}
	fmt.Fprintf(w, "stalled %d\n", threads())
}

// threads is the process's thread count (/proc/self/status).
func threads() int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}
