package node

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/internal/fsperm"
	"github.com/tribeagent/tribe/internal/strictjson"
	"github.com/tribeagent/tribe/node/api"
	"github.com/tribeagent/tribe/plugins"
	"github.com/tribeagent/tribe/plugins/external"
	"github.com/tribeagent/tribe/plugins/external/wire"
)

// Shared plugins: `tribe plugin add FILE --tribe T` (trusted writers) puts
// the binary's version, sha256 and size in the plugin's entry, and keeps
// the binary in the writer's shared store. A member that opted in
// (--accept-plugins trusted) fetches it from any peer that has it over
// PluginFetchProtocol, checks the hash, installs it in its own shared
// store and loads it; one that did not reports it not installed and runs
// nothing it was sent.

// PluginFetchProtocol serves a shared plugin's bytes by hash: the request
// is one line {"sha256": HEX}; the answer one line {"size": N} and then N
// bytes, or {"error": "..."}. Only nodes that count (admitted, or any peer
// with no trust list) are served.
const PluginFetchProtocol = "/tribe/plugin-fetch/1.0.0"

// AcceptTrusted is the --accept-plugins value that takes shared plugins.
const AcceptTrusted = "trusted"

// maxSharedPlugin caps a shared plugin's size.
const maxSharedPlugin = 256 << 20

// sharedBinary is the binary part of a plugin entry written by `plugin add`.
type sharedBinary struct {
	Version string `json:"version"`
	SHA256  string `json:"sha256"`
	Size    int64  `json:"size"`
}

// isSHA256 reports whether s is a sha256 in lower-case hex.
func isSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func (b *sharedBinary) check() error {
	switch {
	case !isSHA256(b.SHA256):
		return fmt.Errorf("sha256 %q: want 64 lower-case hex digits", b.SHA256)
	case b.Size <= 0 || b.Size > maxSharedPlugin:
		return fmt.Errorf("size %d: want 1 byte to %d MiB", b.Size, maxSharedPlugin>>20)
	case b.Version == "" || len(b.Version) > 64:
		return fmt.Errorf("version %q: want 1 to 64 bytes", b.Version)
	}
	return nil
}

func (b *sharedBinary) source() string { return plugins.SourceShared + " sha256:" + b.SHA256[:16] }

// sharing is the node's side of shared plugins.
type sharing struct {
	mu       sync.Mutex
	fetching map[string]bool // by sha256
	failed   map[string]string
	turns    map[string]int // see turn

	hashMismatch atomic.Int64 // fetched bytes whose hash was not the entry's
	badAnswer    atomic.Int64 // fetch answers that did not read, offered another size, or ended before it
	refused      atomic.Int64 // fetch requests refused (not counted, malformed)
	busy         atomic.Int64 // fetch requests refused: too many served, or the peer cooling down
	serving      *gossip.Slots
}

// fetchHeaderMax bounds the first line of a fetch's answer ({"size": N}
// or {"error": ...}).
const fetchHeaderMax = 1024

// maxFetchServing bounds the plugin fetches a node serves at once (one per
// peer): a binary can be 256 MiB, and members fetch it once each.
const maxFetchServing = 4

// fetchRequestWait bounds the wait for a fetch request (one short line,
// written as the stream opens) and for writing a refusal.
const fetchRequestWait = 5 * time.Second

// sharedPath is where a shared plugin's binary is kept: named after the
// plugin (its handshake says that name), in a dir named after its hash.
func (n *Node) sharedPath(b *sharedBinary, name string) string {
	return filepath.Join(n.pluginDir(), "shared", b.SHA256, name)
}

// fileSHA256 is the hex sha256 of the file at path, and its size.
func fileSHA256(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	size, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), size, nil
}

// errNotShared is what a member that did not opt in reports.
var errNotShared = errors.New("not installed here (sharing is off: --accept-plugins trusted takes plugins from trusted writers)")

// loadShared loads plugin name, shared as b, for tribe: from this node's
// shared store if a copy with the right hash is there, else it starts
// fetching one (and the plugin loop tries again once it is installed).
func (n *Node) loadShared(name, tribe string, config map[string]string, b *sharedBinary) (*plugins.Instance, error) {
	if n.cfg.AcceptPlugins != AcceptTrusted || n.rules().Open() {
		return nil, errNotShared
	}
	if err := b.check(); err != nil {
		return nil, fmt.Errorf("shared plugin entry: %w", err)
	}
	if err := n.checkSharedStore(b); err != nil {
		return nil, err
	}
	path := n.sharedPath(b, name)
	sum, _, err := fileSHA256(path)
	switch {
	case err == nil && sum == b.SHA256:
		return plugins.LoadWith(external.Factory(path, n.externalConfig()), name, tribe, config)
	case err == nil:
		n.sharing.hashMismatch.Add(1)
		n.log.Warn("a shared plugin's copy here does not match its hash; fetching it again", "plugin", name, "path", path)
		os.Remove(path)
	}
	n.sharing.mu.Lock()
	defer n.sharing.mu.Unlock()
	if why, ok := n.sharing.failed[b.SHA256]; ok {
		return nil, fmt.Errorf("could not fetch it (sha256:%s) from any peer: %s; trying again", b.SHA256[:16], why)
	}
	if !n.sharing.fetching[b.SHA256] {
		if n.sharing.fetching == nil {
			n.sharing.fetching, n.sharing.failed, n.sharing.turns = map[string]bool{}, map[string]string{}, map[string]int{}
		}
		n.sharing.fetching[b.SHA256] = true
		n.spawn(func() { n.fetchShared(name, tribe, b) })
	}
	return nil, fmt.Errorf("fetching it (sha256:%s) from peers", b.SHA256[:16])
}

// checkSharedStore says why the dirs that lead to b's binary in the shared
// store could be changed by someone other than this user or root, as Find
// does for the plugin dir: whoever could write one could swap the binary
// between its hash check and its start, or before a restart (which runs
// the file again, unchecked). The plugin dir may be a symlink, as for
// local plugins; shared/ and its hash dirs, which the agent makes, may
// not. A dir not made yet is no concern: a fetch makes it.
func (n *Node) checkSharedStore(b *sharedBinary) error {
	dir := n.pluginDir()
	fi, err := os.Stat(dir)
	for _, next := range []string{"shared", b.SHA256, ""} {
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return nil
		case err != nil:
			return fmt.Errorf("shared plugin store: %w", err)
		case !fi.IsDir():
			return fmt.Errorf("shared plugin store: %s is not a dir (a symlink is not followed)", dir)
		case fsperm.Unsafe(fi) != "":
			return fmt.Errorf("shared plugin store: %s is %s: anyone who can write it could run code as the agent", dir, fsperm.Unsafe(fi))
		}
		if next != "" {
			dir = filepath.Join(dir, next)
			fi, err = os.Lstat(dir)
		}
	}
	return nil
}

// sharedRetry is how long a shared plugin no peer could give waits before
// it is asked for again; sharedRetryUnconnected, when no peer that may
// have it was connected to ask.
const (
	sharedRetry            = 30 * time.Second
	sharedRetryUnconnected = 2 * time.Second
)

// fetchShared fetches b from the peers likeliest to have it, the entry's
// writer and the tribe's members, until one gives bytes with its hash;
// then it installs them and pokes the plugin loop.
func (n *Node) fetchShared(name, tribe string, b *sharedBinary) {
	var sources []peer.ID
	if e, ok := n.replica.Get(pluginKey(tribe, name)); ok {
		sources = append(sources, e.Author)
	}
	for _, id := range n.tribeMembers(tribe) {
		if id != n.host.ID() && (len(sources) == 0 || id != sources[0]) {
			sources = append(sources, id)
		}
	}
	var errs []error
	asked := false
	for _, p := range sources {
		if n.host.Network().Connectedness(p) != network.Connected {
			continue
		}
		asked = true
		err := n.fetchFrom(p, name, b)
		if err == nil {
			n.log.Info("shared plugin installed", "plugin", name, "sha256", b.SHA256, "from", p)
			errs = nil
			break
		}
		errs = append(errs, fmt.Errorf("%s: %w", p, err))
		n.log.Warn("fetching a shared plugin", "plugin", name, "from", p, "err", err)
	}
	retry := sharedRetry
	if !asked { // a node that just started: its peers connect in moments
		errs, retry = []error{errors.New("no peer that may have it is connected")}, sharedRetryUnconnected
	}
	n.sharing.mu.Lock()
	delete(n.sharing.fetching, b.SHA256)
	n.sharing.turns[b.SHA256]++
	if len(errs) > 0 {
		n.sharing.failed[b.SHA256] = errors.Join(errs...).Error()
		time.AfterFunc(retry, func() {
			n.sharing.mu.Lock()
			delete(n.sharing.failed, b.SHA256)
			n.sharing.turns[b.SHA256]++
			n.sharing.mu.Unlock()
			n.pokePlugins()
		})
	}
	n.sharing.mu.Unlock()
	n.pokePlugins()
}

// turn counts, by hash, the fetches that ended and the waits after a
// failed one that ran out: a shared plugin that did not load when the
// count was lower may load now (syncPlugins loads it again).
func (s *sharing) turn(sha string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.turns[sha]
}

// fetchFrom asks p for b's bytes and installs them if their hash is b's.
func (n *Node) fetchFrom(p peer.ID, name string, b *sharedBinary) error {
	path := n.sharedPath(b, name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := n.checkSharedStore(b); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(n.ctx, time.Minute)
	defer cancel()
	n.learnRecordAddrs(p)
	defer n.useCallConn(p)()
	s, err := n.host.NewStream(ctx, p, PluginFetchProtocol)
	if err != nil {
		return err
	}
	defer s.Close()
	if dl, ok := ctx.Deadline(); ok {
		s.SetDeadline(dl)
	}
	req, _ := json.Marshal(pluginFetchRequest{SHA256: b.SHA256})
	if _, err := s.Write(append(req, '\n')); err != nil {
		return err
	}
	s.CloseWrite()
	// The answer's first line is small: a peer that sends more without
	// a newline is cut off there (ErrBufferFull), not buffered.
	br := bufio.NewReaderSize(s, fetchHeaderMax)
	line, err := br.ReadSlice('\n')
	if err != nil {
		return fmt.Errorf("no answer: %w", err)
	}
	if err := decodeFetchHeader(line, b.Size); err != nil {
		if errors.Is(err, errBadFetchAnswer) {
			n.sharing.badAnswer.Add(1)
		}
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+name+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	h := sha256.New()
	_, err = io.CopyN(io.MultiWriter(tmp, h), br, b.Size)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	// A peer that closed before the size it offered answered badly; a
	// reset or a deadline may be the network's doing, and is not counted.
	if errors.Is(err, io.EOF) {
		n.sharing.badAnswer.Add(1)
	}
	if err != nil {
		return fmt.Errorf("the bytes were cut short: %w", err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != b.SHA256 {
		n.sharing.hashMismatch.Add(1)
		return fmt.Errorf("refused: its bytes hash to sha256:%s, the entry says sha256:%s", got[:16], b.SHA256[:16])
	}
	if err := os.Chmod(tmp.Name(), 0o755); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// errBadFetchAnswer is a plugin fetch answer that does not read, or
// offers other than the entry's size.
var errBadFetchAnswer = errors.New("a bad plugin fetch answer")

// decodeFetchHeader reads the first line of a plugin fetch's answer: the
// size that follows, which must be want, or the peer's refusal, returned
// as an error.
func decodeFetchHeader(line []byte, want int64) error {
	var head struct {
		Size  int64  `json:"size"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(line, &head); err != nil {
		return fmt.Errorf("%w: %v", errBadFetchAnswer, err)
	}
	if head.Error != "" {
		return errors.New(head.Error)
	}
	if head.Size != want {
		return fmt.Errorf("%w: it offers %d bytes, the entry says %d", errBadFetchAnswer, head.Size, want)
	}
	return nil
}

type pluginFetchRequest struct {
	SHA256 string `json:"sha256"`
}

// decodePluginFetchRequest parses a fetch request line, strictly.
func decodePluginFetchRequest(line []byte) (string, error) {
	var req pluginFetchRequest
	if err := strictjson.Decode(line, &req); err != nil {
		return "", fmt.Errorf("not a fetch request: %w", err)
	}
	if !isSHA256(req.SHA256) {
		return "", fmt.Errorf("sha256 %q is not 64 lower-case hex digits", req.SHA256)
	}
	return req.SHA256, nil
}

// serveSharedPlugin answers a fetch from this node's shared store. Who
// asks is checked first and the request read (a line) before a slot is
// taken: four strangers that sent nothing used to hold every slot for the
// transfer's minute.
func (n *Node) serveSharedPlugin(s network.Stream) {
	from := s.Conn().RemotePeer()
	defer s.Close()
	refuse := func(format string, args ...any) {
		n.sharing.refused.Add(1)
		b, _ := json.Marshal(map[string]string{"error": fmt.Sprintf(format, args...)})
		s.SetWriteDeadline(time.Now().Add(fetchRequestWait))
		s.Write(append(b, '\n'))
	}
	if rules := n.rules(); !rules.Open() && !rules.Counts(from) {
		refuse("%s is %s here: shared plugins go to nodes that count", from, rules.Status(from))
		return
	}
	s.SetReadDeadline(time.Now().Add(fetchRequestWait))
	line, err := bufio.NewReader(io.LimitReader(s, 256)).ReadBytes('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		n.sharing.refused.Add(1)
		s.Reset()
		return
	}
	sum, err := decodePluginFetchRequest(line)
	if err != nil {
		refuse("%v", err)
		return
	}
	if n.replica.Penalised(from) || !n.sharing.serving.Acquire(from) {
		n.sharing.busy.Add(1)
		s.Reset() // the fetcher asks the next peer
		return
	}
	defer n.sharing.serving.Release(from)
	s.SetDeadline(time.Now().Add(time.Minute))
	dir := filepath.Join(n.pluginDir(), "shared", sum)
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		if !e.Type().IsRegular() || !wire.ValidName(e.Name()) {
			continue
		}
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			continue
		}
		b, _ := json.Marshal(map[string]int64{"size": fi.Size()})
		if _, err := s.Write(append(b, '\n')); err == nil {
			io.Copy(s, f)
		}
		return
	}
	refuse("no plugin with sha256:%s here", sum[:16])
}

// addShared is `tribe plugin add FILE`: the file must be a plugin (it is
// started and shakes hands) named as its file; it is copied into this
// node's shared store, and its version, hash and size returned for the
// entry.
func (n *Node) addShared(name, file string) (*sharedBinary, error) {
	if !filepath.IsAbs(file) {
		return nil, api.BadRequest(fmt.Errorf("%s: the file's absolute path, please", file))
	}
	if filepath.Base(file) != name {
		return nil, api.BadRequest(fmt.Errorf("%s: a plugin is named after its file, here %q", file, filepath.Base(file)))
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, api.BadRequest(err)
	}
	src, err := io.ReadAll(io.LimitReader(f, maxSharedPlugin+1))
	f.Close()
	switch {
	case err != nil:
		return nil, api.BadRequest(err)
	case len(src) > maxSharedPlugin:
		return nil, api.BadRequest(fmt.Errorf("%s is over the %d MiB a shared plugin may be", file, maxSharedPlugin>>20))
	}
	sum := sha256.Sum256(src)
	b := &sharedBinary{SHA256: hex.EncodeToString(sum[:]), Size: int64(len(src))}
	path := n.sharedPath(b, name)
	if err := writeExecutable(path, src); err != nil {
		return nil, err
	}
	p, err := external.Start(path, n.externalConfig())
	if err != nil {
		os.Remove(path)
		return nil, api.BadRequest(fmt.Errorf("%s is not a plugin this agent can run: %w", file, err))
	}
	b.Version = p.Version()
	p.Close()
	return b, nil
}

// writeExecutable puts src at path through a new file renamed into place:
// a copy at path may be running (writing over it fails, ETXTBSY).
func writeExecutable(path string, src []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(src)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o755)
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// sharedStale is how long a file or dir of the shared store must have
// been left alone before pruneShared takes it: a fetch writes for at most
// a minute, and `plugin add` stores the binary just before its entry.
const sharedStale = 10 * time.Minute

// sharedPruneEvery is how often pruneShared runs (and first, after start).
const sharedPruneEvery = 10 * time.Minute

// pruneLoop prunes the shared store every sharedPruneEvery.
func (n *Node) pruneLoop() {
	for n.sleep(sharedPruneEvery) {
		n.pruneShared()
	}
}

// pruneShared removes from the shared store the binaries no plugin entry
// names any more (an older version after `plugin add` of a newer one, a
// plugin unloaded from its tribes) and the partial downloads a crash left
// behind, once each has been left alone for sharedStale: each binary may
// be 256 MiB, and every member that opted in keeps a copy. What is not a
// sha256-named dir or a download of ours is left alone, and so is a
// plugin dir outside the data dir (--plugin-dir), which other agents on
// the host may share.
func (n *Node) pruneShared() {
	if rel, err := filepath.Rel(n.cfg.DataDir, n.pluginDir()); err != nil || !filepath.IsLocal(rel) {
		return // a plugin dir of its own, which other agents may share: theirs to keep
	}
	dir := filepath.Join(n.pluginDir(), "shared")
	dirs, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	// No plugin loads meanwhile: one whose entry arrived after the look
	// below could start from a binary about to be removed.
	n.plugins.syncMu.Lock()
	defer n.plugins.syncMu.Unlock()
	named := map[string]bool{}
	for _, e := range n.replica.Prefix(tribesPrefix) {
		if segs := strings.Split(e.Key, "/"); len(segs) != 4 || segs[2] != "plugins" {
			continue
		}
		var rec pluginRecord
		if json.Unmarshal(e.Value, &rec) == nil && rec.Binary != nil {
			named[rec.Binary.SHA256] = true
		}
	}
	n.sharing.mu.Lock()
	for sha := range n.sharing.fetching {
		named[sha] = true
	}
	n.sharing.mu.Unlock()
	stale := func(d os.DirEntry) bool {
		info, err := d.Info()
		return err == nil && time.Since(info.ModTime()) >= sharedStale // a file's time is the host's clock, whatever n.now is
	}
	for _, d := range dirs {
		path := filepath.Join(dir, d.Name())
		if !d.IsDir() || !isSHA256(d.Name()) || !stale(d) && !named[d.Name()] {
			continue
		}
		if !named[d.Name()] {
			if err := os.RemoveAll(path); err != nil {
				n.log.Warn("removing a shared plugin no entry names", "path", path, "err", err)
			} else {
				n.log.Info("removed a shared plugin no entry names", "sha256", d.Name())
			}
			continue
		}
		files, _ := os.ReadDir(path)
		for _, f := range files {
			if strings.HasPrefix(f.Name(), ".") && f.Type().IsRegular() && stale(f) {
				os.Remove(filepath.Join(path, f.Name()))
			}
		}
	}
}
