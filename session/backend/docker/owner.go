package docker

import (
	"bytes"
	"os"
	"strconv"
	"strings"
)

// Labels that say which process owns an engine object, so a sweep can tell
// an object whose server is gone from one a live server is still setting up.
const (
	LabelHost  = "io.sandbox-mcp.host"  // hostname of the server
	LabelPID   = "io.sandbox-mcp.pid"   // its process id
	LabelStart = "io.sandbox-mcp.start" // its start time (clock ticks since boot), against pid reuse
)

// ownerLabels describe this process.
func ownerLabels() map[string]string {
	host, _ := os.Hostname()
	pid := os.Getpid()
	return map[string]string{LabelHost: host, LabelPID: strconv.Itoa(pid), LabelStart: processStart(pid)}
}

// ownerGone reports whether the labels name a server process on this host
// that no longer runs. It is false when that cannot be known (another host,
// no labels): then only age tells.
func ownerGone(labels map[string]string) bool {
	host, _ := os.Hostname()
	if labels[LabelHost] == "" || labels[LabelHost] != host {
		return false
	}
	pid, err := strconv.Atoi(labels[LabelPID])
	if err != nil || pid <= 0 {
		return false
	}
	start := processStart(pid)
	return start == "" || start != labels[LabelStart]
}

// processStart returns a process's start time from /proc, or "" if it does
// not exist.
func processStart(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(string(b[i+1:]))
	// Fields after the command: state(3) ... starttime is field 22 overall,
	// the 20th after the command.
	if len(f) < 20 {
		return ""
	}
	return f[19]
}
