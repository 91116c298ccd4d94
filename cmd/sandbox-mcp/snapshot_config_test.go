package main

import (
	"testing"

	"github.com/sandbox-mcp/sandbox-mcp/snapshot"
)

func TestSnapshotRetentionConfig(t *testing.T) {
	env := envFrom(map[string]string{"HOME": "/home/u", "SANDBOX_MCP_TOKEN": "0123456789abcdef0123"})
	for _, c := range []struct {
		name string
		args []string
		want snapshot.Retention
	}{
		{"stdio: one caller may use it all", nil,
			snapshot.Retention{MaxCount: 100, MaxBytes: 10 << 30, MaxAge: DefaultSnapshotMaxAge, PerCallerCount: 100, PerCallerBytes: 10 << 30}},
		{"http: a quarter each by default", []string{"--http", "127.0.0.1:0"},
			snapshot.Retention{MaxCount: 100, MaxBytes: 10 << 30, MaxAge: DefaultSnapshotMaxAge, PerCallerCount: 25, PerCallerBytes: 10 << 28}},
		{"http: set per caller", []string{"--http", "127.0.0.1:0", "--snapshot-max-count-per-caller", "7", "--snapshot-max-bytes-per-caller", "1GiB"},
			snapshot.Retention{MaxCount: 100, MaxBytes: 10 << 30, MaxAge: DefaultSnapshotMaxAge, PerCallerCount: 7, PerCallerBytes: 1 << 30}},
		{"http: no total limit, none per caller", []string{"--http", "127.0.0.1:0", "--snapshot-max-count", "0", "--snapshot-max-bytes", "0"},
			snapshot.Retention{MaxAge: DefaultSnapshotMaxAge}},
		{"http: a small total still gives each caller one", []string{"--http", "127.0.0.1:0", "--snapshot-max-count", "2"},
			snapshot.Retention{MaxCount: 2, MaxBytes: 10 << 30, MaxAge: DefaultSnapshotMaxAge, PerCallerCount: 1, PerCallerBytes: 10 << 28}},
	} {
		cfg, err := ParseConfig(c.args, env)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := cfg.SnapshotRetention(); got != c.want {
			t.Errorf("%s:\n got %+v\nwant %+v", c.name, got, c.want)
		}
	}
	if _, err := ParseConfig([]string{"--snapshot-max-count-per-caller", "-1"}, env); err == nil {
		t.Error("a negative per-caller cap was accepted")
	}
}
