package workspace

import (
	"context"
	"errors"
	"path"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// ListOptions say what List lists.
type ListOptions struct {
	// Recursive lists everything below the directory, breadth-first.
	Recursive bool
	// Max is the most entries emitted (0 emits none).
	Max int
	// Pattern, if set, is a glob (see MatchGlob) an entry's path must
	// match to be emitted; directories that do not match are still walked.
	Pattern string
	// Prune names directories a recursive list does not enter below its
	// start, and so does a directory holding a file named CACHEDIR.TAG
	// (the Cache Directory Tagging convention: cargo's target, pytest's and
	// mypy's caches), when Prune is not empty. Each is emitted, whatever
	// Pattern says, with Pruned set and Count, the entries directly in it.
	Prune []string
	// MaxScan bounds the directory entries looked at (emitted or not, those
	// counted in pruned directories included); 0 means no bound. Past it the
	// list ends, truncated.
	MaxScan int
}

// cacheDirTag is the file that marks a cache directory
// (https://bford.info/cachedir/).
const cacheDirTag = "CACHEDIR.TAG"

// List reports the entries of the directory rel (everything below it when
// o.Recursive is set) to emit, in order, at most o.Max of them; Truncated is
// set when there were more, or when o.MaxScan entries were looked at before
// the walk ended. A symlink at rel that points to a directory inside the
// workspace is followed (one that leads outside is OUTSIDE_WORKSPACE); any
// other non-directory at rel is reported as its one entry. Below the start,
// symlinks are reported, never followed.
//
// Entry.Path is workspace-relative: rel (normalised: no "//", no "./")
// joined with the names below it, so it can be passed back to the other
// methods. A recursive list is breadth-first: the start's entries, then
// those of its subdirectories in the order they were listed, a level at a
// time; within a directory, entries are sorted by name. Directories 64
// levels below rel are listed but not entered. Each directory is opened
// again by its path below the start when its turn comes, never through a
// symlink or a mount point (one swapped in meanwhile is not entered), so
// the walk holds two descriptors whatever the tree's shape. Names that are
// not valid UTF-8 are listed with each invalid byte sequence replaced by
// U+FFFD (so such a path is for reading, not for passing back); symlink
// targets likewise. When ctx ends the walk stops and List fails with
// TIMEOUT.
func (w *Workspace) List(ctx context.Context, rel string, o ListOptions, emit func(agentproto.Entry) error) (agentproto.ListResult, error) {
	const op = "list"
	var res agentproto.ListResult
	p, err := parsePath(op, rel)
	if err != nil {
		return res, err
	}
	if o.Max < 0 || o.MaxScan < 0 {
		return res, errcode.Errorf(errcode.InvalidArgument, "list %s: max and max_scan must not be negative (got %d, %d)", quote(rel), o.Max, o.MaxScan)
	}
	if err := CheckGlob(o.Pattern); err != nil {
		return res, errcode.Errorf(errcode.InvalidArgument, "list %s: %w", quote(rel), err)
	}
	root, err := w.enter()
	if err != nil {
		return res, err
	}
	defer w.mu.RUnlock()

	l := &lister{ctx: ctx, op: op, rel: rel, o: o, emit: emit}
	prefix := ""
	if len(p.comps) > 0 {
		prefix = strings.ToValidUTF8(p.String(), "\uFFFD") + "/"
	}

	// Look at rel itself first (not following a final symlink).
	self, err := openBeneath(root, p.open(), unix.O_PATH|unix.O_NOFOLLOW, resolveFlags)
	if err != nil {
		return res, fsError(op, rel, err)
	}
	defer closeFd(self)
	st, err := fstat(self)
	if err != nil {
		return res, fsError(op, rel, err)
	}
	var start int
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		start, err = openat(self, ".", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	case unix.S_IFLNK:
		start, err = openBeneath(root, p.open(), unix.O_RDONLY|unix.O_DIRECTORY, resolveFlags)
		if err == unix.ENOTDIR || err == unix.ENOENT {
			// A link to a file, or a dangling one: list the link itself.
			target, _ := readlinkAt(self, "")
			return l.result(l.add(entryOf(p.String(), &st, target)))
		}
	default:
		return l.result(l.add(entryOf(p.String(), &st, "")))
	}
	if err != nil {
		return res, fsError(op, rel, err)
	}
	defer closeFd(start)
	return l.result(l.walk(start, prefix))
}

// lister carries one List call's state.
type lister struct {
	ctx       context.Context
	op, rel   string
	o         ListOptions
	emit      func(agentproto.Entry) error
	count     int // entries emitted
	scanned   int // entries looked at
	truncated bool
}

// errStop ends a walk early (max entries reached) without an error.
var errStop = errors.New("list: max entries reached")

// add emits e unless max entries were emitted already.
func (l *lister) add(e agentproto.Entry) error {
	if l.count >= l.o.Max {
		l.truncated = true
		return errStop
	}
	if err := l.emit(e); err != nil {
		return dstError{err}
	}
	l.count++
	return nil
}

// scan counts n entries looked at, and stops the walk past MaxScan.
func (l *lister) scan(n int) error {
	l.scanned += n
	if l.o.MaxScan > 0 && l.scanned > l.o.MaxScan {
		l.scanned = l.o.MaxScan
		l.truncated = true
		return errStop
	}
	return nil
}

// result turns the walk's outcome into List's results.
func (l *lister) result(err error) (agentproto.ListResult, error) {
	res := agentproto.ListResult{Count: l.count, Truncated: l.truncated, Scanned: l.scanned}
	var de dstError
	switch {
	case err == nil || err == errStop:
		return res, nil
	case l.ctx.Err() != nil:
		return res, stopped(l.ctx, l.op, l.rel)
	case errors.As(err, &de):
		return res, de.err
	}
	return res, fsError(l.op, l.rel, err)
}

// queued is a directory waiting for its turn in the walk.
type queued struct {
	below string // its path below the start ("" for the start)
	path  string // its entries' path prefix, ending in "/" ("" at the root)
	depth int    // its depth below the start (0 for the start)
}

// walk lists the start directory, open for reading as start, and, when
// recursive, every directory below it, breadth-first.
func (l *lister) walk(start int, prefix string) error {
	queue := []queued{{path: prefix}}
	for len(queue) > 0 {
		q := queue[0]
		queue = queue[1:]
		fd := start
		if q.depth > 0 {
			var err error
			fd, err = openBeneath(start, q.below, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, resolveNoSymlinks)
			switch err {
			case nil:
			case unix.ENOENT, unix.ENOTDIR, unix.ELOOP, unix.EACCES, unix.EXDEV, unix.ENAMETOOLONG:
				continue // gone or replaced meanwhile, unreadable, or a mount point: listed, not entered
			default:
				return err
			}
		}
		subs, err := l.dir(fd, q)
		if fd != start {
			closeFd(fd)
		}
		if err != nil {
			return err
		}
		queue = append(queue, subs...)
	}
	return nil
}

// dir lists the directory q, open for reading as fd, and returns its
// subdirectories to enter.
func (l *lister) dir(fd int, q queued) ([]queued, error) {
	if err := l.ctx.Err(); err != nil {
		return nil, err
	}
	room := -1
	if l.o.MaxScan > 0 {
		room = l.o.MaxScan - l.scanned
	}
	names, more, err := readNamesMax(fd, room)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	var subs []queued
	for i, name := range names {
		if i%256 == 0 && l.ctx.Err() != nil {
			return nil, l.ctx.Err()
		}
		if err := l.scan(1); err != nil {
			return nil, err
		}
		st, err := lstatAt(fd, name)
		if err == unix.ENOENT {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, err
		}
		p := q.path + strings.ToValidUTF8(name, "\uFFFD")
		target := ""
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			target, _ = readlinkAt(fd, name)
		}
		e := entryOf(p, &st, target)
		isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
		if isDir && l.o.Recursive && l.pruned(fd, name) {
			n, err := l.countIn(fd, name)
			if err != nil {
				return nil, err
			}
			e.Pruned, e.Count = true, n
			if err := l.add(e); err != nil {
				return nil, err
			}
			continue
		}
		if l.o.Pattern == "" || MatchGlob(l.o.Pattern, p) {
			if err := l.add(e); err != nil {
				return nil, err
			}
		}
		if isDir && l.o.Recursive && q.depth+1 < listMaxDepth {
			below := name
			if q.below != "" {
				below = q.below + "/" + name
			}
			subs = append(subs, queued{below: below, path: p + "/", depth: q.depth + 1})
		}
	}
	if more {
		l.truncated = true
		return nil, errStop
	}
	return subs, nil
}

// pruned reports whether the directory name in dirfd is one a recursive
// list does not enter: a name in Prune, or one holding CACHEDIR.TAG.
func (l *lister) pruned(dirfd int, name string) bool {
	if len(l.o.Prune) == 0 {
		return false
	}
	if slices.Contains(l.o.Prune, name) {
		return true
	}
	fd, err := openBeneath(dirfd, name+"/"+cacheDirTag, unix.O_PATH|unix.O_NOFOLLOW, resolveNoSymlinks)
	if err != nil {
		return false
	}
	closeFd(fd)
	return true
}

// countIn counts the entries directly in the directory name in dirfd,
// within what is left of MaxScan.
func (l *lister) countIn(dirfd int, name string) (int64, error) {
	fd, err := openChild(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return 0, nil // gone, replaced or unreadable: nothing to count
	}
	defer closeFd(fd)
	room := -1
	if l.o.MaxScan > 0 {
		room = l.o.MaxScan - l.scanned
	}
	names, more, err := readNamesMax(fd, room)
	if err != nil {
		return 0, nil
	}
	if err := l.scan(len(names)); err != nil {
		return 0, err
	}
	if more {
		l.truncated = true
		return 0, errStop
	}
	return int64(len(names)), nil
}

// readNamesMax is readNames for at most max names (max < 0: no bound);
// more tells that the directory has others.
func readNamesMax(fd, max int) (names []string, more bool, err error) {
	buf := make([]byte, 32<<10)
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err == unix.ENOENT {
			return nil, false, nil
		}
		if err != nil {
			return nil, false, err
		}
		if n <= 0 {
			return names, false, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
		if max >= 0 && len(names) > max {
			return names[:max], true, nil
		}
	}
}

// entryOf builds a List entry.
func entryOf(path string, st *unix.Stat_t, target string) agentproto.Entry {
	return agentproto.Entry{
		Path:   strings.ToValidUTF8(path, "\uFFFD"),
		Type:   typeOf(st.Mode),
		Size:   st.Size,
		Mode:   permBits(st.Mode),
		MTime:  mtimeOf(st),
		Target: strings.ToValidUTF8(target, "\uFFFD"),
	}
}

// MatchGlob reports whether the "/"-separated path matches pattern. A
// pattern's elements match the path's elements one for one, as path.Match
// matches a name ("*" any run of characters but "/", "?" one, "[a-z]" a
// class, "\" quotes), except that "**" matches any number of elements,
// none included: "**/*.py" matches "a.py" and "src/pkg/a.py". A pattern
// without "/" matches the path's last element, at any depth ("*.py" is
// "**/*.py"). A malformed pattern matches nothing (CheckGlob says why).
func MatchGlob(pattern, p string) bool {
	if pattern == "" {
		return true
	}
	pat := strings.Split(pattern, "/")
	if len(pat) == 1 && pat[0] != "**" {
		pat = []string{"**", pat[0]}
	}
	return matchElems(pat, strings.Split(p, "/"))
}

// matchElems matches path elements against pattern elements, by dynamic
// programming over the two: at most len(pat) × len(elems) element matches,
// however many "**" the pattern holds.
func matchElems(pat, elems []string) bool {
	prev := make([]bool, len(elems)+1) // pat[:i] matches elems[:j]
	cur := make([]bool, len(elems)+1)
	prev[0] = true
	for _, pe := range pat {
		if pe == "**" {
			acc := false
			for j := range prev {
				acc = acc || prev[j]
				cur[j] = acc
			}
		} else {
			cur[0] = false
			for j := 1; j < len(cur); j++ {
				ok := false
				if prev[j-1] {
					ok, _ = path.Match(pe, elems[j-1])
				}
				cur[j] = ok
			}
		}
		prev, cur = cur, prev
	}
	return prev[len(elems)]
}

// CheckGlob reports what is wrong with a pattern for MatchGlob, or nil.
func CheckGlob(pattern string) error {
	if len(pattern) > 1024 {
		return errors.New("the pattern is longer than 1024 bytes")
	}
	for _, el := range strings.Split(pattern, "/") {
		if _, err := path.Match(el, ""); err != nil {
			return errors.New("pattern " + qname(pattern) + " is malformed (an unclosed [ or a trailing \\); use * and ? within a name, ** for any number of directories")
		}
	}
	return nil
}
