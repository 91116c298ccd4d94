package session

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// The container cases of security-cases §4, run in a real sandbox.

func TestSecurityForkBomb(t *testing.T) {
	m := testManager(t, func(o *Options) { o.Policy.Pids = 64 })
	sb := newSandbox(t, m)
	other, _ := m.Sandbox("other", "")
	run(t, other, "true")

	done := make(chan ExecResult, 1)
	go func() {
		res, _ := sb.Exec(context.Background(), ExecRequest{Argv: []string{"sh", "-c", "bomb() { bomb | bomb & }; bomb; sleep 60"}, Cwd: ".", Timeout: 3 * time.Second, MaxOutput: 4096})
		done <- res
	}()
	// Another sandbox answers while the bomb runs.
	time.Sleep(time.Second)
	start := time.Now()
	run(t, other, "true")
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("another sandbox took %s to answer during a fork bomb", d)
	}
	res := <-done
	if !res.TimedOut {
		t.Fatalf("fork bomb: %+v", res)
	}
	// The bomb is gone: the only shell left is the one asking.
	deadline := time.Now().Add(10 * time.Second)
	for {
		out := string(sh(t, sb, "ps -o comm | grep -c '^sh$'").Stdout)
		if strings.TrimSpace(out) == "1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes left after the fork bomb:\n%s", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestSecurityMemoryBomb(t *testing.T) {
	m := testManager(t, nil) // 256 MiB
	sb := newSandbox(t, m)
	// sort keeps a whole line in memory: 1 GiB without a newline.
	res := sh(t, sb, "head -c 1073741824 /dev/zero | sort >/dev/null; echo status=$?")
	if !strings.Contains(string(res.Stdout), "status=137") {
		t.Fatalf("want the OOM killer's 137: %q %q", res.Stdout, res.Stderr)
	}
	run(t, sb, "true") // the sandbox lives on
}

func TestSecurityDiskFill(t *testing.T) {
	m := testManager(t, func(o *Options) { o.Policy.MaxWorkspaceBytes = 16 << 20 })
	sb := newSandbox(t, m)
	res := sh(t, sb, "dd if=/dev/zero of=/workspace/fill bs=1M count=64 2>&1; echo status=$?")
	if !strings.Contains(string(res.Stdout), "No space left on device") {
		t.Fatalf("want ENOSPC at the tmpfs size: %q", res.Stdout)
	}
	if r := run(t, sb, "echo", "still-alive"); string(r.Stdout) != "still-alive\n" {
		t.Fatal(r)
	}
	_, err := sb.WriteFile(context.Background(), "more", make([]byte, 1<<20), false, 0o644)
	wantCode(t, err, policy.TooLarge)
}

func TestSecurityNoWayOut(t *testing.T) {
	m := testManager(t, nil)
	sb := newSandbox(t, m)
	for _, script := range []string{
		// §4 #4: outside the workspace
		"touch /x", "echo x > /etc/passwd", "touch /bin/x", "mkdir /opt",
		// #11: privileged operations
		"mount -t tmpfs x /tmp", "unshare -n true", "unshare -U true", "nsenter -t 1 -m true", "chroot / true",
		"mknod /workspace/d c 1 3", "ip link add d0 type dummy", "chown 0 /workspace",
		"date -s 2000-01-01 >/dev/null 2>&1; test $(date +%Y) = 2000",
		"sysctl -w kernel.hostname=x", "hostname evil", "ping -c 1 -W 1 127.0.0.1",
		// #13: /proc and /sys
		"head -c 1 /proc/kcore", "echo x > /proc/sys/kernel/core_pattern", "echo b > /proc/sysrq-trigger",
		"echo 1 > /sys/fs/cgroup/pids/pids.max || echo 1 > /sys/fs/cgroup/pids.max",
		// #10: no Docker socket
		"test -e /var/run/docker.sock || test -e /run/docker.sock",
	} {
		res := sh(t, sb, script)
		if res.ExitCode == 0 {
			t.Errorf("%q succeeded:\n%s%s", script, res.Stdout, res.Stderr)
		}
	}
	// #12: a setuid copy grants nothing.
	res := sh(t, sb, "mkdir -p /workspace/s && cp /bin/busybox /workspace/s/busybox && chmod u+s /workspace/s/busybox && /workspace/s/busybox id -u")
	if strings.TrimSpace(string(res.Stdout)) != "1000" {
		t.Errorf("setuid binary: %q %q", res.Stdout, res.Stderr)
	}
	// #15 and #18.
	if got := strings.TrimSpace(string(sh(t, sb, "id -u; ulimit -n").Stdout)); got != "1000\n4096" {
		t.Errorf("id and ulimit: %q", got)
	}
	// #19: nothing of the docker socket or the server in the environment.
	if env := string(run(t, sb, "env").Stdout); strings.Contains(strings.ToLower(env), "docker") || strings.Contains(env, "SANDBOX_MCP_TOKEN") {
		t.Errorf("environment: %s", env)
	}
}

func TestSecurityCPULimit(t *testing.T) {
	m := testManager(t, func(o *Options) { o.Policy.CPUs = 0.5 })
	sb := newSandbox(t, m)
	res, err := sb.Exec(context.Background(), ExecRequest{Argv: []string{"sh", "-c",
		"(while :; do :; done) & (while :; do :; done) & sleep 2; cat /sys/fs/cgroup/cpu/cpu.stat /sys/fs/cgroup/cpu.stat 2>/dev/null; kill %1 %2"},
		Cwd: ".", Timeout: 20 * time.Second, MaxOutput: 4096})
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(res.Stdout), "\n") {
		if n, ok := strings.CutPrefix(line, "nr_throttled "); ok {
			if v, _ := strconv.Atoi(n); v > 0 {
				return
			}
		}
	}
	t.Fatalf("no CPU throttling seen: %q", res.Stdout)
}

// TestSecuritySymlinkSwap races file calls against a loop inside the sandbox
// that keeps swapping a directory with a symlink to /tmp (security-cases §3
// #10): no read returns the outside file, no write lands outside.
func TestSecuritySymlinkSwap(t *testing.T) {
	m := testManager(t, nil)
	sb := newSandbox(t, m)
	ctx := context.Background()
	sh(t, sb, "echo SECRET > /tmp/secret; mkdir d; echo inside > d/secret")
	swapper := make(chan struct{})
	go func() {
		defer close(swapper)
		_, _ = sb.Exec(ctx, ExecRequest{Argv: []string{"sh", "-c",
			"while :; do mv d d.real; ln -s /tmp d; rm d; mv d.real d; done"}, Cwd: ".", Timeout: 6 * time.Second})
	}()
	time.Sleep(200 * time.Millisecond)
	var wg sync.WaitGroup
	var mu sync.Mutex
	reads, writes, inside := 0, 0, 0
	deadline := time.Now().Add(4 * time.Second)
	for w := range 2 {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline); i++ {
				res, err := sb.ReadFile(ctx, "d/secret", 0, 0, 1024)
				mu.Lock()
				reads++
				if err == nil {
					if strings.Contains(string(res.Data), "SECRET") {
						mu.Unlock()
						t.Errorf("read /tmp/secret through the swapped symlink")
						return
					}
					inside++
				}
				mu.Unlock()
				_, _ = sb.WriteFile(ctx, "d/x"+strconv.Itoa(w), []byte("x"), false, 0o644)
				mu.Lock()
				writes++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	<-swapper
	if res := sh(t, sb, "ls /tmp"); strings.Contains(string(res.Stdout), "x0") || strings.Contains(string(res.Stdout), "x1") {
		t.Fatalf("a write landed outside the workspace: %q", res.Stdout)
	}
	t.Logf("%d reads (%d inside), %d writes while swapping", reads, inside, writes)
	if reads < 100 {
		t.Fatalf("only %d reads: the race was not exercised", reads)
	}
}

// execKillingAgent runs a command in sb and, while it runs, kills the agent
// from outside the sandbox: an engine exec as root, as an operator or a
// crash would (the sandboxed code cannot, see
// TestSandboxCannotReachTheStream). It returns the command's error.
func execKillingAgent(t *testing.T, m *Manager, sb *Sandbox) error {
	t.Helper()
	ctx := context.Background()
	run(t, sb, "true") // a container, with its agent, is up
	sb.mu.Lock()
	inst := sb.cur
	sb.mu.Unlock()
	errc := make(chan error, 1)
	go func() {
		_, err := sb.Exec(ctx, ExecRequest{Argv: []string{"sleep", "5"}, Cwd: ".", Timeout: 20 * time.Second})
		errc <- err
	}()
	time.Sleep(500 * time.Millisecond)
	ex, err := m.cli.ExecCreate(ctx, inst.containerID, client.ExecCreateOptions{
		User: "0:0", Cmd: []string{"kill", "-9", strconv.Itoa(inst.conn.hello.PID)},
	})
	if err != nil {
		t.Fatalf("kill the agent: %v", err)
	}
	if _, err := m.cli.ExecStart(ctx, ex.ID, client.ExecStartOptions{Detach: true}); err != nil {
		t.Fatalf("kill the agent: %v", err)
	}
	return <-errc
}
