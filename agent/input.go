package agent

import (
	"bufio"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
)

// kindResynced is the pseudo-frame input.next returns when it has read a
// resync marker with the lease's token: a new server speaks from here on.
// It never travels on the wire.
const kindResynced agentproto.Kind = "\x00resynced"

// errStalled is a frame begun but not finished within the stall time.
var errStalled = errors.New("a frame stalled half-read")

// input reads the server's frames. Until a lease gives it a token it
// behaves as agentproto.Reader does (any broken frame ends the agent);
// with a token, the stream may have several servers in turn (a server that
// crashed, then one that took over over a new attach to the same stdin),
// so a frame that cannot be read, or that stalls half-read for the stall
// time, is dropped and the input scans for the resync marker the next
// server sends first. See agentproto.FrameStall.
type input struct {
	src   *stallSource
	br    *bufio.Reader
	token atomic.Pointer[string]
	log   *slog.Logger
}

func newInput(r io.Reader, stall time.Duration, log *slog.Logger) *input {
	src := newStallSource(r, stall)
	return &input{src: src, br: bufio.NewReaderSize(src, 64<<10), log: log}
}

// setToken arms resynchronisation with the lease's token ("" disarms it).
func (in *input) setToken(tok string) { in.token.Store(&tok) }

func (in *input) marker() []byte {
	if p := in.token.Load(); p != nil && *p != "" {
		return agentproto.ResyncMarker(*p)
	}
	return nil
}

// next returns the next frame, or a kindResynced frame after a resync
// marker. Its errors end the agent: the stream's end, or a broken frame
// while no token is set.
func (in *input) next() (agentproto.Frame, error) {
	f, err := in.frame()
	if err == nil || errors.Is(err, io.EOF) {
		return f, err
	}
	m := in.marker()
	if m == nil {
		return f, err // no token (the stall source is not armed then): no resync
	}
	in.log.Warn("dropping a broken frame; waiting for a server's resync marker", "err", err)
	in.src.setArmed(false)
	if err := agentproto.SkipPast(in.br, m, 1<<62); err != nil {
		return agentproto.Frame{}, err
	}
	in.log.Info("a server resynchronised the stream")
	return agentproto.Frame{Header: agentproto.Header{Kind: kindResynced}}, nil
}

// frame reads one frame, or a marker at a frame boundary.
func (in *input) frame() (agentproto.Frame, error) {
	in.src.setArmed(false)
	if _, err := in.br.Peek(1); err != nil {
		return agentproto.Frame{}, err
	}
	// Inside a frame from here: a stall means its writer is gone (only
	// when a token allows a resync; otherwise wait as before).
	in.src.setArmed(in.marker() != nil)
	defer in.src.setArmed(false)
	sizes, err := in.br.Peek(8)
	if err != nil {
		return agentproto.Frame{}, noEOF(err)
	}
	if agentproto.IsMarkerStart(sizes) {
		m := in.marker()
		if m == nil {
			return agentproto.Frame{}, agentproto.ErrFrameTooLarge
		}
		got := make([]byte, len(m))
		if _, err := io.ReadFull(in.br, got); err != nil {
			return agentproto.Frame{}, noEOF(err)
		}
		if string(got) != string(m) {
			return agentproto.Frame{}, errors.New("a resync marker without this agent's token")
		}
		return agentproto.Frame{Header: agentproto.Header{Kind: kindResynced}}, nil
	}
	hl, pl, err := agentproto.FrameSizes(sizes, agentproto.MaxRequestHeader)
	if err != nil {
		return agentproto.Frame{}, err
	}
	in.br.Discard(8)
	buf := make([]byte, hl+pl)
	if _, err := io.ReadFull(in.br, buf); err != nil {
		return agentproto.Frame{}, noEOF(err)
	}
	return agentproto.DecodeFrame(buf, hl)
}

func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// stallSource reads r in its own goroutine, so that a read can give up
// after the stall time while armed (inside a frame) and still leave every
// byte for the next read.
type stallSource struct {
	ch    chan chunk
	cur   []byte
	err   error
	stall time.Duration
	armed atomic.Bool
}

type chunk struct {
	b   []byte
	err error
}

func newStallSource(r io.Reader, stall time.Duration) *stallSource {
	s := &stallSource{ch: make(chan chunk), stall: stall}
	go func() {
		for {
			buf := make([]byte, 64<<10)
			n, err := r.Read(buf)
			if n > 0 || err != nil {
				s.ch <- chunk{buf[:n], err}
			}
			if err != nil {
				return
			}
		}
	}()
	return s
}

func (s *stallSource) setArmed(on bool) { s.armed.Store(on) }

func (s *stallSource) Read(p []byte) (int, error) {
	if len(s.cur) == 0 {
		if s.err != nil {
			return 0, s.err
		}
		var c chunk
		if s.armed.Load() && s.stall > 0 {
			t := time.NewTimer(s.stall)
			select {
			case c = <-s.ch:
				t.Stop()
			case <-t.C:
				return 0, errStalled
			}
		} else {
			c = <-s.ch
		}
		s.cur, s.err = c.b, c.err
		if len(s.cur) == 0 {
			return 0, s.err
		}
	}
	n := copy(p, s.cur)
	s.cur = s.cur[n:]
	return n, nil
}
