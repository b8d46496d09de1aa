package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
)

// rememberedFile is where the peers a node has seen are kept, so that a
// restarted node finds its fleet again without --join.
const rememberedFile = "peers.json"

// rememberedPeer is one row of peers.json.
type rememberedPeer struct {
	ID       string    `json:"id"`
	Addrs    []string  `json:"addrs"`
	LastSeen time.Time `json:"last_seen"`

	// Dial bookkeeping, not persisted.
	failures int
	nextDial time.Time
}

// maxRememberedAddrs bounds the addresses kept of one peer. Identify
// takes up to 500 of a connected peer's (libp2p's cap): a member that
// declared that many had every agent that remembered it write them all
// out and dial them all after each restart. An agent declares two per
// address of its host (TCP and QUIC), so this leaves room for 16 of them.
const maxRememberedAddrs = 32

// remembered is the set of peers seen, newest first, capped at max.
// Safe for concurrent use.
type remembered struct {
	path   string
	max    int
	saveMu sync.Mutex // one save at a time, so an older snapshot never lands last

	mu    sync.Mutex
	peers map[peer.ID]*rememberedPeer
	dirty bool
}

// loadRemembered reads path. A missing file is an empty set; a corrupt one
// is an empty set and a warning (it is a cache, rewritten soon after).
func loadRemembered(path string, max int) (*remembered, error) {
	r := &remembered{path: path, max: max, peers: map[peer.ID]*rememberedPeer{}}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return r, nil
	}
	if err != nil {
		return r, fmt.Errorf("read %s: %w", path, err)
	}
	var file struct {
		Peers []*rememberedPeer `json:"peers"`
	}
	if err := json.Unmarshal(b, &file); err != nil {
		return r, fmt.Errorf("%s is not valid: %w", path, err)
	}
	for _, rp := range file.Peers {
		id, err := peer.Decode(rp.ID)
		if err != nil {
			continue
		}
		rp.Addrs = rp.Addrs[:min(len(rp.Addrs), maxRememberedAddrs)]
		r.peers[id] = rp
	}
	r.trim()
	return r, nil
}

// seen records that p was connected at addrs now. It reports whether p is
// new, in which case the caller should save at once.
func (r *remembered) seen(p peer.ID, addrs []ma.Multiaddr, now time.Time) bool {
	strs := make([]string, 0, len(addrs))
	for _, a := range addrs {
		strs = append(strs, a.String())
	}
	slices.Sort(strs)
	strs = strs[:min(len(strs), maxRememberedAddrs)]
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dirty = true
	rp, ok := r.peers[p]
	if !ok {
		r.peers[p] = &rememberedPeer{ID: p.String(), Addrs: strs, LastSeen: now}
		r.trim()
		return true
	}
	rp.LastSeen, rp.failures, rp.nextDial = now, 0, time.Time{}
	if len(strs) > 0 {
		rp.Addrs = strs
	}
	return false
}

// trim drops the oldest peers beyond max. Callers hold r.mu.
func (r *remembered) trim() {
	if len(r.peers) <= r.max {
		return
	}
	all := r.sorted()
	for _, rp := range all[r.max:] {
		id, _ := peer.Decode(rp.ID)
		delete(r.peers, id)
	}
}

// sorted returns the peers newest first. Callers hold r.mu.
func (r *remembered) sorted() []*rememberedPeer {
	all := make([]*rememberedPeer, 0, len(r.peers))
	for _, rp := range r.peers {
		all = append(all, rp)
	}
	slices.SortFunc(all, func(a, b *rememberedPeer) int {
		if c := b.LastSeen.Compare(a.LastSeen); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return all
}

// due returns the remembered peers, newest first, that skip does not
// pass over (connected ones, say) and whose backoff has passed.
func (r *remembered) due(now time.Time, skip func(peer.ID) bool) []peer.AddrInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []peer.AddrInfo
	for _, rp := range r.sorted() {
		id, err := peer.Decode(rp.ID)
		if err != nil || skip(id) || now.Before(rp.nextDial) {
			continue
		}
		ai := peer.AddrInfo{ID: id}
		for _, s := range rp.Addrs {
			if a, err := ma.NewMultiaddr(s); err == nil {
				ai.Addrs = append(ai.Addrs, a)
			}
		}
		out = append(out, ai)
	}
	return out
}

// failed pushes p's next dial back by wait.
func (r *remembered) failed(p peer.ID, now time.Time, wait func(failures int) time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rp, ok := r.peers[p]; ok {
		rp.failures++
		rp.nextDial = now.Add(wait(rp.failures))
	}
}

// save writes the set if it changed since the last save, atomically.
func (r *remembered) save() error {
	r.saveMu.Lock()
	defer r.saveMu.Unlock()
	r.mu.Lock()
	if !r.dirty {
		r.mu.Unlock()
		return nil
	}
	b, err := json.MarshalIndent(struct {
		Peers []*rememberedPeer `json:"peers"`
	}{r.sorted()}, "", "  ")
	r.dirty = false
	r.mu.Unlock()
	if err != nil {
		return fmt.Errorf("node: encode remembered peers: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(r.path), ".tmp-peers-*")
	if err != nil {
		return fmt.Errorf("node: save remembered peers: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("node: save remembered peers: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("node: save remembered peers: %w", err)
	}
	if err := os.Rename(tmp.Name(), r.path); err != nil {
		return fmt.Errorf("node: save remembered peers: %w", err)
	}
	return nil
}
