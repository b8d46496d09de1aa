package policy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/libp2p/go-netroute"
	"github.com/shirou/gopsutil/v4/cpu"
	"github.com/shirou/gopsutil/v4/host"
	"github.com/shirou/gopsutil/v4/mem"
	psnet "github.com/shirou/gopsutil/v4/net"
	"go.yaml.in/yaml/v3"
)

// Facts describe a host: flat snake_case names, values of JSON types
// (bool, int64, float64, string, lists and maps of them).
type Facts map[string]any

// BuiltinNames are the facts Collect gathers on every host.
var BuiltinNames = []string{
	"hostname", "fqdn", "os", "os_family", "os_dist", "os_dist_version", "os_dist_codename",
	"kernel_version", "architecture", "cpu_count", "cpu_model", "processor_features",
	"memtotal_mb", "default_ipv4", "default_ipv6", "ipv4", "ipv6", "virtual", "boot_time",
}

// Collect gathers the built-in facts with gopsutil and the standard
// library. A fact that cannot be read is left out (and so makes policies
// using it not match); the errors are returned joined, for a warning.
func Collect(ctx context.Context) (Facts, error) {
	f := Facts{}
	var errs []error
	// The host's facts one by one, not host.Info: that also walks /proc
	// for a process count, reads a host ID and, where /etc/lsb-release is
	// missing (Debian), runs the lsb_release script, none of which a fact
	// uses: an agent starting in a fleet spent more CPU there than in any
	// other fact.
	if h, err := os.Hostname(); err != nil {
		errs = append(errs, fmt.Errorf("hostname: %w", err))
	} else {
		f["hostname"] = h
	}
	f["os"] = runtime.GOOS
	if v, err := host.KernelVersionWithContext(ctx); err != nil {
		errs = append(errs, fmt.Errorf("kernel version: %w", err))
	} else {
		f["kernel_version"] = v
	}
	if bt, err := host.BootTimeWithContext(ctx); err != nil {
		errs = append(errs, fmt.Errorf("boot time: %w", err))
	} else {
		f["boot_time"] = int64(bt)
	}
	f["virtual"] = "physical"
	if system, role, err := host.VirtualizationWithContext(ctx); err != nil {
		errs = append(errs, fmt.Errorf("virtualization: %w", err))
	} else if role == "guest" && system != "" {
		f["virtual"] = system
	}
	f["architecture"] = runtime.GOARCH
	if rel, err := readOSRelease("/etc/os-release"); err == nil {
		if id := rel["ID"]; id != "" {
			f["os_dist"] = id
		}
		if v := rel["VERSION_ID"]; v != "" {
			f["os_dist_version"] = v
		}
		if c := rel["VERSION_CODENAME"]; c != "" {
			f["os_dist_codename"] = c
		}
		f["os_family"] = osFamily(rel["ID"], rel["ID_LIKE"])
	} else {
		// No os-release (old distributions, other systems): gopsutil's
		// platform, from the release files it knows.
		if platform, _, version, err := host.PlatformInformationWithContext(ctx); err == nil && platform != "" {
			f["os_dist"], f["os_dist_version"] = platform, version
		}
		if runtime.GOOS != "linux" {
			f["os_family"] = runtime.GOOS
		}
	}
	if n, err := cpu.CountsWithContext(ctx, true); err == nil {
		f["cpu_count"] = int64(n)
	} else {
		errs = append(errs, fmt.Errorf("cpu count: %w", err))
	}
	if infos, err := cpu.InfoWithContext(ctx); err == nil && len(infos) > 0 {
		f["cpu_model"] = infos[0].ModelName
		flags := slices.Clone(infos[0].Flags)
		slices.Sort(flags)
		f["processor_features"] = toAnyList(slices.Compact(flags))
	} else if err != nil {
		errs = append(errs, fmt.Errorf("cpu info: %w", err))
	}
	if vm, err := mem.VirtualMemoryWithContext(ctx); err == nil {
		f["memtotal_mb"] = int64(vm.Total >> 20)
	} else {
		errs = append(errs, fmt.Errorf("memory: %w", err))
	}
	v4, v6 := addresses(ctx)
	f["ipv4"], f["ipv6"] = toAnyList(v4), toAnyList(v6)
	if r, err := netroute.New(); err == nil {
		if ip := defaultRouteSource(r, probeIPv4); ip != "" {
			f["default_ipv4"] = ip
		}
		if ip := defaultRouteSource(r, probeIPv6); ip != "" {
			f["default_ipv6"] = ip
		}
	}
	if h, ok := f["hostname"].(string); ok {
		f["fqdn"] = fqdn(h, "/etc/hosts")
	}
	return f, errors.Join(errs...)
}

func toAnyList(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// readOSRelease parses an os-release file (KEY=value, optionally quoted).
func readOSRelease(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		if !ok || strings.HasPrefix(k, "#") {
			continue
		}
		if uq, err := strconv.Unquote(v); err == nil {
			v = uq
		} else {
			v = strings.Trim(v, `'"`)
		}
		out[k] = v
	}
	return out, nil
}

// osFamily maps os-release IDs to Salt-style families.
func osFamily(id, idLike string) string {
	words := append([]string{id}, strings.Fields(idLike)...)
	for _, w := range words {
		switch w {
		case "debian", "ubuntu":
			return "Debian"
		case "rhel", "fedora", "centos", "rocky", "almalinux":
			return "RedHat"
		case "suse", "opensuse", "sles":
			return "Suse"
		case "arch":
			return "Arch"
		case "alpine":
			return "Alpine"
		case "gentoo":
			return "Gentoo"
		}
	}
	if id == "" {
		return "Linux"
	}
	return strings.ToUpper(id[:1]) + id[1:]
}

// MaxAddressFacts bounds the ipv4 and ipv6 facts: a Kubernetes node with
// kube-proxy in IPVS mode holds every ClusterIP on one interface, and past
// MaxFactItems its facts were refused whole (the agent did not start).
// The first addresses in sorted order are kept, without repeats.
const MaxAddressFacts = 256

// addresses lists the host's global and private unicast addresses, at most
// MaxAddressFacts of each family.
func addresses(ctx context.Context) (v4, v6 []string) {
	ifaces, err := psnet.InterfacesWithContext(ctx)
	if err != nil {
		return nil, nil
	}
	for _, ifc := range ifaces {
		for _, a := range ifc.Addrs {
			ip, _, err := net.ParseCIDR(a.Addr)
			if err != nil || ip.IsLoopback() || ip.IsLinkLocalUnicast() {
				continue
			}
			if ip.To4() != nil {
				v4 = append(v4, ip.String())
			} else {
				v6 = append(v6, ip.String())
			}
		}
	}
	return capAddresses(v4), capAddresses(v6)
}

// capAddresses sorts addrs, drops repeats and keeps MaxAddressFacts.
func capAddresses(addrs []string) []string {
	slices.Sort(addrs)
	addrs = slices.Compact(addrs)
	return addrs[:min(len(addrs), MaxAddressFacts)]
}

// The routing table is asked for the route to a public address, which
// only the default route covers on a host without more specific routes;
// netroute refuses an unspecified destination (0.0.0.0, ::) outright. The
// lookup sends no packet: these addresses are never contacted.
var (
	probeIPv4 = net.IPv4(8, 8, 8, 8)
	probeIPv6 = net.ParseIP("2001:4860:4860::8888")
)

// router is the part of netroute's Router that facts use.
type router interface {
	Route(dst net.IP) (iface *net.Interface, gateway, preferredSrc net.IP, err error)
}

// defaultRouteSource is the source address the kernel picks for traffic
// to probe: a routing-table lookup, no packet is sent. It is empty when no
// route covers probe (no default route for that family).
func defaultRouteSource(r router, probe net.IP) string {
	_, _, src, err := r.Route(probe)
	if err != nil || src == nil || src.IsUnspecified() {
		return ""
	}
	return src.String()
}

// fqdn is the host name if it is qualified, else the first qualified
// alias of it in the hosts file. It never asks DNS: facts are collected on
// every refresh and must not depend on a resolver.
func fqdn(hostname, hostsFile string) string {
	if strings.Contains(hostname, ".") {
		return hostname
	}
	b, err := os.ReadFile(hostsFile)
	if err != nil {
		return hostname
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) < 2 || !slices.Contains(fields[1:], hostname) {
			continue
		}
		for _, name := range fields[1:] {
			if strings.HasPrefix(name, hostname+".") {
				return name
			}
		}
	}
	return hostname
}

// ParseFact parses a --fact key=value. The value is typed: true/false is a
// bool, a whole number an int, a decimal number a float, anything else a
// string (see TypedValue).
func ParseFact(s string) (string, any, error) {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return "", nil, fmt.Errorf("fact %q: want key=value", s)
	}
	if !factKeyOK(k) {
		return "", nil, fmt.Errorf("fact %q: keys are snake_case letters, digits and underscores, starting with a letter", k)
	}
	return k, TypedValue(v), nil
}

// Numbers are written as JSON writes them: a leading zero ("007", a zip
// code, an ID) or a plus sign is text, so the value keeps its spelling.
var (
	// Compiled when first used, not at every process's start.
	intSyntax   = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^-?(0|[1-9][0-9]*)$`) })
	floatSyntax = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?$`)
	})
)

// TypedValue types a fact value given as text: true/false is a bool, a whole
// number that fits an int64 an int, a decimal number a float, anything else
// (including a whole number too big for an int64, which a float would round)
// the text itself.
func TypedValue(v string) any {
	switch v {
	case "true":
		return true
	case "false":
		return false
	}
	if intSyntax().MatchString(v) {
		if i, err := strconv.ParseInt(v, 10, 64); err == nil {
			return i
		}
		return v
	}
	if floatSyntax().MatchString(v) {
		if f, err := strconv.ParseFloat(v, 64); err == nil && !math.IsInf(f, 0) {
			return f
		}
	}
	return v
}

func factKeyOK(k string) bool {
	if len(k) == 0 || len(k) > 64 || !(k[0] >= 'a' && k[0] <= 'z') {
		return false
	}
	for _, c := range k {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// LoadFactsFile reads user facts from YAML or JSON: a map of fact names to
// values, nested maps and lists allowed.
func LoadFactsFile(path string) (Facts, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("facts file: %w", err)
	}
	var raw map[string]any
	if err := yaml.Unmarshal(b, &raw); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("facts file %s: %w", path, err)
	}
	if len(raw) > MaxFactItems {
		return nil, fmt.Errorf("facts file %s: %d facts, at most %d", path, len(raw), MaxFactItems)
	}
	out := Facts{}
	budget := factBudget{values: MaxFactValues}
	for k, v := range raw {
		if !factKeyOK(k) {
			return nil, fmt.Errorf("facts file %s: fact %q: keys are snake_case letters, digits and underscores, starting with a letter", path, k)
		}
		nv, err := budget.normalize(v, 1)
		if err != nil {
			return nil, fmt.Errorf("facts file %s: fact %q: %w", path, k, err)
		}
		out[k] = nv
	}
	return out, nil
}

// Bounds of a node's facts, whoever declares them: at most MaxFactItems
// elements in one list or map, MaxFactValues values in all (each element,
// list and map counts one), nested at most MaxFactDepth deep. Other nodes
// evaluate a node's declared facts (policies back its memberships,
// --auto-admit judges it while it is pending), and CEL's cost limit does
// not bound their CPU: its cost tracking grows with the square of a list a
// comprehension walks (facts.l.exists(x, x == 7) took 787 ms at 16,000
// elements, 1.4 ms without the limit). Real facts are far smaller (a CPU
// has about 150 flags).
const (
	MaxFactItems  = 1024
	MaxFactValues = 4096
	MaxFactDepth  = 8
)

// factBudget is what the facts being decoded may still hold.
type factBudget struct{ values int }

// normalize turns decoded YAML/JSON into the fact value types: int64,
// float64, bool, string, []any, map[string]any, within the bounds above
// (depth is v's).
func (b *factBudget) normalize(v any, depth int) (any, error) {
	if b.values--; b.values < 0 {
		return nil, fmt.Errorf("more than %d values in all", MaxFactValues)
	}
	if depth > MaxFactDepth {
		return nil, fmt.Errorf("nested more than %d deep", MaxFactDepth)
	}
	switch x := v.(type) {
	case nil, bool, string, int64, float64:
		return x, nil
	case int:
		return int64(x), nil
	case uint64:
		if x > math.MaxInt64 {
			return float64(x), nil
		}
		return int64(x), nil
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i, nil
		}
		return x.Float64()
	case []any:
		if len(x) > MaxFactItems {
			return nil, fmt.Errorf("a list of %d elements, at most %d", len(x), MaxFactItems)
		}
		out := make([]any, len(x))
		for i, e := range x {
			n, err := b.normalize(e, depth+1)
			if err != nil {
				return nil, err
			}
			out[i] = n
		}
		return out, nil
	case map[string]any:
		if len(x) > MaxFactItems {
			return nil, fmt.Errorf("a map of %d keys, at most %d", len(x), MaxFactItems)
		}
		out := make(map[string]any, len(x))
		for k, e := range x {
			n, err := b.normalize(e, depth+1)
			if err != nil {
				return nil, err
			}
			out[k] = n
		}
		return out, nil
	}
	return nil, fmt.Errorf("unsupported value %v (%T)", v, v)
}

// DecodeJSON decodes facts from JSON (as stored in node records), with
// whole numbers as int64 so that `facts.cpu_count > 4` compares ints.
func DecodeJSON(b []byte) (Facts, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var raw map[string]any
	if err := dec.Decode(&raw); err != nil {
		return nil, err
	}
	if len(raw) > MaxFactItems {
		return nil, fmt.Errorf("%d facts, at most %d", len(raw), MaxFactItems)
	}
	out := Facts{}
	budget := factBudget{values: MaxFactValues}
	for k, v := range raw {
		nv, err := budget.normalize(v, 1)
		if err != nil {
			return nil, fmt.Errorf("fact %q: %w", k, err)
		}
		out[k] = nv
	}
	return out, nil
}

// Merge returns built-in facts overlaid with user facts (user wins).
func Merge(builtin, user Facts) Facts {
	out := make(Facts, len(builtin)+len(user))
	for k, v := range builtin {
		out[k] = v
	}
	for k, v := range user {
		out[k] = v
	}
	return out
}
