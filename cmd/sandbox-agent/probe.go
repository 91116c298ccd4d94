package main

import (
	"fmt"
	"io"
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
