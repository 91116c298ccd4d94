package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// previewClient is the script the direct baseline runs inside the
// sandbox: the same requests to the same server, over a direct loopback
// connection (python's http.server closes each connection, so each
// request opens one, through the preview and here alike).
const previewClient = `
import http.client, json, sys, time
n, size = int(sys.argv[1]), int(sys.argv[2])
def get(path):
    c = http.client.HTTPConnection("127.0.0.1", 8000)
    c.request("GET", path)
    r = c.getresponse()
    got = 0
    while True:
        b = r.read(256 << 10)
        if not b: break
        got += len(b)
    c.close()
    return got
lat = []
for _ in range(n):
    t = time.perf_counter(); get("/small.txt"); lat.append((time.perf_counter() - t) * 1000)
mbps = []
for _ in range(3):
    t = time.perf_counter(); got = get("/big.bin"); mbps.append(got / (time.perf_counter() - t) / 1e6)
    assert got == size, got
print(json.dumps({"lat_ms": lat, "mbps": mbps}))
`

// preview: a request through a preview URL (the server's HTTP listener,
// the agent's port stream, python's http.server in a sandbox with no
// network) against the same requests made directly to the same server
// from inside the sandbox, in the same run: request latency (a 1 KiB
// file, a new connection each) and download throughput (64 MiB).
func (b *bench) preview(ctx context.Context) error {
	const size = 64 << 20
	srv, err := b.startServer("--network", "none")
	if err != nil {
		return err
	}
	defer srv.stop()
	cs, err := srv.connect(ctx)
	if err != nil {
		return err
	}
	defer cs.Close()
	if _, err := call(ctx, cs, "sandbox_write_file", map[string]any{"path": "client.py", "content": previewClient}); err != nil {
		return err
	}
	if _, err := call(ctx, cs, "sandbox_exec", map[string]any{"command": fmt.Sprintf(
		"head -c 1024 /dev/urandom > small.txt && head -c %d /dev/urandom > big.bin", size)}); err != nil {
		return err
	}
	if _, err := call(ctx, cs, "sandbox_exec", map[string]any{"command": "python3 -m http.server 8000 --bind 127.0.0.1", "background": true}); err != nil {
		return err
	}
	out, err := call(ctx, cs, "sandbox_expose", map[string]any{"port": 8000, "wait_ms": 20000})
	if err != nil {
		return err
	}
	url, _ := out["url"].(string)
	if out["listening"] != true || url == "" {
		return fmt.Errorf("sandbox_expose: %v", out)
	}
	n := b.n(100)
	hc := &http.Client{Timeout: time.Minute}
	get := func(path string) (int64, error) {
		resp, err := hc.Get(url + path)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			return 0, fmt.Errorf("GET %s: %s", path, resp.Status)
		}
		return io.Copy(io.Discard, resp.Body)
	}
	var lat, mbps []float64
	for range n {
		t := time.Now()
		if _, err := get("small.txt"); err != nil {
			return err
		}
		lat = append(lat, ms(time.Since(t)))
	}
	for range 3 {
		t := time.Now()
		got, err := get("big.bin")
		if err != nil {
			return err
		}
		if got != size {
			return fmt.Errorf("big.bin: %d bytes", got)
		}
		mbps = append(mbps, float64(got)/time.Since(t).Seconds()/1e6)
	}
	res, err := call(ctx, cs, "sandbox_exec", map[string]any{"argv": []string{"python3", "client.py", fmt.Sprint(n), fmt.Sprint(size)}, "timeout_ms": 300000})
	if err != nil {
		return err
	}
	var direct struct {
		Lat  []float64 `json:"lat_ms"`
		MBps []float64 `json:"mbps"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(fmt.Sprint(res["stdout"]))), &direct); err != nil {
		return fmt.Errorf("the direct client: %v: %v", err, res)
	}
	b.series("preview: GET 1 KiB", lat)
	b.series("direct in the sandbox: GET 1 KiB", direct.Lat)
	r := median(lat) / median(direct.Lat)
	b.add(Row{
		Measure:  "preview: request latency (GET of 1 KiB from python's http.server, a new connection each)",
		Value:    fmt.Sprintf("p50 %s, p99 %s", fmtMs(median(lat)), fmtMs(percentile(lat, 99))),
		Baseline: fmt.Sprintf("direct from inside the sandbox: p50 %s, p99 %s", fmtMs(median(direct.Lat)), fmtMs(percentile(direct.Lat, 99))),
		Ratio:    r, Goal: "reported", Met: true,
		Note: "through the preview a request crosses the server's listener, the agent's port stream over the attach stream, and a connection the agent opens inside the sandbox; the baseline connects to the server from inside",
	})
	r = median(mbps) / median(direct.MBps)
	b.add(Row{
		Measure:  "preview: download throughput (64 MiB)",
		Value:    fmt.Sprintf("%.0f MB/s", median(mbps)),
		Baseline: fmt.Sprintf("direct from inside the sandbox: %.0f MB/s", median(direct.MBps)),
		Ratio:    r, Goal: "reported", Met: true,
	})
	return nil
}
