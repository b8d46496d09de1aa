package gossip

import (
	"crypto/sha256"
	"encoding/binary"
	"slices"
)

// The digest is a virtual 16-ary hash tree over 64-bit key hashes: the node
// at depth d with value v covers the keys whose hash starts with the d
// nibbles of v. A node's hash is the XOR of the version hashes of the
// entries under it, so two replicas compare a subtree by one number and
// descend only where they differ: a sync costs in proportion to the
// difference, not to the state.
//
// Physically there are 256 buckets (the first two nibbles), each a slice
// sorted by key hash; deeper nodes are ranges found by binary search.

const (
	bucketBits = 8
	numBuckets = 1 << bucketBits
	// MaxDepth is the deepest node: 16 nibbles cover the whole key hash.
	MaxDepth = 16
)

type digestItem struct {
	khash uint64 // hash of the key: its place in the tree
	vhash uint64 // hash of the version (the signed envelope)
	key   string
}

type digest struct {
	buckets [numBuckets][]digestItem
	xors    [numBuckets]uint64
}

func keyHash(key string) uint64 {
	h := sha256.Sum256([]byte(key))
	return binary.BigEndian.Uint64(h[:8])
}

func versionHash(s *Signed) uint64 { return binary.BigEndian.Uint64(s.Hash[:8]) }

// put records key's current version hash (replacing any older one).
func (d *digest) put(key string, khash, vhash uint64) {
	b := khash >> (64 - bucketBits)
	items := d.buckets[b]
	i, found := slices.BinarySearchFunc(items, khash, cmpItem)
	if found {
		d.xors[b] ^= items[i].vhash ^ vhash
		items[i].vhash = vhash
		return
	}
	d.buckets[b] = slices.Insert(items, i, digestItem{khash: khash, vhash: vhash, key: key})
	d.xors[b] ^= vhash
}

// remove drops key from the digest.
func (d *digest) remove(khash uint64) {
	b := khash >> (64 - bucketBits)
	items := d.buckets[b]
	i, found := slices.BinarySearchFunc(items, khash, cmpItem)
	if !found {
		return
	}
	d.xors[b] ^= items[i].vhash
	d.buckets[b] = slices.Delete(items, i, i+1)
}

func cmpItem(it digestItem, k uint64) int {
	switch {
	case it.khash < k:
		return -1
	case it.khash > k:
		return 1
	}
	return 0
}

// NodeRef names a node of the digest tree.
type NodeRef struct {
	Depth uint8  // 0 (root) to MaxDepth
	Value uint64 // the first Depth nibbles of the key hashes under it
}

// span is the key-hash range [lo, hi] the node covers.
func (n NodeRef) span() (lo, hi uint64) {
	if n.Depth == 0 {
		return 0, ^uint64(0)
	}
	shift := 64 - 4*uint(n.Depth)
	lo = n.Value << shift
	return lo, lo | (1<<shift - 1)
}

// Child is the node's i-th child (i < 16).
func (n NodeRef) Child(i int) NodeRef {
	return NodeRef{Depth: n.Depth + 1, Value: n.Value<<4 | uint64(i)}
}

// valid reports whether the ref names a node.
func (n NodeRef) valid() bool {
	return n.Depth <= MaxDepth && (n.Depth == MaxDepth || n.Value < 1<<(4*uint(n.Depth)))
}

// items calls f for every item under n.
func (d *digest) items(n NodeRef, f func(digestItem)) {
	lo, hi := n.span()
	for b := lo >> (64 - bucketBits); b <= hi>>(64-bucketBits); b++ {
		items := d.buckets[b]
		i, _ := slices.BinarySearchFunc(items, lo, cmpItem)
		for ; i < len(items) && items[i].khash <= hi; i++ {
			f(items[i])
		}
		if b == numBuckets-1 {
			break
		}
	}
}

// hash returns the XOR of version hashes and the number of entries under n.
func (d *digest) hash(n NodeRef) (h uint64, count int) {
	if n.Depth <= bucketBits/4 {
		// Whole buckets: use the kept XORs.
		lo, hi := n.span()
		for b := lo >> (64 - bucketBits); b <= hi>>(64-bucketBits); b++ {
			h ^= d.xors[b]
			count += len(d.buckets[b])
			if b == numBuckets-1 {
				break
			}
		}
		return h, count
	}
	d.items(n, func(it digestItem) { h ^= it.vhash; count++ })
	return h, count
}

// lookup finds the key with hash khash.
func (d *digest) lookup(khash uint64) (string, uint64, bool) {
	items := d.buckets[khash>>(64-bucketBits)]
	i, found := slices.BinarySearchFunc(items, khash, cmpItem)
	if !found {
		return "", 0, false
	}
	return items[i].key, items[i].vhash, true
}
