package workspace

// Low-level, fd-relative file system primitives shared by the workspace
// operations (workspace.go) and the tar snapshot and restore (snapshot.go,
// restore.go). Nothing in this file ever resolves a path string from the
// process's current directory or from "/": every call takes a directory
// descriptor, and every multi-component path goes through openat2 with
// resolveFlags.

import (
	"crypto/rand"
	"encoding/hex"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

const (
	// maxPathLen bounds workspace-relative paths (request paths, tar entry
	// names, and paths the snapshot walk produces). It matches PATH_MAX.
	maxPathLen = 4096

	// listMaxDepth is how deep a recursive List descends below its start
	// directory. Directories at this depth are listed but not entered, which
	// also bounds the number of directory descriptors a List holds open.
	listMaxDepth = 64

	// removeFlattenDepth bounds the directory descriptors removeTree holds:
	// deeper directories are moved up to the top of the tree being removed
	// and handled in a later round, so a 10,000-deep tree needs no more than
	// this many open descriptors.
	removeFlattenDepth = 32

	// Names the agent creates in the workspace for its own use. The prefix is
	// reserved: Snapshot leaves such names out (see isInternalName).
	internalPrefix = ".sandbox-mcp-"
	tmpPrefix      = internalPrefix + "tmp-"     // WriteFile's temporary files, anywhere
	restorePrefix  = internalPrefix + "restore-" // Restore's staging directory, in the root
	trashPrefix    = internalPrefix + "trash-"   // Restore's old contents, in the root
	removePrefix   = internalPrefix + "rm-"      // removeTree's flattened directories
)

// resolveFlags confine every openat2 walk from the workspace root: no step may
// leave the tree below the starting descriptor ("..", absolute symlinks and
// absolute paths are refused with EXDEV), /proc magic links are refused
// (ELOOP), and no mount point may be crossed (EXDEV). Symlinks that stay
// inside are followed.
const resolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// resolveNoSymlinks is resolveFlags plus a refusal of every symlink on the
// path (ELOOP). Restore resolves with it inside its staging directory, so an
// archive can never place an entry through a symlink it created earlier.
const resolveNoSymlinks = resolveFlags | unix.RESOLVE_NO_SYMLINKS

// openBeneath opens p relative to dirfd with openat2 and the given RESOLVE_*
// flags. O_CLOEXEC is always added. EINTR is retried, and so is EAGAIN, which
// openat2 returns when a concurrent rename made a ".." step unverifiable.
func openBeneath(dirfd int, p string, flags int, resolve uint64) (int, error) {
	how := unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Resolve: resolve}
	for i := 0; ; i++ {
		fd, err := unix.Openat2(dirfd, p, &how)
		if err == unix.EINTR || (err == unix.EAGAIN && i < 100) {
			continue
		}
		return fd, err
	}
}

// openat opens the single name in dirfd with openat(2). Callers pass only
// names without "/" that are not "." or ".." (validated request base names,
// or names read from the directory itself), together with O_NOFOLLOW, so the
// call cannot leave dirfd. O_CLOEXEC is always added; EINTR is retried.
func openat(dirfd int, name string, flags int, mode uint32) (int, error) {
	for {
		fd, err := unix.Openat(dirfd, name, flags|unix.O_CLOEXEC, mode)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// openChild opens the single name (no "/", not "." or "..") in dirfd
// without following a symlink (ELOOP) and without crossing into a file
// system mounted there (EXDEV): the walks of List, Snapshot and removeTree
// use it to descend, so they stay on the workspace's own file system.
func openChild(dirfd int, name string, flags int) (int, error) {
	return openBeneath(dirfd, name, flags|unix.O_NOFOLLOW, resolveNoSymlinks)
}

// closeFd closes a descriptor the caller owns; a failed close of a
// descriptor that was only read is of no consequence.
func closeFd(fd int) { _ = unix.Close(fd) }

// wsPath is a validated workspace-relative request path: its components,
// with empty and "." components removed ("a//./b" is "a/b"). ".." components
// are kept and left to the kernel, which refuses any that climbs above the
// root; lexical cleaning would be wrong when a component is a symlink.
type wsPath struct {
	rel     string   // the path as given, for messages
	comps   []string // components, never "" or "."
	dirOnly bool     // the path ended in "/", "/." or ".." (it names a directory)
}

// parsePath validates a request path (see Workspace for the rules).
func parsePath(op, rel string) (wsPath, error) {
	p := wsPath{rel: rel}
	switch {
	case strings.IndexByte(rel, 0) >= 0:
		return p, errcode.Errorf(errcode.InvalidArgument,
			"%s %s: the path contains a NUL byte; remove it", op, quote(rel))
	case len(rel) > maxPathLen:
		return p, errcode.Errorf(errcode.InvalidArgument,
			"%s %s: the path is %d bytes long, more than the %d allowed; use a shorter path",
			op, quote(rel), len(rel), maxPathLen)
	case strings.HasPrefix(rel, "/"):
		return p, errcode.Errorf(errcode.OutsideWorkspace,
			"%s %s: absolute paths are not accepted here; give the path relative to the workspace root (for example %s)",
			op, quote(rel), quote(suggestRelative(rel)))
	}
	raw := strings.Split(rel, "/")
	for _, c := range raw {
		if c != "" && c != "." {
			p.comps = append(p.comps, c)
		}
	}
	if len(p.comps) > 0 {
		last := raw[len(raw)-1]
		p.dirOnly = last == "" || last == "." || last == ".."
	}
	return p, nil
}

// suggestRelative turns an absolute path into a plausible relative one for an
// error message: "/workspace/a/b" and "/a/b" both suggest "a/b".
func suggestRelative(abs string) string {
	s := strings.TrimLeft(abs, "/")
	if rest, ok := strings.CutPrefix(s, "workspace/"); ok {
		s = rest
	}
	if s == "" || s == "workspace" {
		return "."
	}
	return s
}

// String is the normalised path: components joined with "/", "." for the
// root.
func (p wsPath) String() string {
	if len(p.comps) == 0 {
		return "."
	}
	return strings.Join(p.comps, "/")
}

// open is the path handed to openat2: the normalised path, with a trailing
// "/" kept so that the kernel insists on a directory.
func (p wsPath) open() string {
	s := p.String()
	if p.dirOnly && p.comps[len(p.comps)-1] != ".." {
		s += "/"
	}
	return s
}

// typeOf is the agentproto entry type of a file mode.
func typeOf(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return agentproto.TypeFile
	case unix.S_IFDIR:
		return agentproto.TypeDir
	case unix.S_IFLNK:
		return agentproto.TypeSymlink
	}
	return agentproto.TypeOther
}

// permBits keeps the permission bits and setuid, setgid and sticky.
func permBits(mode uint32) uint32 { return mode & 0o7777 }

// mtimeOf is a file's modification time, in UTC.
func mtimeOf(st *unix.Stat_t) time.Time {
	return time.Unix(st.Mtim.Sec, st.Mtim.Nsec).UTC()
}

// fstat is unix.Fstat.
func fstat(fd int) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Fstat(fd, &st)
	return st, err
}

// lstatAt stats name in dirfd without following a symlink.
func lstatAt(dirfd int, name string) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	return st, err
}

// readlinkAt reads the target of the symlink name in dirfd ("" with an
// O_PATH|O_NOFOLLOW descriptor of the symlink itself).
func readlinkAt(dirfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
		if size >= 1<<16 {
			return "", unix.ENAMETOOLONG
		}
	}
}

// readNames returns the names in the directory open for reading as fd,
// without "." and "..", in directory order. It reads from the current
// position to the end. A directory removed while it is read (getdents
// fails with ENOENT) has no names.
func readNames(fd int) ([]string, error) {
	buf := make([]byte, 32<<10)
	var names []string
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err == unix.ENOENT {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}

// randomName returns prefix followed by 16 random hex digits.
func randomName(prefix string) string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	return prefix + hex.EncodeToString(b[:])
}

// isInternalName reports whether name, found in the directory at depth
// (1 = the workspace root), is one of the agent's own transient files.
func isInternalName(name string, depth int) bool {
	if strings.HasPrefix(name, tmpPrefix) {
		return true
	}
	return depth == 1 && (strings.HasPrefix(name, restorePrefix) || strings.HasPrefix(name, trashPrefix))
}

// writeAll writes b to fd, retrying short writes and EINTR.
func writeAll(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// clearNonblock clears O_NONBLOCK on fd.
func clearNonblock(fd int) error {
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return err
	}
	_, err = unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl&^unix.O_NONBLOCK)
	return err
}

// futimens sets the access and modification times of the file open as fd
// (utimensat with a NULL path, which x/sys does not offer).
func futimens(fd int, t time.Time) error {
	ts := [2]unix.Timespec{{Sec: t.Unix(), Nsec: int64(t.Nanosecond())}}
	ts[1] = ts[0]
	_, _, e := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// chmodPathFd changes the mode of the file open as pathfd, which may be an
// O_PATH descriptor (fchmod(2) refuses those). It tries fchmodat2 with
// AT_EMPTY_PATH (Linux 6.6), and falls back to chmod on /proc/self/fd/N,
// which acts on the descriptor's own inode and never re-resolves a path.
// Callers use it only on descriptors they have checked to be directories.
func chmodPathFd(pathfd int, mode uint32) error {
	empty := [1]byte{}
	_, _, e := unix.Syscall6(unix.SYS_FCHMODAT2, uintptr(pathfd), uintptr(unsafe.Pointer(&empty[0])),
		uintptr(mode), unix.AT_EMPTY_PATH, 0, 0)
	if e == 0 {
		return nil
	}
	return unix.Chmod("/proc/self/fd/"+strconv.Itoa(pathfd), mode)
}

// mkdirParents returns an O_PATH descriptor of the directory comps (relative
// to the directory base), creating missing directories with mode 0755. Each
// step resolves the whole prefix again from base with openat2 and resolve,
// and each mkdirat creates one plain name in an already-resolved directory,
// so no step follows a symlink out of base and mkdirat never follows one at
// all. The caller closes the descriptor. Errors are raw errnos, except for a
// dangling symlink on the path, which gets its own message (op, rel name the
// request in it).
func mkdirParents(base int, comps []string, resolve uint64, op, rel string) (int, error) {
	whole := "."
	if len(comps) > 0 {
		whole = strings.Join(comps, "/")
	}
	fd, err := openBeneath(base, whole, unix.O_PATH|unix.O_DIRECTORY, resolve)
	if err != unix.ENOENT || len(comps) == 0 {
		return fd, err
	}
	prev := base
	closePrev := func() {
		if prev != base {
			closeFd(prev)
		}
	}
	defer func() { closePrev() }()
	for i, name := range comps {
		prefix := strings.Join(comps[:i+1], "/")
		fd, err := openBeneath(base, prefix, unix.O_PATH|unix.O_DIRECTORY, resolve)
		if err == unix.ENOENT && name != ".." {
			err = unix.Mkdirat(prev, name, 0o755)
			if err != nil && err != unix.EEXIST {
				return -1, err
			}
			fd, err = openBeneath(base, prefix, unix.O_PATH|unix.O_DIRECTORY, resolve)
			if err == unix.ENOENT {
				if st, serr := lstatAt(prev, name); serr == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
					return -1, errcode.Errorf(errcode.InvalidArgument,
						"%s %s: the directory %s on its path is a symlink whose target does not exist; create the target directory first, or remove the symlink",
						op, quote(rel), quote(prefix))
				}
			}
		}
		if err != nil {
			return -1, err
		}
		closePrev()
		prev = fd
	}
	fd, prev = prev, base // hand the last descriptor to the caller
	return fd, nil
}

// removeTree removes everything below the directory open for reading as top
// (the directory itself stays), never following a symlink. Directories
// without write or search permission are made accessible first (the agent
// owns every file in the workspace). Directories deeper than
// removeFlattenDepth are moved up to top and removed in a later round, so
// the descriptors held stay bounded however deep the tree is.
func removeTree(top int) error { return removeTreeCount(top, nil) }

// removeTreeCount is removeTree, adding the number of entries removed to
// *n when n is not nil.
func removeTreeCount(top int, n *int64) error {
	for round := 0; round < 1<<16; round++ {
		if _, err := unix.Seek(top, 0, io.SeekStart); err != nil {
			return err
		}
		names, err := readNames(top)
		if err != nil {
			return err
		}
		if len(names) == 0 {
			return nil
		}
		for _, name := range names {
			if err := removeEntry(top, top, name, 1, n); err != nil {
				return err
			}
		}
	}
	return unix.ENOTEMPTY
}

// removeEntry removes name from the directory dir (open for reading), which
// is depth levels below top, counting what it removes in *n (if n is not
// nil). See removeTree.
func removeEntry(top, dir int, name string, depth int, n *int64) error {
	count := func() {
		if n != nil {
			*n++
		}
	}
	for attempt := 0; attempt < 8; attempt++ {
		err := unix.Unlinkat(dir, name, 0)
		switch err {
		case nil:
			count()
			return nil
		case unix.ENOENT:
			return nil
		case unix.EACCES, unix.EPERM:
			// dir itself lacks write or search permission.
			if err := unix.Fchmod(dir, 0o700); err != nil {
				return err
			}
			continue
		case unix.EISDIR:
		default:
			return err
		}
		if depth >= removeFlattenDepth {
			err := unix.Renameat(dir, name, top, randomName(removePrefix))
			if err == unix.EACCES || err == unix.EPERM {
				// Moving a directory to another parent needs write
				// permission on it.
				err = makeAccessible(dir, name)
			}
			if err == nil || err == unix.ENOENT {
				return nil
			}
			return err
		}
		sub, err := openChild(dir, name, unix.O_RDONLY|unix.O_DIRECTORY)
		if err == unix.EACCES {
			if err = makeAccessible(dir, name); err == nil {
				continue
			}
		}
		switch err {
		case nil:
		case unix.ENOENT:
			return nil
		case unix.ENOTDIR, unix.ELOOP: // replaced by a non-directory meanwhile
			continue
		default:
			return err
		}
		names, err := readNames(sub)
		for _, nm := range names {
			if err != nil {
				break
			}
			err = removeEntry(top, sub, nm, depth+1, n)
		}
		closeFd(sub)
		if err != nil {
			return err
		}
		err = unix.Unlinkat(dir, name, unix.AT_REMOVEDIR)
		if err == nil {
			count()
			return nil
		}
		if err == unix.ENOENT {
			return nil
		}
		if err != unix.ENOTEMPTY && err != unix.EEXIST {
			return err
		}
		// Something was created inside meanwhile: go again.
	}
	return unix.ENOTEMPTY
}

// makeAccessible gives the directory name in dir mode 0700 (read, write and
// search for its owner), through an O_PATH|O_NOFOLLOW descriptor that is
// checked to be a directory first.
func makeAccessible(dir int, name string) error {
	fd, err := openat(dir, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer closeFd(fd)
	return chmodPathFd(fd, 0o700)
}

// bufPool holds ChunkSize buffers for copying file data.
var bufPool = sync.Pool{New: func() any { b := make([]byte, agentproto.ChunkSize); return &b }}
