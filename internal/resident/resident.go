// Package resident gives back the pages of the process's own executable
// that it no longer uses.
//
// An agent touches most of its binary while it starts: some three hundred
// package inits, the host, the store, the policy compiler and the first
// discovery each run code and read tables once. Those pages stay mapped
// (and counted in RSS) for the life of the process although the idle agent
// works with about a fifth of them. Release drops this process's mappings
// of the executable's read-only, clean pages (madvise MADV_DONTNEED); the
// pages stay in the kernel's page cache, shared with any other process that
// maps the file, and the ones the agent still uses fault back in (minor
// faults, no disk read while cached). Nothing written is dropped: a mapping
// that is writable or holds a dirty page (a position-independent build's
// relocations) is left alone.
package resident

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Mapping is one mapped range, from /proc/PID/smaps (or the one summed
// range of /proc/PID/smaps_rollup).
type Mapping struct {
	Start, End uintptr
	Perms      string // e.g. "r-xp"
	Path       string
	RSS        int64 // bytes resident
	PSS        int64 // bytes resident, pages shared with other processes split between them
	Anon       int64 // bytes of anonymous memory
	Dirty      int64 // bytes dirty (private and shared)
}

// ParseSmaps reads /proc/PID/smaps or smaps_rollup: every mapping with its
// resident, proportional, anonymous and dirty bytes.
func ParseSmaps(r io.Reader) ([]Mapping, error) {
	var out []Mapping
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if m, ok := parseHeader(f); ok {
			out = append(out, m)
			continue
		}
		if len(out) == 0 || len(f) < 2 || !strings.HasSuffix(f[0], ":") {
			continue
		}
		last := &out[len(out)-1]
		switch f[0] {
		case "Rss:":
			last.RSS = kB(f)
		case "Pss:":
			last.PSS = kB(f)
		case "Anonymous:":
			last.Anon = kB(f)
		case "Private_Dirty:", "Shared_Dirty:":
			last.Dirty += kB(f)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("resident: reading smaps: %w", err)
	}
	return out, nil
}

// parseHeader parses a mapping's first line: "start-end perms offset dev
// inode [path]".
func parseHeader(f []string) (Mapping, bool) {
	if len(f) < 5 || len(f[1]) != 4 {
		return Mapping{}, false
	}
	lo, hi, ok := strings.Cut(f[0], "-")
	if !ok {
		return Mapping{}, false
	}
	start, err1 := strconv.ParseUint(lo, 16, 64)
	end, err2 := strconv.ParseUint(hi, 16, 64)
	if err1 != nil || err2 != nil || end <= start {
		return Mapping{}, false
	}
	m := Mapping{Start: uintptr(start), End: uintptr(end), Perms: f[1]}
	if len(f) >= 6 {
		m.Path = strings.Join(f[5:], " ")
	}
	return m, true
}

// kB is a smaps field's value ("Rss: 123 kB") in bytes.
func kB(f []string) int64 {
	n, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0
	}
	return n << 10
}

// Releasable picks the mappings of exe that may be dropped: read-only,
// private and clean, so that dropping them loses nothing.
func Releasable(maps []Mapping, exe string) []Mapping {
	var out []Mapping
	for _, m := range maps {
		if m.Path == exe && m.Perms[0] == 'r' && m.Perms[1] == '-' && m.Perms[3] == 'p' && m.Dirty == 0 && m.RSS > 0 {
			out = append(out, m)
		}
	}
	return out
}

// Release drops this process's resident pages of its own executable's
// read-only, clean mappings and returns how many bytes were resident in
// them before.
func Release() (int64, error) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return 0, fmt.Errorf("resident: %w", err)
	}
	// A binary written moments ago (a fresh build, an upgrade) has pages
	// not yet written back, which smaps counts as dirty: write them now
	// so that they count as clean. A no-op for a binary long on disk.
	if f, err := os.Open(exe); err == nil {
		f.Sync()
		f.Close()
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return 0, fmt.Errorf("resident: %w", err)
	}
	maps, err := ParseSmaps(f)
	f.Close()
	if err != nil {
		return 0, err
	}
	var released int64
	for _, m := range Releasable(maps, exe) {
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, m.Start, m.End-m.Start, unix.MADV_DONTNEED); errno != 0 {
			return released, fmt.Errorf("resident: madvise %x-%x: %w", m.Start, m.End, errno)
		}
		released += m.RSS
	}
	return released, nil
}

// Schedule is the waits between Keep's releases: 5 s after ready, when the
// agent alone has settled; 30 s and a minute later, when joining a fleet
// (dials, handshakes, the first state sync and discovery rounds) has; then
// every 10 minutes, giving back what rare work (a reload, a job, a policy
// change) touched.
var Schedule = []time.Duration{5 * time.Second, 30 * time.Second, time.Minute, 10 * time.Minute}

// Keep releases the executable's pages on Schedule (the last interval
// repeating) until stop is closed; each result goes to report.
func Keep(stop <-chan struct{}, report func(released int64, err error)) {
	for i := 0; ; i++ {
		t := time.NewTimer(Schedule[min(i, len(Schedule)-1)])
		select {
		case <-stop:
			t.Stop()
			return
		case <-t.C:
		}
		report(Release())
	}
}
