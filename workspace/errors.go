package workspace

// How failures read: a system call's errno on a workspace path becomes an
// *errcode.Error whose message names the path, says what was wrong and what
// to do instead, or a fault when the caller cannot act on it.

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// stopped is the error of an operation on rel whose ctx ended: the server
// gave up waiting for it (its deadline passed) or cancelled it, so the work
// stops where it is.
func stopped(ctx context.Context, op, rel string) error {
	why := "the server cancelled it"
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		why = "it ran past its deadline"
	}
	return errcode.Errorf(errcode.Timeout, "%s %s: stopped before it finished: %s; try again, or with a smaller range", op, quote(rel), why)
}

// faultError is a failure the caller cannot act on: an unexpected errno, a
// descriptor that would not close. It has no code: the agent sends it as
// INTERNAL, and the model never sees it. It has a type of its own so that
// the functions that map failures pass it through unchanged, as they do an
// *errcode.Error, rather than take it for the caller's own error.
type faultError struct{ msg string }

func (e *faultError) Error() string { return e.msg }

// fault returns a faultError with a formatted message.
func fault(format string, args ...any) error {
	return &faultError{msg: fmt.Sprintf(format, args...)}
}

// described returns the *errcode.Error or the fault in err's chain, if it
// holds one: a failure this package already described.
func described(err error) (error, bool) {
	if e, ok := errcode.As(err); ok {
		return e, true
	}
	var f *faultError
	if errors.As(err, &f) {
		return f, true
	}
	return nil, false
}

// quote renders a workspace path for a message: Go-quoted (control bytes and
// invalid UTF-8 escaped), with the root shown as "." and a very long path
// cut short.
func quote(rel string) string {
	if rel == "" {
		rel = "."
	}
	return qname(rel)
}

// maxQuoted is how much of a name a message shows.
const maxQuoted = 200

// qname quotes a name (an archive entry name, or a path) for a message,
// cutting it after maxQuoted bytes.
func qname(s string) string {
	if len(s) > maxQuoted {
		return strconv.Quote(s[:maxQuoted]) + "…"
	}
	return strconv.Quote(s)
}

// errnoOf extracts the errno from err, if any.
func errnoOf(err error) (unix.Errno, bool) {
	var errno unix.Errno
	ok := errors.As(err, &errno)
	return errno, ok
}

// fsError maps a system call failure on the workspace path rel to the error
// the model reads. A failure already described passes through unchanged. op is a
// short verb phrase ("read", "write", "list", "cwd", …) that starts the
// message.
func fsError(op, rel string, err error) error {
	if d, ok := described(err); ok {
		return d
	}
	q := quote(rel)
	errno, ok := errnoOf(err)
	if !ok {
		return fault("%s %s: %v", op, q, err)
	}
	e := func(c errcode.Code, msg string) error { return errcode.Errorf(c, "%s %s: %s", op, q, msg) }
	switch errno {
	case unix.ENOENT:
		return e(errcode.NotFound,
			"no such file or directory in the workspace (it, or a directory on its path, is missing); list the parent directory to see what exists")
	case unix.EXDEV:
		return e(errcode.OutsideWorkspace,
			`the path leads outside the workspace (through "..", an absolute symlink, a symlink that climbs out of the workspace, or a mount point); use a path that stays inside the workspace`)
	case unix.ELOOP:
		return e(errcode.InvalidArgument,
			"too many levels of symbolic links (a symlink loop, or a link into /proc); use a path that does not go through that symlink")
	case unix.EROFS:
		return e(errcode.ReadOnly,
			"the workspace is read-only on this server; files can be read and listed but not changed")
	case unix.ENOSPC, unix.EDQUOT:
		return e(errcode.TooLarge,
			"the workspace is full (out of space or inodes); delete files you no longer need, or write less")
	case unix.EFBIG:
		return e(errcode.TooLarge,
			"the workspace is full: the file would exceed the largest size allowed; write less")
	case unix.EISDIR:
		return e(errcode.InvalidArgument,
			"it is a directory, not a file; list it to see its entries, or give a file path")
	case unix.ENOTDIR:
		return e(errcode.InvalidArgument,
			"a component of the path is not a directory; check the path with list")
	case unix.ENAMETOOLONG:
		return e(errcode.InvalidArgument,
			"a name in the path is longer than 255 bytes, or the path is too long; use shorter names")
	case unix.EACCES, unix.EPERM:
		return e(errcode.InvalidArgument,
			"permission denied by the mode of the file or of a directory on its path; change the mode first (for example chmod u+rwx through exec)")
	case unix.ENXIO, unix.ENODEV:
		return e(errcode.InvalidArgument,
			"not a regular file (a named pipe, socket or device); only regular files can be read or written")
	case unix.ETXTBSY:
		return e(errcode.InvalidArgument,
			"the file is a program that is running; wait until it exits, or write to another path")
	case unix.EBUSY:
		return e(errcode.Busy,
			"it is in use by the system (a mount point, for example) and cannot be replaced or removed; leave it out")
	case unix.EMFILE, unix.ENFILE, unix.ENOMEM, unix.EAGAIN:
		return e(errcode.Busy,
			"the sandbox is out of resources ("+errno.Error()+"); retry in a moment")
	}
	return fault("%s %s: unexpected error %s (%s)", op, q, unix.ErrnoName(errno), errno.Error())
}

// notRegular describes a file that is not a regular file, for ReadFile and
// WriteFile.
func notRegular(op, rel string, mode uint32) error {
	if mode&unix.S_IFMT == unix.S_IFDIR {
		return fsError(op, rel, unix.EISDIR)
	}
	return errcode.Errorf(errcode.InvalidArgument,
		"%s %s: it is %s, not a regular file; only regular files can be read or written", op, quote(rel), kindOf(mode))
}

// kindOf names a file type for messages.
func kindOf(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "a regular file"
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFLNK:
		return "a symlink"
	case unix.S_IFIFO:
		return "a named pipe (FIFO)"
	case unix.S_IFSOCK:
		return "a socket"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	}
	return "a special file"
}
