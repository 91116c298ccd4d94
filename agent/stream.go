package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"sync"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// inbox is the input side of a request: the payloads of the data frames the
// server sends after it, read as one stream. Pushing never blocks the frame
// reader; the server bounds what it sends.
type inbox struct {
	mu     sync.Mutex
	cond   *sync.Cond
	queue  [][]byte
	closed bool  // eof received
	err    error // set when the consumer is done; later pushes are dropped
}

func newInbox() *inbox {
	b := &inbox{}
	b.cond = sync.NewCond(&b.mu)
	return b
}

func (b *inbox) push(p []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.err != nil || len(p) == 0 {
		return
	}
	b.queue = append(b.queue, p)
	b.cond.Signal()
}

// close marks the end of input.
func (b *inbox) close() {
	b.mu.Lock()
	b.closed = true
	b.cond.Broadcast()
	b.mu.Unlock()
}

// abort tells the inbox its consumer stopped (err may be nil); queued and
// later data is dropped.
func (b *inbox) abort(err error) {
	b.mu.Lock()
	if err == nil {
		err = io.ErrClosedPipe
	}
	b.err = err
	b.queue = nil
	b.cond.Broadcast()
	b.mu.Unlock()
}

func (b *inbox) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for len(b.queue) == 0 && !b.closed && b.err == nil {
		b.cond.Wait()
	}
	if b.err != nil {
		return 0, b.err
	}
	if len(b.queue) == 0 {
		return 0, io.EOF
	}
	n := copy(p, b.queue[0])
	if n == len(b.queue[0]) {
		b.queue[0] = nil
		b.queue = b.queue[1:]
	} else {
		b.queue[0] = b.queue[0][n:]
	}
	return n, nil
}

// chunkWriter sends what is written to it as data frames of a request.
type chunkWriter struct {
	s    *server
	id   uint64
	kind agentproto.Kind // KindData when empty
	ctx  context.Context // optional: writes fail once it is done
}

func (w *chunkWriter) Write(p []byte) (int, error) {
	kind := w.kind
	if kind == "" {
		kind = agentproto.KindData
	}
	written := 0
	for len(p) > 0 {
		if w.ctx != nil {
			if err := w.ctx.Err(); err != nil {
				return written, errcode.Errorf(errcode.Timeout, "the request was cancelled")
			}
		}
		n := min(len(p), agentproto.ChunkSize)
		if err := w.s.send(w.id, kind, nil, p[:n]); err != nil {
			return written, err
		}
		written += n
		p = p[n:]
	}
	return written, nil
}

// entryWriter batches list entries as JSON lines into data frames. It is
// used by one goroutine.
type entryWriter struct {
	cw  chunkWriter
	buf bytes.Buffer
}

func (e *entryWriter) emit(en agentproto.Entry) error {
	line, err := json.Marshal(en)
	if err != nil {
		return err
	}
	if e.buf.Len()+len(line)+1 > agentproto.ChunkSize {
		if err := e.flush(); err != nil {
			return err
		}
	}
	e.buf.Write(line)
	e.buf.WriteByte('\n')
	return nil
}

// flush sends the batched entries.
func (e *entryWriter) flush() error {
	if e.buf.Len() == 0 {
		return nil
	}
	_, err := e.cw.Write(e.buf.Bytes())
	e.buf.Reset()
	return err
}
