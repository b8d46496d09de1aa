package gossip

import (
	"fmt"
	"time"
)

// HLC is a hybrid logical clock value: milliseconds since the Unix epoch
// in the high 48 bits, a logical counter in the low 16. It orders events
// like wall time while never going backwards and always moving past any
// clock value a node has seen, so a write made after seeing another one
// wins over it even when the writers' wall clocks disagree.
type HLC uint64

const logicalBits = 16

// MakeHLC builds a clock value from wall milliseconds and a counter.
func MakeHLC(ms int64, logical uint16) HLC {
	return HLC(uint64(ms)<<logicalBits | uint64(logical))
}

// Wall is the clock's wall-time part.
func (h HLC) Wall() time.Time { return time.UnixMilli(int64(h >> logicalBits)) }

// Logical is the clock's counter part.
func (h HLC) Logical() uint16 { return uint16(h) }

func (h HLC) String() string {
	return fmt.Sprintf("%s+%d", h.Wall().UTC().Format(time.RFC3339Nano), h.Logical())
}

// Next is the clock value for a local event at wall time now, after last
// (the highest value this node has issued or seen): now if it is ahead,
// otherwise last plus one tick.
func Next(last HLC, now time.Time) HLC {
	if wall := MakeHLC(now.UnixMilli(), 0); wall > last {
		return wall
	}
	return last + 1
}

// Observe is the new "last" after seeing remote: the higher of the two.
func Observe(last, remote HLC) HLC { return max(last, remote) }
