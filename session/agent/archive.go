package agent

// Snapshot and Restore: the whole workspace as a tar stream, in both
// directions, with the same fd-relative, no-follow primitives as the other
// operations (see the top of workspace.go).

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
		return agentproto.Errorf(agentproto.CodeInvalidArgument,
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
				return agentproto.Errorf(agentproto.CodeInvalidArgument,
					"%s changed while it was read, and it is a hard link: what was read may be a file outside the directory; copy the directory when nothing changes it", quote(name))
			}
			nlink = uint64(st.Nlink)
		}
		if nlink > uint64(len(names)) {
			return agentproto.Errorf(agentproto.CodeInvalidArgument,
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
		return agentproto.Errorf(agentproto.CodeTooLarge,
			"the workspace snapshot would exceed %d bytes, the limit set by the server; delete files you no longer need (large ones first) and try again", s.lim.MaxBytes)
	}
	var ae *agentproto.Error
	if errors.As(err, &ae) {
		return ae
	}
	return agentproto.Errorf(agentproto.CodeInternal, "snapshot: %v", err)
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
		return agentproto.Errorf(agentproto.CodeTooLarge,
			"the workspace has more than %d files and directories, the snapshot limit set by the server; delete files you no longer need and try again", s.lim.MaxEntries)
	case s.lim.MaxDepth > 0 && depth > s.lim.MaxDepth:
		return agentproto.Errorf(agentproto.CodeTooLarge,
			"the workspace is deeper than %d levels, the snapshot limit set by the server (at %s); flatten or delete that tree and try again", s.lim.MaxDepth, quote(path))
	case len(path) >= maxPathLen:
		return agentproto.Errorf(agentproto.CodeTooLarge,
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
	fd, err := openChild(parent, name, unix.O_RDONLY|unix.O_NONBLOCK)
	switch err {
	case nil:
	case unix.ENOENT:
		return nil
	case unix.ELOOP, unix.ENXIO, unix.ENODEV, unix.EXDEV:
		s.skipped++
		return nil
	default:
		return fsError("snapshot", path, err)
	}
	defer closeFd(fd)
	st, err := fstat(fd)
	if err != nil {
		return fsError("snapshot", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		s.skipped++
		return nil
	}
	if s.links != nil && st.Nlink > 1 {
		id := fileID{dev: uint64(st.Dev), ino: st.Ino}
		s.links[id] = append(s.links[id], path)
	}
	size := st.Size
	// The header (a PAX one may add more; snapWriter catches that), the
	// padded content and the end-of-archive marker must fit.
	if s.lim.MaxBytes > 0 && s.out.n+tarBlock+padded(size)+tarTrailer > s.lim.MaxBytes {
		return agentproto.Errorf(agentproto.CodeTooLarge,
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

// Restore replaces the workspace's contents with the tar archive read from
// src, and reports the entries created, the bytes read and the entries
// skipped.
//
// The archive is extracted into a fresh staging directory inside the
// workspace (".sandbox-mcp-restore-<random>", mode 0700). Only when all of it
// extracted cleanly are the workspace's old contents moved aside and the
// staged entries moved into the root (renameat); the old contents are then
// deleted. On any error before that point the staging directory is removed
// and the workspace is left as it was. Other operations on this Workspace
// wait while the contents are swapped. Restoring needs room for the old and
// the new contents at once.
//
// Accepted entry types: regular files, directories, symlinks and hard links
// (PAX and GNU long-name headers are read by archive/tar; PAX global headers
// are ignored). Character and block devices and FIFOs are skipped (counted in
// Skipped), never created. Any other type is INVALID_ARGUMENT, as is an entry
// whose name is empty, absolute, has a ".." component or a NUL, or is longer
// than 4096 bytes; an entry whose parent path goes through a symlink (a
// symlink entry "link" -> /etc followed by "link/passwd" is refused: no path
// is ever resolved through a symlink while extracting); and a hard link whose
// target is not a regular file that came earlier in the archive. "./" name
// prefixes are accepted. Missing parent directories are created (0755).
//
// Symlinks are created as stored, whatever their target: inside the
// workspace they are only data, and every later operation resolves them with
// the confinement rules. Hard links are created with linkat (never following
// a symlink) to the earlier file. Only the permission bits are kept
// (setuid, setgid and sticky are dropped); ownership is not restored;
// modification times are. Directory modes and times are applied after their
// contents are in place. When a name occurs twice, the later entry replaces
// the earlier one, except that a directory and a non-directory may not
// replace each other (INVALID_ARGUMENT).
//
// Limits (0 = no limit for each): lim.MaxBytes bounds the bytes read from src
// (an entry's size is checked against what is left before it is written, so
// a "bomb" stops at the cap without filling the disk); lim.MaxEntries bounds
// the headers; lim.MaxDepth the components of an entry's name. Exceeding any
// is TOO_LARGE. After the end-of-archive marker, src is read to its end
// (within MaxBytes) and the rest is ignored.
func (w *Workspace) Restore(src io.Reader, lim agentproto.Limits) (agentproto.RestoreResult, error) {
	return w.Extract(src, lim, ExtractOptions{})
}

// ExtractOptions adjust Extract for a tree that is not a sandbox's own
// workspace, such as a directory on the host (sandbox-mcp snapshot export).
// The zero value extracts as Restore does.
type ExtractOptions struct {
	// ClearMode holds permission bits cleared from every file and
	// directory created, on top of setuid, setgid and sticky (e.g. the
	// umask, and group and other write).
	ClearMode uint32
	// KeepSymlink, if set, decides for each symlink entry, by its name and
	// target, whether it is created; one it refuses is skipped (counted in
	// Skipped) and nothing else changes.
	KeepSymlink func(name, target string) bool
}

// SymlinkStaysInside reports whether a symlink entry named name, whose
// target is target, leads to a place inside the tree it is extracted into,
// whatever the other entries are: the target is relative, and made only of
// ".." components followed only of other components, with no more ".."
// than name has parent directories. Every step up is then taken from the
// link's own directory (a real directory of the tree: entries are never
// placed through a symlink), and every step down stays inside, symlinks
// met on the way included, as each of those passed the same test. A target
// such as "a/../.." is refused, though it may be harmless, because "a"
// could itself be a symlink.
func SymlinkStaysInside(name, target string) bool {
	comps, problem := entryComps(name)
	if problem != "" || len(comps) == 0 || target == "" || strings.HasPrefix(target, "/") {
		return false
	}
	up, down := 0, false
	for c := range strings.SplitSeq(target, "/") {
		switch c {
		case "", ".":
		case "..":
			if down {
				return false
			}
			up++
		default:
			down = true
		}
	}
	return up <= len(comps)-1
}

// Extract is Restore with options (see ExtractOptions).
func (w *Workspace) Extract(src io.Reader, lim agentproto.Limits, opt ExtractOptions) (agentproto.RestoreResult, error) {
	const op = "restore"
	var res agentproto.RestoreResult
	if err := checkLimits(op, lim); err != nil {
		return res, err
	}
	w.restoreMu.Lock()
	defer w.restoreMu.Unlock()

	// Extraction uses a descriptor of its own, so that it needs no lock
	// while it waits for src.
	shared, err := w.enter()
	if err != nil {
		return res, err
	}
	root, err := unix.FcntlInt(uintptr(shared), unix.F_DUPFD_CLOEXEC, 0)
	w.mu.RUnlock()
	if err != nil {
		return res, fsError(op, ".", err)
	}
	defer closeFd(root)

	stagingName := randomName(restorePrefix)
	if err := unix.Mkdirat(root, stagingName, 0o700); err != nil {
		return res, fsError(op, ".", err)
	}
	staging, err := openat(root, stagingName, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		_ = unix.Unlinkat(root, stagingName, unix.AT_REMOVEDIR)
		return res, fsError(op, ".", err)
	}
	defer closeFd(staging)
	discard := func() {
		_ = removeTree(staging)
		_ = unix.Unlinkat(root, stagingName, unix.AT_REMOVEDIR)
	}

	x := &extractor{
		staging: staging,
		lim:     lim,
		opt:     opt,
		in:      &capReader{r: src, max: lim.MaxBytes},
		regular: map[string]bool{},
		dirs:    map[string]dirMeta{},
	}
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	x.buf = *bp
	err = x.run()
	res = agentproto.RestoreResult{Files: x.files, Bytes: x.in.n, Skipped: x.skipped}
	if err != nil {
		discard()
		return res, unchanged(err)
	}

	w.mu.Lock()
	if w.fd < 0 {
		w.mu.Unlock()
		discard()
		return res, errClosed()
	}
	trash, trashName, err := swapIn(root, staging, stagingName)
	if err == nil {
		x.applyDirMeta(root)
	}
	w.mu.Unlock()
	if err != nil {
		discard()
		return res, unchanged(err)
	}

	// The old contents are out of sight (Snapshot skips the trash
	// directory); delete them without holding up other operations.
	err = removeTree(trash)
	closeFd(trash)
	if err == nil {
		err = unix.Unlinkat(root, trashName, unix.AT_REMOVEDIR)
	}
	if err != nil {
		return res, agentproto.Errorf(agentproto.CodeInternal,
			"restore: the archive was restored, but the old contents could not all be deleted from %s (%v); delete that directory", quote(trashName), err)
	}
	return res, nil
}

// unchanged adds to a restore error that the workspace was not changed.
func unchanged(err error) error {
	var ae *agentproto.Error
	if errors.As(err, &ae) {
		return &agentproto.Error{Code: ae.Code, Message: ae.Message + " (the workspace was left unchanged)"}
	}
	return err // the caller's own error from src
}

// swapIn moves the root's entries (other than the staging directory) into a
// new trash directory and the staged entries into the root. On failure it
// moves everything back and returns an error; on success it returns the
// trash directory, open for reading, and its name.
func swapIn(root, staging int, stagingName string) (int, string, error) {
	const op = "restore"
	rootDir, err := openat(root, ".", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, "", fsError(op, ".", err)
	}
	old, err := readNames(rootDir)
	closeFd(rootDir)
	if err != nil {
		return -1, "", fsError(op, ".", err)
	}
	trashName := randomName(trashPrefix)
	if err := unix.Mkdirat(root, trashName, 0o700); err != nil {
		return -1, "", fsError(op, ".", err)
	}
	trash, err := openat(root, trashName, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		_ = unix.Unlinkat(root, trashName, unix.AT_REMOVEDIR)
		return -1, "", fsError(op, ".", err)
	}

	type movedOut struct {
		name        string
		restoreMode bool   // the mode had to be changed to move it
		mode        uint32 // the original mode
	}
	var out []movedOut
	var in []string
	undo := func() {
		for _, name := range slices.Backward(in) {
			_ = unix.Renameat(root, name, staging, name)
		}
		for _, m := range slices.Backward(out) {
			if unix.Renameat(trash, m.name, root, m.name) == nil && m.restoreMode {
				if fd, err := openat(root, m.name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY, 0); err == nil {
					_ = chmodPathFd(fd, m.mode)
					closeFd(fd)
				}
			}
		}
		_ = removeTree(trash)
		closeFd(trash)
		_ = unix.Unlinkat(root, trashName, unix.AT_REMOVEDIR)
	}

	for _, name := range old {
		if name == stagingName || name == trashName {
			continue
		}
		m := movedOut{name: name}
		err := unix.Renameat(root, name, trash, name)
		if err == unix.EACCES || err == unix.EPERM {
			// A directory can only move to another parent when it is
			// writable (its ".." entry changes).
			if fd, oerr := openat(root, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY, 0); oerr == nil {
				if st, serr := fstat(fd); serr == nil && chmodPathFd(fd, permBits(st.Mode)|0o700) == nil {
					m.restoreMode, m.mode = true, permBits(st.Mode)
				}
				closeFd(fd)
			}
			err = unix.Renameat(root, name, trash, name)
		}
		if err == unix.ENOENT {
			continue
		}
		if err != nil {
			undo()
			return -1, "", fsError(op, name, err)
		}
		out = append(out, m)
	}

	if _, err := unix.Seek(staging, 0, io.SeekStart); err != nil {
		undo()
		return -1, "", fsError(op, ".", err)
	}
	staged, err := readNames(staging)
	if err != nil {
		undo()
		return -1, "", fsError(op, ".", err)
	}
	for _, name := range staged {
		err := unix.Renameat2(staging, name, root, name, unix.RENAME_NOREPLACE)
		if err == unix.EINVAL {
			err = unix.Renameat(staging, name, root, name) // no RENAME_NOREPLACE here
		}
		if err == unix.EEXIST {
			undo()
			return -1, "", agentproto.Errorf(agentproto.CodeBusy,
				"restore: %s was created in the workspace while the restore was running; retry when nothing else writes to the workspace", quote(name))
		}
		if err != nil {
			undo()
			return -1, "", fsError(op, name, err)
		}
		in = append(in, name)
	}
	if err := unix.Unlinkat(root, stagingName, unix.AT_REMOVEDIR); err != nil {
		// Something was added to the staging directory meanwhile.
		_ = removeTree(staging)
		_ = unix.Unlinkat(root, stagingName, unix.AT_REMOVEDIR)
	}
	return trash, trashName, nil
}

// dirMeta is a directory's mode and time from the archive, applied after
// its contents are in place.
type dirMeta struct {
	mode  uint32
	mtime time.Time
}

// extractor carries one Restore call's state.
type extractor struct {
	staging int // the staging directory, open for reading
	lim     agentproto.Limits
	opt     ExtractOptions
	in      *capReader
	buf     []byte

	headers, files, skipped int
	regular                 map[string]bool    // regular files extracted so far: hard-link targets
	dirs                    map[string]dirMeta // directory entries
}

// capReader counts what is read from the archive stream and enforces the
// byte limit.
type capReader struct {
	r   io.Reader
	n   int64 // bytes read
	max int64 // 0: no limit
	err error // sticky: TOO_LARGE, or the caller's error (dstError)
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	if c.max > 0 {
		left := c.max - c.n
		if left <= 0 {
			// At the limit: only the end of the stream may follow.
			var one [1]byte
			n, err := c.r.Read(one[:])
			switch {
			case n > 0:
				c.err = c.tooLarge()
				return 0, c.err
			case err == io.EOF:
				return 0, io.EOF
			case err != nil:
				c.err = dstError{err}
				return 0, c.err
			}
			return 0, nil
		}
		if int64(len(p)) > left {
			p = p[:left]
		}
	}
	n, err := c.r.Read(p)
	c.n += int64(n)
	if err != nil && err != io.EOF {
		c.err = dstError{err}
		return n, c.err
	}
	return n, err
}

func (c *capReader) tooLarge() error {
	return agentproto.Errorf(agentproto.CodeTooLarge,
		"restore: the archive is larger than %d bytes, the limit set by the server; restore a smaller snapshot", c.max)
}

// run extracts the whole archive into the staging directory.
func (x *extractor) run() error {
	tr := tar.NewReader(x.in)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if errors.Is(err, tar.ErrInsecurePath) && hdr != nil {
			err = nil // GODEBUG tarinsecurepath=0: entry() applies its own, stricter checks
		}
		if err != nil {
			return x.streamErr(err)
		}
		x.headers++
		if x.lim.MaxEntries > 0 && x.headers > x.lim.MaxEntries {
			return agentproto.Errorf(agentproto.CodeTooLarge,
				"restore: the archive has more than %d entries, the limit set by the server; restore a smaller snapshot", x.lim.MaxEntries)
		}
		if err := x.entry(tr, hdr); err != nil {
			return err
		}
	}
	// Read the rest (tar writers pad to whole records) so that the stream
	// ends cleanly.
	if _, err := io.Copy(io.Discard, x.in); err != nil {
		return x.streamErr(err)
	}
	return nil
}

// streamErr explains a failure to read the archive.
func (x *extractor) streamErr(err error) error {
	if x.in.err != nil {
		err = x.in.err
	}
	var de dstError
	if errors.As(err, &de) {
		return de.err
	}
	var ae *agentproto.Error
	if errors.As(err, &ae) {
		return ae
	}
	return agentproto.Errorf(agentproto.CodeInvalidArgument,
		"restore: the archive is not a valid tar stream (%v); restore from a snapshot made by this server", err)
}

// bad is an INVALID_ARGUMENT error about one archive entry.
func bad(name, format string, args ...any) error {
	return agentproto.Errorf(agentproto.CodeInvalidArgument, "restore: entry %s "+format, append([]any{qname(name)}, args...)...)
}

// entryComps validates an archive name and returns its components ("" and
// "." components dropped). problem is "" when the name is acceptable.
func entryComps(name string) (comps []string, problem string) {
	switch {
	case name == "":
		return nil, "has an empty name"
	case strings.IndexByte(name, 0) >= 0:
		return nil, "contains a NUL byte"
	case len(name) > maxPathLen:
		return nil, "is longer than 4096 bytes"
	case strings.HasPrefix(name, "/"):
		return nil, "is an absolute path; archive names must be relative to the workspace"
	}
	for c := range strings.SplitSeq(name, "/") {
		switch c {
		case "", ".":
		case "..":
			return nil, `has a ".." component, which could leave the workspace`
		default:
			comps = append(comps, c)
		}
	}
	return comps, ""
}

// entry extracts one archive entry.
func (x *extractor) entry(tr *tar.Reader, hdr *tar.Header) error {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	comps, problem := entryComps(hdr.Name)
	if problem != "" {
		return bad(hdr.Name, "%s", problem)
	}
	if len(comps) == 0 {
		if hdr.Typeflag == tar.TypeDir {
			return nil // the root itself ("./"): nothing to create
		}
		return bad(hdr.Name, "names the workspace root, which can only be a directory")
	}
	if x.lim.MaxDepth > 0 && len(comps) > x.lim.MaxDepth {
		return agentproto.Errorf(agentproto.CodeTooLarge,
			"restore: entry %s is %d levels deep, more than the limit of %d set by the server", qname(hdr.Name), len(comps), x.lim.MaxDepth)
	}
	switch hdr.Typeflag {
	case tar.TypeReg, 0: // 0 is the old TypeRegA
		return x.regularFile(tr, hdr, comps)
	case tar.TypeDir:
		return x.directory(hdr, comps)
	case tar.TypeSymlink:
		return x.symlink(hdr, comps)
	case tar.TypeLink:
		return x.hardlink(hdr, comps)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		x.skipped++
		return nil
	}
	return bad(hdr.Name, "has tar type %q, which a restore does not accept (only files, directories, symlinks and hard links)", string(rune(hdr.Typeflag)))
}

// parent resolves (creating as needed) the parent directory of an entry in
// the staging directory, refusing any symlink on the way.
func (x *extractor) parent(name string, comps []string) (int, error) {
	fd, err := mkdirParents(x.staging, comps[:len(comps)-1], resolveNoSymlinks, "restore", name)
	if err != nil {
		return -1, x.fail(name, err)
	}
	return fd, nil
}

// fail maps a system call failure while extracting the entry name.
func (x *extractor) fail(name string, err error) error {
	switch err {
	case unix.ELOOP:
		return bad(name, "lies below a symlink that came earlier in the archive; an archive may not place entries through a symlink")
	case unix.ENOTDIR:
		return bad(name, "lies below an entry that is not a directory")
	case unix.ENOSPC, unix.EDQUOT, unix.EFBIG:
		return agentproto.Errorf(agentproto.CodeTooLarge,
			"restore: the workspace ran out of space while extracting %s; a restore needs room for the old and the new contents at once: delete files first, or restore into a new session", qname(name))
	}
	return fsError("restore: entry", name, err)
}

// place runs create, which makes base in dir; if base exists already (the
// name came earlier in the archive) and is not a directory, it is removed
// and create runs again.
func (x *extractor) place(dir int, base, name string, create func() error) error {
	err := create()
	if err != unix.EEXIST {
		return err
	}
	if st, serr := lstatAt(dir, base); serr == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return bad(name, "has the name of a directory that came earlier in the archive")
	}
	if err := unix.Unlinkat(dir, base, 0); err != nil && err != unix.ENOENT {
		return err
	}
	return create()
}

func (x *extractor) regularFile(tr *tar.Reader, hdr *tar.Header, comps []string) error {
	name := hdr.Name
	size := hdr.Size
	if size < 0 {
		return bad(name, "has a negative size")
	}
	if x.lim.MaxBytes > 0 && x.in.n+padded(size) > x.lim.MaxBytes {
		return agentproto.Errorf(agentproto.CodeTooLarge,
			"restore: entry %s is %d bytes, more than is left of the %d-byte limit set by the server; restore a smaller snapshot", qname(name), size, x.lim.MaxBytes)
	}
	dir, err := x.parent(name, comps)
	if err != nil {
		return err
	}
	defer closeFd(dir)
	base := comps[len(comps)-1]
	fd := -1
	err = x.place(dir, base, name, func() error {
		var e error
		fd, e = openat(dir, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW, 0o600)
		return e
	})
	if err != nil {
		return x.fail(name, err)
	}
	defer closeFd(fd)
	for {
		n, rerr := tr.Read(x.buf)
		if n > 0 {
			if err := writeAll(fd, x.buf[:n]); err != nil {
				return x.fail(name, err)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return x.streamErr(rerr)
		}
	}
	if err := unix.Fchmod(fd, uint32(hdr.Mode)&0o777&^x.opt.ClearMode); err != nil {
		return x.fail(name, err)
	}
	_ = futimens(fd, hdr.ModTime)
	x.regular[strings.Join(comps, "/")] = true
	x.files++
	return nil
}

func (x *extractor) directory(hdr *tar.Header, comps []string) error {
	name := hdr.Name
	dir, err := x.parent(name, comps)
	if err != nil {
		return err
	}
	defer closeFd(dir)
	base := comps[len(comps)-1]
	// 0700 until the end: the directory's own mode may forbid adding its
	// contents.
	if err := unix.Mkdirat(dir, base, 0o700); err == unix.EEXIST {
		if st, serr := lstatAt(dir, base); serr != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return bad(name, "is a directory, but the same name came earlier in the archive as a file or symlink")
		}
	} else if err != nil {
		return x.fail(name, err)
	}
	key := strings.Join(comps, "/")
	x.dirs[key] = dirMeta{mode: uint32(hdr.Mode) & 0o777 &^ x.opt.ClearMode, mtime: hdr.ModTime}
	delete(x.regular, key)
	x.files++
	return nil
}

func (x *extractor) symlink(hdr *tar.Header, comps []string) error {
	name := hdr.Name
	if hdr.Linkname == "" || strings.IndexByte(hdr.Linkname, 0) >= 0 {
		return bad(name, "is a symlink with an empty target or a target that contains NUL")
	}
	if x.opt.KeepSymlink != nil && !x.opt.KeepSymlink(name, hdr.Linkname) {
		x.skipped++
		return nil
	}
	dir, err := x.parent(name, comps)
	if err != nil {
		return err
	}
	defer closeFd(dir)
	base := comps[len(comps)-1]
	if err := x.place(dir, base, name, func() error { return unix.Symlinkat(hdr.Linkname, dir, base) }); err != nil {
		return x.fail(name, err)
	}
	ts := unix.Timespec{Sec: hdr.ModTime.Unix(), Nsec: int64(hdr.ModTime.Nanosecond())}
	_ = unix.UtimesNanoAt(dir, base, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
	delete(x.regular, strings.Join(comps, "/"))
	x.files++
	return nil
}

func (x *extractor) hardlink(hdr *tar.Header, comps []string) error {
	name := hdr.Name
	tcomps, problem := entryComps(hdr.Linkname)
	if problem != "" {
		return bad(name, "is a hard link to %s, which %s", qname(hdr.Linkname), problem)
	}
	key, tkey := strings.Join(comps, "/"), strings.Join(tcomps, "/")
	if len(tcomps) == 0 || !x.regular[tkey] {
		return bad(name, "is a hard link to %s, which is not a regular file that came earlier in the archive", qname(hdr.Linkname))
	}
	if key == tkey {
		x.files++
		return nil // a link to itself: nothing to do
	}
	tdirPath := "."
	if len(tcomps) > 1 {
		tdirPath = strings.Join(tcomps[:len(tcomps)-1], "/")
	}
	tdir, err := openBeneath(x.staging, tdirPath, unix.O_PATH|unix.O_DIRECTORY, resolveNoSymlinks)
	if err != nil {
		return x.fail(name, err)
	}
	defer closeFd(tdir)
	tbase := tcomps[len(tcomps)-1]
	if st, err := lstatAt(tdir, tbase); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return bad(name, "is a hard link to %s, which is no longer a regular file", qname(hdr.Linkname))
	}
	dir, err := x.parent(name, comps)
	if err != nil {
		return err
	}
	defer closeFd(dir)
	base := comps[len(comps)-1]
	// linkat without AT_SYMLINK_FOLLOW links the name itself, never what a
	// symlink would point to.
	if err := x.place(dir, base, name, func() error { return unix.Linkat(tdir, tbase, dir, base, 0) }); err != nil {
		return x.fail(name, err)
	}
	x.regular[key] = true
	x.files++
	return nil
}

// applyDirMeta gives the restored directories their modes and times, deepest
// first, once everything is in place in the root. Best effort: a directory
// that is gone or replaced meanwhile is passed over.
func (x *extractor) applyDirMeta(root int) {
	paths := make([]string, 0, len(x.dirs))
	for p := range x.dirs {
		paths = append(paths, p)
	}
	slices.SortFunc(paths, func(a, b string) int {
		return strings.Count(b, "/") - strings.Count(a, "/")
	})
	for _, p := range paths {
		fd, err := openBeneath(root, p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, resolveNoSymlinks)
		if err != nil {
			continue
		}
		m := x.dirs[p]
		_ = futimens(fd, m.mtime)
		_ = unix.Fchmod(fd, m.mode)
		closeFd(fd)
	}
}
