package gossip

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	pb "github.com/libp2p/go-libp2p-pubsub/pb"
	"github.com/libp2p/go-libp2p/core/peer"
)

// makeEntries signs n entries under tribes/… by a few authors, with values
// of about valueSize bytes.
func makeEntries(b *testing.B, n, valueSize int) []*Signed {
	rng := rand.New(rand.NewPCG(42, 42))
	authors := []*author{newAuthor(b, rng), newAuthor(b, rng), newAuthor(b, rng)}
	value := make([]byte, valueSize)
	for i := range value {
		value[i] = 'a' + byte(i%26)
	}
	out := make([]*Signed, n)
	for i := range out {
		out[i] = authors[i%len(authors)].write(b, t0, fmt.Sprintf("tribes/t%07d", i), string(value), false)
	}
	return out
}

// BenchmarkMergeVsVerify: entries merged per second, each opened (envelope
// decode and signature check) and applied, against raw ed25519 verifies
// per second of a same-size message, timed side by side. Target: at least
// 0.8x.
func BenchmarkMergeVsVerify(b *testing.B) {
	const n = 20000
	entries := makeEntries(b, n, 100)
	raws := make([][]byte, n)
	for i, e := range entries {
		raws[i] = e.Raw
	}
	pub, priv, _ := ed25519.GenerateKey(nil)
	msg := make([]byte, len(raws[0]))
	sig := ed25519.Sign(priv, msg)
	b.ResetTimer()
	var merge, verify time.Duration
	for range b.N {
		s := NewState(NewTrust())
		start := time.Now()
		for _, raw := range raws {
			e, err := Open(raw)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := s.Apply(e, t0); err != nil {
				b.Fatal(err)
			}
		}
		merge += time.Since(start)
		start = time.Now()
		for range raws {
			if !ed25519.Verify(pub, msg, sig) {
				b.Fatal("verify")
			}
		}
		verify += time.Since(start)
	}
	total := float64(n * b.N)
	b.ReportMetric(total/merge.Seconds(), "merges/s")
	b.ReportMetric(total/verify.Seconds(), "verifies/s")
	b.ReportMetric(verify.Seconds()/merge.Seconds(), "merge/verify_ratio")
}

// BenchmarkValidateFlood: what the topic validator spends on a message
// of a node that does not count (a policy membership of a made-up
// identity: what any peer that can connect may send as fast as it likes,
// refused before its signature is checked), against one it takes (an
// admitted node's membership: its signature checked), side by side.
// Reports how many of the first cost as much as one of the second.
func BenchmarkValidateFlood(b *testing.B) {
	const n = 2000
	rng := rand.New(rand.NewPCG(11, 12))
	writer, admitted := newAuthor(b, rng), newAuthor(b, rng)
	net := trustedNet(b, writer, admitted)
	flood, taken := make([]*pubsub.Message, n), make([]*pubsub.Message, n)
	for i := range n {
		a := newAuthor(b, rng)
		e := a.write(b, t0, "tribes/web/members/"+a.id.String()+"/policy", `{"policies":["web"]}`, false)
		flood[i] = &pubsub.Message{Message: &pb.Message{Data: e.Raw}}
		e = admitted.write(b, t0, fmt.Sprintf("tribes/t%d/members/%s/policy", i, admitted.id), `{"policies":["web"]}`, false)
		taken[i] = &pubsub.Message{Message: &pb.Message{Data: e.Raw}}
	}
	ctx := context.Background()
	b.ResetTimer()
	var refusing, taking time.Duration
	for range b.N {
		start := time.Now()
		for _, m := range flood {
			if net.r.validate(ctx, writer.id, m) != pubsub.ValidationIgnore {
				b.Fatal("a made-up node's membership was not ignored")
			}
		}
		refusing += time.Since(start)
		start = time.Now()
		for _, m := range taken {
			if net.r.validate(ctx, writer.id, m) != pubsub.ValidationAccept {
				b.Fatal("an admitted node's membership was not accepted")
			}
		}
		taking += time.Since(start)
	}
	total := float64(n * b.N)
	b.ReportMetric(total/refusing.Seconds(), "refused/s")
	b.ReportMetric(total/taking.Seconds(), "taken/s")
	b.ReportMetric(taking.Seconds()/refusing.Seconds(), "refused_per_taken")
}

// BenchmarkCatchUp: a replica missing 10,000 of 100,000 entries pulls
// from a full one through the wire codec. Reports the bytes that crossed
// (both ways, with frames) against the size of the missing entries
// (target: at most 2x), the rounds, and the time.
func BenchmarkCatchUp(b *testing.B) {
	const total, missing = 100000, 10000
	entries := makeEntries(b, total, 100)
	full := NewState(NewTrust())
	for _, e := range entries {
		full.Apply(e, t0)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	skip := map[int]bool{}
	for len(skip) < missing {
		skip[rng.IntN(total)] = true
	}
	missingBytes := 0
	for i := range skip {
		missingBytes += len(entries[i].Raw)
	}
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		partial := NewState(NewTrust())
		for i, e := range entries {
			if !skip[i] {
				partial.Apply(e, t0)
			}
		}
		b.StartTimer()
		start := time.Now()
		sent, rounds := pull(b, partial, full)
		took := time.Since(start)
		if partial.Root() != full.Root() {
			b.Fatal("not caught up")
		}
		b.ReportMetric(float64(sent)/float64(missingBytes), "bytes/missing_ratio")
		b.ReportMetric(float64(sent)/(1<<20), "MiB_sent")
		b.ReportMetric(float64(missingBytes)/(1<<20), "MiB_missing")
		b.ReportMetric(float64(rounds), "rounds")
		b.ReportMetric(float64(took.Milliseconds()), "catchup_ms")
	}
}

// pull is pullAll with frame bytes counted and rounds returned.
func pull(b *testing.B, dst, src *State) (sent, rounds int) {
	req := dst.StartPull(Full)
	for rounds = 1; ; rounds++ {
		qb := EncodeRequest(req)
		rb := EncodeResponse(src.Respond(req, respondBudget, Full))
		sent += len(qb) + len(rb) + 2*4 // uvarint frames, at most 4 bytes each
		resp, err := DecodeResponse(rb)
		if err != nil {
			b.Fatal(err)
		}
		for _, raw := range resp.Entries {
			e, err := Open(raw)
			if err != nil {
				b.Fatal(err)
			}
			dst.Apply(e, t0)
		}
		next, done := dst.NextPull(req, resp, Full, nil)
		if done {
			return sent, rounds
		}
		req = next
	}
}

// BenchmarkStoreBytesPerEntry: bbolt file bytes per stored entry, against
// the entry's own size.
func BenchmarkStoreBytesPerEntry(b *testing.B) {
	const n = 100000
	entries := makeEntries(b, n, 100)
	raw := 0
	for _, e := range entries {
		raw += len(e.Raw)
	}
	b.ResetTimer()
	for range b.N {
		st, err := OpenStore(filepath.Join(b.TempDir(), StoreFile), true)
		if err != nil {
			b.Fatal(err)
		}
		for i := 0; i < n; i += 1000 {
			if err := st.Put(entries[i : i+1000]...); err != nil {
				b.Fatal(err)
			}
		}
		size, _ := st.Size()
		st.Close()
		b.ReportMetric(float64(size)/n, "disk_bytes/entry")
		b.ReportMetric(float64(raw)/n, "entry_bytes")
		b.ReportMetric(float64(size)/float64(raw), "disk/entry_ratio")
	}
}

// BenchmarkCanonicalPeer: checking the peer ID in an entry's key, as the
// authorisation table does at every entry, for a fleet of 5,000 node IDs
// seen again and again, against decoding each one (peer.Decode), side by
// side in one run.
func BenchmarkCanonicalPeer(b *testing.B) {
	rng := rand.New(rand.NewPCG(5, 5))
	ids := make([]string, 5000)
	for i := range ids {
		ids[i] = newAuthor(b, rng).id.String()
	}
	for _, s := range ids { // as after the fleet's first entries
		canonicalPeer(s)
	}
	b.ResetTimer()
	var cached, decoded time.Duration
	for range b.N { // a pass over the fleet each, timed whole
		start := time.Now()
		for _, s := range ids {
			if _, ok := canonicalPeer(s); !ok {
				b.Fatal(s)
			}
		}
		cached += time.Since(start)
		start = time.Now()
		for _, s := range ids {
			if _, err := peer.Decode(s); err != nil {
				b.Fatal(err)
			}
		}
		decoded += time.Since(start)
	}
	checks := float64(b.N * len(ids))
	b.ReportMetric(float64(cached.Nanoseconds())/checks, "cached_ns")
	b.ReportMetric(float64(decoded.Nanoseconds())/checks, "decode_ns")
	b.ReportMetric(float64(cached)/float64(decoded), "cached/decode")
}
