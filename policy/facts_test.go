package policy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// refusingRouter behaves like netroute on the destinations it is asked
// about: it refuses an unspecified one and answers anything else with src.
type refusingRouter struct {
	src   net.IP
	asked []net.IP
}

func (r *refusingRouter) Route(dst net.IP) (*net.Interface, net.IP, net.IP, error) {
	r.asked = append(r.asked, dst)
	if dst.IsUnspecified() {
		return nil, nil, nil, errors.New("destination IP must be specified")
	}
	return nil, nil, r.src, nil
}

func TestDefaultRouteProbesAPublicAddress(t *testing.T) {
	for _, tc := range []struct {
		name  string
		probe net.IP
		v4    bool
		src   string
	}{
		{"ipv4", probeIPv4, true, "192.0.2.2"},
		{"ipv6", probeIPv6, false, "fd00::2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.probe.IsUnspecified() || !tc.probe.IsGlobalUnicast() || tc.probe.IsPrivate() {
				t.Fatalf("probe %v is not a public unicast address: only the default route covers one", tc.probe)
			}
			if (tc.probe.To4() != nil) != tc.v4 {
				t.Fatalf("probe %v is of the wrong family", tc.probe)
			}
			r := &refusingRouter{src: net.ParseIP(tc.src)}
			if got := defaultRouteSource(r, tc.probe); got != tc.src {
				t.Errorf("defaultRouteSource = %q, want %q (asked %v)", got, tc.src, r.asked)
			}
		})
	}
	// No route for the family, or an unspecified source: no fact.
	if got := defaultRouteSource(&refusingRouter{}, net.IPv4zero); got != "" {
		t.Errorf("refused lookup gave %q", got)
	}
	if got := defaultRouteSource(&refusingRouter{src: net.IPv4zero}, probeIPv4); got != "" {
		t.Errorf("unspecified source gave %q", got)
	}
}

// TestCollectDefaultIPv4 checks the real lookup on this host, told apart
// from netroute by reading the kernel's table directly.
func TestCollectDefaultIPv4(t *testing.T) {
	if !hasDefaultIPv4Route(t) {
		t.Skip("this host has no IPv4 default route: default_ipv4 is rightly unset")
	}
	f, _ := Collect(context.Background())
	ip, _ := f["default_ipv4"].(string)
	if net.ParseIP(ip).To4() == nil {
		t.Fatalf("host has an IPv4 default route but default_ipv4 = %#v", f["default_ipv4"])
	}
	found := false
	for _, a := range f["ipv4"].([]any) {
		found = found || a == ip
	}
	if !found {
		t.Errorf("default_ipv4 %s is not among the host's ipv4 %v", ip, f["ipv4"])
	}
}

func hasDefaultIPv4Route(t *testing.T) bool {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc/net/route to know whether the host has a default route")
	}
	file, err := os.Open("/proc/net/route")
	if err != nil {
		t.Skipf("cannot read the routing table: %v", err)
	}
	defer file.Close()
	sc := bufio.NewScanner(file)
	for sc.Scan() {
		// Iface Destination Gateway Flags RefCnt Use Metric Mask ...
		f := strings.Fields(sc.Text())
		if len(f) >= 8 && f[1] == "00000000" && f[7] == "00000000" {
			return true
		}
	}
	return false
}

// TestCollectStartsNoProcess: collecting facts runs no other program
// (gopsutil's host.Info ran the lsb_release script where
// /etc/lsb-release is missing, as on Debian: 12 ms of a 13 ms Collect,
// paid by every agent at start and every FactsInterval). A child that ran
// and was waited for adds its page faults to RUSAGE_CHILDREN, and no
// process starts without faulting.
func TestCollectStartsNoProcess(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("RUSAGE_CHILDREN's page faults are read on Linux")
	}
	if _, err := os.Stat("/etc/os-release"); err != nil {
		t.Skip("no /etc/os-release: Collect asks gopsutil for the platform, which may run lsb_release")
	}
	faults := func() int64 {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru); err != nil {
			t.Fatal(err)
		}
		return ru.Minflt + ru.Majflt
	}
	before := faults()
	if _, err := Collect(context.Background()); err != nil {
		t.Logf("some facts were not read: %v", err)
	}
	if after := faults(); after != before {
		t.Errorf("Collect ran a process: its children's page faults went from %d to %d", before, after)
	}
}

// Facts are bounded however they come (a record's JSON, a facts file):
// at most MaxFactItems in a list, a map or the facts themselves,
// MaxFactValues values in all, MaxFactDepth deep. Other nodes evaluate a
// node's declared facts, and CEL's cost tracking grows with the square of
// a list a comprehension walks: 16,000 elements cost 787 ms an evaluation.
func TestFactsBounded(t *testing.T) {
	list := func(n int) string { return "[" + strings.TrimSuffix(strings.Repeat("0,", n), ",") + "]" }
	nested := func(depth int) string { return strings.Repeat("[", depth-1) + "1" + strings.Repeat("]", depth-1) }
	keys := func(n int) string {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, `"k%d":0,`, i)
		}
		return "{" + strings.TrimSuffix(b.String(), ",") + "}"
	}
	for _, c := range []struct {
		name, facts string
		ok          bool
	}{
		{"a list at the bound", `{"l":` + list(MaxFactItems) + `}`, true},
		{"a list past it", `{"l":` + list(MaxFactItems+1) + `}`, false},
		{"a map past it", `{"m":` + keys(MaxFactItems+1) + `}`, false},
		{"facts past it", keys(MaxFactItems + 1), false},
		{"values past the total", `{"a":` + list(MaxFactItems) + `,"b":` + list(MaxFactItems) + `,"c":` + list(MaxFactItems) + `,"d":` + list(MaxFactItems) + `}`, false},
		{"nested to the bound", `{"n":` + nested(MaxFactDepth) + `}`, true},
		{"nested past it", `{"n":` + nested(MaxFactDepth+1) + `}`, false},
	} {
		_, err := DecodeJSON([]byte(c.facts))
		if (err == nil) != c.ok {
			t.Errorf("%s: record %v, want ok %v", c.name, err, c.ok)
		}
		path := filepath.Join(t.TempDir(), "facts.json")
		if err := os.WriteFile(path, []byte(c.facts), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadFactsFile(path); (err == nil) != c.ok {
			t.Errorf("%s: facts file %v, want ok %v", c.name, err, c.ok)
		}
	}
}

// A host's addresses are facts of at most MaxAddressFacts each family,
// sorted, without repeats: more (every ClusterIP of a Kubernetes node in
// IPVS mode) went past MaxFactItems, and the agent did not start.
func TestAddressFactsCapped(t *testing.T) {
	var addrs []string
	for i := range 2000 {
		addrs = append(addrs, fmt.Sprintf("10.%d.%d.1", i/250, i%250), "10.0.0.1")
	}
	got := capAddresses(addrs)
	if len(got) != MaxAddressFacts || !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
		t.Fatalf("%d addresses, sorted %v", len(got), slices.IsSorted(got))
	}
	if _, err := DecodeJSON([]byte(`{"ipv4":["` + strings.Join(got, `","`) + `"]}`)); err != nil {
		t.Fatal(err)
	}
}
