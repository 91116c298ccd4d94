package netproxy

import (
	"net/netip"
	"testing"
)

func TestClassify(t *testing.T) {
	cases := map[string]string{
		// Public: "".
		"8.8.8.8":              "",
		"1.1.1.1":              "",
		"93.184.216.34":        "",
		"100.63.255.255":       "", // just below CGNAT
		"100.128.0.1":          "", // just above
		"168.63.129.15":        "", // next to Azure WireServer
		"169.253.255.255":      "",
		"172.15.255.255":       "",
		"172.32.0.0":           "",
		"192.0.1.255":          "",
		"198.17.255.255":       "",
		"198.20.0.0":           "",
		"223.255.255.255":      "",
		"::ffff:8.8.8.8":       "", // mapped: the IPv4 address it carries
		"2001:4860:4860::8888": "",
		"2606:4700::1111":      "",
		"2001:200::1":          "", // just above 2001::/23

		"0.255.255.255":    ClassThisNetwork,
		"127.0.0.1":        ClassLoopback,
		"::ffff:127.0.0.1": ClassLoopback,
		"::ffff:10.1.1.1":  ClassPrivate,
		"::ffff:0.0.0.0":   ClassUnspecified,
		"169.254.0.1":      ClassLinkLocal,
		"169.254.169.253":  ClassLinkLocal,
		"169.254.170.23":   ClassMetadata,
		"fd00:ec2::23":     ClassMetadata,
		"fd00:ec2::253":    ClassPrivate,
		"fe80::1%lo":       ClassLinkLocal,
		"ff02::1%eth0":     ClassMulticast,
		"192.0.0.9":        ClassIETFProtocol,
		"192.88.99.1":      Class6to4,
		"239.255.255.250":  ClassMulticast,
		"2001:2::1":        ClassBenchmarking,
		"2001:10::1":       ClassIETFProtocol,
		"2001:1ff::1":      ClassIETFProtocol,
		"3fff::1":          ClassDocumentation,
		"5f00::1":          ClassReserved,
		"4000::1":          ClassReserved, // outside 2000::/3
		"::2":              ClassIPv4Compatible,
		"::ffff:0:0:1":     ClassIPv4Translated,
		"64:ff9b::8.8.8.8": ClassNAT64, // public embedding, still refused
		"2002:808:808::1":  Class6to4,
		"2001:0:808:808::": ClassTeredo,
		"100::ffff":        ClassDiscard,
		"100:0:0:1::":      ClassReserved,
		"fe00::1":          ClassReserved,
	}
	for _, s := range specialAddrs {
		cases[s.addr] = s.class
	}
	for in, want := range cases {
		if got := Classify(netip.MustParseAddr(in)); got != want {
			t.Errorf("Classify(%s) = %q, want %q", in, got, want)
		}
	}
	if got := Classify(netip.Addr{}); got != ClassInvalid {
		t.Errorf("Classify(zero) = %q", got)
	}
}

// The standard library's predicates call all of these global and not
// private. Classify must not.
func TestClassifyWhereStdlibSaysGlobal(t *testing.T) {
	for _, s := range []string{"100.64.0.1", "0.1.2.3", "192.0.0.192", "198.18.0.1", "240.0.0.1", "192.0.2.1",
		"fec0::1", "100::1", "2001:db8::1", "::7f00:1", "::ffff:0:7f00:1", "64:ff9b::7f00:1",
		"64:ff9b:1::7f00:1", "2002:7f00:1::1", "2001:0:4136:e378:8000:63bf:3fff:fdd2"} {
		a := netip.MustParseAddr(s)
		if !a.IsGlobalUnicast() || a.IsPrivate() {
			t.Logf("%s: stdlib no longer calls it global; fine", s)
		}
		if Classify(a) == "" {
			t.Errorf("Classify(%s) = \"\", want a special class", s)
		}
	}
}

func TestAllowPrivateUnlocksOnlySome(t *testing.T) {
	p, err := New(Config{AllowPrivate: true})
	if err != nil {
		t.Fatal(err)
	}
	strict, _ := New(Config{})
	unlocked := []string{"127.0.0.1", "::1", "10.0.0.1", "172.16.0.1", "192.168.1.1", "fd12::1", "100.64.0.1", "::ffff:192.168.0.1"}
	for _, s := range unlocked {
		a := netip.MustParseAddr(s)
		if r := p.checkAddr(a, 443); r != "" {
			t.Errorf("AllowPrivate: %s refused: %s", s, r)
		}
		if r := strict.checkAddr(a, 443); r == "" {
			t.Errorf("without AllowPrivate: %s allowed", s)
		}
	}
	for _, s := range specialAddrs {
		if unlockedByAllowPrivate(s.class) {
			continue
		}
		if r := p.checkAddr(netip.MustParseAddr(s.addr), 443); r == "" {
			t.Errorf("AllowPrivate: %s (%s) allowed, want always refused", s.addr, s.class)
		}
	}
	for _, s := range []string{"169.254.169.254", "100.100.100.200", "fd00:ec2::254", "0.0.0.0", "::", "224.0.0.1", "169.254.1.1", "fe80::1"} {
		if r := p.checkAddr(netip.MustParseAddr(s), 443); r == "" {
			t.Errorf("AllowPrivate: %s allowed", s)
		}
	}
}

func BenchmarkClassify(b *testing.B) {
	addrs := []netip.Addr{netip.MustParseAddr("93.184.216.34"), netip.MustParseAddr("2606:4700::1111"), netip.MustParseAddr("10.0.0.1")}
	for i := 0; b.Loop(); i++ {
		Classify(addrs[i%len(addrs)])
	}
}
