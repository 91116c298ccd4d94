// Package agentproto is the wire protocol between the sandbox-mcp server and
// the agent that runs inside every sandbox container.
//
// The server starts the container with the agent as its main process and keeps
// one attach stream open to it for the sandbox's whole life: the server writes
// frames to the agent's stdin and reads frames from its stdout. The agent's
// stderr carries human-readable diagnostics only. Nothing else travels on the
// stream, and no `docker exec` is made per tool call.
//
// # Frames
//
// Every message is one frame:
//
//	uint32 big-endian  header length H   (1 ≤ H ≤ MaxRequestHeader from the server, MaxHeader from the agent)
//	uint32 big-endian  payload length P  (0 ≤ P ≤ MaxPayload)
//	H bytes            header: a JSON object {"id": uint64, "k": kind, "b": body}
//	P bytes            payload: raw bytes (file content, output, tar data)
//
// The id names a request. The server picks ids (starting at 1) and the agent
// answers with the same id; id 0 is the connection itself (hello, ping). The
// body is a JSON value whose shape depends on the kind (see the Kind
// constants). Bulk data never goes in the body; it goes in payloads, chunked
// so that no frame exceeds MaxPayload. A request's header may be larger than
// a reply's: an exec carries its argv and env in the body.
//
// A frame is never cut: a writer refuses a frame over the limits before
// writing a byte (ErrNotSent), so only that frame's request fails, and the
// stream goes on.
//
// # Conversation
//
//  1. The agent sends KindHello (id 0) with the protocol Version it speaks.
//     The server refuses to go on if the version differs.
//  2. The server sends requests (setup, exec, read, write, list, resolve,
//     snapshot, restore, ping); setup, when the sandbox needs it, comes
//     first. Each request is answered by zero or more streaming
//     frames (stdout, stderr, data) and ends with exactly one terminal frame:
//     exit (for exec), result, or error.
//     An exec runs as a job (ExecRequest.Job): the agent keeps its output,
//     and job requests read it later from any offset, write its stdin, and
//     signal or wait for it; a background exec answers at once with the
//     job's status, and jobs lists them.
//  3. Requests that carry bulk input (exec with stdin, write, restore) are
//     followed by data frames from the server and one eof frame.
//  4. The server may send cancel for any request in flight; the agent then
//     stops the work (for exec: kills every process the command started) and
//     still sends the terminal frame.
//  5. The agent exits when its stdin reaches EOF, or when no frame has arrived
//     for the lease the server gave in the hello reply (KindLease): the server
//     pings while it is alive, so a sandbox whose server died ends itself.
//
// # Trust
//
// The sandboxed code cannot reach the stream: the container's init and the
// agent keep uid 0 as their real and saved uid, and the sandbox user can
// neither signal nor trace them nor open their /proc files. The agent still
// runs beside that code, so the server treats everything it sends as
// untrusted input: frame sizes are bounded, every header is decoded into a
// fixed type and validated, streams are counted against the caps the server
// asked for, and a violation ends the connection.
//
// # Versioning
//
// Version changes whenever a frame's meaning changes in a way a peer of the
// previous version would misread; its history is written beside it. Adding
// an optional body field does not change it: both sides ignore unknown
// fields. The JSON of every message is pinned in testdata/*.golden.json.
package agentproto
