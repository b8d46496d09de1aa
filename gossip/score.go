package gossip

import (
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Peer scoring (gossipsub v1.1) on the state topic counts one thing: the
// entries a peer delivers that the validator rejects (see honestMayRelay
// for what is rejected rather than ignored). Each costs
// InvalidEntryWeight × (rejected so far)², the count decaying every
// scoreDecayInterval to a hundredth of itself in invalidEntryDecay (and
// to 0 once below decayToZero), so a peer that sends a few bad entries by
// mistake recovers, and one that keeps sending them is cut off:
//
//	rejected entries   score   what pubsub does with the peer
//	1                  -10
//	3                  -90     no gossip to or from it (below GossipThreshold -50)
//	4                  -160    its own publishes are not flooded to it (PublishThreshold -100)
//	5                  -250    every message from it is ignored (GraylistThreshold -200)
//
// Nothing else is scored: time in mesh and first deliveries favour
// long-lived, well-connected peers, which a fleet of equals does not need,
// and co-location by IP would penalise the agents behind one NAT.
const (
	InvalidEntryWeight = -10.0
	invalidEntryDecay  = 10 * time.Minute

	// scoreDecayInterval is how often pubsub decays the counters: at
	// pubsub's default of a second, a timer that woke every idle agent
	// once a second for a decay that takes ten minutes.
	scoreDecayInterval = 10 * time.Second

	GossipThreshold   = -50.0
	PublishThreshold  = -100.0
	GraylistThreshold = -200.0
)

// decayToZero is where pubsub rounds a decaying counter down to 0.
const decayToZero = 0.01

func scoreParams(topic string) (*pubsub.PeerScoreParams, *pubsub.PeerScoreThresholds) {
	params := &pubsub.PeerScoreParams{
		SkipAtomicValidation: true,
		Topics: map[string]*pubsub.TopicScoreParams{topic: {
			SkipAtomicValidation: true,
			TopicWeight:          1,
			// Unused (weight 0), but pubsub divides by it for every peer
			// in the mesh.
			TimeInMeshQuantum:              time.Second,
			InvalidMessageDeliveriesWeight: InvalidEntryWeight,
			InvalidMessageDeliveriesDecay:  pubsub.ScoreParameterDecayWithBase(invalidEntryDecay, scoreDecayInterval, decayToZero),
		}},
		AppSpecificScore: func(peer.ID) float64 { return 0 },
		DecayInterval:    scoreDecayInterval,
		DecayToZero:      decayToZero,
		// A peer that disconnects and comes back keeps its score for this
		// long: reconnecting does not wash it.
		RetainScore: invalidEntryDecay,
	}
	thresholds := &pubsub.PeerScoreThresholds{
		SkipAtomicValidation: true,
		GossipThreshold:      GossipThreshold,
		PublishThreshold:     PublishThreshold,
		GraylistThreshold:    GraylistThreshold,
	}
	return params, thresholds
}
