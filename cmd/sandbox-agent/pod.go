package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
)

// Subcommands for a Kubernetes pod, where the agent comes from an image of
// its own (FROM scratch, the static agent alone) and the sandbox runs the
// user's image unchanged.
const (
	// InstallCommand copies this executable to the path given: the pod's
	// init container runs it from the agent image to put the agent on a
	// volume the sandbox container shares.
	InstallCommand = "install"
	// HoldCommand is the sandbox container's main process (its pid 1): it
	// reaps the orphans that commands leave and waits for SIGTERM. The
	// agent itself runs beside it over an exec stream.
	HoldCommand = "hold"
)

// install copies the running executable to dst (mode 0555), through a
// temporary file renamed into place, so a reader never sees half of it.
func install(dst string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this executable: %w", err)
	}
	in, err := os.Open(self)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".agent-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, in); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o555); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}

// hold reaps children until SIGTERM or SIGINT, then returns. As pid 1 of
// the container it adopts every orphan: a process that a command left
// behind is reaped when it ends instead of staying a zombie.
func hold() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			return
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}

// stopInit asks the container's pid 1 (hold) to end, so the sandbox ends
// with the agent's stream.
func stopInit() { _ = syscall.Kill(1, syscall.SIGTERM) }
