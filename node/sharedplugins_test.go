package node

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"

	"github.com/tribeagent/tribe/node/api"
)

// FuzzDecodePluginFetchRequest: a fetch request is a stranger's bytes.
func FuzzDecodePluginFetchRequest(f *testing.F) {
	f.Add([]byte(`{"sha256":"` + strings.Repeat("ab", 32) + `"}` + "\n"))
	f.Add([]byte(`{"sha256":"../../etc/passwd"}`))
	f.Add([]byte(`{"sha256":"` + strings.Repeat("AB", 32) + `","x":1}`))
	good := `{"sha256":"` + strings.Repeat("ab", 32) + `"}`
	for _, bad := range []string{good + "}", good + "]", good + " {}"} {
		if _, err := decodePluginFetchRequest([]byte(bad)); err == nil {
			f.Errorf("%s taken", bad)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		sum, err := decodePluginFetchRequest(b)
		if err == nil && !isSHA256(sum) {
			t.Fatalf("accepted %q as %q", b, sum)
		}
	})
}

// A trusted writer shares a plugin it has as a file: the members that take
// shared plugins fetch it, check it and run it; the one that does not
// says so and runs nothing. Bytes that do not hash to the entry's sha256
// are refused and counted, whoever sends them.
func TestSharedPlugin(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not installed: the example plugin pyecho needs it")
	}
	ctx := context.Background()
	ca := loopbackConfig(t, "admin")
	ca.Trusted = []string{identity(t, ca).String()}
	admin := startNode(t, ca)
	nodes := map[string]*Node{}
	for _, name := range []string{"b", "c", "d"} {
		c := loopbackConfig(t, name)
		c.Trusted, c.Join = ca.Trusted, []string{tcpAddr(admin)}
		if name != "d" {
			c.AcceptPlugins = AcceptTrusted
		}
		nodes[name] = startNode(t, c)
	}
	b, c, d := nodes["b"], nodes["c"], nodes["d"]
	waitFor(t, "admin to know every node", func() bool { return len(admin.nodeRecords()) == 4 })
	if _, err := admin.Admit(ctx, api.AdmitRequest{AllPending: true}); err != nil {
		t.Fatal(err)
	}
	jobTribe(t, admin, "t", "echo", []*Node{b, c, d})

	src, err := os.ReadFile(filepath.Join("..", "plugins", "examples", "pyecho", "pyecho"))
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "pyecho")
	os.WriteFile(file, src, 0o755)
	if _, err := admin.LoadPlugin(ctx, "pyecho", "t", api.LoadRequest{File: file}); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(src)
	hexSum := hex.EncodeToString(sum[:])
	states := func() map[string]api.PluginNode {
		out := map[string]api.PluginNode{}
		ps, _ := admin.Plugins(ctx, "t")
		for _, p := range ps {
			if p.Name == "pyecho" {
				for _, pn := range p.Nodes {
					out[pn.Name] = pn
				}
			}
		}
		return out
	}
	var last map[string]api.PluginNode
	defer func() {
		if t.Failed() {
			t.Logf("the members' last states: %+v", last)
		}
	}()
	waitFor(t, "b and c to run pyecho, d to refuse it", func() bool {
		last = states()
		return last["b"].State == "loaded" && last["c"].State == "loaded" && last["d"].State == "error"
	})
	s := states()
	for _, name := range []string{"b", "c"} {
		if s[name].Source != "shared sha256:"+hexSum[:16] || s[name].Version != "1.0.0" {
			t.Errorf("%s: %+v", name, s[name])
		}
	}
	if !strings.Contains(s["d"].Error, "not installed here (sharing is off") {
		t.Errorf("d: %+v", s["d"])
	}
	if _, err := os.Stat(filepath.Join(d.pluginDir(), "shared")); err == nil {
		t.Error("d, which takes no shared plugins, has a shared store")
	}
	sumCall, err := admin.Call(ctx, api.CallRequest{Tribes: []string{"t"}, Plugin: "pyecho", Method: "echo", Args: []byte(`"hi"`)}, func(api.CallResult) {})
	if err != nil || sumCall.Answered != 2 || sumCall.Failed != 1 {
		t.Fatalf("a call to the tribe: %+v %v", sumCall, err)
	}

	// A tampered copy on b: c refuses it and counts it, and takes the
	// writer's.
	bin := &sharedBinary{Version: "1.0.0", SHA256: hexSum, Size: int64(len(src))}
	os.WriteFile(b.sharedPath(bin, "pyecho"), bytes.Replace(src, []byte("echo"), []byte("ohce"), 1), 0o755)
	os.Remove(c.sharedPath(bin, "pyecho"))
	if err := c.fetchFrom(b.ID(), "pyecho", bin); err == nil || !strings.Contains(err.Error(), "refused: its bytes hash to") {
		t.Fatalf("a tampered copy: %v", err)
	}
	if c.sharing.hashMismatch.Load() != 1 || c.rejected()["plugin_hash_mismatch"] != 1 {
		t.Errorf("hash mismatches counted: %d", c.sharing.hashMismatch.Load())
	}
	if _, err := os.Stat(c.sharedPath(bin, "pyecho")); err == nil {
		t.Fatal("the tampered copy was installed")
	}
	if err := c.fetchFrom(admin.ID(), "pyecho", bin); err != nil {
		t.Fatalf("from the writer: %v", err)
	}
	// A request that is not one is refused and counted.
	st, err := d.host.NewStream(ctx, admin.ID(), PluginFetchProtocol)
	if err != nil {
		t.Fatal(err)
	}
	st.Write([]byte(`{"sha256":"../x"}` + "\n"))
	st.CloseWrite()
	var answer bytes.Buffer
	answer.ReadFrom(st)
	if !strings.Contains(answer.String(), "not 64 lower-case hex digits") || admin.sharing.refused.Load() != 1 {
		t.Errorf("a malformed fetch: %q, %d refused", answer.String(), admin.sharing.refused.Load())
	}
}

// A peer that answers a fetch with an endless first line is cut off at
// fetchHeaderMax, not buffered.
func TestPluginFetchHeaderIsBounded(t *testing.T) {
	admin, stranger := adminAndStranger(t)
	// The plugin loop registers the real handler when it starts: replaced
	// before that, the fake was replaced in turn.
	waitFor(t, "the stranger to serve fetches", func() bool {
		return slices.Contains(stranger.host.Mux().Protocols(), PluginFetchProtocol)
	})
	stranger.host.SetStreamHandler(PluginFetchProtocol, func(s network.Stream) {
		defer s.Close()
		s.Write(bytes.Repeat([]byte("x"), 64*fetchHeaderMax))
	})
	bin := &sharedBinary{Version: "1", SHA256: strings.Repeat("ab", 32), Size: 10}
	if err := admin.fetchFrom(stranger.ID(), "x", bin); err == nil || !strings.Contains(err.Error(), "buffer full") {
		t.Fatalf("an endless first line: %v", err)
	}
}

// A peer that offers the entry's size and sends less before it closes
// gave a bad answer, counted like one that does not read.
func TestPluginFetchCutShortIsABadAnswer(t *testing.T) {
	admin, stranger := adminAndStranger(t)
	waitFor(t, "the stranger to serve fetches", func() bool {
		return slices.Contains(stranger.host.Mux().Protocols(), PluginFetchProtocol)
	})
	stranger.host.SetStreamHandler(PluginFetchProtocol, func(s network.Stream) {
		defer s.Close()
		s.Write([]byte(`{"size":10}` + "\n" + "abcd"))
	})
	bin := &sharedBinary{Version: "1", SHA256: strings.Repeat("ab", 32), Size: 10}
	if err := admin.fetchFrom(stranger.ID(), "x", bin); err == nil || !strings.Contains(err.Error(), "cut short") {
		t.Fatalf("4 bytes of 10: %v", err)
	}
	if got := admin.sharing.badAnswer.Load(); got != 1 {
		t.Errorf("%d bad answers counted, want 1", got)
	}
}

// Strangers that open fetch streams and send nothing take no fetch slot:
// they are refused at once and counted, and a node that counts is served
// meanwhile (four of them used to hold every slot for a minute).
func TestStrangersHoldNoFetchSlot(t *testing.T) {
	ctx := context.Background()
	ca := loopbackConfig(t, "admin")
	ca.Trusted = []string{identity(t, ca).String()}
	admin := startNode(t, ca)
	cb := loopbackConfig(t, "b")
	cb.Trusted, cb.Join = ca.Trusted, []string{tcpAddr(admin)}
	b := startNode(t, cb)
	waitFor(t, "admin to know b", func() bool { return len(admin.nodeRecords()) == 2 })
	if _, err := admin.Admit(ctx, api.AdmitRequest{AllPending: true}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b to count on admin", func() bool { return admin.rules().Counts(b.ID()) })
	waitFor(t, "admin to serve fetches", func() bool {
		return slices.Contains(admin.host.Mux().Protocols(), PluginFetchProtocol)
	})
	_, ai := tcpListenAddr(t, admin)
	for range maxFetchServing {
		h := lightHost(t)
		if err := connectWithin(h, ai, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		st, err := h.NewStream(ctx, admin.ID(), PluginFetchProtocol)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Reset() })
		if _, err := st.Write([]byte("{")); err != nil { // a request begun, never ended
			t.Fatal(err)
		}
	}
	waitFor(t, "the strangers' fetches refused", func() bool { return admin.sharing.refused.Load() == maxFetchServing })
	bin := &sharedBinary{Version: "1", SHA256: strings.Repeat("ab", 32), Size: 10}
	if err := b.fetchFrom(admin.ID(), "x", bin); err == nil || !strings.Contains(err.Error(), "no plugin with sha256") {
		t.Fatalf("a fetch from a node that counts, with strangers at the door: %v", err)
	}
	if busy := admin.sharing.busy.Load(); busy != 0 {
		t.Errorf("%d fetches refused as busy", busy)
	}
}

// The shared store keeps what plugin entries name: binaries no entry
// names any more and partial downloads are removed once left alone for
// sharedStale; anything else in the dir is left alone.
func TestSharedStoreIsPruned(t *testing.T) {
	n := startNode(t, loopbackConfig(t, "a"))
	named, unnamed, fresh := strings.Repeat("a", 64), strings.Repeat("b", 64), strings.Repeat("c", 64)
	rec, _ := json.Marshal(pluginRecord{Binary: &sharedBinary{Version: "1", SHA256: named, Size: 1}})
	if _, err := n.replica.Put(context.Background(), pluginKey("t", "p"), rec); err != nil {
		t.Fatal(err)
	}
	store := filepath.Join(n.pluginDir(), "shared")
	old := time.Now().Add(-time.Hour)
	write := func(path string, mtime time.Time) {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte("x"), 0o755); err != nil {
			t.Fatal(err)
		}
		os.Chtimes(path, mtime, mtime)
	}
	write(filepath.Join(store, named, "p"), old)
	write(filepath.Join(store, named, ".p-1"), old)        // a crash's partial download
	write(filepath.Join(store, named, ".p-2"), time.Now()) // a fetch under way
	write(filepath.Join(store, unnamed, "p"), old)
	write(filepath.Join(store, fresh, "p"), old)
	write(filepath.Join(store, "notes", "x"), old)
	for _, d := range []string{named, unnamed, "notes"} {
		os.Chtimes(filepath.Join(store, d), old, old)
	}
	n.pruneShared()
	for path, want := range map[string]bool{
		filepath.Join(store, named, "p"):    true,
		filepath.Join(store, named, ".p-1"): false,
		filepath.Join(store, named, ".p-2"): true,
		filepath.Join(store, unnamed):       false,
		filepath.Join(store, fresh, "p"):    true, // stored a moment ago: its entry may be on its way
		filepath.Join(store, "notes", "x"):  true,
	} {
		if _, err := os.Stat(path); (err == nil) != want {
			t.Errorf("%s: kept %v, want %v", path, err == nil, want)
		}
	}
}

// A shared plugin runs only from a store only this user (or root) can
// change, as a local one runs only from such a plugin dir: a store dir
// group or others may write, or a symlink in its place, is refused, and
// nothing is fetched into it (whoever can write it could swap the binary
// between its hash check and its start, or before a restart).
func TestSharedPluginNeedsASafeStore(t *testing.T) {
	c := loopbackConfig(t, "a")
	c.Trusted, c.AcceptPlugins = []string{identity(t, c).String()}, AcceptTrusted
	n := startNode(t, c)
	src := []byte("#!/bin/sh\nread line\n" +
		`printf '{"jsonrpc":"2.0","id":0,"result":{"protocol":1,"name":"shok","version":"1","kind":"processor","methods":["x"]}}\n'` +
		"\nread line\n") // the shutdown: it exits
	sum := sha256.Sum256(src)
	bin := &sharedBinary{Version: "1", SHA256: hex.EncodeToString(sum[:]), Size: int64(len(src))}
	path := n.sharedPath(bin, "shok")
	if err := writeExecutable(path, src); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{n.pluginDir(), filepath.Dir(filepath.Dir(path)), filepath.Dir(path)} {
		os.Chmod(d, 0o755)
	}
	inst, err := n.loadShared("shok", "t", nil, bin)
	if err != nil {
		t.Fatalf("from a safe store: %v", err)
	}
	inst.Close()
	for _, d := range []string{n.pluginDir(), filepath.Dir(filepath.Dir(path)), filepath.Dir(path)} {
		os.Chmod(d, 0o775)
		if inst, err := n.loadShared("shok", "t", nil, bin); err == nil || !strings.Contains(err.Error(), "writable by group or others") {
			if inst != nil {
				inst.Close()
			}
			t.Errorf("%s writable by group: %v", d, err)
		}
		os.Chmod(d, 0o755)
	}
	// The hash's dir a symlink to another dir of this user's.
	other := t.TempDir()
	if err := os.Rename(filepath.Dir(path), filepath.Join(other, "x")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(other, "x"), filepath.Dir(path)); err != nil {
		t.Fatal(err)
	}
	if inst, err := n.loadShared("shok", "t", nil, bin); err == nil || !strings.Contains(err.Error(), "not a dir") {
		if inst != nil {
			inst.Close()
		}
		t.Errorf("a symlinked store dir: %v", err)
	}
	if err := n.fetchFrom(n.ID(), "shok", bin); err == nil || !strings.Contains(err.Error(), "not a dir") {
		t.Errorf("a fetch into a symlinked store dir: %v", err)
	}
}
