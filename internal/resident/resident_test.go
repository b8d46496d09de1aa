package resident

import (
	"os"
	"strings"
	"testing"
)

const sample = `00400000-01112000 r-xp 00000000 fe:00 9977972                            /usr/bin/tribe
Size:              13384 kB
Rss:               11656 kB
Shared_Dirty:          0 kB
Private_Dirty:         0 kB
01112000-022d9000 r--p 00d12000 fe:00 9977972                            /usr/bin/tribe
Rss:               11932 kB
Shared_Dirty:          0 kB
Private_Dirty:         0 kB
022d9000-023a0000 rw-p 01ed9000 fe:00 9977972                            /usr/bin/tribe
Rss:                 604 kB
Private_Dirty:       120 kB
023a0000-023b0000 r--p 00000000 fe:00 9977973                            /usr/bin/tribe (deleted)
Rss:                  64 kB
Private_Dirty:         0 kB
023b0000-023c0000 r--p 00000000 fe:00 9977972                            /usr/bin/tribe
Rss:                  64 kB
Private_Dirty:         4 kB
26d473c00000-26d474400000 rw-p 00000000 00:00 0 
Rss:                3420 kB
Private_Dirty:      3420 kB
7fff38ab1000-7fff38ad2000 rw-p 00000000 00:00 0                          [stack]
Rss:                  16 kB
`

func TestParseSmaps(t *testing.T) {
	maps, err := ParseSmaps(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	if len(maps) != 7 {
		t.Fatalf("parsed %d mappings, want 7: %+v", len(maps), maps)
	}
	first := maps[0]
	if first.Start != 0x400000 || first.End != 0x1112000 || first.Perms != "r-xp" || first.Path != "/usr/bin/tribe" || first.RSS != 11656<<10 || first.Dirty != 0 {
		t.Errorf("first mapping %+v", first)
	}
	if maps[2].Dirty != 120<<10 {
		t.Errorf("dirty of the data segment: %d", maps[2].Dirty)
	}
	if maps[3].Path != "/usr/bin/tribe (deleted)" {
		t.Errorf("a path with a space: %q", maps[3].Path)
	}
	if maps[5].Path != "" || maps[6].Path != "[stack]" {
		t.Errorf("anonymous mappings: %q %q", maps[5].Path, maps[6].Path)
	}
}

// Only the executable's read-only, private, clean, resident mappings may
// be dropped: never its data, another file, or a page written to.
func TestReleasable(t *testing.T) {
	maps, err := ParseSmaps(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	got := Releasable(maps, "/usr/bin/tribe")
	if len(got) != 2 || got[0].Perms != "r-xp" || got[1].Start != 0x1112000 {
		t.Fatalf("releasable: %+v", got)
	}
	if got := Releasable(maps, "/usr/bin/serf"); len(got) != 0 {
		t.Fatalf("another binary's mappings released: %+v", got)
	}
}

func TestParseSmapsRollup(t *testing.T) {
	const rollup = `00400000-7fff38ad2000 ---p 00000000 00:00 0                              [rollup]
Rss:               28300 kB
Pss:               14150 kB
Pss_Anon:           4232 kB
Anonymous:          4232 kB
`
	maps, err := ParseSmaps(strings.NewReader(rollup))
	if err != nil || len(maps) != 1 {
		t.Fatalf("got %+v, %v", maps, err)
	}
	if m := maps[0]; m.RSS != 28300<<10 || m.PSS != 14150<<10 || m.Anon != 4232<<10 || m.Path != "[rollup]" {
		t.Fatalf("rollup %+v", m)
	}
}

func TestParseSmapsSkipsGarbage(t *testing.T) {
	maps, err := ParseSmaps(strings.NewReader("nonsense\nRss: 12 kB\nzz-yy r-xp 0 0 0 /x\n10-5 r-xp 0 0 0 /x\n"))
	if err != nil || len(maps) != 0 {
		t.Fatalf("got %+v, %v", maps, err)
	}
}

// Release drops this test binary's resident code and read-only data, and
// the process goes on running (the pages it uses fault back in).
func TestReleaseDropsTheExecutablesPages(t *testing.T) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		t.Skipf("no /proc/self/exe: %v", err)
	}
	before := exeResident(t, exe)
	released, err := Release()
	if err != nil {
		t.Fatal(err)
	}
	after := exeResident(t, exe)
	t.Logf("resident read-only pages of %s: %d kB before, %d kB released, %d kB after", exe, before>>10, released>>10, after>>10)
	if released < before/2 {
		t.Errorf("released %d bytes of %d resident", released, before)
	}
	if after >= before*3/4 {
		t.Errorf("still %d bytes resident of %d", after, before)
	}
}

// exeResident is how many bytes of exe's read-only mappings are resident.
func exeResident(t *testing.T, exe string) int64 {
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skipf("no smaps: %v", err)
	}
	defer f.Close()
	maps, err := ParseSmaps(f)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, m := range maps {
		if m.Path == exe && !strings.Contains(m.Perms, "w") {
			n += m.RSS
		}
	}
	return n
}
