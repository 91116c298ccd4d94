package agent

// ring keeps the last size bytes written to a stream, addressed by their
// offset in everything the stream ever carried: byte o of the stream sits
// at buf[o%size] while it is kept. The buffer grows as bytes arrive, up to
// size, so a job that prints little holds little.
type ring struct {
	size  int64
	buf   []byte
	total int64 // bytes ever written
}

func newRing(size int64) ring { return ring{size: max(size, 0)} }

// write keeps p, dropping the oldest bytes past size.
func (r *ring) write(p []byte) {
	n := int64(len(p))
	if r.size == 0 || n == 0 {
		r.total += n
		return
	}
	if n > r.size {
		// Only the last size bytes of p can be kept.
		r.total += n - r.size
		p = p[n-r.size:]
		n = r.size
	}
	for len(p) > 0 {
		at := r.total % r.size
		if int64(len(r.buf)) < r.size && at == int64(len(r.buf)) {
			// Still growing: the stream so far fits from buf[0].
			k := min(int64(len(p)), r.size-at)
			r.buf = append(r.buf, p[:k]...)
			r.total += k
			p = p[k:]
			continue
		}
		if int64(len(r.buf)) < r.size {
			// A write longer than the ring skipped ahead: it fills the
			// whole ring from here.
			r.buf = append(r.buf, make([]byte, r.size-int64(len(r.buf)))...)
		}
		k := copy(r.buf[at:], p)
		r.total += int64(k)
		p = p[k:]
	}
}

// start is the offset of the oldest byte kept.
func (r *ring) start() int64 { return max(r.total-int64(len(r.buf)), 0) }

// read returns up to n bytes from offset off (moved up to start when they
// were dropped) and the offset they begin at.
func (r *ring) read(off, n int64) ([]byte, int64) {
	off = min(max(off, r.start()), r.total)
	n = min(max(n, 0), r.total-off)
	out := make([]byte, 0, n)
	for n > 0 {
		at := off % r.size
		k := min(n, int64(len(r.buf))-at)
		out = append(out, r.buf[at:at+k]...)
		off += k
		n -= k
	}
	return out, off - int64(len(out))
}
