package workspace

// Snapshot: the whole workspace as a tar stream (tar out), with the same
// fd-relative, no-follow primitives as the other operations (see the top of
// workspace.go). The tar block arithmetic and the limit check here serve
// Restore (restore.go) as well.

import (
	"archive/tar"
	"errors"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// tarBlock is the tar record unit; tarTrailer is the end-of-archive marker.
const (
	tarBlock   = 512
	tarTrailer = 2 * tarBlock
)

// padded is n rounded up to whole tar blocks.
func padded(n int64) int64 { return (n + tarBlock - 1) / tarBlock * tarBlock }

// checkLimits refuses negative limits.
func checkLimits(op string, lim agentproto.Limits) error {
	if lim.MaxBytes < 0 || lim.MaxEntries < 0 || lim.MaxDepth < 0 {
		return errcode.Errorf(errcode.InvalidArgument,
			"%s: limits must not be negative (max_bytes %d, max_entries %d, max_depth %d)", op, lim.MaxBytes, lim.MaxEntries, lim.MaxDepth)
	}
	return nil
}

// Snapshot writes a tar archive of the whole workspace to dst and reports
// the entries written, the bytes of the stream and the special files left
// out.
//
// The archive holds directories, regular files and symlinks, named relative
// to the root ("a", "dir/", "dir/b"; no "./" or "/" prefix and no entry for
// the root itself), in sorted order with every directory before its
// contents, with permission bits (setuid, setgid and sticky included), uid,
// gid and the modification time in whole seconds. Headers are USTAR, or PAX
// where a name or size needs it. Symlinks are stored as symlinks and never
// followed. Hard-linked files are stored as separate regular files (each
// name with its full content); Restore makes separate files of them.
// FIFOs, sockets and devices are skipped without being opened, and counted
// in Skipped, as is a file that turns into one of those during the walk.
// The agent's own transient files (".sandbox-mcp-tmp-*" anywhere, Restore's
// staging and trash directories in the root) are left out.
//
// Limits (0 = no limit for each): lim.MaxBytes bounds the bytes written to
// dst, headers, padding and the end-of-archive marker included; every file's
// size is checked against what is left before any of it is read, so a huge
// sparse file fails at once. lim.MaxEntries bounds the entries, and
// lim.MaxDepth the components of an entry's path. Exceeding any is
// TOO_LARGE, and dst then holds an incomplete archive the caller must
// discard. Paths longer than 4096 bytes are TOO_LARGE as well (Restore
// could not recreate them).
//
// Files that change during the walk: a file is archived with the size it had
// when it was opened; if it grows, only that many bytes are stored, and if it
// shrinks, the rest is zero-filled, so the archive stays well-formed.
//
// dst gets Write calls of at most agentproto.ChunkSize bytes; its errors are
// returned unchanged.
func (w *Workspace) Snapshot(dst io.Writer, lim agentproto.Limits) (agentproto.SnapshotResult, error) {
	return w.SnapshotTree(dst, lim, SnapshotOptions{})
}

// SnapshotOptions adjust SnapshotTree for a tree that is not a sandbox's
// own workspace, such as a directory on the host (--workspace-from). The
// zero value archives as Snapshot does.
type SnapshotOptions struct {
	// OwnLinksOnly refuses a tree holding a regular file that has hard
	// links outside it: such a file's content is another file's (a link to
	// /etc/shadow made in the tree, say), which the walk would read without
	// ever leaving the tree. Every name of a file with more than one link
	// is noted as the walk reads it; once the walk is done, each of those
	// names must still be that file, and the file must have no more links
	// than names seen. Otherwise the snapshot fails with INVALID_ARGUMENT
	// naming the file, and dst holds an archive the caller must discard.
	// Since the link outside the tree stays while the walk runs, no
	// renaming or relinking during the walk gets such a file through. The
	// names kept are part of the archive, so the memory this takes is
	// bounded by lim.MaxBytes.
	OwnLinksOnly bool
}

// fileID names a file by device and inode.
type fileID struct{ dev, ino uint64 }

// SnapshotTree is Snapshot with options (see SnapshotOptions).
func (w *Workspace) SnapshotTree(dst io.Writer, lim agentproto.Limits, opt SnapshotOptions) (agentproto.SnapshotResult, error) {
	const op = "snapshot"
	var res agentproto.SnapshotResult
	if err := checkLimits(op, lim); err != nil {
		return res, err
	}
	root, err := w.enter()
	if err != nil {
		return res, err
	}
	defer w.mu.RUnlock()

	out := &snapWriter{dst: dst, buf: make([]byte, 0, agentproto.ChunkSize), max: lim.MaxBytes}
	s := &snapshotter{tw: tar.NewWriter(out), out: out, lim: lim}
	if opt.OwnLinksOnly {
		s.links = map[fileID][]string{}
	}
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	s.buf = *bp

	fd, err := openat(root, ".", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return res, fsError(op, ".", err)
	}
	err = s.dir(fd, "", 1)
	closeFd(fd)
	if err == nil && s.links != nil {
		err = s.checkLinks(root)
	}
	if err == nil {
		err = s.tw.Close()
	}
	if err == nil {
		err = out.flush()
	}
	res = agentproto.SnapshotResult{Files: s.files, Bytes: out.n, Skipped: s.skipped}
	if err != nil {
		return res, s.mapErr(err)
	}
	return res, nil
}

// snapshotter carries one Snapshot call's state.
type snapshotter struct {
	tw             *tar.Writer
	out            *snapWriter
	lim            agentproto.Limits
	buf            []byte
	files, skipped int
	// links holds the names of every file with more than one link, with
	// SnapshotOptions.OwnLinksOnly (nil otherwise).
	links map[fileID][]string
}

// checkLinks verifies, after the walk, that every file archived with more
// than one link has all its links among the names archived (see
// SnapshotOptions.OwnLinksOnly).
func (s *snapshotter) checkLinks(root int) error {
	ids := slices.Collect(maps.Keys(s.links))
	slices.SortFunc(ids, func(a, b fileID) int { return strings.Compare(s.links[a][0], s.links[b][0]) })
	for _, id := range ids {
		names := s.links[id]
		var nlink uint64
		for _, name := range names {
			fd, err := openBeneath(root, name, unix.O_PATH|unix.O_NOFOLLOW, resolveNoSymlinks)
			var st unix.Stat_t
			if err == nil {
				st, err = fstat(fd)
				closeFd(fd)
			}
			if err != nil || st.Dev != id.dev || st.Ino != id.ino {
				return errcode.Errorf(errcode.InvalidArgument,
					"%s changed while it was read, and it is a hard link: what was read may be a file outside the directory; copy the directory when nothing changes it", quote(name))
			}
			nlink = uint64(st.Nlink)
		}
		if nlink > uint64(len(names)) {
			return errcode.Errorf(errcode.InvalidArgument,
				"%s is a hard link to a file with %d links, only %d of them in the directory: its content belongs to a file outside it, which is not copied; remove that name, or copy the directory with `cp -R` (which makes separate files; `git clone --no-hardlinks` for a local clone)",
				quote(names[0]), nlink, len(names))
		}
	}
	return nil
}

// errStreamCap is returned by snapWriter when a write would pass the byte
// limit; mapErr turns it into the TOO_LARGE message.
var errStreamCap = errors.New("snapshot byte limit reached")

// mapErr turns a failure inside the walk into Snapshot's error.
func (s *snapshotter) mapErr(err error) error {
	var de dstError
	if errors.As(err, &de) {
		return de.err
	}
	if errors.Is(err, errStreamCap) {
		return errcode.Errorf(errcode.TooLarge,
			"the workspace snapshot would exceed %d bytes, the limit set by the server; delete files you no longer need (large ones first) and try again", s.lim.MaxBytes)
	}
	if d, ok := described(err); ok {
		return d
	}
	return fault("snapshot: %v", err)
}

// dir archives the entries of the directory open for reading as fd, whose
// paths start with prefix and have depth components.
func (s *snapshotter) dir(fd int, prefix string, depth int) error {
	names, err := readNames(fd)
	if err != nil {
		return fsError("snapshot", dirPath(prefix), err)
	}
	slices.Sort(names)
	for _, name := range names {
		if isInternalName(name, depth) {
			continue
		}
		st, err := lstatAt(fd, name)
		if err == unix.ENOENT {
			continue // removed meanwhile
		}
		path := prefix + name
		if err != nil {
			return fsError("snapshot", path, err)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			err = s.file(fd, name, path, depth)
		case unix.S_IFDIR:
			err = s.subdir(fd, name, path, depth, &st)
		case unix.S_IFLNK:
			err = s.symlink(fd, name, path, depth, &st)
		default:
			s.skipped++ // FIFO, socket, device: never opened
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// dirPath names a directory for messages from its entries' prefix.
func dirPath(prefix string) string {
	if prefix == "" {
		return "."
	}
	return strings.TrimSuffix(prefix, "/")
}

// admit checks the entry, path-length and depth limits before an entry is
// written.
func (s *snapshotter) admit(path string, depth int) error {
	switch {
	case s.lim.MaxEntries > 0 && s.files >= s.lim.MaxEntries:
		return errcode.Errorf(errcode.TooLarge,
			"the workspace has more than %d files and directories, the snapshot limit set by the server; delete files you no longer need and try again", s.lim.MaxEntries)
	case s.lim.MaxDepth > 0 && depth > s.lim.MaxDepth:
		return errcode.Errorf(errcode.TooLarge,
			"the workspace is deeper than %d levels, the snapshot limit set by the server (at %s); flatten or delete that tree and try again", s.lim.MaxDepth, quote(path))
	case len(path) >= maxPathLen:
		return errcode.Errorf(errcode.TooLarge,
			"snapshot: the path %s is %d bytes long, more than the %d a snapshot can hold; shorten or delete that tree and try again", quote(path), len(path), maxPathLen)
	}
	return nil
}

// header is the common part of an entry's tar header.
func header(name string, typ byte, st *unix.Stat_t) *tar.Header {
	return &tar.Header{
		Typeflag: typ,
		Name:     name,
		Mode:     int64(permBits(st.Mode)),
		Uid:      int(st.Uid),
		Gid:      int(st.Gid),
		ModTime:  time.Unix(st.Mtim.Sec, 0),
	}
}

func (s *snapshotter) subdir(parent int, name, path string, depth int, st *unix.Stat_t) error {
	if err := s.admit(path, depth); err != nil {
		return err
	}
	fd, err := openChild(parent, name, unix.O_RDONLY|unix.O_DIRECTORY)
	switch err {
	case nil:
	case unix.ENOENT, unix.ENOTDIR, unix.ELOOP:
		return nil // removed or replaced meanwhile
	case unix.EXDEV:
		s.skipped++ // a mount point: not the workspace's own content
		return nil
	default:
		return fsError("snapshot", path, err)
	}
	defer closeFd(fd)
	if cur, err := fstat(fd); err == nil {
		st = &cur // the directory actually opened
	}
	if err := s.tw.WriteHeader(header(path+"/", tar.TypeDir, st)); err != nil {
		return err
	}
	s.files++
	return s.dir(fd, path+"/", depth+1)
}

func (s *snapshotter) symlink(parent int, name, path string, depth int, st *unix.Stat_t) error {
	if err := s.admit(path, depth); err != nil {
		return err
	}
	target, err := readlinkAt(parent, name)
	switch err {
	case nil:
	case unix.ENOENT, unix.EINVAL:
		return nil // removed, or no longer a symlink
	default:
		return fsError("snapshot", path, err)
	}
	h := header(path, tar.TypeSymlink, st)
	h.Linkname = target
	h.Mode = 0o777
	if err := s.tw.WriteHeader(h); err != nil {
		return err
	}
	s.files++
	return nil
}

func (s *snapshotter) file(parent int, name, path string, depth int) error {
	if err := s.admit(path, depth); err != nil {
		return err
	}
	// O_NOFOLLOW|O_NONBLOCK: a file swapped for a symlink or a FIFO since
	// the lstat is neither followed nor waited on.
	fd, st, err := openRegular(func() (int, error) {
		return openChild(parent, name, unix.O_RDONLY|unix.O_NONBLOCK)
	}, "snapshot", path)
	var ir *irregular
	switch {
	case err == nil:
	case err == unix.ENOENT:
		return nil
	case err == unix.ELOOP, err == unix.ENXIO, err == unix.ENODEV, err == unix.EXDEV, errors.As(err, &ir):
		s.skipped++
		return nil
	default:
		if errno, ok := err.(unix.Errno); ok {
			err = fsError("snapshot", path, errno)
		}
		return err
	}
	defer closeFd(fd)
	if s.links != nil && st.Nlink > 1 {
		id := fileID{dev: uint64(st.Dev), ino: st.Ino}
		s.links[id] = append(s.links[id], path)
	}
	size := st.Size
	// The header (a PAX one may add more; snapWriter catches that), the
	// padded content and the end-of-archive marker must fit.
	if s.lim.MaxBytes > 0 && s.out.n+tarBlock+padded(size)+tarTrailer > s.lim.MaxBytes {
		return errcode.Errorf(errcode.TooLarge,
			"the workspace snapshot would exceed %d bytes, the limit set by the server: %s alone is %d bytes; delete or shrink large files and try again",
			s.lim.MaxBytes, quote(path), size)
	}
	h := header(path, tar.TypeReg, &st)
	h.Size = size
	if err := s.tw.WriteHeader(h); err != nil {
		return err
	}
	var done int64
	for done < size {
		n, err := unix.Read(fd, s.buf[:min(int64(len(s.buf)), size-done)])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fsError("snapshot", path, err)
		}
		if n == 0 {
			break // shrank
		}
		if _, err := s.tw.Write(s.buf[:n]); err != nil {
			return err
		}
		done += int64(n)
	}
	if done < size {
		clear(s.buf)
		for done < size {
			n := min(int64(len(s.buf)), size-done)
			if _, err := s.tw.Write(s.buf[:n]); err != nil {
				return err
			}
			done += n
		}
	}
	s.files++
	return nil
}

// snapWriter counts the archive's bytes against the limit and hands them to
// dst in Writes of exactly ChunkSize bytes (the last one shorter).
type snapWriter struct {
	dst io.Writer
	buf []byte // cap ChunkSize
	n   int64  // bytes accepted
	max int64  // 0: no limit
}

func (s *snapWriter) Write(p []byte) (int, error) {
	if s.max > 0 && s.n+int64(len(p)) > s.max {
		return 0, errStreamCap
	}
	s.n += int64(len(p))
	total := len(p)
	for len(p) > 0 {
		k := copy(s.buf[len(s.buf):cap(s.buf)], p)
		s.buf = s.buf[:len(s.buf)+k]
		p = p[k:]
		if len(s.buf) == cap(s.buf) {
			if err := s.flush(); err != nil {
				return 0, err
			}
		}
	}
	return total, nil
}

func (s *snapWriter) flush() error {
	if len(s.buf) == 0 {
		return nil
	}
	_, err := s.dst.Write(s.buf)
	s.buf = s.buf[:0]
	if err != nil {
		return dstError{err}
	}
	return nil
}
