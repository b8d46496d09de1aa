package main

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tribeagent/tribe/node"
	"github.com/tribeagent/tribe/plugins"
)

// TestDebPackage builds the .deb as `make package` does, installs it with
// dpkg into a throwaway root (its maintainer scripts run outside a chroot,
// on DPKG_ROOT), checks what it installed and what the scripts did, runs
// the installed binary, verifies the unit with systemd-analyze where it
// exists, then removes and purges the package. It needs root and Debian's
// dpkg and passwd; .ci/run provides them.
func TestDebPackage(t *testing.T) {
	for _, tool := range []string{"dpkg", "dpkg-deb", "dpkg-query", "useradd"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("skipping the .deb test: %s not found (Debian's dpkg and passwd packages)", tool)
		}
	}
	if os.Geteuid() != 0 {
		t.Skip("skipping the .deb test: installing into a throwaway root takes root (.ci/run runs as root)")
	}
	hostPasswd, err := os.ReadFile("/etc/passwd")
	if err != nil {
		t.Fatal(err)
	}

	// A binary stamped as a build 5 commits after tag v0.9.1.
	const version, debVersion = "0.9.1-5-gabc1234", "0.9.1+5.gabc1234"
	work := t.TempDir()
	bin := filepath.Join(work, "tribe")
	build := exec.Command("go", "build", "-trimpath", "-o", bin,
		"-ldflags", "-s -w -X github.com/tribeagent/tribe/node.Version="+version, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0") // as make build, and TestMain: no rebuild
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	// gzip: xz of the 30 MB binary takes most of a minute on a busy machine.
	pack := exec.Command("packaging/deb/build.sh", bin, version, filepath.Join(work, "out"))
	pack.Env = append(os.Environ(), "DEB_COMPRESSION=gzip")
	out, err := pack.Output()
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		t.Fatalf("packaging/deb/build.sh: %v\n%s", err, ee.Stderr)
	} else if err != nil {
		t.Fatal(err)
	}
	deb := strings.TrimSpace(string(out))
	if want := "tribe_" + debVersion + "_" + debArch() + ".deb"; filepath.Base(deb) != want {
		t.Fatalf("built %s, want %s", filepath.Base(deb), want)
	}

	root := throwawayRoot(t)
	dpkg := func(args ...string) string {
		t.Helper()
		return runTool(t, "dpkg", append([]string{"--root=" + root, "--force-script-chrootless", "--log=/dev/null"}, args...)...)
	}
	query := func(format string) string {
		t.Helper()
		// stdout alone: a package dpkg no longer knows is a message on stderr.
		out, _ := exec.Command("dpkg-query", "--admindir="+filepath.Join(root, "var/lib/dpkg"), "-W", "-f="+format, "tribe").Output()
		return string(out)
	}

	dpkg("-i", deb)
	dpkg("-i", deb) // again, as an upgrade: the scripts must be idempotent
	if got := query("${Status} ${Version}"); got != "install ok installed "+debVersion {
		t.Fatalf("dpkg-query says %q, want installed %s", got, debVersion)
	}
	conffiles := query("${Conffiles}")
	for _, f := range []string{"/etc/tribe/agent.yaml", "/etc/default/tribe"} {
		if !strings.Contains(conffiles, f+" ") {
			t.Errorf("%s is not a conffile: %q", f, conffiles)
		}
	}

	uid, gid := tribeUser(t, root)
	for _, f := range []struct {
		path string
		mode os.FileMode
		gid  int
	}{
		{"usr/bin/tribe", 0o755, 0},
		{"lib/systemd/system/tribe.service", 0o644, 0},
		{"etc/tribe/agent.yaml", 0o640, gid}, // readable by the agent, not by everyone
		{"etc/default/tribe", 0o644, 0},
		{"usr/share/doc/tribe/copyright", 0o644, 0},
	} {
		fi, err := os.Stat(filepath.Join(root, f.path))
		if err != nil {
			t.Errorf("not installed: %v", err)
			continue
		}
		if fi.Mode().Perm() != f.mode {
			t.Errorf("/%s has mode %v, want %v", f.path, fi.Mode().Perm(), f.mode)
		}
		if g := int(fileGID(fi)); g != f.gid {
			t.Errorf("/%s has group %d, want %d", f.path, g, f.gid)
		}
	}
	if uid == 0 || uid >= 1000 {
		t.Errorf("user tribe has uid %d, want a system uid", uid)
	}
	if after, _ := os.ReadFile("/etc/passwd"); !bytes.Equal(after, hostPasswd) {
		t.Fatal("installing into the throwaway root changed this host's /etc/passwd")
	}

	if v := runTool(t, filepath.Join(root, "usr/bin/tribe"), "--version"); !strings.Contains(v, version) {
		t.Errorf("installed tribe --version = %q, want %s", v, version)
	}
	checkUnit(t, root)
	checkConfig(t, filepath.Join(root, "etc/tribe/agent.yaml"))

	// What the agent would have made under StateDirectory=, for purge.
	if err := os.MkdirAll(filepath.Join(root, "var/lib/tribe/state"), 0o750); err != nil {
		t.Fatal(err)
	}
	dpkg("-r", "tribe")
	for _, gone := range []string{"usr/bin/tribe", "lib/systemd/system/tribe.service", "usr/share/doc/tribe"} {
		if _, err := os.Stat(filepath.Join(root, gone)); !os.IsNotExist(err) {
			t.Errorf("/%s is still there after dpkg -r (%v)", gone, err)
		}
	}
	for _, kept := range []string{"etc/tribe/agent.yaml", "var/lib/tribe/state"} {
		if _, err := os.Stat(filepath.Join(root, kept)); err != nil {
			t.Errorf("dpkg -r removed /%s; only purge may: %v", kept, err)
		}
	}
	dpkg("--purge", "tribe")
	for _, gone := range []string{"etc/tribe", "etc/default/tribe", "var/lib/tribe"} {
		if _, err := os.Stat(filepath.Join(root, gone)); !os.IsNotExist(err) {
			t.Errorf("/%s is still there after dpkg --purge (%v)", gone, err)
		}
	}
	if got := query("${Status}"); got != "" && !strings.Contains(got, "not-installed") {
		t.Errorf("after purge dpkg-query says %q", got)
	}
}

// throwawayRoot makes a root that dpkg can install into: an empty package
// database that knows the package's dependencies as installed, and account
// files for useradd.
func throwawayRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	files := map[string]string{
		"etc/passwd":           "root:x:0:0:root:/root:/bin/sh\n",
		"etc/group":            "root:x:0:\n",
		"etc/shadow":           "root:*:19000:0:99999:7:::\n",
		"etc/gshadow":          "root:*::\n",
		"var/lib/dpkg/status":  "",
		"var/lib/dpkg/updates": "",
	}
	for _, dep := range []string{"passwd", "procps"} {
		files["var/lib/dpkg/status"] += "Package: " + dep + "\nStatus: install ok installed\nPriority: required\n" +
			"Version: 1:99\nArchitecture: all\nMaintainer: test <test@invalid>\nDescription: stand-in\n\n"
		files["var/lib/dpkg/info/"+dep+".list"] = ""
	}
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if name == "var/lib/dpkg/updates" {
			if err := os.Mkdir(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// tribeUser checks the account postinst made in root and returns its IDs.
func tribeUser(t *testing.T, root string) (uid, gid int) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Split(sc.Text(), ":")
		if len(f) != 7 || f[0] != "tribe" {
			continue
		}
		if f[5] != "/var/lib/tribe" || f[6] != "/usr/sbin/nologin" {
			t.Errorf("user tribe has home %s and shell %s, want /var/lib/tribe and /usr/sbin/nologin", f[5], f[6])
		}
		uid, _ = strconv.Atoi(f[2])
		gid, _ = strconv.Atoi(f[3])
		return uid, gid
	}
	t.Fatalf("postinst made no user tribe:\n%s", b)
	return 0, 0
}

// checkUnit checks the installed unit's promises and, where systemd-analyze
// exists, verifies it.
func checkUnit(t *testing.T, root string) {
	t.Helper()
	unit := filepath.Join(root, "lib/systemd/system/tribe.service")
	b, err := os.ReadFile(unit)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Type=notify", "Restart=on-failure", "User=tribe", "StateDirectory=tribe",
		"ProtectSystem=strict", "ProtectHome=true", "NoNewPrivileges=true", "PrivateTmp=true",
		"ExecStart=/usr/bin/tribe agent --data-dir /var/lib/tribe --config /etc/tribe/agent.yaml $TRIBE_OPTS",
		"EnvironmentFile=-/etc/default/tribe",
		"ExecReload=/usr/bin/tribe reload --data-dir /var/lib/tribe",
	} {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(want) + `$`).Match(b) {
			t.Errorf("the unit lacks the line %q", want)
		}
	}
	// The agent warns below 2,816 open files (node/limits.go).
	if m := regexp.MustCompile(`(?m)^LimitNOFILE=(\d+)$`).FindSubmatch(b); m == nil {
		t.Error("the unit sets no LimitNOFILE")
	} else if n, _ := strconv.Atoi(string(m[1])); n < 2816 {
		t.Errorf("LimitNOFILE=%d, want at least 2816", n)
	}

	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Log("skipping systemd-analyze verify: systemd-analyze not found (Debian's systemd package)")
		return
	}
	// verify --root wants a whole systemd in the root, so the unit is
	// verified against this host's units, its ExecStart pointed at the
	// binary installed in the throwaway root.
	dir := t.TempDir()
	fixed := strings.ReplaceAll(string(b), "=/usr/bin/tribe ", "="+filepath.Join(root, "usr/bin/tribe")+" ")
	if err := os.WriteFile(filepath.Join(dir, "tribe.service"), []byte(fixed), 0o644); err != nil {
		t.Fatal(err)
	}
	// systemd-analyze verify warns on stderr and exits 0 for some findings:
	// any output at all is a failure.
	out, err := runToolErr("systemd-analyze", "verify", "--man=no", filepath.Join(dir, "tribe.service"))
	if err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("systemd-analyze verify tribe.service: %v\n%s", err, out)
	}
}

// checkConfig loads the installed config as the agent would, and again
// with every commented-out setting turned on, so the defaults it documents
// stay keys the agent knows.
func checkConfig(t *testing.T, path string) {
	t.Helper()
	cfg := node.DefaultConfig()
	if err := node.LoadConfigFile(path, &cfg); err != nil {
		t.Fatalf("the installed agent.yaml: %v", err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// "#key: value" and "#  - item" are settings; "# text" is prose.
	prose := regexp.MustCompile(`^#( \S|$)`)
	var on []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "#") && !prose.MatchString(line) {
			line = line[1:]
		}
		on = append(on, line)
	}
	all := filepath.Join(t.TempDir(), "all.yaml")
	if err := os.WriteFile(all, []byte(strings.Join(on, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg = node.DefaultConfig()
	if err := node.LoadConfigFile(all, &cfg); err != nil {
		t.Fatalf("agent.yaml with every setting on: %v\n%s", err, strings.Join(on, "\n"))
	}
	if c := cfg.Exec.Commands["disk"]; c.Timeout != 10*time.Second || len(c.Argv) != 2 {
		t.Errorf("agent.yaml's exec example loads as %+v", c)
	}
	def := node.DefaultConfig()
	type documented struct {
		Cluster             string
		MDNS                bool
		TargetPeers         int
		Reconnect           time.Duration
		LogLevel, LogFormat string
		FileMaxBytes        int64
	}
	got := documented{cfg.Cluster, cfg.MDNS, cfg.TargetPeers, cfg.ReconnectTimeout, cfg.LogLevel, cfg.LogFormat, cfg.FileMaxBytes}
	// An empty log level and format mean info and text; a zero cap, the
	// file plugin's default.
	want := documented{def.Cluster, def.MDNS, def.TargetPeers, def.ReconnectTimeout,
		cmp.Or(def.LogLevel, "info"), cmp.Or(def.LogFormat, "text"), cmp.Or(def.FileMaxBytes, plugins.DefaultFileMaxBytes)}
	if got != want {
		t.Errorf("agent.yaml documents the defaults %+v; the agent's are %+v", got, want)
	}
}

// debArch is Debian's name for this build's architecture.
func debArch() string {
	switch runtime.GOARCH {
	case "386":
		return "i386"
	case "arm":
		return "armhf"
	case "ppc64le":
		return "ppc64el"
	}
	return runtime.GOARCH
}

// runTool runs a command in this package's directory and fails the test
// if it fails; it returns stdout and stderr together.
func runTool(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := runToolErr(name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

func runToolErr(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	return string(out), err
}

// fileGID is the group that owns the file fi describes.
func fileGID(fi os.FileInfo) uint32 { return fi.Sys().(*syscall.Stat_t).Gid }

// TestDebVersion checks that Debian versions sort as the builds do: a
// development build before its release, commits after a tag after it.
func TestDebVersion(t *testing.T) {
	if _, err := exec.LookPath("dpkg"); err != nil {
		t.Skip("skipping: dpkg not found (Debian's dpkg package) to compare versions")
	}
	deb := func(v string) string {
		t.Helper()
		out, err := exec.Command("packaging/deb/debversion.sh", v).Output()
		if err != nil {
			t.Fatalf("debversion.sh %s: %v", v, err)
		}
		return strings.TrimSpace(string(out))
	}
	for v, want := range map[string]string{
		"0.2.0":                       "0.2.0",
		"0.2.0-5-gabc1234":            "0.2.0+5.gabc1234",
		"0.2.0-5-gabc1234-dirty":      "0.2.0+5.gabc1234.dirty",
		"0.2.0-rc1":                   "0.2.0~rc1",
		"0.1.0-dev+git.abc1234.dirty": "0.1.0~dev+git.abc1234.dirty",
	} {
		if got := deb(v); got != want {
			t.Errorf("debversion.sh %s = %s, want %s", v, got, want)
		}
	}
	// Oldest first, as git history runs.
	order := []string{"0.1.0-dev+git.abc1234", "0.1.0", "0.1.0-3-gdef5678", "0.1.0-12-g0123abc", "0.2.0-rc1", "0.2.0"}
	for i := 1; i < len(order); i++ {
		a, b := deb(order[i-1]), deb(order[i])
		if err := exec.Command("dpkg", "--compare-versions", a, "lt", b).Run(); err != nil {
			t.Errorf("dpkg does not order %s (%s) before %s (%s)", a, order[i-1], b, order[i])
		}
	}
	for _, bad := range []string{"v0.2.0", "0.2.0 beta", ""} {
		if err := exec.Command("packaging/deb/debversion.sh", bad).Run(); err == nil {
			t.Errorf("debversion.sh accepted %q", bad)
		}
	}
}
