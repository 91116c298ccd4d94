package netproxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// Benchmarks of the proxy's performance goal (docs/bench): a CONNECT adds at
// most 2 ms to a direct connection's setup, and a tunnel carries at least
// 0.8× a direct connection's throughput.
// Each iteration measures the direct connection and the proxied one back to
// back, so both see the same machine noise; the custom metrics are medians
// (setup) or totals (throughput) over all iterations.
//
//	go test -run xxx -bench . -benchtime 200x ./netproxy

// benchProxy serves a Proxy on loopback that allows name:port -> 127.0.0.1,
// with the real dialer and no rate limits.
func benchProxy(b *testing.B, name string, port int) string {
	b.Helper()
	r := newFakeResolver()
	r.setAddrs(name, "127.0.0.1")
	allow, err := ParseAllowlist([]string{name + ":" + itoa(port)})
	if err != nil {
		b.Fatal(err)
	}
	p, err := New(Config{Allow: allow, AllowPrivate: true, Resolver: r, Rate: rate.Inf, MaxTunnels: 1 << 20, MaxConns: 1 << 20})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Serve(ctx, ln, "bench"); close(done) }()
	b.Cleanup(func() { cancel(); <-done })
	return ln.Addr().String()
}

// proxyDial opens a tunnel through the proxy at addr.
func proxyDial(addr, target string) (net.Conn, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	if _, err := io.WriteString(c, "CONNECT "+target+" HTTP/1.1\r\nHost: "+target+"\r\n\r\n"); err != nil {
		c.Close()
		return nil, err
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		c.Close()
		return nil, err
	}
	if resp.StatusCode != 200 {
		c.Close()
		return nil, &net.OpError{Op: "connect", Err: io.ErrUnexpectedEOF}
	}
	return &bufConn{Conn: c, r: br}, nil
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// BenchmarkConnectSetup: connect, one byte each way, close; directly and
// through the proxy (CONNECT, lookup, check, dial, 200).
func BenchmarkConnectSetup(b *testing.B) {
	srv := startServer(b, "tcp4", "127.0.0.1:0", echo)
	target := "echo.bench.example:" + itoa(srv.port())
	proxyAddr := benchProxy(b, "echo.bench.example", srv.port())
	ping := func(c net.Conn) {
		buf := []byte{'x'}
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
	var direct, proxied []time.Duration
	for b.Loop() {
		t0 := time.Now()
		c, err := net.Dial("tcp", srv.addr())
		if err != nil {
			b.Fatal(err)
		}
		ping(c)
		t1 := time.Now()
		pc, err := proxyDial(proxyAddr, target)
		if err != nil {
			b.Fatal(err)
		}
		ping(pc)
		direct = append(direct, t1.Sub(t0))
		proxied = append(proxied, time.Since(t1))
	}
	added := make([]time.Duration, len(direct))
	for i := range direct {
		added[i] = proxied[i] - direct[i]
	}
	b.ReportMetric(float64(median(direct).Microseconds()), "direct-µs")
	b.ReportMetric(float64(median(proxied).Microseconds()), "proxy-µs")
	b.ReportMetric(float64(median(added).Microseconds()), "added-µs")
	b.ReportMetric(float64(percentile(added, 0.99).Microseconds()), "added-p99-µs")
}

// BenchmarkTunnelThroughput: 1 MiB per iteration to a sink that acknowledges
// each MiB, over one long-lived direct connection and one tunnel.
//
// "loopback" is the worst case: every hop is a loopback copy limited only
// by CPU, and the tunnel doubles the hops (client -> proxy -> sink instead
// of client -> sink), so on a small machine it shows the proxy's CPU cost
// rather than a network's throughput. "link-100MBps" paces the sink to
// 100 MB/s (800 Mbit/s), a fast Internet link, which is what a sandbox's
// traffic actually crosses after the proxy.
func BenchmarkTunnelThroughput(b *testing.B) {
	b.Run("loopback", func(b *testing.B) { benchThroughput(b, 0) })
	b.Run("link-100MBps", func(b *testing.B) { benchThroughput(b, 100e6) })
}

func benchThroughput(b *testing.B, bytesPerSec float64) {
	const chunk = 1 << 20
	srv := startServer(b, "tcp4", "127.0.0.1:0", func(c net.Conn) {
		buf := make([]byte, 64<<10)
		for {
			var start time.Time
			for got := 0; got < chunk; {
				n, err := c.Read(buf[:min(len(buf), chunk-got)])
				if err != nil {
					return
				}
				if got == 0 {
					start = time.Now()
				}
				got += n
				if bytesPerSec > 0 { // deliver no faster than the link
					time.Sleep(time.Until(start.Add(time.Duration(float64(got) / bytesPerSec * float64(time.Second)))))
				}
			}
			if _, err := c.Write([]byte{1}); err != nil {
				return
			}
		}
	})
	proxyAddr := benchProxy(b, "sink.bench.example", srv.port())
	dc, err := net.Dial("tcp", srv.addr())
	if err != nil {
		b.Fatal(err)
	}
	defer dc.Close()
	pc, err := proxyDial(proxyAddr, "sink.bench.example:"+itoa(srv.port()))
	if err != nil {
		b.Fatal(err)
	}
	defer pc.Close()

	payload := make([]byte, chunk)
	ack := make([]byte, 1)
	send := func(c net.Conn) time.Duration {
		t0 := time.Now()
		if _, err := c.Write(payload); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, ack); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	send(dc) // warm up both paths
	send(pc)
	var direct, proxied time.Duration
	b.SetBytes(2 * chunk)
	for b.Loop() {
		direct += send(dc)
		proxied += send(pc)
	}
	mbps := func(d time.Duration) float64 { return float64(b.N) * chunk / 1e6 / d.Seconds() }
	b.ReportMetric(mbps(direct), "direct-MB/s")
	b.ReportMetric(mbps(proxied), "proxy-MB/s")
	b.ReportMetric(mbps(proxied)/mbps(direct), "ratio")
}
