package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
)

// The hub: a sandbox pod's pid 1 when servers share its agent (Kubernetes
// replicas). On Docker a server that comes back attaches again to the same
// stdin pipe of the container; a pod's exec has no such pipe (every exec
// is a new process, and its end closes the process's stdin), so the hub
// keeps the agent's stdin and stdout itself and lends them to one attach
// at a time.
const (
	// HubCommand is the pod's main process: it reaps orphans as hold does,
	// runs the agent (the arguments after it) as its child, ends with it,
	// and serves the agent's stream on HubSocket.
	HubCommand = "hub"
	// AttachCommand is what a server execs to reach the agent: it relays
	// its stdin to the hub and the agent's stdout and stderr back. A newer
	// attach supersedes the one before: the hub cuts the older one, which
	// exits with ExitSuperseded.
	AttachCommand = "attach"
	// HubSocket is the hub's listener, in the pod's abstract unix socket
	// namespace (no file, nothing to delete or replace on a filesystem).
	// Code in the sandbox runs as the same user and can reach it: what
	// it gets is its own agent, which it could signal anyway, and taking
	// the agent over needs the resume token (agentproto.ResyncMarker).
	HubSocket = "@sandbox-mcp-agent-hub"
	// ExitSuperseded is an attach's exit code when a newer attach took
	// the agent's stream.
	ExitSuperseded = 3
)

// Records from the hub to an attach: a stream byte, a 4-byte length, the
// bytes.
const (
	recStdout     = 1
	recStderr     = 2
	recSuperseded = 3
)

// hubState is the agent's stream and the attach that holds it.
type hubState struct {
	stdin io.Writer // the agent's

	mu   sync.Mutex
	cond *sync.Cond
	gen  uint64
	cur  *hubConn

	inMu sync.Mutex // whole units (frames, markers) into the agent's stdin
}

type hubConn struct {
	c   net.Conn
	wmu sync.Mutex
}

func (c *hubConn) record(kind byte, b []byte) error {
	var h [5]byte
	h[0] = kind
	binary.BigEndian.PutUint32(h[1:], uint32(len(b)))
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if _, err := c.c.Write(h[:]); err != nil {
		return err
	}
	_, err := c.c.Write(b)
	return err
}

// hubSocket is HubSocket, or a test's own from $SANDBOX_MCP_HUB_SOCKET
// (tests on one host share the abstract namespace).
func hubSocket() string {
	if s := os.Getenv("SANDBOX_MCP_HUB_SOCKET"); s != "" {
		return s
	}
	return HubSocket
}

// hub runs the agent with args and serves its stream until it ends, and
// returns the exit code for the pod's main process.
func hub(args []string) int {
	ln, err := net.Listen("unix", hubSocket())
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandbox-agent hub:", err)
		return 1
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandbox-agent hub:", err)
		return 1
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	cmd := exec.Command(self, args...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return 1
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return 1
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return 1
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "sandbox-agent hub: start the agent:", err)
		return 1
	}
	h := &hubState{stdin: stdin}
	h.cond = sync.NewCond(&h.mu)
	go h.accept(ln)
	go h.output(stdout)
	go h.errors(stderr)
	agent := cmd.Process.Pid
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			_ = cmd.Process.Kill()
			continue // its exit ends the hub below
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
			if pid == agent {
				if ws.Exited() {
					return ws.ExitStatus()
				}
				return 1
			}
		}
	}
	return 1
}

// accept gives the stream to each new attach, cutting the one before.
func (h *hubState) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		hc := &hubConn{c: c}
		h.mu.Lock()
		old := h.cur
		h.gen++
		g := h.gen
		h.cur = hc
		h.cond.Broadcast()
		h.mu.Unlock()
		// The older attach's unit in progress, if any, is dropped (its
		// pump writes only while it is current): the agent's stdin sees
		// whole frames only, so the new server needs no quiet period.
		h.inMu.Lock()
		h.inMu.Unlock()
		if old != nil {
			// A write to it that blocks (its server stopped reading)
			// must not hold the hub: the deadline ends it.
			_ = old.c.SetWriteDeadline(time.Now().Add(time.Second))
			go func() {
				_ = old.record(recSuperseded, nil)
				old.c.Close()
			}()
		}
		go h.pump(hc, g)
	}
}

// current reports whether attach g still holds the stream.
func (h *hubState) current(g uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.gen == g
}

// drop lets go of hc if it still holds the stream.
func (h *hubState) drop(hc *hubConn) {
	h.mu.Lock()
	if h.cur == hc {
		h.cur = nil
	}
	h.mu.Unlock()
	hc.c.Close()
}

// pump copies an attach's bytes into the agent's stdin, one whole frame
// or resync marker at a time, while it holds the stream. Anything that is
// not a frame or a marker ends the attach.
func (h *hubState) pump(hc *hubConn, g uint64) {
	defer h.drop(hc)
	br := bufio.NewReaderSize(hc.c, 64<<10)
	for {
		sizes := make([]byte, 8)
		if _, err := io.ReadFull(br, sizes); err != nil {
			return
		}
		var unit []byte
		if agentproto.IsMarkerStart(sizes) {
			rest, err := br.ReadSlice('\n')
			if err != nil || len(rest) > 4096 {
				return
			}
			unit = append(sizes, rest...)
		} else {
			hl, pl, err := agentproto.FrameSizes(sizes, agentproto.MaxRequestHeader)
			if err != nil {
				return
			}
			unit = make([]byte, 8+hl+pl)
			copy(unit, sizes)
			if _, err := io.ReadFull(br, unit[8:]); err != nil {
				return
			}
		}
		h.inMu.Lock()
		if !h.current(g) {
			h.inMu.Unlock()
			return
		}
		_, err := h.stdin.Write(unit)
		h.inMu.Unlock()
		if err != nil {
			return
		}
	}
}

// output sends the agent's stdout to the attach that holds the stream,
// waiting for one while there is none (so the first attach gets the
// agent's hello). What a dying attach did not take is lost: a server that
// takes over skips to the agent's reply marker anyway.
func (h *hubState) output(r io.Reader) {
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			for {
				h.mu.Lock()
				for h.cur == nil {
					h.cond.Wait()
				}
				hc := h.cur
				h.mu.Unlock()
				if hc.record(recStdout, buf[:n]) == nil {
					break
				}
				h.drop(hc)
			}
		}
		if err != nil {
			return
		}
	}
}

// errors sends the agent's stderr to the attach that holds the stream, or
// drops it when none does (the pod's log stays empty).
func (h *hubState) errors(r io.Reader) {
	buf := make([]byte, 16<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			h.mu.Lock()
			hc := h.cur
			h.mu.Unlock()
			if hc != nil {
				_ = hc.record(recStderr, buf[:n])
			}
		}
		if err != nil {
			return
		}
	}
}

// attach relays stdin to the hub and the agent's output back, and returns
// the exit code: 0 when the hub closed the stream, ExitSuperseded when a
// newer attach took it.
func attach() int {
	c, err := net.Dial("unix", hubSocket())
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandbox-agent attach:", err)
		return 1
	}
	go func() {
		_, _ = io.Copy(c, os.Stdin)
		// The server closed its end, or is gone: the hub lets go of
		// this attach and the agent lives on its lease.
		c.(*net.UnixConn).CloseWrite()
	}()
	br := bufio.NewReaderSize(c, 64<<10)
	var h [5]byte
	for {
		if _, err := io.ReadFull(br, h[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return 0
			}
			return 1
		}
		n := int64(binary.BigEndian.Uint32(h[1:]))
		var w io.Writer
		switch h[0] {
		case recStdout:
			w = os.Stdout
		case recStderr:
			w = os.Stderr
		case recSuperseded:
			return ExitSuperseded
		default:
			return 1
		}
		if _, err := io.CopyN(w, br, n); err != nil {
			return 1
		}
	}
}
