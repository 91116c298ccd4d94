package agentproto

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// Version is the protocol version spoken by this package. The server
// refuses an agent whose hello names another. It changes when a frame's
// meaning changes in a way a peer of the previous version would misread;
// adding an optional body field that both sides may ignore does not change
// it. Every message's JSON is pinned in testdata/, so such a change shows in
// review.
//
// The server builds the runtime image from the agent binary next to it
// (--agent-bin) and tags it by that binary's digest, so the two ends normally
// come from one build; the version catches an agent from another build.
//
// History of versions:
//
//   - 1 (2026-11-29): frames of a 4-byte header length, a 4-byte payload
//     length, a JSON header {"id", "k", "b"} and a payload; at most 64 KiB of
//     header and 1 MiB of payload either way. Hello, lease, ping and pong;
//     exec, read, write, list, resolve, snapshot, restore; data, eof,
//     cancel; stdout, stderr, exit, result, error.
//   - 2 (2026-11-30): requests from the server may carry up to
//     MaxRequestHeader (1 MiB) of header, so that the largest exec the
//     policy allows fits once escaped; a version 1 agent reads at most
//     64 KiB and would end the sandbox on such a request. The agent's frames
//     keep MaxHeader (64 KiB). The hello carries the agent's ids (uids, gids,
//     command_uid, command_gid, command_groups), which a version 1 agent
//     does not send: the server would log zeros, root, as its ids. The
//     agent answers a result it cannot send with an error frame, so every
//     request gets its terminal frame. The error frame's codes are
//     internal/errcode's, with INTERNAL for faults (the same strings as
//     before).
//   - 3 (2026-11-30): every exec may run as a job (ExecRequest.Job) whose
//     output the agent keeps (KeepOutput per stream) for later reads; a
//     background exec answers at once with KindResult and a JobStatus
//     instead of output frames and KindExit; new requests KindJob (stdin,
//     signal, wait, read a job's output from an offset) and KindJobs (list).
//     A version 2 agent would refuse both kinds and stream a background
//     command as a foreground one. ExecRequest.MaxJobs bounds the jobs that
//     run at once (BUSY past it).
//     Also edit, delete and move requests; a read may ask for
//     lines (start_line, end_line) and its result says where the content
//     starts and, for lines, which lines it holds and how many the file
//     has. A version 2 agent would ignore start_line and send bytes from
//     offset 0.
//     Also the setup request (SetupRequest, answered by
//     SetupResult): the server sends its egress proxy's CA certificate and
//     the agent writes a CA bundle (the image's roots and that
//     certificate) before any command runs. A version 2 agent answers it
//     with an error, and the sandbox's programs would not trust the proxy.
//   - 4 (2026-12-01): a request's header may carry a timeout (Header.
//     TimeoutMillis): the agent stops the request when it passes, as if
//     cancelled, and answers TIMEOUT; the scans of a line read and of a
//     list are bounded by the bytes and entries the server allows
//     (ReadRequest.MaxScan, ListRequest.MaxScan). A foreground exec may be
//     detached (KindDetach): the agent then answers with KindResult and the
//     job's JobStatus, and the command runs on as a background job, its
//     timeout kept, its next read starting after the output streamed so
//     far. A version 3 agent would ignore the timeout and the bounds (and
//     go on scanning after the server gave up, holding the workspace), and
//     answer the detach frame with an error, leaving the exec waiting.
//     Additive: ExecResult.PipesHeld (a process kept the command's output
//     open past the agent's wait), ExecResult.OOMKills and
//     JobStatus.OOMKills (kills the sandbox's memory cgroup counted while
//     the command ran); a line read may cut long lines (MaxLineChars,
//     answered with Cuts and End); an edit may carry several replacements
//     (EditRequest.Edits); a list walks breadth-first, may filter by a glob
//     (Pattern) and leave dependency trees unentered (Prune, answered by
//     entries with Pruned and Count). A job wait returns on a line end or a
//     short quiet period instead of the first byte. The setup request
//     may carry the sandbox's environment (SetupRequest.Env, counted back
//     in SetupResult.Env): a backend that must keep it out of its instance
//     definition (a pod spec) sends it here; an agent without it answers
//     0 and the server stops the start.
//   - 5 (2026-12-02): a server that lost its connection may take over the
//     running agent again (a server started again after a crash, over a
//     new attach to the same container). The lease may carry a token
//     (Lease.Token); with one, the agent outlives a broken stream: a frame
//     it cannot read, or one that stalls half-read for FrameStall, sends it
//     scanning for the resync marker (ResyncMarker(token)), and a marker
//     at a frame boundary is always accepted. After the marker comes
//     KindResume: the agent detaches the old connection's foreground
//     execs (they run on as jobs), cancels its other requests, and answers
//     with the reply marker (ResyncReply(nonce)) and KindResumed (its hello
//     and its jobs). A version 4 agent would read the marker as an
//     oversized frame and end.
//   - 6 (2026-12-02): port streams. KindPortOpen asks the agent to dial
//     127.0.0.1:PORT inside the sandbox (its network namespace, so it
//     works with no network at all) and relay bytes both ways over this
//     connection: KindPortReady, then KindPortData, KindPortAck (flow
//     control: at most PortWindow bytes un-acknowledged each way) and
//     KindPortClose (half-close) either way, ended by KindResult with a
//     PortResult, KindError (NOT_FOUND when nothing listens), or the
//     server's KindCancel. A version 4 agent answers port_open with an
//     error and the server could reach no port. (The port_* kinds are
//     names, not numbers: another branch adding kinds at the same time
//     cannot collide with them unless it picks the same prefix.)
const Version = 6

// FrameStall is how long the agent waits for the rest of a frame it has
// begun to read before it takes the frame for the last, cut one of a
// server that is gone, drops it and scans for a resync marker (only once
// a lease gave it a token). A server writes each frame with one write, so
// a live server's frame does not stall; a server that resumes waits
// ResumeQuiet before its first byte so that such a cut frame has been
// dropped and none of its bytes complete it.
const FrameStall = 2 * time.Second

// ResumeQuiet is how long a server that takes over a running agent stays
// silent on its new stream before the resync marker: FrameStall and a
// margin.
const ResumeQuiet = FrameStall + 500*time.Millisecond

// markerPrefix begins both resync markers: a frame header of two sizes no
// frame may have, so that at a frame boundary the marker can never be read
// as a frame, and a reader knows it at its first 8 bytes.
var markerPrefix = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// ResyncMarker is what a server writes before KindResume on a stream whose
// earlier bytes came from another server: the marker prefix, then the
// lease's token. The agent accepts no marker without the token, so model
// content travelling in payloads (a file written, a job's stdin) can never
// be taken for one.
func ResyncMarker(token string) []byte {
	return append(append(append([]byte(nil), markerPrefix...), "sandbox-mcp resync "+token...), '\n')
}

// ResyncReply is what the agent writes, at a frame boundary, before
// KindResumed: the marker prefix and the nonce of the KindResume it
// answers. The server drops what it reads before it: the rest of frames
// the agent wrote for the old connection. Sandboxed code cannot know the
// nonce, so its output cannot forge the reply.
func ResyncReply(nonce string) []byte {
	return append(append(append([]byte(nil), markerPrefix...), "sandbox-mcp resumed "+nonce...), '\n')
}

// IsMarkerStart reports whether the 8 bytes at a frame boundary begin a
// resync marker rather than a frame.
func IsMarkerStart(sizes []byte) bool { return bytes.Equal(sizes, markerPrefix) }

// ErrMarkerNotFound is SkipPast's error when max bytes passed without the
// marker.
var ErrMarkerNotFound = errors.New("agentproto: resync marker not found")

// SkipPast reads br until marker has been read whole, dropping what came
// before it, at most max bytes in all (ErrMarkerNotFound past them).
func SkipPast(br *bufio.Reader, marker []byte, max int64) error {
	if !bytes.HasPrefix(marker, markerPrefix) || len(marker) == len(markerPrefix) {
		return errors.New("agentproto: not a resync marker")
	}
	// The rest of a marker holds no 0xff, so a match is a run of at
	// least eight 0xff followed by the rest.
	rest := marker[len(markerPrefix):]
	ff, j := 0, -1
	for n := int64(0); n < max; n++ {
		b, err := br.ReadByte()
		if err != nil {
			return err
		}
		if j >= 0 {
			if b == rest[j] {
				if j++; j == len(rest) {
					return nil
				}
				continue
			}
			j, ff = -1, 0
		}
		switch {
		case b == 0xff:
			ff = min(ff+1, len(markerPrefix))
		case ff == len(markerPrefix) && b == rest[0]:
			if len(rest) == 1 {
				return nil
			}
			j, ff = 1, 0
		default:
			ff = 0
		}
	}
	return ErrMarkerNotFound
}

// Limits on a single frame. A peer that sends more is broken or hostile, and
// the connection ends; a Writer refuses to send more, before writing a byte.
const (
	// MaxHeader bounds the JSON header of a frame from the agent.
	MaxHeader = 64 << 10
	// MaxRequestHeader bounds the JSON header of a frame from the server.
	// An exec request carries a command's argv and env, each up to 64 KiB
	// (policy.MaxArgvBytes, policy.MaxEnvBytes), a program path and a cwd
	// of up to 4 KiB each; JSON escapes a byte to at most 6 (\u0001), so
	// the largest such request is about 816 KiB.
	MaxRequestHeader = 1 << 20
	// MaxPayload bounds the payload of a frame either way.
	MaxPayload = 1 << 20
	// ChunkSize is the payload size senders use when they stream bulk data.
	ChunkSize = 256 << 10
	// PortChunk bounds the payload of a KindPortData frame.
	PortChunk = 64 << 10
	// PortWindow is the flow-control window of a port stream, each way:
	// the most bytes a sender may have in flight that its peer has not
	// acknowledged (KindPortAck). It is also all either end buffers for
	// one direction of one stream, so a reader that does not read (a slow
	// browser) stops the other end after PortWindow bytes, and the socket
	// inside the sandbox then pushes back on the program writing to it.
	PortWindow = 256 << 10
	// MaxPortStreams bounds the port streams open at once on one
	// connection; the agent answers BUSY past it.
	MaxPortStreams = 128
)

// Kind names what a frame is. Each constant's comment gives the direction
// (S→A from server to agent, A→S from agent to server), the body type and what
// the payload holds.
type Kind string

const (
	// KindHello A→S, id 0: body Hello. First frame on the stream.
	KindHello Kind = "hello"
	// KindLease S→A, id 0: body Lease. Sent once after hello.
	KindLease Kind = "lease"
	// KindPing S→A: no body. The agent answers KindPong with the same id.
	KindPing Kind = "ping"
	// KindPong A→S: no body.
	KindPong Kind = "pong"
	// KindResume S→A, id 0: body Resume. Sent right after ResyncMarker by
	// a server that takes over a running agent; answered by
	// ResyncReply(nonce) and KindResumed.
	KindResume Kind = "resume"
	// KindResumed A→S, id 0: body Resumed. The first frame after the
	// reply marker.
	KindResumed Kind = "resumed"

	// KindExec S→A: body ExecRequest. If Stdin is true, data frames and one
	// eof frame follow. Answered by stdout/stderr frames, then KindExit or
	// KindError.
	KindExec Kind = "exec"
	// KindStdout, KindStderr A→S: payload is command output.
	KindStdout Kind = "stdout"
	KindStderr Kind = "stderr"
	// KindExit A→S: body ExecResult. Terminal.
	KindExit Kind = "exit"

	// KindJob S→A: body JobRequest. Answered by stdout/stderr frames, then
	// KindResult with JobStatus.
	KindJob Kind = "job"
	// KindJobs S→A: body JobsRequest. Answered by KindResult with JobList.
	KindJobs Kind = "jobs"

	// KindRead S→A: body ReadRequest. Answered by data frames with the
	// content, then KindResult with ReadResult.
	KindRead Kind = "read"
	// KindWrite S→A: body WriteRequest, then data frames and eof. Answered by
	// KindResult with WriteResult.
	KindWrite Kind = "write"
	// KindEdit S→A: body EditRequest, then data frames (old text, new text)
	// and eof. Answered by KindResult with EditResult.
	KindEdit Kind = "edit"
	// KindDelete S→A: body DeleteRequest. Answered by KindResult with
	// DeleteResult.
	KindDelete Kind = "delete"
	// KindMove S→A: body MoveRequest. Answered by KindResult with
	// MoveResult.
	KindMove Kind = "move"
	// KindList S→A: body ListRequest. Answered by data frames whose payloads
	// are JSON lines of Entry, then KindResult with ListResult.
	KindList Kind = "list"
	// KindResolve S→A: body ResolveRequest. Answered by KindResult with
	// ResolveResult.
	KindResolve Kind = "resolve"
	// KindSnapshot S→A: body SnapshotRequest. Answered by data frames with a
	// tar stream of the workspace, then KindResult with SnapshotResult.
	KindSnapshot Kind = "snapshot"
	// KindRestore S→A: body RestoreRequest, then data frames with a tar
	// stream and eof. Answered by KindResult with RestoreResult.
	KindRestore Kind = "restore"

	// KindSetup S→A: body SetupRequest. Sent after the lease, before any
	// other request, when the sandbox needs it. Answered by KindResult with
	// SetupResult.
	KindSetup Kind = "setup"

	// KindData carries a chunk of bulk data in its payload, either way.
	KindData Kind = "data"
	// KindEOF S→A: the end of the data frames of a request.
	KindEOF Kind = "eof"
	// KindCancel S→A: stop the request with this id.
	KindCancel Kind = "cancel"
	// KindDetach S→A, no body: stop waiting for the foreground exec with
	// this id. Unless the command ended already (then KindExit answers as
	// usual), the agent answers with KindResult and a JobStatus, and the
	// command runs on as a background job.
	KindDetach Kind = "detach"

	// KindPortOpen S→A: body PortOpenRequest. The agent dials
	// 127.0.0.1:Port in the sandbox and answers KindPortReady, or
	// KindError (NOT_FOUND: nothing listens there; BUSY: too many streams).
	// After ready, bytes flow both ways in KindPortData frames; the stream
	// ends with KindResult and a PortResult once both ways are closed or
	// the server sent KindCancel (which closes the socket at once).
	KindPortOpen Kind = "port_open"
	// KindPortReady A→S: no body. The socket is connected.
	KindPortReady Kind = "port_ready"
	// KindPortData either way: the payload is up to PortChunk bytes of the
	// stream. A sender has at most PortWindow bytes that its peer has not
	// acknowledged in flight; a peer that sends more breaks the protocol.
	KindPortData Kind = "port_data"
	// KindPortAck either way: body PortAck. The receiver handed that many
	// more bytes on (to the socket, or to the server's reader): the sender
	// may send as many more.
	KindPortAck Kind = "port_ack"
	// KindPortClose either way, no body: the sender sends no more data (a
	// half-close: the agent shuts the socket's write side down once what
	// it holds is written; the server's reader sees EOF).
	KindPortClose Kind = "port_close"

	// KindResult A→S: terminal success; the body depends on the request.
	KindResult Kind = "result"
	// KindError A→S: terminal failure; body Error.
	KindError Kind = "error"
)

// Header is the JSON head of a frame.
type Header struct {
	ID   uint64 `json:"id"`
	Kind Kind   `json:"k"`
	// TimeoutMillis, on a request from the server, is how long the agent
	// may work on it, in milliseconds from when it reads the frame: then it
	// stops the request as it stops a cancelled one and answers TIMEOUT.
	// The server sets it from the deadline it waits for the answer by, so
	// the agent never works on what the server gave up on, whether the
	// cancel frame arrives or not. 0 sets no limit (an exec has its own
	// TimeoutMillis in its body).
	TimeoutMillis int64           `json:"t,omitempty"`
	Body          json.RawMessage `json:"b,omitempty"`
}

// Frame is one decoded message.
type Frame struct {
	Header
	Payload []byte
}

// Decode unmarshals the frame's body into v. A missing body leaves v as it is.
func (f *Frame) Decode(v any) error {
	if len(f.Body) == 0 {
		return nil
	}
	if err := json.Unmarshal(f.Body, v); err != nil {
		return fmt.Errorf("agentproto: %s frame %d: bad body: %w", f.Kind, f.ID, err)
	}
	return nil
}

// ErrFrameTooLarge reports a frame whose sizes exceed the limits.
var ErrFrameTooLarge = errors.New("agentproto: frame exceeds size limits")

// ErrBadHeader reports a frame whose header is not a JSON object with a
// kind. Like ErrFrameTooLarge from a Reader, it means the peer broke the
// protocol.
var ErrBadHeader = errors.New("agentproto: bad frame header")

// ErrNotSent marks an error of Writer.Write that came before a byte was
// written: a frame too large (ErrFrameTooLarge) or a body that does not
// encode. The stream is intact; only the request the frame belonged to
// fails. Any other error of Write leaves the stream cut inside a frame.
var ErrNotSent = errors.New("agentproto: frame not sent")

// Writer encodes frames onto a stream. It is not safe for concurrent use;
// callers serialise writes.
type Writer struct {
	// MaxHeader is the largest header written: MaxHeader unless set (the
	// server sets MaxRequestHeader).
	MaxHeader int

	w   *bufio.Writer
	hdr [8]byte
}

// NewWriter returns a Writer on w.
func NewWriter(w io.Writer) *Writer {
	return &Writer{MaxHeader: MaxHeader, w: bufio.NewWriterSize(w, 64<<10)}
}

// Write encodes one frame and flushes it. body may be nil. A frame whose
// header exceeds w.MaxHeader or whose payload exceeds MaxPayload is refused
// with an error that wraps ErrNotSent and ErrFrameTooLarge, before anything
// is written.
func (w *Writer) Write(id uint64, kind Kind, body any, payload []byte) error {
	return w.write(Header{ID: id, Kind: kind}, body, payload)
}

// WriteRequest is Write for a request the agent must finish within timeout
// (Header.TimeoutMillis, rounded up to a whole millisecond); a timeout of 0
// or less sets none.
func (w *Writer) WriteRequest(id uint64, kind Kind, timeout time.Duration, body any) error {
	return w.write(Header{ID: id, Kind: kind, TimeoutMillis: TimeoutMillis(timeout)}, body, nil)
}

// TimeoutMillis is d in whole milliseconds, rounded up, for
// Header.TimeoutMillis: 0 for none when d is 0 or less.
func TimeoutMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// Timeout is the header's TimeoutMillis as a duration (0: none); a
// negative value reads as none too.
func (h Header) Timeout() time.Duration {
	if h.TimeoutMillis <= 0 {
		return 0
	}
	return time.Duration(min(h.TimeoutMillis, int64(1<<62)/int64(time.Millisecond))) * time.Millisecond
}

func (w *Writer) write(h Header, body any, payload []byte) error {
	kind := h.Kind
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("%w: encode %s body: %w", ErrNotSent, kind, err)
		}
		h.Body = b
	}
	head, err := json.Marshal(h)
	if err != nil {
		return fmt.Errorf("%w: encode header: %w", ErrNotSent, err)
	}
	if len(head) > w.MaxHeader || len(payload) > MaxPayload {
		return fmt.Errorf("%w: %w: a %s frame of %d header and %d payload bytes (limits %d and %d)",
			ErrNotSent, ErrFrameTooLarge, kind, len(head), len(payload), w.MaxHeader, MaxPayload)
	}
	binary.BigEndian.PutUint32(w.hdr[0:4], uint32(len(head)))
	binary.BigEndian.PutUint32(w.hdr[4:8], uint32(len(payload)))
	if _, err := w.w.Write(w.hdr[:]); err != nil {
		return err
	}
	if _, err := w.w.Write(head); err != nil {
		return err
	}
	if _, err := w.w.Write(payload); err != nil {
		return err
	}
	return w.w.Flush()
}

// WriteRaw writes b as it is (a resync marker) and flushes.
func (w *Writer) WriteRaw(b []byte) error {
	if _, err := w.w.Write(b); err != nil {
		return err
	}
	return w.w.Flush()
}

// Reader decodes frames from a stream.
type Reader struct {
	// MaxHeader is the largest header accepted: MaxHeader unless set (the
	// agent sets MaxRequestHeader).
	MaxHeader int

	r *bufio.Reader
}

// NewReader returns a Reader on r.
func NewReader(r io.Reader) *Reader {
	return &Reader{MaxHeader: MaxHeader, r: bufio.NewReaderSize(r, 64<<10)}
}

// SkipPast drops what the stream holds up to and including marker (see
// the package function SkipPast): a server that resumes reads the agent's
// frames from the reply marker on.
func (r *Reader) SkipPast(marker []byte, max int64) error { return SkipPast(r.r, marker, max) }

// Read decodes the next frame. It returns io.EOF at a clean end of stream,
// io.ErrUnexpectedEOF for a stream cut inside a frame, ErrFrameTooLarge for
// oversized frames (before reading or allocating their bytes), and an error
// wrapping ErrBadHeader for a malformed header. After an error the stream
// cannot be resynchronised and must be closed.
func (r *Reader) Read() (Frame, error) {
	var sizes [8]byte
	if _, err := io.ReadFull(r.r, sizes[:]); err != nil {
		return Frame{}, err
	}
	hl, pl, err := FrameSizes(sizes[:], r.MaxHeader)
	if err != nil {
		return Frame{}, err
	}
	buf := make([]byte, hl+pl)
	if _, err := io.ReadFull(r.r, buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, err
	}
	return DecodeFrame(buf, hl)
}

// FrameSizes checks the 8 size bytes that begin a frame against the
// limits (maxHeader for the header) and returns the header's and the
// payload's lengths, or ErrFrameTooLarge.
func FrameSizes(sizes []byte, maxHeader int) (header, payload int, err error) {
	hl := binary.BigEndian.Uint32(sizes[0:4])
	pl := binary.BigEndian.Uint32(sizes[4:8])
	if hl == 0 || hl > uint32(maxHeader) || pl > MaxPayload {
		return 0, 0, ErrFrameTooLarge
	}
	return int(hl), int(pl), nil
}

// DecodeFrame decodes a frame's bytes after its sizes: hl bytes of header,
// then the payload.
func DecodeFrame(buf []byte, hl int) (Frame, error) {
	var f Frame
	if err := json.Unmarshal(buf[:hl], &f.Header); err != nil {
		return Frame{}, fmt.Errorf("%w: %w", ErrBadHeader, err)
	}
	if f.Kind == "" {
		return Frame{}, fmt.Errorf("%w: no kind", ErrBadHeader)
	}
	if len(buf) > hl {
		f.Payload = buf[hl:]
	}
	return f, nil
}
