package node

import (
	"testing"
	"time"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/gossip/swim"
)

func TestLeaveAndReapRules(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	const reconnect = time.Hour
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	hlc := func(d time.Duration) gossip.HLC { return gossip.MakeHLC(ago(d).UnixMilli(), 0) }
	cases := []struct {
		name   string
		v      peerView
		state  string
		reaped bool
	}{
		{"alive, heard just now", peerView{known: true, swim: swim.Alive, heard: ago(time.Second), record: hlc(2 * time.Hour)}, Alive, false},
		{"not known to the detector yet", peerView{record: hlc(2 * time.Hour)}, Alive, false},
		{"suspect", peerView{known: true, swim: swim.Suspect, heard: ago(45 * time.Second), record: hlc(2 * time.Hour)}, Suspect, false},
		{"alive, long unheard (others probe it)", peerView{known: true, swim: swim.Alive, heard: ago(3 * time.Hour), record: hlc(3 * time.Hour)}, Alive, false},
		{"dead, within the reconnect timeout", peerView{known: true, swim: swim.Dead, heard: ago(59 * time.Minute), record: hlc(2 * time.Hour)}, Dead, false},
		{"dead, past the reconnect timeout", peerView{known: true, swim: swim.Dead, heard: ago(61 * time.Minute), record: hlc(2 * time.Hour)}, Dead, true},
		{"dead, never heard, record recent", peerView{known: true, swim: swim.Dead, record: hlc(time.Minute)}, Dead, false},
		{"dead, never heard, record old", peerView{known: true, swim: swim.Dead, record: hlc(2 * time.Hour)}, Dead, true},
		{"left by its record, the detector behind", peerView{known: true, swim: swim.Alive, heard: ago(time.Second), leftAt: ago(time.Second), record: hlc(time.Second)}, Left, false},
		{"left by the detector only", peerView{known: true, swim: swim.Left, heard: ago(time.Second), record: hlc(time.Hour)}, Left, false},
		{"left, within the reconnect timeout", peerView{known: true, swim: swim.Dead, heard: ago(50 * time.Minute), leftAt: ago(50 * time.Minute), record: hlc(50 * time.Minute)}, Left, false},
		{"left, past the reconnect timeout", peerView{known: true, swim: swim.Left, heard: ago(2 * time.Hour), leftAt: ago(2 * time.Hour), record: hlc(2 * time.Hour)}, Left, true},
		{"forced out, alive to the detector", peerView{known: true, swim: swim.Alive, heard: ago(time.Second), record: hlc(time.Hour), forced: hlc(time.Minute)}, Left, true},
		{"forced out, then a newer record", peerView{known: true, swim: swim.Alive, heard: ago(time.Second), record: hlc(time.Second), forced: hlc(time.Minute)}, Alive, false},
		{"forced out, newer record, then dead", peerView{known: true, swim: swim.Dead, record: hlc(time.Second), forced: hlc(time.Minute)}, Dead, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.v.state(); got != tc.state {
				t.Errorf("state = %s, want %s", got, tc.state)
			}
			if got := tc.v.reaped(now, reconnect); got != tc.reaped {
				t.Errorf("reaped = %v, want %v", got, tc.reaped)
			}
		})
	}
}
